"""The state store's contract (the job part of RuntimeStateStore): the job queue, the
audit ledger, runtime locks and the optional extensions (outbox, approvals, replay,
readiness, metrics)."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobstate.audit import AuditStage
from jobstate.exceptions import LockHeld
from jobstate.states import (
    ApprovalRequeueOutcome,
    ClaimReport,
    CompletionOutcome,
    DeliveryRequeueOutcome,
    JobId,
    JobOperationalMetrics,
    JobStatus,
    NotificationRequest,
    NotificationState,
    Readiness,
)

if TYPE_CHECKING:
    from jobstate.models import AuditEntry, Job, Notification

#: ``metadata`` key that suppresses delivery of a job's result; a refired job delivers
#: again, so the refire drops it.
NO_DELIVERY_KEY = "no_delivery"

#: How far back ``terminal_last_15m`` looks.
METRICS_TERMINAL_WINDOW = timedelta(minutes=15)

#: Jobs of this ``source`` are probes; they do not age the queue (``oldest_queued_age``).
MONITOR_SOURCE = "monitor"


def reject_audit_detail(by: str, reason: str) -> dict[str, Any]:
    """The ``detail`` of the ``rejected`` audit entry ``reject_queued_job`` writes."""
    return {"by": by, "reason": reason, "prev_status": JobStatus.QUEUED.value}


def approval_via(decision_id: str) -> str:
    """The ``via`` an approval's rerun audit entry names."""
    return f"approval:{decision_id}"


def approval_audit_entry(decision_id: str, approver: str, comment: str) -> dict[str, Any]:
    """The ``append_audit`` arguments of the entry that records who approved."""
    summary = f"approved by {approver}" + (f": {comment}" if comment else "")
    return {
        "event": "approved",
        "stage": AuditStage.APPROVAL,
        "title": "Approved",
        "summary": summary,
        "detail": {"decision_id": decision_id, "approver": approver, "comment": comment},
    }


@dataclass(frozen=True)
class CompletionResult:
    """The outcome of a fenced report and the job as stored afterwards (``None`` only
    for ``NOT_FOUND``)."""

    outcome: CompletionOutcome
    job: Job | None

    @property
    def completed(self) -> bool:
        return self.outcome is CompletionOutcome.COMPLETED


