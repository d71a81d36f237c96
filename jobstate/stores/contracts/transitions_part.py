"""The state store's transitions, each written once over the primitives: the refire
(reruns, approvals, the recovery of expired leases), reject and delete, the same over a
batch of jobs (the console's bulk actions), and the approval that requeues exactly once.

What a requeue writes is defined here once (:data:`REQUEUED`, :func:`delivering_metadata`,
:func:`requeue_detail`); the database store's set-based batch writes the same. Which jobs
may be requeued is :meth:`~jobstate.models.JobQuerySet.requeueable`: finished ones, and
claimed ones whose lease has ended.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from jobstate.core.states import (
    TERMINAL_JOB_STATUSES,
    ApprovalRequeueOutcome,
    JobId,
    JobStatus,
)
from jobstate.exceptions import UniqueTaskHeld
from jobstate.stores.contracts.audit import AuditStage
from jobstate.stores.contracts.ledger_part import LedgerPart
from jobstate.stores.contracts.validation import (
    CLEARED_CLAIM,
    parse_statuses,
    parse_uuid,
    validate_approval_arguments,
    validate_reject_arguments,
    validate_requeue_arguments,
)

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = [
    "NO_DELIVERY_KEY",
    "REQUEUED",
    "TransitionsPart",
    "delivering_metadata",
    "requeue_detail",
]

#: ``metadata`` key that suppresses delivery of a job's result; a refired job delivers
#: again, so the refire drops it.
NO_DELIVERY_KEY = "no_delivery"

#: What every requeue writes besides ``metadata`` (:func:`delivering_metadata`) and,
#: for a task, an emptied ``attempt_log``: back to the queue, attempts reset, no delay,
#: no error, no claim.
REQUEUED: dict[str, Any] = {
    "status": JobStatus.QUEUED,
    "attempts": 0,
    "run_after": None,
    "error": None,
    **CLEARED_CLAIM,
}


def delivering_metadata(metadata: Any) -> Any:
    """A requeued job's ``metadata``: as it was, without :data:`NO_DELIVERY_KEY`."""
    if not isinstance(metadata, dict):
        return metadata
    return {key: value for key, value in metadata.items() if key != NO_DELIVERY_KEY}


def reject_detail(by: str, error: str, via: str) -> dict[str, Any]:
    """The detail of a reject's audit entry; ``via`` (what made the change, e.g.
    ``bulk:<id>``, which the audit list's ``?bulk=`` filter reads) only when given."""
    detail = {"by": by, "reason": error, "prev_status": JobStatus.QUEUED.value}
    return {**detail, "via": via} if via else detail


def requeue_detail(
    by: str, via: str, prev_status: str, attempt_log: list[Any] | None
) -> dict[str, Any]:
    """The detail of a requeue's audit entry. A task starts over (its TaskResult counts
    the attempts since the refire); its entry keeps the count of the attempts it had."""
    detail: dict[str, Any] = {"by": by, "via": via, "prev_status": str(prev_status)}
    if attempt_log is not None:
        detail["previous_attempts"] = len(attempt_log)
    return detail


class _Superseded(Exception):
    """Rolls back an approval's block: the job was requeued by someone else."""


