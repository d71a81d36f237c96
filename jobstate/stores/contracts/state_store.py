"""The state store's contract (the job part of RuntimeStateStore): the job queue, the
audit ledger, runtime locks and the optional extensions (outbox, approvals, replay,
readiness, metrics).

:class:`StateStore` works like Django's ``SessionBase``: its public methods hold the
behaviour every store shares (argument checks, defaults, and the transitions written
once over primitives: refire, reject, approval) and call the protected primitives a
backend implements (:class:`~jobstate.stores.contracts.primitives.StateStorePrimitives`).
The required half of the public API lives in :mod:`jobstate.stores.contracts.queue_part`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobstate.core.states import (
    TERMINAL_JOB_STATUSES,
    ApprovalRequeueOutcome,
    DeliveryRequeueOutcome,
    JobId,
    JobOperationalMetrics,
    JobStatus,
    NotificationRequest,
    Readiness,
)
from jobstate.exceptions import InvalidJobState, LockHeld
from jobstate.stores.contracts.audit import AuditStage
from jobstate.stores.contracts.outbox_repository import NotificationOutbox
from jobstate.stores.contracts.primitives import METRICS_TERMINAL_WINDOW, MONITOR_SOURCE
from jobstate.stores.contracts.queue_part import CompletionResult
from jobstate.stores.contracts.state_validation import (
    CLEARED_CLAIM,
    JOB_COMPLETION_FIELDS,
    validate_approval_arguments,
    validate_notification_requests,
    validate_reject_arguments,
    validate_requeue_arguments,
)
from jobstate.stores.contracts.tasks_part import TaskStateStore
from jobstate.stores.contracts.validation import (
    clean_job_fields,
    parse_statuses,
    parse_uuid,
    require_text,
    validate_instant,
)

if TYPE_CHECKING:
    from jobstate.models import Job
    from jobstate.stores.contracts.sweep_store import SweepStore

__all__ = [
    "METRICS_TERMINAL_WINDOW",
    "MONITOR_SOURCE",
    "NO_DELIVERY_KEY",
    "CompletionResult",
    "NotificationOutbox",
    "StateStore",
    "runtime_lock",
]

#: ``metadata`` key that suppresses delivery of a job's result; a refired job delivers
#: again, so the refire drops it.
NO_DELIVERY_KEY = "no_delivery"


class _Superseded(Exception):
    """Rolls back an approval's block: the job was requeued by someone else."""


