"""The contract of the batch methods behind the maintenance sweeps.

A state store that can be swept says so with ``supports_sweeps = True`` and hands out a
:class:`SweepStore` from ``sweep_store()``; a run store does the same with a
:class:`RunSweepStore`. :mod:`jobstate.maintenance` owns the loop around them (batch
size, time budget, limit, dry run, results) and reaches them only through the configured
stores (``JOBSTATE['STATE_STORE']`` and ``JOBSTATE['RUN_STORE']``); a sweep store owns
one batch at a time.

Every ``*_batch`` operation

- moves or deletes at most ``limit`` rows (a positive ``int``) in one short transaction
  and returns what it changed, so a caller that loops until a batch comes back short has
  emptied the candidates it could reach;
- passes over rows another caller holds and repeats its candidate condition when it
  writes, so concurrent callers (on one machine or several) move and count each row
  exactly once, and a row that stopped qualifying since the pick is left alone;
- measures ages on the store's clock, so callers with skewed clocks agree on what is
  stale.

Every ``count_*`` operation answers, without writing anything, what the matching batch
operation would move if it took at most ``limit`` rows now (``None``: no cap); this is
what ``--dry-run`` reports.

Sweep stores keep state between the batches of one sweep (a retention sweep resumes
after the last row its previous batch deleted), so a caller asks for a new one per sweep.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

__all__ = ["LeaseRecovery", "OutboxRecovery", "RunSweepStore", "SweepStore"]


@dataclass(frozen=True)
class LeaseRecovery:
    """What one batch of expired in-process leases became (or, counted, would become)."""

    requeued: int = 0
    """Back to ``queued`` (attempts below the limit), with a ``recovered`` audit entry."""
    failed: int = 0
    """Moved to ``error`` (the attempt limit was reached), with a ``recovered`` audit
    entry of severity error."""

    @property
    def total(self) -> int:
        return self.requeued + self.failed


class OutboxRecovery(Protocol):
    """What one batch of notifications whose relay lease ended became (or would become):
    the outbox's own result type, read through these three figures."""

    @property
    def rearmed(self) -> int:
        """Back to ``pending`` (attempts left), due at once."""

    @property
    def dead(self) -> int:
        """Dead-lettered: the lost attempt was the row's last (``OUTBOX_MAX_ATTEMPTS``)."""

    @property
    def total(self) -> int:
        """``rearmed + dead``."""


