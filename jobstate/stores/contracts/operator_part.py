"""The state store's operator transitions on one job: cancel it, bring a task's retry
forward, discard a task.

Each takes a job only while it is in the state the matching :class:`~jobstate.models.JobQuerySet`
rule names (``cancellable``, ``retryable_now``, ``discardable``; the console's buttons
and actions ask the same rule), checks that state with the job held until its write
commits, and writes an audit entry naming the operator in the same transaction. ``None``
(and nothing written) when the job is gone or no longer in that state.

A cancel revokes a claim by clearing its ``claim_token``, so the holder's later report
or lease renewal is refused by the fencing every report goes through: of a cancel and a
completion at the same moment exactly one is written.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from jobstate.core.attempt_log import (
    AttemptOutcome,
    TaskAttempt,
    attempt_history,
    bounded_log,
    error_summary,
)
from jobstate.core.states import CLAIMED_JOB_STATUSES, JobId, JobStatus
from jobstate.exceptions import TaskCancelled
from jobstate.stores.contracts.ledger_part import LedgerPart
from jobstate.stores.contracts.validation import (
    CLEARED_CLAIM,
    REJECT_REASON_LIMIT,
    optional_text,
    parse_claim_pairs,
    parse_uuid,
    require_text,
)

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = ["OperatorPart", "operator_error"]

_CANCELLED_PATH = f"{TaskCancelled.__module__}.{TaskCancelled.__qualname__}"


def operator_error(verb: str, by: str, reason: str) -> str:
    """The ``error`` an operator's transition leaves: ``"<verb> by <by>[: <reason>]"``."""
    text = f"{verb} by {by}"
    return f"{text}: {reason}" if reason else text


def _operator_arguments(by: str, reason: str) -> str:
    require_text(by, field="by")
    optional_text(reason, field="reason", limit=REJECT_REASON_LIMIT)
    return reason.strip()


class OperatorPart(LedgerPart):
    """See the module docstring and
    :class:`~jobstate.stores.contracts.state_store.StateStore` for the guarantees."""

    def cancel_job(self, job_id: JobId, *, by: str, reason: str = "") -> Job | None:
        """Cancel a job that has not finished (``JobQuerySet.cancellable``): it becomes
        ``rejected`` with ``error`` ``"cancelled by <by>[: <reason>]"`` and a
        ``cancelled`` audit entry (``by``, ``reason``, ``prev_status``, and the claim's
        holder for a claimed job). A queued job is so rejected before anything claims it.
        A running or dispatched job also loses its claim (``claim_token`` and the lease
        cleared), so its holder's report and lease renewal are refused; a task's
        attempt is logged as ``cancelled`` with :class:`~jobstate.exceptions.TaskCancelled`.
        The worker running a task interrupts it when it sees the claim gone (see
        ``jobstate.tasks`` docs). ``None`` (nothing written) when the job is gone or
        finished, e.g. completed meanwhile. ``reason`` is at most 2000 characters."""
        pk = parse_uuid(job_id, field="job_id")
        reason = _operator_arguments(by, reason)
        with self._atomic():
            held = self._lock_job(pk)
            if held is None or not held.cancellable_now():
                return None
            prev = JobStatus(held.status)
            error = operator_error("cancelled", by, reason)
            changes: dict[str, Any] = {"status": JobStatus.REJECTED, "error": error}
            detail: dict[str, Any] = {"by": by, "reason": reason, "prev_status": prev.value}
            if prev in CLAIMED_JOB_STATUSES:
                changes.update(CLEARED_CLAIM)
                detail["holder"] = held.executor_id or ""
                if held.task_path is not None:
                    record = _cancelled_attempt(held, error)
                    changes["error"] = error_summary(record)
                    changes["attempt_log"] = bounded_log(
                        [*attempt_history(list(held.attempt_log or ())), record]
                    )
                    detail["attempt"] = held.attempts
            job = self._update_job(pk, changes, [prev])
            if job is not None:
                self.append_audit(job=job, event="cancelled", detail=detail)
            return job

    def retry_job_now(self, job_id: JobId, *, by: str) -> Job | None:
        """Make a task waiting out a retry's backoff (``JobQuerySet.retryable_now``:
        queued after an attempt, ``run_after`` set) claimable at once: ``run_after``
        cleared, so it is due (and claimed) as if its backoff had ended, with a
        ``retry_now`` audit entry (``by``, the ``run_after`` it had). ``None`` (nothing
        written) when the job is gone, claimed, finished or not waiting."""
        pk = parse_uuid(job_id, field="job_id")
        require_text(by, field="by")
        with self._atomic():
            held = self._lock_job(pk)
            if held is None or not held.waiting_for_retry():
                return None
            assert held.run_after is not None
            job = self._update_job(pk, {"run_after": None}, [JobStatus.QUEUED])
            if job is not None:
                detail = {"by": by, "run_after": held.run_after.isoformat()}
                self.append_audit(job=job, event="retry_now", detail=detail)
            return job

    def discard_job(self, job_id: JobId, *, by: str, reason: str = "") -> Job | None:
        """Give up a queued task (``JobQuerySet.discardable``: waiting for a retry or
        for its first attempt): it becomes ``error``, attempts left unused, with
        ``error`` ``"discarded by <by>[: <reason>]"`` and a ``discarded`` audit entry
        (``by``, ``reason``, the attempts it had). Its attempt log is kept as it was.
        ``None`` (nothing written) when the job is gone, no task, or no longer queued
        (claimed meanwhile: cancel it instead)."""
        pk = parse_uuid(job_id, field="job_id")
        reason = _operator_arguments(by, reason)
        with self._atomic():
            held = self._lock_job(pk)
            if held is None or not held.discardable_now():
                return None
            error = operator_error("discarded", by, reason)
            changes = {"status": JobStatus.ERROR, "error": error, "run_after": None}
            job = self._update_job(pk, changes, [JobStatus.QUEUED])
            if job is not None:
                detail = {"by": by, "reason": reason, "attempts": held.attempts}
                self.append_audit(job=job, event="discarded", detail=detail)
            return job

    def lost_claims(
        self, claims: Sequence[tuple[JobId, uuid.UUID | str]]
    ) -> dict[uuid.UUID, JobStatus | None]:
        """Which of these ``(job id, claim token)`` claims are no longer their job's
        current one, with the job's status now (``None``: the job is gone); a claim still
        held is left out. A read only: a worker asks it every turn of its loop for the
        tasks it runs, to stop at once a task that was cancelled (``rejected``)."""
        pairs = parse_claim_pairs(claims)
        if not pairs:
            return {}
        now = self._claims_now([pk for pk, _token in pairs])
        lost: dict[uuid.UUID, JobStatus | None] = {}
        for pk, token in pairs:
            status, current = now.get(pk, (None, None))
            if status is None or current != token or status not in CLAIMED_JOB_STATUSES:
                lost[pk] = status
        return lost


def _cancelled_attempt(job: Job, error: str) -> TaskAttempt:
    return TaskAttempt(
        worker_id=job.executor_id or "",
        started_at=job.claimed_at,
        finished_at=timezone.now(),
        outcome=AttemptOutcome.CANCELLED,
        exception_class_path=_CANCELLED_PATH,
        traceback=f"{_CANCELLED_PATH}: {error}\n",
        message=error,
    )
