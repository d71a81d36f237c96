"""Settling ended attempts: one fenced report per attempt, written in batches.

An attempt that succeeded is ``done`` with its return value. One that failed, timed out
or was interrupted goes back to the queue after the backend's backoff while attempts
remain, else it is ``error``; either way its error is kept in the attempt log, and a
``retry_scheduled`` or ``finished`` audit entry is written in the same transaction as the
report. A claimed task the worker never started is handed back as it was, its claim not
counted as an attempt.

A batch of successes writes no audit entry, so it goes with the worker's next claim in
one store call (:meth:`Reporter.settle_and_claim`; one statement on PostgreSQL): at one
task at a time, a task costs one round trip.

Every report is fenced by the attempt's claim token: if the worker lost the claim (its
lease ran out and a sweep recovered the task), the report writes nothing and the
attempt's result is dropped, with a warning. An atomic task's success report is written
by its own thread, inside the body's transaction (:mod:`.atomic`), and never sent again.

A report whose connection died on its way (a database or pooler restart) raises
:class:`~jobstate.exceptions.StoreUnavailable`, whatever the driver raised, and is sent
again by the worker later; it may have committed before the connection died. When the
second report then finds the claim gone, the row it read back tells which: if its log
holds this attempt, the first report was written and the attempt is settled. The tasks
a lost reply had claimed are not known to the worker: nothing runs them, and they are
recovered as lost attempts once their leases run out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from jobstate.core.attempt_log import (
    AttemptOutcome,
    AttemptSettlement,
    TaskAttempt,
    attempt_history,
    refused_settlement,
    settle_attempt,
    storable_class_path,
)
from jobstate.core.conf import jobstate_settings
from jobstate.core.states import ClaimReport, JobStatus
from jobstate.exceptions import (
    InvalidPatch,
    InvalidPayload,
    StoreUnavailable,
    TaskReportRefused,
    TaskTimedOut,
    WorkerLost,
)
from jobstate.stores.base import CompletionResult, StateStore
from jobstate.stores.errors import translated_database_errors
from jobstate.tasks.compat import task_finished
from jobstate.tasks.options import TaskOptions
from jobstate.tasks.results import task_result
from jobstate.tasks.worker.announcer import Announcer, write_plainly
from jobstate.tasks.worker.execution import Attempt, Outcome, class_path
from jobstate.tasks.worker.receivers import send_to_every_receiver
from jobstate.tasks.worker.settled import SettledAttempt, held, note_cancel
from jobstate.tasks.worker.task_claims import TaskClaim

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = ["Reporter", "TaskClaim"]

logger = logging.getLogger("jobstate.worker")

#: What a store raises when it refuses a report's values (before writing anything).
_REFUSALS = (InvalidPatch, InvalidPayload)


#: The errors the worker records itself (the task raised none of them), by class path.
_WORKER_ERRORS = {class_path(cls): cls for cls in (TaskTimedOut, WorkerLost, TaskReportRefused)}


def _worker_error(record: TaskAttempt) -> BaseException | None:
    """The exception an attempt that ended without one of the task's own (it timed out,
    its worker stopped waiting for it) is recorded as, for ``task_finished``'s
    receivers; ``None`` for a successful attempt."""
    cls = _WORKER_ERRORS.get(record.exception_class_path)
    return None if cls is None else cls(record.message)


class Reporter:
    """Writes the reports of one worker's attempts to ``store`` on database ``using``."""

    def __init__(
        self,
        store: StateStore,
        *,
        using: str,
        options: TaskOptions,
        sender: type,
        announcer: Announcer | None = None,
    ) -> None:
        self.store = store
        self.using = using
        self.options = options
        self.sender = sender
        #: Where the settled attempts are announced; ``None``: on the caller's thread.
        self.announcer = announcer
        #: The claims (job id, token) whose last report died with its connection and so
        #: may have been written.
        self._unconfirmed: set[tuple[Any, Any]] = set()
        # What a report is checked against (MAX_PAYLOAD_BYTES) is what the worker
        # started with, whatever a task does to settings.JOBSTATE.
        jobstate_settings.read_all()

    def settle(self, outcomes: Sequence[Outcome]) -> list[SettledAttempt]:
        """Report every outcome; return what each report did, in order. A report the
        store refuses (a value it cannot keep) settles its task as failed with
        :class:`~jobstate.exceptions.TaskReportRefused` instead, and the others are
        written as they are."""
        return self.settle_and_claim(outcomes, None)[0]

    def settle_and_claim(
        self, outcomes: Sequence[Outcome], claim: TaskClaim | None
    ) -> tuple[list[SettledAttempt], list[Job] | None]:
        """:meth:`settle`, and when every outcome is a success, also ``claim`` the next
        tasks in the same store call (one statement on PostgreSQL). Returns what each
        report did and the tasks claimed, or ``None`` when no claim was made (no
        ``claim`` asked, a failure among the outcomes, or a refused report): the caller
        claims on its own then.

        When the connection dies on the way, the reports are marked unconfirmed as
        :meth:`settle` marks them, and the tasks the lost reply named are not known:
        nothing runs them, and once their leases run out they are recovered as lost
        attempts, like the tasks of a worker that died."""
        if not outcomes:
            return [], None
        outcomes = list(outcomes)
        if claim is not None and not all(
            outcome.record.outcome is AttemptOutcome.SUCCESSFUL for outcome in outcomes
        ):
            claim = None
        settlements = [self._settlement(outcome) for outcome in outcomes]
        claimed: list[Job] | None = None
        try:
            results, claimed = self._report(outcomes, settlements, claim)
        except _REFUSALS as exc:
            if len(outcomes) > 1:
                # Every report of a batch is checked before any is written (and before
                # anything is claimed): find the refused one by settling each alone.
                return [item for outcome in outcomes for item in self.settle([outcome])], None
            outcomes, settlements, results = self._settle_refused(outcomes[0], exc)
        settled = [
            self._settled(outcome, settlement, result)
            for outcome, settlement, result in zip(outcomes, settlements, results, strict=True)
        ]
        for item, result in zip(settled, results, strict=True):
            final = item.written and not item.settlement.retrying
            self.announce(item, result.job if final else None)
        return settled, claimed

    def announce(self, item: SettledAttempt, finished: Job | None) -> None:
        """Log the settled attempt's line and, given ``finished`` (its task's row at
        its final status), send ``task_finished``; then let go of the exception the
        task raised, which holds the task's frames and their locals. On the
        announcer's thread (:mod:`.announcer`) when there is one."""

        def announcement() -> None:
            self._guarded(item, self._log, item)
            if finished is not None:
                self._guarded(item, self._finished, item.outcome, finished)
            item.outcome.exception = None

        if self.announcer is None:
            announcement()
        else:
            self.announcer.put(announcement)

    def _guarded(self, item: SettledAttempt, step: Callable[..., None], *args: Any) -> None:
        """Run ``step`` (the attempt's log line, or ``task_finished``): the host's code
        runs there (its log handlers and signal receivers, and the task's exception,
        which a handler formats with its traceback: an exception whose attributes
        raise fails that). The worker goes on whatever it raises, and says so in a
        plain line on stderr, as logging may be what failed."""
        try:
            step(*args)
        # The host's handler, receiver or exception, whatever it raises (a receiver's
        # SystemExit included): on the announcer's thread, nothing else would see it,
        # and the announcements after it would never be made.
        except BaseException as exc:
            job = item.outcome.attempt.job
            write_plainly(
                f"jobstate_worker: the end of task {job.task_path} {job.id} attempt "
                f"{job.attempts} was reported, but logging or announcing it raised "
                f"{storable_class_path(type(exc))}"
            )

    def _settled(
        self, outcome: Outcome, settlement: AttemptSettlement, result: CompletionResult
    ) -> SettledAttempt:
        claim = held(outcome.attempt)
        unconfirmed = claim in self._unconfirmed
        self._unconfirmed.discard(claim)
        if result.completed:
            return SettledAttempt(outcome, settlement, True)
        if unconfirmed and _logged(result.job, outcome.record):
            return SettledAttempt(outcome, settlement, True, reply_lost=True)
        note_cancel(outcome.attempt, result)
        return SettledAttempt(outcome, settlement, False)

    def _report(
        self,
        outcomes: Sequence[Outcome],
        settlements: Sequence[AttemptSettlement],
        claim: TaskClaim | None = None,
    ) -> tuple[list[CompletionResult], list[Job] | None]:
        """Write the reports (and claim, with ``claim``); a lost connection raises
        ``StoreUnavailable`` (never the driver's error, which a failed commit, or a
        reconnection as the transaction block ends, raises outside the store's own
        calls) and marks them unconfirmed."""
        try:
            with translated_database_errors("The report of ended task attempts", self.using):
                return self._write(outcomes, settlements, claim)
        except StoreUnavailable:
            self._unconfirmed.update(held(outcome.attempt) for outcome in outcomes)
            raise

    def _write(
        self,
        outcomes: Sequence[Outcome],
        settlements: Sequence[AttemptSettlement],
        claim: TaskClaim | None,
    ) -> tuple[list[CompletionResult], list[Job] | None]:
        reports = [
            ClaimReport(
                job_id=outcome.attempt.job.id,
                claim_token=outcome.attempt.job.claim_token or "",
                status=settlement.status,
                patch=settlement.patch,
            )
            for outcome, settlement in zip(outcomes, settlements, strict=True)
        ]
        if claim is not None:
            # Successes only (see settle_and_claim), so no audit entry: the reports and
            # the next claim are one call.
            keyed = any(outcome.attempt.job.concurrency_digest for outcome in outcomes)
            return claim.complete_and_claim(self.store, reports, keyed_ending=keyed)
        if all(outcome.record.outcome is AttemptOutcome.SUCCESSFUL for outcome in outcomes):
            # Successes write no audit entry: the batch is one statement on its own.
            return self.store.complete_claimed_jobs(reports), None
        with transaction.atomic(using=self.using):
            results = self.store.complete_claimed_jobs(reports)
            for outcome, settlement, result in zip(outcomes, settlements, results, strict=True):
                if result.completed and outcome.record.failed:
                    self._audit(outcome, settlement, result)
        return results, None

    def _settle_refused(
        self, outcome: Outcome, refusal: Exception
    ) -> tuple[list[Outcome], list[AttemptSettlement], list[CompletionResult]]:
        """Settle a task whose report was refused as failed, naming the refusal; should
        its log be refused too, with the ``error`` alone."""
        job = outcome.attempt.job
        logger.error(
            "The store refused the report of task %s %s attempt %d (%s); the task is "
            "settled as failed",
            job.task_path,
            job.id,
            job.attempts,
            refusal,
        )
        try:
            return self._report_refused(outcome, refusal, with_log=True)
        except _REFUSALS:
            return self._report_refused(outcome, refusal, with_log=False)

    def _report_refused(
        self, outcome: Outcome, refusal: Exception, *, with_log: bool
    ) -> tuple[list[Outcome], list[AttemptSettlement], list[CompletionResult]]:
        record, settlement = refused_settlement(
            attempt_log=outcome.attempt.job.attempt_log,
            attempt=outcome.record,
            refusal=refusal,
            what="report",
            with_log=with_log,
        )
        replaced = Outcome(
            outcome.attempt, record, duration=outcome.duration, exception=outcome.exception
        )
        return [replaced], [settlement], self._report([replaced], [settlement])[0]

    def hand_back(self, attempts: Sequence[Attempt], *, run_after: datetime | None = None) -> int:
        """Give back claimed tasks no thread started, as they were before the claim
        (their attempt count too), due at once or at ``run_after``. Returns how many were
        given back."""
        if not attempts:
            return 0
        patch: dict[str, Any] = {} if run_after is None else {"run_after": run_after}
        reports = [
            ClaimReport(
                job_id=attempt.job.id,
                claim_token=attempt.job.claim_token or "",
                status=JobStatus.QUEUED,
                patch={**patch, "attempts": max(attempt.job.attempts - 1, 0)},
            )
            for attempt in attempts
        ]
        results = self.store.complete_claimed_jobs(reports)
        return sum(1 for result in results if result.completed)

    def _finished(self, outcome: Outcome, job: Job) -> None:
        """Send ``task_finished`` for a task that reached its final status, while the
        exception the task raised (if it raised) is being handled, as Django's own
        backends do: its receivers (Django's log of the task among them) read it from
        ``sys.exc_info()``. A task that did not import has no ``Task`` to build a result
        of, so it sends nothing; a receiver that raises (``SystemExit`` too) is logged,
        and the receivers after it are still sent it."""
        attempt = outcome.attempt
        if attempt.task is None:
            return
        result = task_result(job, attempt.alias, attempt.task)
        error = outcome.exception
        if error is None:
            error = _worker_error(outcome.record)
        if error is None:
            self._send_finished(result, job)
            return
        frames = error.__traceback__
        try:
            raise error
        except BaseException:  # the task's own exception, raised just above
            # Raising added this frame to its traceback: give receivers the task's own.
            error.__traceback__ = frames
            self._send_finished(result, job)
        finally:
            del error, frames

    def _send_finished(self, result: Any, job: Job) -> None:
        for receiver, response in send_to_every_receiver(
            task_finished, self.sender, task_result=result
        ):
            if isinstance(response, BaseException):
                logger.error(
                    "A task_finished receiver (%r) raised for task %s: %r",
                    receiver,
                    job.id,
                    response,
                    exc_info=response,
                )

    def _settlement(self, outcome: Outcome) -> AttemptSettlement:
        job = outcome.attempt.job
        retry_at = None
        if outcome.record.failed:
            delay = self.options.retry_delay(job.attempts, outcome.attempt.policy.retry_backoff)
            retry_at = timezone.now() + max(delay, outcome.retry_hold or timedelta(0))
        final = outcome.final or not _retryable(outcome)
        return settle_attempt(
            attempt_log=job.attempt_log,
            attempts=job.attempts,
            max_attempts=job.attempts if final else job.max_attempts,
            attempt=outcome.record,
            return_value=outcome.return_value,
            retry_at=retry_at,
        )

    def _audit(
        self, outcome: Outcome, settlement: AttemptSettlement, result: CompletionResult
    ) -> None:
        job = outcome.attempt.job
        detail: dict[str, Any] = {
            "task": job.task_path,
            "attempt": job.attempts,
            "max_attempts": job.max_attempts,
            "outcome": outcome.record.outcome.value,
            "error": outcome.record.exception_class_path,
            "worker": outcome.attempt.worker_id,
            "status": settlement.status.value,
        }
        if settlement.retrying:
            detail["retry_at"] = _retry_at(settlement)
        self.store.append_audit(
            job=result.job or job,
            event="retry_scheduled" if settlement.retrying else "finished",
            detail=detail,
        )

    def _log(self, item: SettledAttempt) -> None:
        outcome, settlement = item.outcome, item.settlement
        job = outcome.attempt.job
        duration_ms = outcome.duration * 1000
        if not item.written and outcome.attempt.cancelled:
            logger.warning(
                "Task %s %s attempt %d stopped after %.0f ms: it was cancelled",
                job.task_path,
                job.id,
                job.attempts,
                duration_ms,
            )
            return
        if not item.written:
            logger.warning(
                "Task %s %s attempt %d %s after %.0f ms, but its claim was lost (its lease "
                "ran out and it was recovered): the result is dropped",
                job.task_path,
                job.id,
                job.attempts,
                outcome.record.outcome.value,
                duration_ms,
            )
            return
        what, failed = outcome.record.outcome.value, outcome.record.failed
        level = logging.WARNING if failed else logging.INFO
        if not logger.isEnabledFor(level):
            # The line is built for every task: skip the building where it is not shown.
            return
        if failed:
            what = f"{what} ({settlement.patch.get('error')})"
        what = f"{what} in {duration_ms:.0f} ms"
        if item.reply_lost:
            what = (
                f"{what} (the connection was lost as its report was sent; the task's row "
                "shows the report written)"
            )
        if settlement.retrying:
            what = f"{what}; retry in {_wait(settlement).total_seconds():.1f} s"
        elif failed:
            what = f"{what}; {_why_final(outcome)}"
        logger.log(
            level,
            "Task %s %s attempt %d/%d %s",
            job.task_path,
            job.id,
            job.attempts,
            job.max_attempts or 1,
            what,
        )