class TransitionsPart(LedgerPart):
    """The transitions; see the module docstring and
    :class:`~jobstate.stores.contracts.state_store.StateStore` for the guarantees."""

    def requeue_job(
        self,
        job_id: JobId,
        *,
        from_statuses: Sequence[str],
        by: str,
        via: str,
        event: str = "rerun",
    ) -> Job | None:
        """The refire transition shared by reruns, approvals and recovery: while the job
        is still in one of ``from_statuses``, put it back to ``queued`` with attempts
        reset, ``run_after``/``error`` and every claim field cleared (and a task's attempt
        log emptied), and write an audit entry ``event`` naming ``by`` and ``via`` in the
        same transaction. ``None`` (and
        nothing written) when the job is gone or no longer in those statuses.

        The job is held (:meth:`_lock_job`) from the read of its status to the commit, so
        the audit entry's ``prev_status`` is exactly the status the refire replaced.
        ``metadata['no_delivery']`` is removed. Runs in the caller's transaction when
        there is one."""
        pk = parse_uuid(job_id, field="job_id")
        statuses = validate_requeue_arguments(from_statuses, by, via, event)
        return self._refire(pk, statuses, by=by, via=via, event=event) if statuses else None

    def requeue_expired_lease_job(
        self, job_id: JobId, *, by: str, via: str, event: str = "rerun"
    ) -> Job | None:
        """The refire transition (:meth:`requeue_job`) for a running or dispatched job
        whose ``lease_until`` is before the store's clock. The lease is checked with the
        job held against concurrent writers until the refire commits, so a holder that
        renews or reports at that moment either wins (nothing written, ``None``) or
        finds its claim gone. ``None`` too when the job is gone, not claimed, has no
        lease or a lease still running."""
        pk = parse_uuid(job_id, field="job_id")
        validate_requeue_arguments([JobStatus.RUNNING], by, via, event)
        with self._atomic():
            job = self._lock_job(pk, lease_ended=True)
            if job is None:
                return None
            statuses = [JobStatus(job.status)]
            return self._refire(pk, statuses, by=by, via=via, event=event)

    def reject_queued_job(
        self, job_id: JobId, *, by: str, reason: str = "", via: str = ""
    ) -> Job | None:
        """Cancel a job that is still ``queued``: it becomes ``rejected`` with ``error``
        set to ``reason`` (or ``"rejected by <by>"``), and a ``rejected`` audit entry
        naming ``by``, ``reason`` and ``via`` (when given) is written in the same
        transaction. ``None`` (and nothing written) when the job is gone or no longer
        queued, e.g. claimed meanwhile. ``reason`` is at most 2000 characters."""
        pk = parse_uuid(job_id, field="job_id")
        error = validate_reject_arguments(by, reason, via)
        with self._atomic():
            return self._reject(pk, by=by, error=error, via=via)

    def delete_finished_job(self, job_id: JobId, *, by: str, via: str) -> Job | None:
        """Delete a job that is done, error or rejected, and write a ``deleted`` audit
        entry naming ``by`` and ``via`` (with the job's id, request id and last status;
        audit entries outlive their job) in the same transaction. The job is held from
        the read of its status to the delete, so a job requeued or claimed meanwhile is
        never deleted: ``None`` (and nothing written) when it is gone or not finished.
        Returns the job as it was before the delete."""
        self._require(self.supports_job_deletion, "supports_job_deletion", "delete_finished_job")
        pk = parse_uuid(job_id, field="job_id")
        validate_requeue_arguments([JobStatus.DONE], by, via, "deleted")
        with self._atomic():
            return self._delete(pk, by=by, via=via)

    # --- the same transitions over a batch of jobs (the console's bulk actions) -------

    def requeue_jobs(
        self,
        jobs: Sequence[tuple[JobId, str]],
        *,
        by: str,
        via: str,
        event: str = "rerun",
    ) -> list[uuid.UUID]:
        """The refire transition (:meth:`requeue_job`) for a batch of ``(job id, status
        it was seen in)`` pairs, in one transaction: a finished job is requeued while it
        is still in that status; a running or dispatched one while it is still in it and
        its lease has ended on the store's clock (:meth:`requeue_expired_lease_job`).
        Each job is checked while held, and each requeued one gets the audit entry
        :meth:`requeue_job` writes. Returns the ids requeued; the rest are untouched."""
        pairs = [
            (parse_uuid(pk, field="job_id"), parse_statuses([status])[0]) for pk, status in jobs
        ]
        validate_requeue_arguments([JobStatus.DONE], by, via, event)
        if not pairs:
            return []
        with self._atomic():
            requeued = self._requeue_batch(pairs, by=by, via=via, event=event)
            if requeued is None:
                requeued = [
                    pk for pk, status in pairs if self._refire_seen(pk, status, by, via, event)
                ]
            return requeued

    def reject_queued_jobs(
        self, job_ids: Sequence[JobId], *, by: str, reason: str = "", via: str = ""
    ) -> list[uuid.UUID]:
        """:meth:`reject_queued_job` for a batch of jobs, in one transaction; the ids
        rejected (those still queued)."""
        pks = [parse_uuid(pk, field="job_id") for pk in job_ids]
        error = validate_reject_arguments(by, reason, via)
        if not pks:
            return []
        with self._atomic():
            rejected = self._reject_batch(pks, by=by, error=error, via=via)
            if rejected is None:
                rejected = [
                    pk for pk in pks if self._reject(pk, by=by, error=error, via=via) is not None
                ]
            return rejected

    def delete_finished_jobs(
        self, job_ids: Sequence[JobId], *, by: str, via: str
    ) -> list[uuid.UUID]:
        """:meth:`delete_finished_job` for a batch of jobs, in one transaction; the ids
        deleted (those still done, error or rejected)."""
        self._require(self.supports_job_deletion, "supports_job_deletion", "delete_finished_jobs")
        pks = [parse_uuid(pk, field="job_id") for pk in job_ids]
        validate_requeue_arguments([JobStatus.DONE], by, via, "deleted")
        if not pks:
            return []
        with self._atomic():
            deleted = self._delete_batch(pks, by=by, via=via)
            if deleted is None:
                deleted = [pk for pk in pks if self._delete(pk, by=by, via=via) is not None]
            return deleted

    # --- each transition on one job, on checked arguments ----------------------------

    def _refire_seen(self, pk: uuid.UUID, status: JobStatus, by: str, via: str, event: str) -> bool:
        """One job of :meth:`requeue_jobs`: refired while still in the ``status`` it was
        seen in and requeueable (a claimed one only once its lease has ended)."""
        if status not in TERMINAL_JOB_STATUSES:
            held = self._lock_job(pk, lease_ended=True)
            if held is None or held.status != status:
                return False
        try:
            return self._refire(pk, [status], by=by, via=via, event=event) is not None
        except UniqueTaskHeld:
            # A unique task whose key a newer job holds stays as it is, as in a batch.
            return False

    def _reject(self, pk: uuid.UUID, *, by: str, error: str, via: str) -> Job | None:
        """:meth:`reject_queued_job` on checked arguments, inside a unit of work."""
        job = self._update_job(
            pk, {"status": JobStatus.REJECTED, "error": error}, [JobStatus.QUEUED]
        )
        if job is not None:
            self.append_audit(job=job, event="rejected", detail=reject_detail(by, error, via))
        return job

    def _delete(self, pk: uuid.UUID, *, by: str, via: str) -> Job | None:
        """:meth:`delete_finished_job` on checked arguments, inside a unit of work."""
        job = self._lock_job(pk)
        if job is None or job.status not in TERMINAL_JOB_STATUSES:
            return None
        if not self._delete_job(pk, [JobStatus(job.status)]):
            return None
        detail = {"by": by, "via": via, "prev_status": job.status}
        self.append_audit(job=job.pk, request_id=job.request_id, event="deleted", detail=detail)
        return job

    def requeue_approved_job_once(
        self, *, job_id: JobId, decision_id: str, approver: str, comment: str = ""
    ) -> ApprovalRequeueOutcome:
        """Requeue a terminal job for an approval exactly once per ``decision_id``: the
        refire transition and a permanent :class:`~jobstate.models.ApprovalDecision`
        marker in one transaction, with an audit entry naming the approver.

        The job is held first, so concurrent approvals of one job (same or different
        ``decision_id``) run one after another and each later one sees either its own
        marker (``ALREADY_REQUEUED``) or the job back in the queue (``JOB_IN_FLIGHT``).
        A ``decision_id`` raced for two jobs is settled by the marker: the loser answers
        ``DECISION_CONFLICT``. On ``REQUEUED`` the audit has an ``approved`` entry (stage
        approval: approver, decision, comment) and the ``rerun`` entry of the refire."""
        self._require(self.supports_approvals, "supports_approvals", "requeue_approved_job_once")
        pk = parse_uuid(job_id, field="job_id")
        validate_approval_arguments(decision_id, approver, comment)
        with self._atomic():
            job = self._lock_job(pk)
            if job is None:
                return ApprovalRequeueOutcome.NOT_FOUND
            decided = self._recorded_decision(decision_id)
            if decided is not None:
                return _decided(decided, pk)
            if job.status not in TERMINAL_JOB_STATUSES:
                return ApprovalRequeueOutcome.JOB_IN_FLIGHT
            try:
                # An inner block: a job that left its terminal status in spite of the
                # hold undoes the marker and the audit entry.
                with self._atomic():
                    winner = self._record_decision(decision_id, pk, approver, comment)
                    if winner is not None:
                        return _decided(winner, pk)
                    self.append_audit(
                        job=job,
                        event="approved",
                        stage=AuditStage.APPROVAL,
                        title="Approved",
                        summary=f"approved by {approver}" + (f": {comment}" if comment else ""),
                        detail={
                            "decision_id": decision_id,
                            "approver": approver,
                            "comment": comment,
                        },
                    )
                    statuses = [JobStatus(job.status)]
                    if (
                        self._refire(pk, statuses, by=approver, via=f"approval:{decision_id}")
                        is None
                    ):
                        raise _Superseded
            except _Superseded:
                return ApprovalRequeueOutcome.JOB_IN_FLIGHT
            return ApprovalRequeueOutcome.REQUEUED

    def _refire(
        self, pk: uuid.UUID, statuses: list[JobStatus], *, by: str, via: str, event: str = "rerun"
    ) -> Job | None:
        """:meth:`requeue_job` on checked arguments."""
        with self._atomic():
            held = self._lock_job(pk)
            if held is None or held.status not in statuses:
                return None
            prev_status = JobStatus(held.status)
            # The job is held until the block ends, so no writer can change metadata
            # between this read and the write below.
            changes = {**REQUEUED, "metadata": delivering_metadata(held.metadata)}
            if held.attempt_log is not None:
                changes["attempt_log"] = []
            detail = requeue_detail(by, via, prev_status, held.attempt_log)
            job = self._update_job(pk, changes, [prev_status])
            if job is not None:
                self.append_audit(job=job, event=event, detail=detail)
            return job


def _decided(decided_job: uuid.UUID, pk: uuid.UUID) -> ApprovalRequeueOutcome:
    if decided_job == pk:
        return ApprovalRequeueOutcome.ALREADY_REQUEUED
    return ApprovalRequeueOutcome.DECISION_CONFLICT