class StateStore(TaskStateStore):
    """Persistence port for the job queue, the audit ledger and runtime locks (the job
    part of the RuntimeStateStore contract).

    Guarantees every implementation keeps (checked by
    :func:`jobstate.testing.state_contract.state_store_contract_cases`):

    - **Idempotent intake**: ``request_id`` is unique; ``create_job`` refuses a duplicate
      with :class:`~jobstate.exceptions.DuplicateRequestId`, ``enqueue`` returns the
      existing job for the same request and refuses a different payload.
    - **Whitelisted patches**: updates write only the fields they are given, from
      :data:`JOB_PATCH_FIELDS`; ``None`` clears a nullable field; identity fields cannot be
      patched; ``updated_at`` moves to the store's clock on every write.
    - **Atomic claims**: a queued job is claimed by at most one caller; a claim takes the
      oldest ready job of the given targets, skips jobs whose ``run_after`` is in the
      future, and never starts a job of a thread that has running or dispatched work or
      an earlier ready queued job (per-thread FIFO). Each claim gets a fresh
      ``claim_token``; ``claimed_at`` and ``lease_until`` come from the store's clock.
    - **Fenced reports**: ``complete_claimed_job`` and ``extend_claim_lease`` write only
      while the caller's ``claim_token`` is the job's current one.
    - **Conditional maintenance**: requeue and expiry move only rows that still qualify
      when they are written, and count only those.
    - **Runtime locks**: at most one owner holds a lock key until it expires or is
      released; the owner may renew; a non-owner's release does nothing.

    Instants handed in (``run_after``, ``lease_until``, an audit ``at``) are stored
    verbatim and must be aware; durations are :class:`datetime.timedelta`. Bad input
    raises before anything is written.

    Every public method is concrete: it checks its arguments once and calls the
    primitives of :class:`~jobstate.stores.contracts.primitives.StateStorePrimitives`, which
    a backend implements. Optional capabilities are declared by that class's
    ``supports_*`` flags; a method whose flag is off raises
    :class:`~jobstate.exceptions.UnsupportedStoreOperation` before anything else.
    """

    # --- transitions written once: refire, reject, approval ---------------------------

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

    def reject_queued_job(self, job_id: JobId, *, by: str, reason: str = "") -> Job | None:
        """Cancel a job that is still ``queued``: it becomes ``rejected`` with ``error``
        set to ``reason`` (or ``"rejected by <by>"``), and a ``rejected`` audit entry
        naming ``by`` and ``reason`` is written in the same transaction. ``None`` (and
        nothing written) when the job is gone or no longer queued, e.g. claimed
        meanwhile. ``reason`` is at most 2000 characters."""
        pk = parse_uuid(job_id, field="job_id")
        error = validate_reject_arguments(by, reason)
        changes = {"status": JobStatus.REJECTED, "error": error}
        with self._atomic():
            job = self._update_job(pk, changes, [JobStatus.QUEUED])
            if job is not None:
                detail = {"by": by, "reason": error, "prev_status": JobStatus.QUEUED.value}
                self.append_audit(job=job, event="rejected", detail=detail)
            return job

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
            job = self._lock_job(pk)
            if job is None or job.status not in TERMINAL_JOB_STATUSES:
                return None
            if not self._delete_job(pk, [JobStatus(job.status)]):
                return None
            detail = {"by": by, "via": via, "prev_status": job.status}
            self.append_audit(job=job.pk, request_id=job.request_id, event="deleted", detail=detail)
            return job

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
            return self._requeue_batch(pairs, by=by, via=via, event=event)

    def reject_queued_jobs(
        self, job_ids: Sequence[JobId], *, by: str, reason: str = ""
    ) -> list[uuid.UUID]:
        """:meth:`reject_queued_job` for a batch of jobs, in one transaction; the ids
        rejected (those still queued)."""
        pks = [parse_uuid(pk, field="job_id") for pk in job_ids]
        error = validate_reject_arguments(by, reason)
        if not pks:
            return []
        with self._atomic():
            return self._reject_batch(pks, by=by, error=error)

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
            return self._delete_batch(pks, by=by, via=via)

    def _requeue_batch(
        self, jobs: list[tuple[uuid.UUID, JobStatus]], *, by: str, via: str, event: str
    ) -> list[uuid.UUID]:
        """:meth:`requeue_jobs` on checked arguments, inside its transaction. This
        default refires one job at a time; a backend may override it with set-based
        statements that keep the same checks."""
        requeued = []
        for pk, status in jobs:
            if status not in TERMINAL_JOB_STATUSES:
                held = self._lock_job(pk, lease_ended=True)
                if held is None or held.status != status:
                    continue
            if self._refire(pk, [status], by=by, via=via, event=event) is not None:
                requeued.append(pk)
        return requeued

    def _reject_batch(self, pks: list[uuid.UUID], *, by: str, error: str) -> list[uuid.UUID]:
        """:meth:`reject_queued_jobs` on checked arguments (default: one at a time)."""
        rejected = []
        for pk in pks:
            job = self._update_job(
                pk, {"status": JobStatus.REJECTED, "error": error}, [JobStatus.QUEUED]
            )
            if job is not None:
                detail = {"by": by, "reason": error, "prev_status": JobStatus.QUEUED.value}
                self.append_audit(job=job, event="rejected", detail=detail)
                rejected.append(pk)
        return rejected

    def _delete_batch(self, pks: list[uuid.UUID], *, by: str, via: str) -> list[uuid.UUID]:
        """:meth:`delete_finished_jobs` on checked arguments (default: one at a time)."""
        deleted = []
        for pk in pks:
            job = self._lock_job(pk)
            if job is None or job.status not in TERMINAL_JOB_STATUSES:
                continue
            if self._delete_job(pk, [JobStatus(job.status)]):
                detail = {"by": by, "via": via, "prev_status": job.status}
                self.append_audit(job=pk, request_id=job.request_id, event="deleted", detail=detail)
                deleted.append(pk)
        return deleted

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
            metadata = {
                key: value for key, value in held.metadata.items() if key != NO_DELIVERY_KEY
            }
            changes: dict[str, Any] = {
                "status": JobStatus.QUEUED,
                "attempts": 0,
                "run_after": None,
                "error": None,
                "metadata": metadata,
                **CLEARED_CLAIM,
            }
            detail: dict[str, Any] = {"by": by, "via": via, "prev_status": prev_status.value}
            if held.attempt_log is not None:
                # A task starts over: its TaskResult counts the attempts since the refire.
                # The entry keeps the count of the attempts it had before.
                changes["attempt_log"] = []
                detail["previous_attempts"] = len(held.attempt_log)
            job = self._update_job(pk, changes, [prev_status])
            if job is not None:
                self.append_audit(job=job, event=event, detail=detail)
            return job

    # --- optional: outbox, replay, observability -------------------------------------

    def complete_job_with_notifications(
        self,
        original: Job,
        patch: dict[str, Any],
        notifications: Iterable[NotificationRequest] = (),
    ) -> Job | None:
        """Fenced terminal transition plus outbox rows in one transaction: applies
        ``patch`` (its ``status`` must be terminal) only while the job is still in
        ``original.status`` with ``original.claim_token``, clears the claim fields, writes
        a ``finished`` audit entry and one ``Notification`` per request. Nothing is sent
        inside the transaction. A stale ``original`` writes nothing and returns ``None``.

        An ``original`` that is already terminal is settled, so it also answers ``None``.
        ``patch`` may not name claim fields (they are cleared). Each notification's
        idempotency key defaults to
        :func:`~jobstate.stores.contracts.state_validation.default_idempotency_key`; a key already
        in the outbox raises :class:`~jobstate.exceptions.DuplicateNotification` and
        rolls back the whole transition. Runs in the caller's transaction when there is
        one, so the caller can add its own writes to the same commit."""
        from jobstate.models import Job

        self._require(self.supports_outbox, "supports_outbox", "complete_job_with_notifications")
        if not isinstance(original, Job):
            raise InvalidJobState(f"original must be a Job, got {type(original).__name__}.")
        if not isinstance(patch, dict):
            raise InvalidJobState(f"patch must be a dict, got {type(patch).__name__}.")
        cleaned = clean_job_fields(
            patch, allowed=JOB_COMPLETION_FIELDS, action="complete_job_with_notifications"
        )
        status = cleaned.get("status")
        if status not in TERMINAL_JOB_STATUSES:
            raise InvalidJobState(
                "complete_job_with_notifications needs a terminal status in patch "
                f"(done, error or rejected), got {status!r}."
            )
        requests = validate_notification_requests(original, notifications)
        if original.status in TERMINAL_JOB_STATUSES:
            return None
        return self._complete_with_notifications(original, cleaned, requests)

    @property
    def notification_outbox(self) -> NotificationOutbox:
        """The outbox repository relays use (claim due rows, mark delivered or failed)."""
        self._require(self.supports_outbox, "supports_outbox", "notification_outbox")
        return self._notification_outbox()

    def requeue_delivery_job_once(
        self, *, notification_id: JobId, dlq_key: str, requested_by: str
    ) -> DeliveryRequeueOutcome:
        """Send a dead notification (the original row, never a copy) back to pending
        together with a permanent :class:`~jobstate.models.DeliveryReplay` marker for
        ``dlq_key``, in one transaction; a key replays at most once. A key already used
        for this notification answers ``ALREADY_REQUEUED``, one used for another
        notification ``KEY_CONFLICT``."""
        self._require(
            self.supports_delivery_replay, "supports_delivery_replay", "requeue_delivery_job_once"
        )
        pk = parse_uuid(notification_id, field="notification_id")
        require_text(dlq_key, field="dlq_key")
        require_text(requested_by, field="requested_by")
        return self._requeue_delivery(pk, dlq_key, requested_by)

    def operational_metrics_snapshot(
        self, now: datetime | None = None, *, exact: bool = False
    ) -> JobOperationalMetrics:
        """The six operational figures at ``now`` (default: the store's clock). A store
        may estimate the counts of finished jobs on a large table (it names them in
        ``estimated_statuses``); ``exact=True`` asks for exact counts whatever they cost."""
        self._require(self.supports_metrics, "supports_metrics", "operational_metrics_snapshot")
        instant = None if now is None else validate_instant(now, field="now")
        return self._metrics_snapshot(instant, exact)

    def schema_readiness(self) -> Readiness:
        """Whether the store's schema is usable. Never raises: any error means not ready."""
        self._require(self.supports_readiness, "supports_readiness", "schema_readiness")
        return self._schema_readiness()

    def sweep_store(self) -> SweepStore:
        """A new :class:`~jobstate.stores.contracts.sweep_store.SweepStore` over this store's jobs,
        audit
        entries, locks and outbox, for one sweep of :mod:`jobstate.maintenance`."""
        self._require(self.supports_sweeps, "supports_sweeps", "sweep_store")
        return self._sweep_store()


def _decided(decided_job: uuid.UUID, pk: uuid.UUID) -> ApprovalRequeueOutcome:
    if decided_job == pk:
        return ApprovalRequeueOutcome.ALREADY_REQUEUED
    return ApprovalRequeueOutcome.DECISION_CONFLICT


@contextmanager
def runtime_lock(store: StateStore, lock_key: str, owner: str, ttl: timedelta) -> Iterator[None]:
    """Hold a runtime lock for the ``with`` block and release it afterwards.

    Raises :class:`~jobstate.exceptions.LockHeld` (and runs nothing) when another owner
    holds the key. The lock is not renewed while the block runs: pick a ``ttl`` longer
    than the block, or renew with ``acquire_runtime_lock`` from inside it.
    """
    if not store.acquire_runtime_lock(lock_key, owner, ttl):
        raise LockHeld(f"runtime lock {lock_key!r} is held by another owner.", lock_key=lock_key)
    try:
        yield
    finally:
        store.release_runtime_lock(lock_key, owner)