def _retryable(outcome: Outcome) -> bool:
    """Whether the task's policy lets this failure be retried (``retry_on``,
    ``discard_on``): judged on what the task raised, or on
    :class:`~jobstate.exceptions.TaskTimedOut` for an attempt past its timeout. An attempt
    the worker ended for its own reasons (it stopped) is always retried."""
    error = _error(outcome)
    return error is None or outcome.attempt.policy.retries(error)


def _error(outcome: Outcome) -> type[BaseException] | None:
    if outcome.exception is not None:
        return type(outcome.exception)
    if outcome.record.outcome is AttemptOutcome.TIMED_OUT:
        return TaskTimedOut
    return None


def _why_final(outcome: Outcome) -> str:
    """Why a failed attempt is its task's last, for the log."""
    job, error = outcome.attempt.job, _error(outcome)
    refusal = None if error is None else outcome.attempt.policy.refusal(error)
    if refusal is not None and job.attempts < (job.max_attempts or 1):
        return f"not retried: {refusal}"
    return "no attempt left"


def _logged(job: Job | None, record: TaskAttempt) -> bool:
    """Whether ``job``'s attempt log holds ``record``: the same worker, start, end and
    outcome. Only this attempt's own report writes that entry (a recovery of the task
    logs the attempt as its worker lost, at another instant)."""
    if job is None:
        return False
    mark = (record.worker_id, record.started_at, record.finished_at, record.outcome)
    return any(
        isinstance(entry, TaskAttempt)
        and (entry.worker_id, entry.started_at, entry.finished_at, entry.outcome) == mark
        for entry in attempt_history(job.attempt_log)
    )


def _retry_at(settlement: AttemptSettlement) -> str | None:
    run_after = settlement.patch.get("run_after")
    return None if run_after is None else run_after.isoformat()


def _wait(settlement: AttemptSettlement) -> timedelta:
    run_after = settlement.patch.get("run_after")
    if run_after is None:
        return timedelta(0)
    return max(run_after - timezone.now(), timedelta(0))
