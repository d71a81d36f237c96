"""Operations jobs and the runner that executes them.

An *operations job* is a named piece of maintenance work (closing a business day,
building a report) that a scheduler, an operator or a Celery task starts on demand.
Declare one with :func:`operations_job`::

    @operations_job("billing.close-day", overlap="forbid", timeout=timedelta(minutes=20))
    def close_day(ctx: RunContext, input: None) -> dict[str, object]:
        ...
        return {"closed": 42}

and run it with ``JobRunner().execute("billing.close-day")`` (or ``manage.py
run_operations_job billing.close-day``). The runner keeps the durable record of every
run in the run store (:class:`jobstate.stores.base.JobRunStore`):

- **forbid** jobs hold one overlap key (the job key), so at most one run executes at a
  time across every process sharing the database; a run that finds the key held is
  recorded as SKIPPED and never executes its body.
- **allow** jobs get a fresh overlap key per run, so runs may overlap.
- A heartbeat thread advances the run's liveness watermark (on the store's clock) while
  the body runs. A run whose process died stops beating and is reaped to TIMED_OUT by
  the next run of the same key or by ``manage.py reap_stale``.
- The body has a deadline. Python cannot stop a thread, so on the deadline the runner
  sets ``ctx.cancelled``, records TIMED_OUT and returns; a body that finishes later is
  logged and never written.
- The runner rides out a database restart: a failed heartbeat drops its thread's dead
  connection and the next beat reconnects; the final write is tried again on a
  retryable :class:`StoreError` for up to ``stale_run_after``, so a run whose outcome is
  known is not left RUNNING by a short outage.

Every run ends in exactly one :class:`JobExecutionResult`; ``execute`` raises only for
an unknown job, rejected input, a call inside a transaction, or a failing store.

This module holds :class:`JobRunner`; its settings-backed options are read in
:mod:`jobstate.operations.runner_options`, the body's view of its run lives in
:mod:`jobstate.operations.run_context`, the outcome types in
:mod:`jobstate.operations.outcomes` and the registry in
:mod:`jobstate.operations.job_registry`. Their public names are importable from here.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import connections

from jobstate.core.clock import Clock, SystemClock
from jobstate.core.jsonvalues import ensure_json
from jobstate.exceptions import (
    InvalidJobState,
    InvalidPayload,
    InvalidRunnerConfiguration,
    JobStateError,
    OperationsJobInputError,
    StoreError,
    TransactionNotAllowed,
)
from jobstate.operations.job_registry import OperationsJob, Registry, operations_job, registry
from jobstate.operations.outcomes import (
    JobExecutionResult,
    Recorded,
    RunReason,
    Verdict,
    abort_verdict,
    body_verdict,
    truncate_error_text,
)
from jobstate.operations.run_context import RunContext, RunExecution, discard_connection
from jobstate.operations.runner_options import (
    FROM_SETTINGS,
    FromSettings,
    ReapScope,
    runner_options,
)
from jobstate.stores import get_run_store
from jobstate.stores.base import (
    JobRunStatus,
    JobRunStore,
    Trigger,
)
from jobstate.stores.contracts.validation import (
    validate_instant,
    validate_reap_limit,
)

__all__ = [
    "CLI_TRIGGER",
    "FROM_SETTINGS",
    "JobExecutionResult",
    "JobRunner",
    "OperationsJob",
    "Registry",
    "RunContext",
    "RunReason",
    "operations_job",
    "registry",
]

logger = logging.getLogger("jobstate.runner")

#: The trigger ``execute`` records when the caller names none.
CLI_TRIGGER = Trigger("CLI")

# Waits between tries of the final write after a retryable store error: short at first
# (a dropped connection comes back at once), never long enough to overshoot the budget.
_COMPLETE_RETRY_FIRST_SECONDS = 0.2
_COMPLETE_RETRY_MAX_SECONDS = 2.0


class JobRunner:
    """Executes registered operations jobs and records each run in a run store.

    Every option not given falls back to its ``JOBSTATE`` setting: ``HEARTBEAT_INTERVAL``,
    ``STALE_RUN_AFTER``, ``DEFAULT_JOB_TIMEOUT``, ``REAP_SCOPE``, ``REAP_LIMIT``,
    ``ERROR_TEXT_LIMIT`` and ``SERVICE_REVISION``. ``store`` defaults to
    :func:`jobstate.stores.get_run_store`, ``clock`` (anything with ``now()`` returning an
    aware datetime; it stamps the recorded instants) to the system clock in UTC.

    ``stale_run_after`` must be at least twice ``heartbeat_interval``, so one late beat
    never makes a live run look dead. Invalid options raise
    :class:`InvalidRunnerConfiguration`.

    Waiting (heartbeat interval, deadline) is measured on this process's monotonic clock;
    the liveness watermark itself comes from the store's clock.
    """

    def __init__(
        self,
        *,
        store: JobRunStore | None = None,
        registry: Registry = registry,
        clock: Clock | None = None,
        heartbeat_interval: timedelta | FromSettings = FROM_SETTINGS,
        stale_run_after: timedelta | FromSettings = FROM_SETTINGS,
        default_timeout: timedelta | FromSettings = FROM_SETTINGS,
        reap_scope: ReapScope | FromSettings = FROM_SETTINGS,
        reap_limit: int | FromSettings | None = FROM_SETTINGS,
        error_text_limit: int | FromSettings = FROM_SETTINGS,
        service_revision: str | FromSettings | None = FROM_SETTINGS,
    ) -> None:
        options = runner_options(
            heartbeat_interval=heartbeat_interval,
            stale_run_after=stale_run_after,
            default_timeout=default_timeout,
            reap_scope=reap_scope,
            reap_limit=reap_limit,
            error_text_limit=error_text_limit,
            service_revision=service_revision,
        )
        self.heartbeat_interval = options.heartbeat_interval
        self.stale_run_after = options.stale_run_after
        self.default_timeout = options.default_timeout
        self.reap_scope: ReapScope = options.reap_scope
        self.reap_limit: int | None = options.reap_limit
        self.error_text_limit: int = options.error_text_limit
        self.service_revision: str | None = options.service_revision
        if not isinstance(registry, Registry):
            raise InvalidRunnerConfiguration(f"registry must be a Registry, got {registry!r}.")
        self.registry = registry
        self.clock: Clock = SystemClock() if clock is None else clock
        try:
            validate_instant(self.clock.now(), field="clock.now()")
        except (AttributeError, TypeError, InvalidJobState) as exc:
            raise InvalidRunnerConfiguration(
                f"clock must have a now() method returning an aware datetime: {exc}"
            ) from exc
        self.store: JobRunStore = get_run_store() if store is None else store

    # -- public API ------------------------------------------------------------------------

    def execute(
        self, job_key: str, input: Any = None, trigger: Trigger = CLI_TRIGGER
    ) -> JobExecutionResult:
        """Run job ``job_key`` once and record the run.

        Steps: look the job up (:class:`UnknownOperationsJob`); validate ``input``
        (:class:`OperationsJobInputError`); reap stale runs in the configured scope (a
        failure is logged and ignored); claim the overlap key (:class:`StoreError` if the
        store fails); on a held key record a SKIPPED run and return; otherwise run the
        body with heartbeats until it settles or its deadline passes, and record the
        outcome exactly once. Nothing is written when it raises before the claim.

        Must be called outside a database transaction on the store's database
        (:class:`TransactionNotAllowed`): heartbeats use their own connection and could
        not see an uncommitted run. The body runs in its own thread, with its own
        database connection, and never inside the caller's transaction.
        """
        job = self.registry.get(job_key)
        if not isinstance(trigger, Trigger):
            raise TypeError(f"trigger must be a jobstate Trigger, got {type(trigger).__name__}.")
        try:
            ensure_json(input, field="input")
        except InvalidPayload as exc:
            raise OperationsJobInputError(f"{job.key}: {exc}") from exc
        value = job.parse_input(input)
        self._refuse_transaction()
        # An allow-run gets a fresh key, so allow-runs never block one another.
        overlap_key = job.key if job.overlap == "forbid" else f"{job.key}#{uuid.uuid4()}"
        self._reap_before_claim(job, overlap_key)
        started_at = self.clock.now()
        try:
            run_id = self.store.claim(
                job_key=job.key,
                overlap_key=overlap_key,
                trigger=trigger,
                input=input,
                started_at=started_at,
                service_revision=self.service_revision,
            )
        except JobStateError:
            raise
        except Exception as exc:
            raise StoreError(f"Claiming a run of {job.key!r} failed: {exc}") from exc
        if run_id is None:
            return self._record_skipped(job, overlap_key, trigger, input, started_at)
        return self._run(job, run_id, trigger, value, started_at)

    def reap_stale_runs(self, limit: int | None = None) -> int:
        """Move every RUNNING run (any job, any key) whose heartbeat is older than
        ``stale_run_after`` to TIMED_OUT; at most ``limit`` rows (default: the runner's
        ``reap_limit``). Returns the rows this call moved; concurrent calls never count
        the same row twice. A store failure raises :class:`StoreError`."""
        cap = self.reap_limit if limit is None else validate_reap_limit(limit)
        try:
            return self.store.reap_stale(stale_after=self.stale_run_after, limit=cap)
        except JobStateError:
            raise
        except Exception as exc:
            raise StoreError(f"Reaping stale runs failed: {exc}") from exc

    # -- pipeline steps --------------------------------------------------------------------

    def _refuse_transaction(self) -> None:
        alias = getattr(self.store, "using", None)
        if isinstance(alias, str) and connections[alias].in_atomic_block:
            raise TransactionNotAllowed(
                f"JobRunner.execute() was called inside a transaction on database {alias!r}. "
                "Call it in autocommit mode (outside transaction.atomic and "
                "ATOMIC_REQUESTS views): the heartbeat thread's connection cannot see an "
                "uncommitted run and would abort it."
            )

    def _reap_before_claim(self, job: OperationsJob, overlap_key: str) -> None:
        if self.reap_scope == "off":
            return
        scope: dict[str, str] = {}
        if self.reap_scope == "overlap-key":
            # An allow-run's key is brand new, so only the job key can find its dead runs.
            scope = (
                {"overlap_key": overlap_key} if job.overlap == "forbid" else {"job_key": job.key}
            )
        try:
            reaped = self.store.reap_stale(
                stale_after=self.stale_run_after, limit=self.reap_limit, **scope
            )
        # Reaping is housekeeping: whatever makes it fail, the claim decides the run.
        except Exception:
            logger.warning(
                "stale job run reap failed before %s", job.key, exc_info=True, extra=scope
            )
            return
        if reaped:
            logger.warning(
                "stale RUNNING job runs reaped: %d before %s", reaped, job.key, extra=scope
            )

    def _record_skipped(
        self,
        job: OperationsJob,
        overlap_key: str,
        trigger: Trigger,
        input: Any,
        at: datetime,
    ) -> JobExecutionResult:
        logger.warning(
            "job skipped: %s (overlap key already held)",
            job.key,
            extra={
                "job_key": job.key,
                "overlap_key": overlap_key,
                "trigger_source": trigger.source,
                "triggered_by": trigger.triggered_by,
            },
        )
        try:
            run_id = self.store.record_skipped(
                job_key=job.key,
                trigger=trigger,
                input=input,
                at=at,
                reason=RunReason.OVERLAP.value,
                service_revision=self.service_revision,
            )
        except JobStateError:
            raise
        except Exception as exc:
            raise StoreError(f"Recording a skipped run of {job.key!r} failed: {exc}") from exc
        return JobExecutionResult(
            run_id=str(run_id),
            job_key=job.key,
            status=JobRunStatus.SKIPPED,
            duration_ms=0,
            recorded="settled",
            reason=RunReason.OVERLAP,
        )

    def _run(
        self, job: OperationsJob, run_id: str, trigger: Trigger, value: Any, started_at: datetime
    ) -> JobExecutionResult:
        timeout = job.timeout or self.default_timeout
        execution = RunExecution(
            store=self.store,
            run_id=str(run_id),
            job_key=job.key,
            budget=self.stale_run_after.total_seconds(),
        )
        ctx = RunContext(
            run_id=str(run_id),
            job_key=job.key,
            trigger=trigger,
            deadline_at=started_at + timeout,
            execution=execution,
        )
        beater = threading.Thread(
            target=self._beat_until_settled,
            args=(execution,),
            name=f"jobstate-heartbeat-{job.key}",
            daemon=True,
        )
        # A daemon thread: a body that ignores its deadline must not keep the process alive.
        worker = threading.Thread(
            target=_run_body,
            args=(execution, job, ctx, value),
            name=f"jobstate-run-{job.key}",
            daemon=True,
        )
        # From the claim on, an interrupt (Ctrl-C, a command's stop signal) is recorded,
        # so the run frees its key at once instead of after a reap; one that comes before
        # the threads start is caught here too.
        try:
            beater.start()
            worker.start()
            if not execution.wake.wait(min(timeout.total_seconds(), threading.TIMEOUT_MAX)):
                execution.abort(RunReason.TIMEOUT)
        except KeyboardInterrupt:
            # Record the interrupted run so its key is free at once instead of after a reap.
            execution.abort(RunReason.INTERRUPTED)
            self._finalise(job, execution, beater, started_at, timeout)
            raise
        return self._finalise(job, execution, beater, started_at, timeout)

    def _beat_until_settled(self, execution: RunExecution) -> None:
        interval = self._heartbeat_wait()
        try:
            while not execution.stop_heartbeats.wait(interval):
                if not execution.beat(None):
                    return
        finally:
            connections.close_all()

    def _heartbeat_wait(self) -> float:
        """The heartbeat interval in seconds, no longer than a thread can wait (about
        292 years, less than the longest interval the runner accepts)."""
        return min(self.heartbeat_interval.total_seconds(), threading.TIMEOUT_MAX)

    def _finalise(
        self,
        job: OperationsJob,
        execution: RunExecution,
        beater: threading.Thread,
        started_at: datetime,
        timeout: timedelta,
    ) -> JobExecutionResult:
        settlement = execution.settle()
        execution.stop_heartbeats.set()
        if beater.is_alive():  # not when an interrupt came before it started
            beater.join(self._heartbeat_wait())

        finished_at = self.clock.now()
        elapsed = finished_at - started_at
        if elapsed < timedelta(0):
            logger.warning(
                "runner clock moved backwards during %s (run %s): duration recorded as 0",
                job.key,
                execution.run_id,
                extra=execution.log_extra,
            )
        duration_ms = max(0, round(elapsed / timedelta(milliseconds=1)))

        verdict: Verdict
        if settlement.body_first:
            verdict = body_verdict(settlement.value, settlement.error)
        else:
            # The caller settles only once the body has finished or the run was aborted.
            assert settlement.abort_reason is not None
            verdict = abort_verdict(
                settlement.abort_reason, timeout=timeout, stale_run_after=self.stale_run_after
            )
        status, summary = verdict.status, verdict.summary
        error_text = (
            None
            if verdict.error is None
            else truncate_error_text(verdict.error, self.error_text_limit)
        )

        recorded: Recorded
        try:
            written, retried = self._complete(
                execution,
                status=status,
                finished_at=finished_at,
                duration_ms=duration_ms,
                summary=summary,
                error=error_text,
            )
        # Whatever the store raised, the run is over; the row stays RUNNING until a reap.
        except Exception:
            logger.error(
                "job run finalize failed: the row stays RUNNING until the next reap: %s (run %s)",
                job.key,
                execution.run_id,
                exc_info=True,
                extra=execution.log_extra,
            )
            recorded = "unrecorded"
        else:
            recorded = "settled" if written else "superseded"
            if not written and retried:
                logger.warning(
                    "job run was already settled when its final write was tried again: an "
                    "earlier try whose answer was lost may have written it, or a reaper "
                    "settled it: %s (run %s)",
                    job.key,
                    execution.run_id,
                    extra=execution.log_extra,
                )
            elif not written:
                logger.warning(
                    "job run was already settled by a reaper: this body may be a second "
                    "run: %s (run %s)",
                    job.key,
                    execution.run_id,
                    extra=execution.log_extra,
                )
        return JobExecutionResult(
            run_id=execution.run_id,
            job_key=job.key,
            status=status,
            duration_ms=duration_ms,
            recorded=recorded,
            summary=summary,
            error=error_text,
            reason=verdict.reason,
        )

    def _complete(self, execution: RunExecution, **outcome: Any) -> tuple[bool, bool]:
        """Write the outcome; ``(written, retried)``. A retryable :class:`StoreError` (the
        database restarting, a conflict, a timeout) is tried again until
        ``stale_run_after`` has passed: by then a reaper may settle the row anyway, and
        the caller has waited long enough. The row is fenced by its RUNNING status, so a
        second try never overwrites another outcome."""
        deadline = time.monotonic() + self.stale_run_after.total_seconds()
        delay = _COMPLETE_RETRY_FIRST_SECONDS
        retried = False
        while True:
            try:
                return self.store.complete(run_id=execution.run_id, **outcome), retried
            except StoreError as exc:
                if not exc.retryable or time.monotonic() + delay > deadline:
                    raise
                logger.warning(
                    "job run finalize failed, trying again in %.1f s: %s (run %s): %s",
                    delay,
                    execution.job_key,
                    execution.run_id,
                    exc,
                    extra=execution.log_extra,
                )
            discard_connection(self.store)
            time.sleep(delay)
            delay = min(delay * 2, _COMPLETE_RETRY_MAX_SECONDS)
            retried = True


def _run_body(execution: RunExecution, job: OperationsJob, ctx: RunContext, value: Any) -> None:
    try:
        try:
            result = job.func(ctx, value)
        # Nothing above a worker thread could handle the exception; it becomes the outcome.
        except BaseException as exc:
            execution.body_finished(error=exc)
        else:
            execution.body_finished(value=result)
    finally:
        connections.close_all()
