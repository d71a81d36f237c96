"""Atomic tasks (``policy(atomic=True)``): the body and its attempt's report in one
transaction.

The task's thread opens a transaction on the worker's database, runs the body in it,
and writes the attempt's success report there, fenced by its claim token as every
report is, before the transaction commits. So the body's writes commit with the task's
success or not at all:

- the body raises, or is interrupted (past its timeout, cancelled): the transaction
  rolls back, and the failure is reported as any other, outside it; a retry runs a body
  whose earlier writes never committed;
- the report is refused (the claim is gone: the lease ran out and the task was
  recovered elsewhere, or it was cancelled or requeued): the transaction rolls back,
  and the worker logs the attempt as one whose claim was lost;
- the worker dies or loses its connection: the database rolls the transaction back;
- the store refuses the report's values (nothing written): the transaction rolls back
  and the task fails for good with ``TaskReportRefused``, as any task whose report the
  store refuses;
- the body marks the transaction for rollback: it rolls back, and the attempt fails.

The body's ``transaction.on_commit`` callbacks run once the success has committed; one
that raises is logged, and the success stands.

The attempt is sealed (:meth:`~.execution.Attempt.seal`) just before its report, so no
interrupt lands in the report or the commit. The loop then sends no second report for
an attempt its transaction settled: :class:`AtomicReporter` logs it, sends
``task_finished`` and counts it as its own reports are.

Only the task's database is covered: what the body does elsewhere (mail, HTTP, other
databases) is not undone. A long body holds its transaction open, with its locks (on
SQLite, the database's single write lock).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from jobstate.core.attempt_log import AttemptOutcome, AttemptSettlement, TaskAttempt
from jobstate.core.states import ClaimReport
from jobstate.exceptions import (
    InvalidPatch,
    InvalidPayload,
    TaskCancelled,
    TaskReportRefused,
    TaskTimeLimitExceeded,
)
from jobstate.tasks.worker.execution import Attempt, Outcome
from jobstate.tasks.worker.reports import Reporter, TaskClaim
from jobstate.tasks.worker.settled import SettledAttempt, note_cancel

if TYPE_CHECKING:
    from jobstate.models import Job
    from jobstate.stores.base import CompletionResult

__all__ = ["AtomicReporter"]

logger = logging.getLogger("jobstate.worker")


class _ClaimGone(Exception):
    """Rolls back the transaction of an attempt whose report was refused."""


class AtomicReporter(Reporter):
    """A :class:`~.reports.Reporter` that also runs atomic tasks' bodies with their
    reports (:meth:`run`, an :data:`~.execution.AtomicRun`) and settles what those
    transactions reported without writing again."""

    def run(self, attempt: Attempt, body: Callable[[], Any]) -> tuple[TaskAttempt, Any]:
        """Run ``body`` and write the attempt's success report in one transaction on the
        worker's database; the success's log entry and value. What ``body`` raises, or
        the interrupt that stopped it, is raised once the transaction has rolled back;
        a refused report rolls it back too, and :attr:`~.execution.Attempt.settled`
        says so."""
        if not attempt.interruptible:
            # A stored policy can outlive the code: this task became async since.
            raise TypeError("an async task cannot run atomically: its body runs in another thread")
        answer = None
        committed: list[bool] = []
        try:
            with transaction.atomic(using=self.using, durable=True):
                connection = transaction.get_connection(self.using)
                depth = len(connection.atomic_blocks)
                # The first of the transaction's on_commit callbacks: they run once it
                # has committed, and not at all when it rolls back.
                transaction.on_commit(lambda: committed.append(True), using=self.using)
                value = body()
                record = TaskAttempt(
                    worker_id=attempt.worker_id,
                    started_at=attempt.job.claimed_at,
                    finished_at=timezone.now(),
                    outcome=AttemptOutcome.SUCCESSFUL,
                )
                if len(connection.atomic_blocks) > depth:
                    # Leaving this block would then only release the body's savepoint:
                    # the report would be written in a transaction nobody commits, which
                    # closing the connection (release_task_connections) rolls back.
                    raise TransactionManagementError(
                        "the body of this atomic task left a transaction.atomic() block "
                        "open: nothing it wrote was committed"
                    )
                if transaction.get_rollback(using=self.using):
                    raise TransactionManagementError(
                        "the body of this atomic task marked its transaction for rollback: "
                        "nothing it wrote was committed"
                    )
                if not attempt.seal():
                    # Interrupted (or given up on) as the body returned: roll back; the
                    # attempt ends as the interrupt says.
                    raise TaskCancelled() if attempt.cancelled else TaskTimeLimitExceeded()
                answer = self._report_inside(Outcome(attempt, record, value))
                if not answer[1].completed:
                    raise _ClaimGone
        except _ClaimGone:
            pass
        # Past the commit nothing is the attempt's failure: what raised there is an
        # on_commit callback of the body's, and the success is recorded.
        except BaseException:
            if not committed:
                raise
            logger.exception(
                "Task %s %s succeeded and was committed, but an on_commit callback of its "
                "body raised",
                attempt.job.task_path,
                attempt.job.id,
            )
        attempt.settled = answer
        return record, value

    def _report_inside(self, outcome: Outcome) -> tuple[AttemptSettlement, CompletionResult]:
        """Write the success report of ``outcome`` on the task thread's connection, inside
        the transaction of its body."""
        settlement = self._settlement(outcome)
        job = outcome.attempt.job
        report = ClaimReport(
            job_id=job.id,
            claim_token=job.claim_token or "",
            status=settlement.status,
            patch=settlement.patch,
        )
        try:
            (result,) = self.store.complete_claimed_jobs([report])
        except (InvalidPatch, InvalidPayload) as exc:
            # A value the store cannot keep (its payload limit, say): nothing was
            # written; the attempt fails, rolled back, naming the refusal.
            raise TaskReportRefused(f"the store refused the report of this attempt: {exc}") from exc
        return settlement, result

    def settle_and_claim(
        self, outcomes: Sequence[Outcome], claim: TaskClaim | None
    ) -> tuple[list[SettledAttempt], list[Job] | None]:
        """The reports of the outcomes their atomic transaction did not settle, as
        :meth:`~.reports.Reporter.settle_and_claim` writes them (with ``claim``); the
        others are logged and announced as settled already."""
        done: list[SettledAttempt] = []
        rest: list[Outcome] = []
        for outcome in outcomes:
            answer = outcome.attempt.settled
            if answer is None:
                if outcome.attempt.policy.atomic and isinstance(
                    outcome.exception, TaskReportRefused
                ):
                    # Its success report was refused in its transaction: it fails for
                    # good, as a task whose report the store refuses does.
                    outcome.final = True
                rest.append(outcome)
                continue
            settlement, result = answer
            if not result.completed:
                note_cancel(outcome.attempt, result)
            item = SettledAttempt(outcome, settlement, result.completed)
            self.announce(item, result.job if item.written else None)
            done.append(item)
        settled, claimed = super().settle_and_claim(rest, claim)
        return [*done, *settled], claimed

    def _log(self, item: SettledAttempt) -> None:
        super()._log(item)
        attempt = item.outcome.attempt
        if attempt.settled is not None and not item.written:
            logger.warning(
                "Task %s %s is atomic: what its body wrote was rolled back with its report",
                attempt.job.task_path,
                attempt.job.id,
            )
