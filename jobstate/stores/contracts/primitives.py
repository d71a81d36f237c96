"""What a state store backend implements: every protected primitive behind the public
methods of :class:`~jobstate.stores.contracts.state_store.StateStore`, in this one module.

A backend author reads this class and nothing else to know what to write; the public
methods, their argument checks, audit entries and defaults live in the capability parts
(:mod:`~jobstate.stores.contracts.queue_part`, ``ledger_part``, ``transitions_part``,
``operator_part``, ``fleet_part``, ``tasks_part``, ``optional_part``) and call these.

The public methods validate their arguments once and then call these with clean
values: ids are :class:`uuid.UUID`, statuses :class:`~jobstate.core.states.JobStatus`,
durations positive or zero :class:`~datetime.timedelta` (defaults already applied),
instants aware and in UTC, patches checked by
:func:`~jobstate.stores.contracts.validation.clean_job_fields`, limits positive ints, and a target
scope a non-empty list (``None`` where the caller did not narrow). A primitive never
re-checks them; it keeps the guarantee its public method documents, atomically, on the
store's own clock.

A backend implements every abstract primitive. ``_claim_batch``,
``_complete_claimed_batch``, ``_extend_claim_leases`` and ``_complete_and_claim_tasks``
have portable defaults built from the other primitives, and the batch transitions
(``_requeue_batch``, ``_reject_batch``, ``_delete_batch``) default to ``None``, which
tells the base to apply the single-job transition to each job; a backend overrides them
for a faster path.
The primitives of an optional capability are implemented only by a backend that sets
its ``supports_*`` flag; their defaults raise
:class:`~jobstate.exceptions.UnsupportedStoreOperation`.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, ClassVar

from jobstate.core.states import (
    DeliveryRequeueOutcome,
    JobOperationalMetrics,
    JobStatus,
    NotificationRequest,
    Readiness,
)
from jobstate.exceptions import UnsupportedStoreOperation
from jobstate.stores.contracts.operational_figures import operational_metrics
from jobstate.stores.contracts.task_primitives import TaskPrimitives
from jobstate.stores.contracts.validation import ParsedReport

if TYPE_CHECKING:
    from jobstate.models import AuditEntry, Job
    from jobstate.stores.contracts.audit import AuditFields
    from jobstate.stores.contracts.outbox_repository import NotificationOutbox
    from jobstate.stores.contracts.sweep_store import SweepStore

__all__ = [
    "METRICS_TERMINAL_WINDOW",
    "MONITOR_SOURCE",
    "AuditSubject",
    "QueueKey",
    "Settled",
    "StateStorePrimitives",
    "operational_metrics",
]

#: The job id (or ``None``) and request id an audit entry names.
AuditSubject = tuple["uuid.UUID | None", str]

#: What a fenced report answers: whether its write applied, and the job as stored
#: afterwards (``None`` when no job has that id).
Settled = tuple[bool, "Job | None"]

#: A queue as the store names it: ``(target, queue name)``, ``""`` for no queue.
QueueKey = tuple[str, str]

#: How far back ``terminal_last_15m`` looks.
METRICS_TERMINAL_WINDOW = timedelta(minutes=15)

#: Jobs of this ``source`` are probes; they do not age the queue (``oldest_queued_age``).
MONITOR_SOURCE = "monitor"


class StateStorePrimitives(TaskPrimitives, ABC):
    """The primitives of a state store (see the module docstring for what they receive)."""

    # --- capabilities ----------------------------------------------------------------
    # Which optional public methods the store offers, each with the primitives it then
    # implements. A public method whose flag is off raises UnsupportedStoreOperation
    # before it checks or writes anything.

    #: ``claim_next_inhub_jobs``, ``complete_claimed_jobs`` and ``extend_claim_leases``
    #: (``_claim_batch``, ``_complete_claimed_batch``, ``_extend_claim_leases``). The
    #: base builds them from the single-job primitives, so every store has them unless
    #: it turns them off.
    supports_batch_claims: ClassVar[bool] = True
    #: django.tasks tasks: ``enqueue_task``, ``claim_tasks``, ``recover_expired_tasks``
    #: and ``count_expired_tasks`` (``_enqueue_task``, ``_claim_tasks``,
    #: ``_list_expired_tasks``). The base enqueues with ``_create_job`` and recovers over
    #: ``_lock_job`` and ``_complete_claimed``.
    supports_tasks: ClassVar[bool] = False
    #: ``complete_job_with_notifications`` and ``notification_outbox``
    #: (``_complete_with_notifications``, ``_notification_outbox``).
    supports_outbox: ClassVar[bool] = False
    #: ``requeue_approved_job_once`` (``_recorded_decision``, ``_record_decision``).
    supports_approvals: ClassVar[bool] = False
    #: ``requeue_delivery_job_once`` (``_requeue_delivery``).
    supports_delivery_replay: ClassVar[bool] = False
    #: ``operational_metrics_snapshot`` (``_metrics_snapshot``).
    supports_metrics: ClassVar[bool] = False
    #: ``schema_readiness`` (``_schema_readiness``).
    supports_readiness: ClassVar[bool] = False
    #: ``sweep_store`` (``_sweep_store``): the batch methods of the maintenance
    #: sweeps (:mod:`jobstate.maintenance`) over the store's data.
    supports_sweeps: ClassVar[bool] = False
    #: ``pause_queue``, ``resume_queue`` and ``paused_queues`` (``_pause_queue``,
    #: ``_resume_queue``, ``_paused_queues``); every claim primitive then passes over
    #: the jobs of a paused queue (:mod:`jobstate.stores.contracts.fleet_part`).
    supports_queue_pauses: ClassVar[bool] = False
    #: ``register_worker``, ``beat_worker`` and ``stop_worker`` (``_register_worker``,
    #: ``_beat_worker``, ``_stop_worker``): the worker processes the console lists.
    supports_worker_registry: ClassVar[bool] = False

    #: ``delete_finished_job`` (``_delete_job``).
    supports_job_deletion: ClassVar[bool] = False

    # --- one unit of work ------------------------------------------------------------

    @abstractmethod
    def _atomic(self) -> AbstractContextManager[object]:
        """A block whose primitives run as one unit against concurrent callers: a
        database transaction (a savepoint inside a caller's), or the lock of a
        process-local store. A database backend rolls the block back when it raises;
        the base raises inside a block after a write only on races a process-local
        store cannot have (an insert beaten by a concurrent one, a row moved in spite of
        its lock), so a lock is enough there."""

    # --- jobs ------------------------------------------------------------------------

    @abstractmethod
    def _find_by_request_id(self, request_id: str) -> Job | None:
        """The job with that ``request_id``, or ``None``."""

    @abstractmethod
    def _get_job(self, pk: uuid.UUID) -> Job | None:
        """The job with that id, or ``None``."""

    @abstractmethod
    def _create_job(self, cleaned: dict[str, Any]) -> Job:
        """Insert a job (``request_id`` and the fields given; the rest at their
        defaults, ``created_at`` and ``updated_at`` on the store's clock) and return it
        as stored. A taken ``request_id`` raises
        :func:`~jobstate.stores.contracts.validation.duplicate_request` and writes nothing."""

    @abstractmethod
    def _enqueue_job(self, cleaned: dict[str, Any], quota: int | None) -> tuple[Job, bool]:
        """Insert a job unless one with its ``request_id`` exists: ``(job, True)`` when
        inserted, ``(existing, False)`` otherwise (the base compares the payloads).
        With a ``quota`` and a ``thread_id``, count the thread's in-flight jobs in the
        same atomic step as the insert and call
        :func:`~jobstate.stores.contracts.validation.check_thread_quota` before inserting."""

    @abstractmethod
    def _update_job(
        self, pk: uuid.UUID, cleaned: dict[str, Any], expected: list[JobStatus] | None
    ) -> Job | None:
        """Write ``cleaned`` and ``updated_at`` in one atomic step, only while the job's
        status is one of ``expected`` (any status when ``None``; never empty), and
        return the job as written; ``None`` when nothing was written."""

    @abstractmethod
    def _lock_job(self, pk: uuid.UUID, *, lease_ended: bool = False) -> Job | None:
        """The job, held against concurrent writers until the enclosing
        :meth:`_atomic` block ends; ``None`` when there is none. With ``lease_ended``,
        only a running or dispatched job whose ``lease_until`` is before the store's
        clock, and a store may answer ``None`` for one another transaction holds at
        that moment rather than wait for it."""

    def _delete_job(self, pk: uuid.UUID, expected: list[JobStatus]) -> bool:
        """Delete the job while its status is one of ``expected``, in one atomic step;
        whether it was deleted. Its audit entries stay."""
        raise self._missing_primitive("supports_job_deletion", "_delete_job")

    # --- claims and reports ----------------------------------------------------------

    @abstractmethod
    def _claim(
        self, scope: list[str], owner: str, lease: timedelta, status: JobStatus
    ) -> Job | None:
        """Move the oldest ready queued job of ``scope`` that passes the per-thread
        gate to ``status`` (running or dispatched) for ``owner``, atomically, and
        return it; ``None`` when nothing is claimable. See
        :meth:`~jobstate.stores.contracts.state_store.StateStore.claim_next_job` for the fields a
        claim sets."""

    def _claim_batch(self, scope: list[str], owner: str, lease: timedelta, limit: int) -> list[Job]:
        """Claim up to ``limit`` jobs for an in-process worker, in any order (the base
        sorts them). One :meth:`_claim` after another inside one :meth:`_atomic`
        block: each passes the thread gate with the earlier claims of the batch
        applied, so a thread gives at most one job to a batch."""
        claimed: list[Job] = []
        with self._atomic():
            while len(claimed) < limit:
                job = self._claim(scope, owner, lease, JobStatus.RUNNING)
                if job is None:
                    break
                claimed.append(job)
        return claimed

    @abstractmethod
    def _complete_claimed(
        self, pk: uuid.UUID, token: uuid.UUID, status: JobStatus, cleaned: dict[str, Any]
    ) -> Settled:
        """Fenced report: while the job is running or dispatched under ``token``,
        write ``cleaned`` and ``status``, clear the claim fields and stamp
        ``updated_at``, in one atomic step."""

    def _complete_claimed_batch(self, reports: list[ParsedReport]) -> list[Settled]:
        """Apply many fenced reports, one answer per report in the order given. One
        :meth:`_complete_claimed` after another inside one :meth:`_atomic` block."""
        with self._atomic():
            return [self._complete_claimed(*report) for report in reports]

    @abstractmethod
    def _extend_claim_lease(self, pk: uuid.UUID, token: uuid.UUID, lease: timedelta | None) -> bool:
        """While ``token`` is the claimed job's current one, move ``lease_until`` to the
        store's clock + ``lease`` (``None``: ``JOBSTATE['WORKER_LEASE']`` for a running
        job, ``JOBSTATE['EXECUTOR_LEASE']`` for a dispatched one)."""

    def _extend_claim_leases(
        self, pairs: list[tuple[uuid.UUID, uuid.UUID]], lease: timedelta
    ) -> list[uuid.UUID]:
        """Renew the lease of every ``(job id, claim token)`` whose token is still its
        job's current claim, to the store's clock + ``lease``; return the ids renewed.
        One :meth:`_extend_claim_lease` after another inside one :meth:`_atomic` block."""
        with self._atomic():
            return [pk for pk, token in pairs if self._extend_claim_lease(pk, token, lease)]

    def _claims_now(self, pks: list[uuid.UUID]) -> dict[uuid.UUID, tuple[JobStatus, Any]]:
        """Each job's status and claim token now (a job that is gone is left out): one
        :meth:`_get_job` per id unless a backend reads them at once."""
        jobs = [job for job in map(self._get_job, pks) if job is not None]
        return {job.pk: (JobStatus(job.status), job.claim_token) for job in jobs}

    # --- leases and maintenance ------------------------------------------------------

    @abstractmethod
    def _extend_executor_leases(self, executor_id: str, lease: timedelta) -> int:
        """Renew every dispatched job of ``executor_id``; return how many."""

    @abstractmethod
    def _requeue_stale_dispatched(
        self, dead_after: timedelta, hard_cap: timedelta, scope: list[str] | None, limit: int
    ) -> int:
        """Move up to ``limit`` dispatched jobs of ``scope`` (``None``: every target)
        whose executor stopped renewing back to ``queued`` with the claim fields cleared:
        lease ended before the store's clock, no lease and not written for
        ``dead_after``, or dispatched more than ``hard_cap`` ago. Oldest lease first
        (jobs without a lease last). Each move re-checks its condition when it is
        written, and each job moved gets a ``recovered`` audit entry in the same unit of
        work (severity warning, title ``Requeued: executor lease expired``, detail
        ``by`` = ``"jobstate.maintenance"``, ``via`` = ``"executor-lease-expired"``,
        ``prev_status`` and ``executor_id``). Returns the jobs moved."""

    @abstractmethod
    def _list_expired_leases(
        self,
        statuses: list[JobStatus],
        fallback_older_than: timedelta,
        scope: list[str] | None,
        limit: int,
    ) -> list[Job]:
        """See :meth:`~jobstate.stores.contracts.state_store.StateStore.list_expired_leases`
        (``statuses`` is never empty)."""

    @abstractmethod
    def _list_jobs_by_status(
        self,
        statuses: list[JobStatus],
        older_than: timedelta | None,
        scope: list[str] | None,
        limit: int,
    ) -> list[Job]:
        """See :meth:`~jobstate.stores.contracts.state_store.StateStore.list_jobs_by_status`
        (``statuses`` is never empty)."""

    @abstractmethod
    def _expire_stale_queued(self, ttl: timedelta, scope: list[str] | None) -> int:
        """The conditional sweep of
        :meth:`~jobstate.stores.contracts.state_store.StateStore.expire_stale_queued`."""

    @abstractmethod
    def _count_inflight(self, thread_id: int) -> int:
        """How many jobs of the thread are queued, running or dispatched."""

    # --- audit ledger and runtime locks ----------------------------------------------

    @abstractmethod
    def _append_audit_entry(
        self, subject: AuditSubject, event: str, fields: AuditFields, at: datetime | None
    ) -> AuditEntry:
        """Append one entry naming ``subject`` (job id or ``None``, request id) with the
        completed ``fields``; stamp it with ``at``, or the store's clock when ``None``."""

    @abstractmethod
    def _list_audit(
        self, job_id: uuid.UUID | None, request_id: str | None, limit: int
    ) -> list[AuditEntry]:
        """Entries of the job and/or request id (at least one is given), oldest first."""

    @abstractmethod
    def _prune_audit(self, cutoff: datetime, batch_size: int) -> int:
        """Delete entries stamped before ``cutoff``; return how many."""

    @abstractmethod
    def _acquire_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        """See :meth:`~jobstate.stores.contracts.state_store.StateStore.acquire_runtime_lock`."""

    @abstractmethod
    def _release_lock(self, lock_key: str, owner: str) -> None:
        """See :meth:`~jobstate.stores.contracts.state_store.StateStore.release_runtime_lock`."""

    # --- batch transitions (the console's bulk actions) -------------------------------

    def _requeue_batch(
        self, jobs: list[tuple[uuid.UUID, JobStatus]], *, by: str, via: str, event: str
    ) -> list[uuid.UUID] | None:
        """Inside the caller's :meth:`_atomic` block, refire each ``(job id, status seen)``
        still in that status and requeueable (finished, or claimed with its lease ended
        on the store's clock: :meth:`~jobstate.models.JobQuerySet.requeueable`) as the
        single-job refire does, audit entries included; return the ids requeued.
        ``None`` (the default): the base refires one job at a time."""
        return None

    def _reject_batch(
        self, pks: list[uuid.UUID], *, by: str, error: str, via: str
    ) -> list[uuid.UUID] | None:
        """Reject each job still queued with ``error`` and a ``rejected`` audit entry
        (``reject_detail``), inside the caller's :meth:`_atomic` block; the ids
        rejected. ``None`` (the default): the base rejects one job at a time."""
        return None

    def _delete_batch(self, pks: list[uuid.UUID], *, by: str, via: str) -> list[uuid.UUID] | None:
        """Delete each job still finished with a ``deleted`` audit entry, inside the
        caller's :meth:`_atomic` block; the ids deleted. ``None`` (the default): the base
        deletes one job at a time."""
        return None

    # --- optional: the outbox (supports_outbox) --------------------------------------

    def _complete_with_notifications(
        self, original: Job, cleaned: dict[str, Any], requests: list[NotificationRequest]
    ) -> Job | None:
        """One transaction: while the job still has ``original``'s status and claim
        token, write ``cleaned`` (its status is terminal) and clear the claim fields,
        append a ``finished`` audit entry and insert one notification per request;
        ``None`` when the fence does not match. A key already in the outbox raises
        :class:`~jobstate.exceptions.DuplicateNotification` and writes nothing."""
        raise self._missing_primitive("supports_outbox", "_complete_with_notifications")

    def _notification_outbox(self) -> NotificationOutbox:
        """The outbox repository on the store's notifications."""
        raise self._missing_primitive("supports_outbox", "_notification_outbox")

    # --- optional: approvals (supports_approvals) ------------------------------------

    def _recorded_decision(self, decision_id: str) -> uuid.UUID | None:
        """The job the permanent marker of ``decision_id`` names, or ``None``."""
        raise self._missing_primitive("supports_approvals", "_recorded_decision")

    def _record_decision(
        self, decision_id: str, pk: uuid.UUID, approver: str, comment: str
    ) -> uuid.UUID | None:
        """Store the permanent marker of ``decision_id`` for job ``pk``: ``None`` when
        stored, or the job named by the marker of a concurrent approval that stored the
        same ``decision_id`` first (nothing written then)."""
        raise self._missing_primitive("supports_approvals", "_record_decision")

    # --- optional: dead-letter replay (supports_delivery_replay) ---------------------

    def _requeue_delivery(
        self, pk: uuid.UUID, dlq_key: str, requested_by: str
    ) -> DeliveryRequeueOutcome:
        """See
        :meth:`~jobstate.stores.contracts.state_store.StateStore.requeue_delivery_job_once`."""
        raise self._missing_primitive("supports_delivery_replay", "_requeue_delivery")

    # --- optional: queue pauses (supports_queue_pauses) -------------------------------

    def _pause_queue(self, key: QueueKey, by: str) -> bool:
        """Record ``key`` as paused by ``by`` at the store's clock; ``False`` (nothing
        written) when it is paused already. From then on no claim primitive
        (``_claim``, ``_claim_batch``, ``_claim_tasks``) takes a job of that queue: a
        job's queue is its ``(target, queue_name or "")``."""
        raise self._missing_primitive("supports_queue_pauses", "_pause_queue")

    def _resume_queue(self, key: QueueKey) -> bool:
        """Forget the pause of ``key``; ``False`` when it was not paused."""
        raise self._missing_primitive("supports_queue_pauses", "_resume_queue")

    def _paused_queues(self) -> list[QueueKey]:
        """Every paused queue, in any order."""
        raise self._missing_primitive("supports_queue_pauses", "_paused_queues")

    # --- optional: the worker registry (supports_worker_registry) ----------------------

    def _register_worker(self, fields: dict[str, Any]) -> None:
        """Insert or replace the worker ``fields['worker_id']`` (the checked fields of a
        :class:`~jobstate.core.states.WorkerRegistration`), started and last beat at the
        store's clock, not stopped."""
        raise self._missing_primitive("supports_worker_registry", "_register_worker")

    def _beat_worker(self, worker_id: str) -> bool:
        """Move the last beat of a registered worker that has not stopped to the store's
        clock; ``False`` when there is none."""
        raise self._missing_primitive("supports_worker_registry", "_beat_worker")

    def _stop_worker(self, worker_id: str, reason: str) -> bool:
        """Record that the worker stopped at the store's clock, for ``reason``;
        ``False`` when it is not registered."""
        raise self._missing_primitive("supports_worker_registry", "_stop_worker")

    # --- optional: maintenance sweeps (supports_sweeps) --------------------------------

    def _sweep_store(self) -> SweepStore:
        """A new sweep store over this store's jobs, audit entries, locks and outbox."""
        raise self._missing_primitive("supports_sweeps", "_sweep_store")

    # --- optional: observability (supports_metrics, supports_readiness) --------------

    def _metrics_snapshot(self, now: datetime | None, exact: bool) -> JobOperationalMetrics:
        """The figures at ``now`` (``None``: the store's clock); see
        :func:`operational_metrics`."""
        raise self._missing_primitive("supports_metrics", "_metrics_snapshot")

    def _schema_readiness(self) -> Readiness:
        """Whether the schema is usable; never raises."""
        raise self._missing_primitive("supports_readiness", "_schema_readiness")

    def _require(self, supported: bool, flag: str, operation: str) -> None:
        """Refuse ``operation`` up front when the capability ``flag`` names is off."""
        if not supported:
            raise UnsupportedStoreOperation(
                f"{type(self).__name__} does not support {operation}() ({flag} is False)."
            )

    def _missing_primitive(self, flag: str, primitive: str) -> UnsupportedStoreOperation:
        return UnsupportedStoreOperation(
            f"{type(self).__name__} sets {flag} but does not implement {primitive}()."
        )