class StateStore(ABC):
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
    """

    # --- jobs ------------------------------------------------------------------------

    @abstractmethod
    def find_by_request_id(self, request_id: str) -> Job | None:
        """The job with that ``request_id``, or ``None``."""

    @abstractmethod
    def get_job(self, job_id: JobId) -> Job | None:
        """The job with that id, or ``None``. A malformed id raises ``InvalidJobState``."""

    @abstractmethod
    def create_job(self, **fields: Any) -> Job:
        """Insert a job and return it as stored. ``request_id`` is required; the other
        fields come from :data:`JOB_PATCH_FIELDS` (``status`` defaults to queued). An
        existing ``request_id`` raises :class:`~jobstate.exceptions.DuplicateRequestId`
        and writes nothing."""

    @abstractmethod
    def enqueue(self, **fields: Any) -> tuple[Job, bool]:
        """Queue a new job, idempotently by ``request_id``: return ``(job, True)`` when it
        was created, ``(existing, False)`` when the same request (see
        :data:`ENQUEUE_PAYLOAD_FIELDS`) was queued before, and raise
        :class:`~jobstate.exceptions.IdempotencyConflict` for a different payload under the
        same ``request_id``. A new job in a thread that already has
        ``JOBSTATE['THREAD_INFLIGHT_QUOTA']`` in-flight jobs raises
        :class:`~jobstate.exceptions.ThreadQuotaExceeded`. Accepts :data:`ENQUEUE_FIELDS`."""

    @abstractmethod
    def update_job(self, job_id: JobId, **patch: Any) -> Job | None:
        """Write ``patch`` (see :func:`clean_job_fields`) and ``updated_at``; return the job
        re-read, or ``None`` when no job has that id."""

    @abstractmethod
    def update_job_if_status(
        self, job_id: JobId, expected_statuses: Iterable[str], **patch: Any
    ) -> Job | None:
        """Like :meth:`update_job`, but only while the job's status is one of
        ``expected_statuses`` (one atomic conditional write). ``None`` means the job is
        missing or another caller moved it on; nothing was written. An empty
        ``expected_statuses`` writes nothing and returns ``None``."""

    # --- claims ----------------------------------------------------------------------

    @abstractmethod
    def claim_next_job(
        self, targets: Sequence[str], executor_id: str, lease: timedelta | None = None
    ) -> Job | None:
        """Claim the oldest ready queued job of ``targets`` for a remote executor: it
        becomes ``dispatched`` with ``executor_id``, ``claimed_at`` and ``dispatched_at``
        set to the store's clock, ``lease_until`` = clock + ``lease`` (default
        ``JOBSTATE['EXECUTOR_LEASE']``), a fresh ``claim_token`` and ``run_after`` cleared.
        ``None`` when nothing is claimable or ``targets`` is empty."""

    @abstractmethod
    def claim_next_inhub_job(
        self, targets: Sequence[str], worker_id: str, lease: timedelta | None = None
    ) -> Job | None:
        """As :meth:`claim_next_job` for an in-process worker: the job becomes ``running``
        with ``executor_id = worker_id`` and no ``dispatched_at``; ``lease`` defaults to
        ``JOBSTATE['WORKER_LEASE']``."""

    @abstractmethod
    def complete_claimed_job(
        self, job_id: JobId, claim_token: uuid.UUID | str, status: str, **patch: Any
    ) -> CompletionResult:
        """Fenced report of a claim holder. ``status`` is terminal (done / error /
        rejected) or ``queued`` (give the job back, e.g. for a retry with ``run_after``
        and ``attempts`` in ``patch``). Writes only while the job is running or
        dispatched under ``claim_token``; then it clears the claim fields
        (:data:`JOB_CLAIM_FIELDS`). A stale token, or a job requeued meanwhile, writes
        nothing and answers ``STALE_CLAIM``."""

    def claim_next_inhub_jobs(
        self,
        targets: Sequence[str],
        worker_id: str,
        lease: timedelta | None = None,
        *,
        limit: int,
    ) -> list[Job]:
        """Claim up to ``limit`` ready queued jobs of ``targets`` for an in-process worker
        at once, each exactly as :meth:`claim_next_inhub_job` would (``running``, its own
        fresh ``claim_token``, the same lease). Returns them oldest first; an empty list
        when nothing is claimable or ``targets`` is empty.

        Guarantees: no job is claimed by two callers; every job returned was ready and
        passed the per-thread FIFO gate when it was claimed, and at most one job of a
        thread is in a batch (its siblings wait for it). Jobs without a thread may be
        taken ahead of an older threaded job: a store may claim the thread-less part of
        the batch in one step and the threaded part one job at a time through the gate.
        ``limit`` must be a positive int."""
        raise NotImplementedError("this store does not support claim_next_inhub_jobs()")

    def complete_claimed_jobs(self, reports: Sequence[ClaimReport]) -> list[CompletionResult]:
        """Apply many fenced reports (:class:`ClaimReport`) at once. Each report is
        fenced on its own exactly as :meth:`complete_claimed_job`: it writes only while
        its job is running or dispatched under its ``claim_token``, and a stale one
        writes nothing. Returns one :class:`CompletionResult` per report, in the order
        given. Every report is validated before anything is written: one bad report (or
        the same job twice) raises and writes nothing."""
        raise NotImplementedError("this store does not support complete_claimed_jobs()")

    @abstractmethod
    def extend_claim_lease(
        self, job_id: JobId, claim_token: uuid.UUID | str, lease: timedelta | None = None
    ) -> bool:
        """Move one claimed job's ``lease_until`` to the store's clock + ``lease``
        (default: the worker or executor lease for its status) while ``claim_token`` is
        current. ``False`` means the claim is gone and nothing was written."""

    # --- leases and maintenance ------------------------------------------------------

    @abstractmethod
    def extend_executor_leases(self, executor_id: str, lease: timedelta | None = None) -> int:
        """Renew every ``dispatched`` job of ``executor_id`` to clock + ``lease`` (default
        ``JOBSTATE['EXECUTOR_LEASE']``); return how many were renewed."""

    @abstractmethod
    def requeue_stale_dispatched(
        self,
        dead_after: timedelta | None = None,
        hard_cap: timedelta | None = None,
        *,
        targets: Sequence[str] | None = None,
    ) -> int:
        """Move ``dispatched`` jobs back to ``queued`` with their claim fields cleared when
        their lease has expired, when they have no lease and were last written more than
        ``dead_after`` ago, or when they were dispatched more than ``hard_cap`` ago
        (defaults: ``EXECUTOR_DEAD_AFTER``, ``EXECUTOR_HARD_CAP``). ``targets`` narrows
        the sweep. Returns the jobs this call moved."""

    @abstractmethod
    def list_expired_leases(
        self,
        statuses: Iterable[str],
        fallback_older_than: timedelta,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs in ``statuses`` whose lease has expired, or that have no lease and were
        last written more than ``fallback_older_than`` ago; oldest first, at most ``limit``
        (default ``JOBSTATE['LIST_LIMIT']``). Empty ``statuses`` -> ``[]``."""

    @abstractmethod
    def list_jobs_by_status(
        self,
        statuses: Iterable[str],
        older_than: timedelta | None = None,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs in ``statuses`` (last written more than ``older_than`` ago when given),
        oldest first, at most ``limit`` (default ``JOBSTATE['LIST_LIMIT']``). Empty
        ``statuses`` -> ``[]``."""

    @abstractmethod
    def expire_stale_queued(
        self, ttl: timedelta | None = None, *, targets: Sequence[str] | None = None
    ) -> int:
        """Move ``queued`` jobs created more than ``ttl`` ago (default
        ``JOBSTATE['QUEUED_TTL']``) to ``error`` with :data:`EXPIRED_QUEUED_ERROR`; a job
        claimed meanwhile is left alone. Returns the jobs this call moved."""

    @abstractmethod
    def count_inflight_by_thread(self, thread_id: int) -> int:
        """How many jobs of the thread are queued, running or dispatched."""

    # --- audit ledger ----------------------------------------------------------------

    @abstractmethod
    def append_audit(
        self,
        *,
        job: Job | JobId | None = None,
        request_id: str = "",
        event: str,
        stage: str | None = None,
        severity: str | None = None,
        title: str = "",
        summary: str = "",
        detail: dict[str, Any] | None = None,
        at: datetime | None = None,
    ) -> AuditEntry:
        """Append one entry and return it. Stage, severity, title and summary left out are
        filled from the event (:func:`complete_audit_fields`); ``request_id`` defaults to
        the job's. ``at`` is stored verbatim; without it the store's clock stamps the
        entry."""

    @abstractmethod
    def list_audit(
        self,
        *,
        job: Job | JobId | None = None,
        request_id: str | None = None,
        limit: int | None = None,
    ) -> list[AuditEntry]:
        """Entries of one job and/or request id, oldest first, at most ``limit``
        (default ``JOBSTATE['LIST_LIMIT']``)."""

    @abstractmethod
    def prune_audit_older_than(self, cutoff: datetime, *, batch_size: int | None = None) -> int:
        """Delete entries stamped before ``cutoff`` in batches of ``batch_size`` (default
        ``JOBSTATE['AUDIT_PRUNE_BATCH_SIZE']``), each its own short transaction, and
        return how many were deleted."""

    # --- runtime locks ---------------------------------------------------------------

    @abstractmethod
    def acquire_runtime_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        """Take or renew ``lock_key`` for ``owner`` until clock + ``ttl``. ``True`` when
        the lock was free, expired or already ``owner``'s; ``False`` while another owner
        holds it. Atomic: of concurrent callers for a free key exactly one wins."""

    @abstractmethod
    def release_runtime_lock(self, lock_key: str, owner: str) -> None:
        """Release ``lock_key`` if ``owner`` holds it; otherwise do nothing."""

    # --- optional extensions: outbox, approvals, replay, readiness, metrics -----------
    # A store may leave these out (they raise NotImplementedError); the database store
    # implements them all.

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
        reset, ``run_after``/``error`` and every claim field cleared, and write an audit
        entry ``event`` naming ``by`` and ``via`` in the same transaction. ``None`` (and
        nothing written) when the job is gone or no longer in those statuses."""
        raise NotImplementedError("this store does not support requeue_job()")

    def requeue_expired_lease_job(
        self, job_id: JobId, *, by: str, via: str, event: str = "rerun"
    ) -> Job | None:
        """The refire transition (:meth:`requeue_job`) for a running or dispatched job
        whose ``lease_until`` is before the store's clock. The lease is checked with the
        job held against concurrent writers until the refire commits, so a holder that
        renews or reports at that moment either wins (nothing written, ``None``) or
        finds its claim gone. ``None`` too when the job is gone, not claimed, has no
        lease or a lease still running."""
        raise NotImplementedError("this store does not support requeue_expired_lease_job()")

    def reject_queued_job(self, job_id: JobId, *, by: str, reason: str = "") -> Job | None:
        """Cancel a job that is still ``queued``: it becomes ``rejected`` with ``error``
        set to ``reason`` (or ``"rejected by <by>"``), and a ``rejected`` audit entry
        naming ``by`` and ``reason`` is written in the same transaction. ``None`` (and
        nothing written) when the job is gone or no longer queued, e.g. claimed
        meanwhile. ``reason`` is at most 2000 characters."""
        raise NotImplementedError("this store does not support reject_queued_job()")

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
        inside the transaction. A stale ``original`` writes nothing and returns ``None``."""
        raise NotImplementedError("this store does not support complete_job_with_notifications()")

    @property
    def notification_outbox(self) -> NotificationOutbox:
        """The outbox repository relays use (claim due rows, mark delivered or failed)."""
        raise NotImplementedError("this store has no notification outbox")

    def requeue_approved_job_once(
        self, *, job_id: JobId, decision_id: str, approver: str, comment: str = ""
    ) -> ApprovalRequeueOutcome:
        """Requeue a terminal job for an approval exactly once per ``decision_id``: the
        refire transition and a permanent :class:`~jobstate.models.ApprovalDecision`
        marker in one transaction, with an audit entry naming the approver."""
        raise NotImplementedError("this store does not support requeue_approved_job_once()")

    def requeue_delivery_job_once(
        self, *, notification_id: JobId, dlq_key: str, requested_by: str
    ) -> DeliveryRequeueOutcome:
        """Send a dead notification (the original row, never a copy) back to pending
        together with a permanent :class:`~jobstate.models.DeliveryReplay` marker for
        ``dlq_key``, in one transaction; a key replays at most once."""
        raise NotImplementedError("this store does not support requeue_delivery_job_once()")

    def operational_metrics_snapshot(
        self, now: datetime | None = None, *, exact: bool = False
    ) -> JobOperationalMetrics:
        """The six operational figures at ``now`` (default: the store's clock). A store
        may estimate the counts of finished jobs on a large table (it names them in
        ``estimated_statuses``); ``exact=True`` asks for exact counts whatever they cost."""
        raise NotImplementedError("this store does not support operational_metrics_snapshot()")

    def schema_readiness(self) -> Readiness:
        """Whether the store's schema is usable. Never raises: any error means not ready."""
        raise NotImplementedError("this store does not support schema_readiness()")


class NotificationOutbox(ABC):
    """The outbox repository a relay uses. Rows move pending -> delivering (claimed with a
    lease) -> delivered, or back to pending with a backoff, or to dead after the last
    attempt. A relay that dies leaves its rows delivering until the lease ends; then they
    are due again (at-least-once delivery)."""

    @abstractmethod
    def claim_due(self, *, relay_id: str, limit: int, lease: timedelta) -> list[Notification]:
        """Claim up to ``limit`` due pending rows (and delivering rows whose lease ended)
        under ``SKIP LOCKED``: no two relays ever hold the same row at once. Each claim
        counts one attempt, and the row is held until clock + ``lease``."""

    @abstractmethod
    def mark_delivered(
        self, *, notification_id: JobId, relay_id: str, started_at: datetime | None = None
    ) -> bool:
        """Settle a row this relay holds as delivered; ``False`` if it no longer holds it.
        ``started_at`` (when the send began, recorded verbatim in the attempt history)
        defaults to the store's clock."""

    @abstractmethod
    def mark_failed(
        self,
        *,
        notification_id: JobId,
        relay_id: str,
        error: str,
        started_at: datetime | None = None,
    ) -> NotificationState | None:
        """Record a failed attempt of a row this relay holds: back to pending with an
        exponential backoff and jitter, or dead after the last attempt. Returns the new
        state, or ``None`` if the relay no longer holds the row."""

    @abstractmethod
    def dead_letters(self, *, limit: int = 100) -> list[Notification]:
        """The newest dead rows, at most ``limit``."""


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