class SweepStore(ABC):
    """The batch methods of the job-queue sweeps: jobs, audit entries, runtime locks
    and notifications of one state store (see the module docstring for what every
    operation guarantees)."""

    # --- reaping: settle work whose owner is gone -------------------------------------

    @abstractmethod
    def requeue_stale_dispatched_batch(
        self, *, dead_after: timedelta, hard_cap: timedelta, limit: int
    ) -> int:
        """Move up to ``limit`` dispatched jobs whose executor stopped renewing (lease
        expired; no lease and silent for ``dead_after``; or dispatched longer than
        ``hard_cap``) back to ``queued`` with their claim cleared, oldest lease first and
        jobs without a lease last, each with a ``recovered`` audit entry naming the
        executor that lost it. A late report of the old claim is refused afterwards.
        Returns the jobs moved."""

    @abstractmethod
    def count_stale_dispatched(
        self, *, dead_after: timedelta, hard_cap: timedelta, limit: int | None = None
    ) -> int:
        """How many jobs :meth:`requeue_stale_dispatched_batch` would move now."""

    @abstractmethod
    def recover_expired_leases_batch(
        self, *, fallback_older_than: timedelta, attempt_limit: int, limit: int
    ) -> LeaseRecovery:
        """Recover up to ``limit`` running (in-process) jobs whose lease ended, or that
        have no lease and were last written more than ``fallback_older_than`` ago. Each
        lost lease counts as an attempt: while ``attempts + 1`` is below
        ``attempt_limit`` the job is refired (back to ``queued``, claim cleared, a
        ``recovered`` audit entry) keeping the new count; on the last attempt it moves to
        ``error`` with a ``recovered`` entry of severity error. A worker renewing or
        finishing the job at the same moment either wins (the job is no longer a
        candidate) or finds its claim gone."""

    @abstractmethod
    def count_expired_leases(
        self, *, fallback_older_than: timedelta, attempt_limit: int, limit: int | None = None
    ) -> LeaseRecovery:
        """What :meth:`recover_expired_leases_batch` would do now, split the same way."""

    @abstractmethod
    def expire_stale_queued_batch(self, *, ttl: timedelta, limit: int) -> int:
        """Move up to ``limit`` jobs queued longer than ``ttl`` since they were created
        to ``error``, oldest first, each with an ``expired`` audit entry. A job claimed
        meanwhile is left alone. Returns the jobs moved."""

    @abstractmethod
    def count_stale_queued(self, *, ttl: timedelta, limit: int | None = None) -> int:
        """How many jobs :meth:`expire_stale_queued_batch` would move now."""

    @abstractmethod
    def release_expired_locks_batch(self, *, limit: int) -> int:
        """Delete up to ``limit`` runtime locks whose ``expires_at`` has passed. A lock
        renewed or taken over meanwhile is kept. Returns the locks deleted."""

    @abstractmethod
    def count_expired_locks(self, *, limit: int | None = None) -> int:
        """How many locks :meth:`release_expired_locks_batch` would delete now."""

    @abstractmethod
    def rearm_outbox_leases_batch(self, *, limit: int) -> OutboxRecovery:
        """Hand back up to ``limit`` notifications whose relay lease ended, oldest lease
        first. Each lost attempt is recorded as a relay's claim records it; a row with
        attempts left goes back to ``pending``, due at once, and a row whose lost attempt
        was its last becomes dead with a ``delivery_error`` audit entry. The relay that
        lost the row can no longer settle it."""

    @abstractmethod
    def count_expired_outbox_leases(self, *, limit: int | None = None) -> OutboxRecovery:
        """What :meth:`rearm_outbox_leases_batch` would do now, split the same way."""

    # --- retention: delete history past its age ----------------------------------------

    @abstractmethod
    def prune_audit_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Delete up to ``limit`` audit entries stamped more than ``older_than`` ago,
        oldest first. Returns the entries deleted."""

    @abstractmethod
    def count_old_audit(self, *, older_than: timedelta, limit: int | None = None) -> int:
        """How many entries :meth:`prune_audit_batch` would delete now."""

    @abstractmethod
    def prune_finished_jobs_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Delete up to ``limit`` done, error and rejected jobs last written more than
        ``older_than`` ago, oldest first. Their audit entries, approval markers and
        undelivered notifications are kept. Returns the jobs deleted."""

    @abstractmethod
    def count_old_finished_jobs(self, *, older_than: timedelta, limit: int | None = None) -> int:
        """How many jobs :meth:`prune_finished_jobs_batch` would delete now."""

    @abstractmethod
    def prune_delivered_notifications_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Delete up to ``limit`` notifications delivered more than ``older_than`` ago,
        oldest first, with their delivery history. Pending, delivering and dead rows are
        never deleted, nor are replay markers. Returns the notifications deleted."""

    @abstractmethod
    def count_old_delivered_notifications(
        self, *, older_than: timedelta, limit: int | None = None
    ) -> int:
        """How many notifications :meth:`prune_delivered_notifications_batch` would
        delete now."""

    @abstractmethod
    def prune_workers_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Forget up to ``limit`` registered workers whose last beat is more than
        ``older_than`` old (stopped or lost), oldest beat first. A live worker beats
        far more often than any retention, so it is never forgotten; one that is
        forgotten while hung registers again at its next beat. Returns the workers
        deleted."""

    @abstractmethod
    def count_old_workers(self, *, older_than: timedelta, limit: int | None = None) -> int:
        """How many workers :meth:`prune_workers_batch` would delete now."""


class RunSweepStore(ABC):
    """The batch operations of the sweeps over one run store's operations-job runs (see
    the module docstring for what every operation guarantees)."""

    @abstractmethod
    def reap_stale_runs_batch(self, *, stale_after: timedelta, limit: int) -> int:
        """Move up to ``limit`` RUNNING runs whose heartbeat is at least ``stale_after``
        old to TIMED_OUT, oldest heartbeat first, freeing their overlap keys: the run
        store's ``reap_stale`` (S4). Returns the runs moved."""

    @abstractmethod
    def count_stale_runs(self, *, stale_after: timedelta, limit: int | None = None) -> int:
        """How many runs :meth:`reap_stale_runs_batch` would move now."""

    @abstractmethod
    def prune_finished_runs_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Delete up to ``limit`` settled or skipped runs that finished more than
        ``older_than`` ago, oldest first; RUNNING runs are never deleted. Returns the
        runs deleted."""

    @abstractmethod
    def count_old_finished_runs(self, *, older_than: timedelta, limit: int | None = None) -> int:
        """How many runs :meth:`prune_finished_runs_batch` would delete now."""
