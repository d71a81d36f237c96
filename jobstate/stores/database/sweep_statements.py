"""The batch statements behind the maintenance sweeps: :class:`DatabaseSweepStore` (jobs,
audit entries, runtime locks, notifications) and :class:`DatabaseRunSweepStore` (job
runs), the database stores' implementations of :mod:`jobstate.stores.contracts.sweep_store`.

Each ``*_batch`` method moves or deletes at most ``limit`` rows in one short transaction
and returns what it changed. The candidates are picked with ``SELECT ... FOR UPDATE SKIP
LOCKED`` where the backend has it (PostgreSQL, MySQL 8, MariaDB 10.6), so sweepers on
several machines pass over each other's rows instead of queueing behind them or counting
them twice; the write repeats the candidate condition, so a row that changed between the
pick and the write is left alone and not counted. On SQLite the ``IMMEDIATE``
transaction holds the database's write lock from the pick to the commit, which gives the
same answer. The sweep loops (batch size, time budget, results) live in
:mod:`jobstate.maintenance`.

Age cut-offs are computed by the database (``Now() - duration``), like every other
liveness instant, so machines with skewed clocks agree on what is stale.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

from django.db import models, transaction
from django.db.models.functions import Now

from jobstate.core.conf import jobstate_settings
from jobstate.models import (
    AuditEntry,
    Job,
    JobQuerySet,
    JobRun,
    Notification,
    RuntimeLock,
    Worker,
    WorkerQuerySet,
)
from jobstate.stores.base import (
    EXPIRED_QUEUED_ERROR,
    TERMINAL_RUN_STATUSES,
    JobRunStore,
    JobStatus,
    NotificationState,
    StateStore,
)
from jobstate.stores.contracts.audit import AuditFields, AuditSeverity, complete_audit_fields
from jobstate.stores.contracts.sweep_store import LeaseRecovery, RunSweepStore, SweepStore
from jobstate.stores.contracts.validation import (
    CLEARED_CLAIM,
    validate_duration,
    validate_reap_limit,
)
from jobstate.stores.database.audit_locks import audit_row
from jobstate.stores.database.batched_delete import BatchedDeleter, pick_oldest
from jobstate.stores.database.notification_outbox import (
    DatabaseNotificationOutbox,
    OutboxLeaseRecovery,
)
from jobstate.stores.errors import translate_store_errors

__all__ = [
    "LEASE_EXPIRED_ERROR",
    "SWEEP_ACTOR",
    "DatabaseRunSweepStore",
    "DatabaseSweepStore",
    "LeaseRecovery",
    "requeue_stale_dispatched",
]

_M = TypeVar("_M", bound=models.Model)

#: Who the sweeps' audit entries name as the actor (``detail["by"]``).
SWEEP_ACTOR = "jobstate.maintenance"

#: The error a job gets when its in-process lease expired on its last allowed attempt.
LEASE_EXPIRED_ERROR = (
    "lease expired: the worker running this job stopped renewing its lease on every "
    "allowed attempt (JOBSTATE['WORKER_ATTEMPT_LIMIT']), so it was not requeued again"
)


@translate_store_errors
class DatabaseSweepStore(SweepStore):
    """:class:`~jobstate.stores.contracts.sweep_store.SweepStore` on jobstate's tables in database
    ``using``; a state store's ``sweep_store()`` makes one.

    ``state`` is the state store whose refire transition (``requeue_job``) and
    conditional update the lease recovery uses; it must write to database ``using``,
    because the recovery runs it inside its own transaction, under the row lock it took
    on the job. The outbox sweep is the lease re-arm of the notification outbox on the
    same database.

    The deleting batches of one instance resume after the last row the previous batch
    of the same kind deleted (:class:`~jobstate.stores.database.batched_delete.BatchedDeleter`),
    so use one instance per sweep, as :mod:`jobstate.maintenance` does.
    """

    def __init__(self, using: str = "default", *, state: StateStore) -> None:
        self.using = using
        self.state = state
        self.outbox = DatabaseNotificationOutbox(using, store=state)
        self._deleter = BatchedDeleter(using)

    # --- candidates (what the batches pick from and a dry run counts) -------------------

    def stale_dispatched(self, *, dead_after: timedelta, hard_cap: timedelta) -> JobQuerySet:
        """Dispatched jobs whose executor stopped renewing (see
        :meth:`~jobstate.stores.base.StateStore.requeue_stale_dispatched`)."""
        dead = validate_duration(dead_after, field="dead_after")
        cap = validate_duration(hard_cap, field="hard_cap")
        return self._jobs().stale_dispatched(dead, cap)

    def expired_worker_leases(self, *, fallback_older_than: timedelta) -> JobQuerySet:
        """Running (in-process) jobs whose lease ended, or that have no lease and were
        last written more than ``fallback_older_than`` ago."""
        fallback = validate_duration(fallback_older_than, field="fallback_older_than")
        # Tasks have their own recovery, which records the lost attempt in the task's
        # attempt log (``recover_expired_tasks``, the ``tasks`` sweep).
        jobs = self._jobs().filter(status=JobStatus.RUNNING, task_path__isnull=True)
        return jobs.expired_leases(fallback)

    def stale_queued(self, *, ttl: timedelta) -> JobQuerySet:
        """Queued jobs created more than ``ttl`` ago."""
        return self._jobs().stale_queued(validate_duration(ttl, field="ttl"))

    def expired_locks(self) -> models.QuerySet[RuntimeLock]:
        """Runtime locks whose ``expires_at`` has passed on the database clock."""
        return RuntimeLock.objects.using(self.using).expired()

    def old_audit(self, *, older_than: timedelta) -> models.QuerySet[AuditEntry]:
        """Audit entries stamped more than ``older_than`` ago."""
        age = validate_duration(older_than, field="older_than", allow_zero=False)
        return AuditEntry.objects.using(self.using).filter(ts__lt=Now() - age)

    def old_finished_jobs(self, *, older_than: timedelta) -> JobQuerySet:
        """Done, error and rejected jobs last written more than ``older_than`` ago."""
        age = validate_duration(older_than, field="older_than", allow_zero=False)
        return self._jobs().terminal().not_written_for(age)

    def expired_outbox_leases(self) -> models.QuerySet[Notification]:
        """Notifications left delivering by a relay whose lease ended."""
        return self.outbox.expired_leases()

    def old_delivered_notifications(
        self, *, older_than: timedelta
    ) -> models.QuerySet[Notification]:
        """Delivered notifications settled more than ``older_than`` ago. A delivered
        row is last written when it is delivered, so ``updated_at`` is its delivery
        time, and the ``(state, updated_at)`` index serves the cut-off."""
        age = validate_duration(older_than, field="older_than", allow_zero=False)
        return Notification.objects.using(self.using).filter(
            state=NotificationState.DELIVERED, updated_at__lt=Now() - age
        )

    # --- dry-run counts ---------------------------------------------------------------

    def count_stale_dispatched(
        self, *, dead_after: timedelta, hard_cap: timedelta, limit: int | None = None
    ) -> int:
        return _count(self.stale_dispatched(dead_after=dead_after, hard_cap=hard_cap), limit)

    def count_expired_leases(
        self, *, fallback_older_than: timedelta, attempt_limit: int, limit: int | None = None
    ) -> LeaseRecovery:
        last = _attempt_limit(attempt_limit)
        candidates = self.expired_worker_leases(fallback_older_than=fallback_older_than)
        # A job on its last allowed attempt has ``attempts == attempt_limit - 1``.
        count, failing = _split_count(candidates, limit, last_from=last - 1)
        return LeaseRecovery(requeued=count - failing, failed=failing)

    def count_stale_queued(self, *, ttl: timedelta, limit: int | None = None) -> int:
        return _count(self.stale_queued(ttl=ttl), limit)

    def count_expired_locks(self, *, limit: int | None = None) -> int:
        return _count(self.expired_locks(), limit)

    def count_expired_outbox_leases(self, *, limit: int | None = None) -> OutboxLeaseRecovery:
        # A delivering row's ``attempts`` already counts the attempt its relay lost.
        count, dead = _split_count(
            self.expired_outbox_leases(), limit, last_from=jobstate_settings.OUTBOX_MAX_ATTEMPTS
        )
        return OutboxLeaseRecovery(rearmed=count - dead, dead=dead)

    def count_old_audit(self, *, older_than: timedelta, limit: int | None = None) -> int:
        return _count(self.old_audit(older_than=older_than), limit)

    def count_old_finished_jobs(self, *, older_than: timedelta, limit: int | None = None) -> int:
        return _count(self.old_finished_jobs(older_than=older_than), limit)

    def count_old_delivered_notifications(
        self, *, older_than: timedelta, limit: int | None = None
    ) -> int:
        return _count(self.old_delivered_notifications(older_than=older_than), limit)

    def old_workers(self, *, older_than: timedelta) -> WorkerQuerySet:
        """Registered workers whose last beat is older than ``older_than`` (the
        ``(heartbeat_at, id)`` index serves the cut-off and the order)."""
        age = validate_duration(older_than, field="older_than", allow_zero=False)
        return Worker.objects.using(self.using).silent_for(age)

    def count_old_workers(self, *, older_than: timedelta, limit: int | None = None) -> int:
        return _count(self.old_workers(older_than=older_than), limit)

    def prune_workers_batch(self, *, older_than: timedelta, limit: int) -> int:
        return self._deleter.delete_batch(
            self.old_workers(older_than=older_than), "heartbeat_at", limit
        )

    # --- reaping ----------------------------------------------------------------------

    def requeue_stale_dispatched_batch(
        self, *, dead_after: timedelta, hard_cap: timedelta, limit: int
    ) -> int:
        """The state store's bounded, audited requeue (``requeue_stale_dispatched``)."""
        return self.state.requeue_stale_dispatched(dead_after, hard_cap, limit=limit)

    def recover_expired_leases_batch(
        self, *, fallback_older_than: timedelta, attempt_limit: int, limit: int
    ) -> LeaseRecovery:
        """Recover up to ``limit`` running jobs whose in-process lease expired.

        A job's ``attempts`` counts the leases it lost. While ``attempts + 1`` is below
        ``attempt_limit`` the job is refired (``requeue_job``: back to ``queued``, claim
        cleared, a ``recovered`` audit entry) and keeps the new count; on the last
        attempt it moves to ``error`` with :data:`LEASE_EXPIRED_ERROR` and a
        ``recovered`` entry of severity error. The job's row stays locked from the pick
        to the commit, so a worker renewing or finishing the job at that moment either
        wins before the pick (the job is no longer a candidate) or waits and then finds
        its claim gone.
        """
        attempt_limit = _attempt_limit(attempt_limit)
        candidates = self.expired_worker_leases(fallback_older_than=fallback_older_than)
        requeued = failed = 0
        with transaction.atomic(using=self.using):
            picked = _pick_by_lease(candidates, limit, "id", "attempts", "executor_id")
            for job_id, attempts, worker in picked:
                tries = attempts + 1
                if tries < attempt_limit:
                    job = self.state.requeue_job(
                        job_id,
                        from_statuses=[JobStatus.RUNNING],
                        by=SWEEP_ACTOR,
                        via=f"worker-lease-expired:{worker or 'unknown'}"[:250],
                        event="recovered",
                    )
                    if job is not None:
                        self.state.update_job_if_status(job_id, [JobStatus.QUEUED], attempts=tries)
                        requeued += 1
                    continue
                job = self.state.update_job_if_status(
                    job_id,
                    [JobStatus.RUNNING],
                    status=JobStatus.ERROR,
                    error=LEASE_EXPIRED_ERROR,
                    attempts=tries,
                    **CLEARED_CLAIM,
                )
                if job is None:
                    continue
                self.state.append_audit(
                    job=job,
                    event="recovered",
                    severity=AuditSeverity.ERROR,
                    title="Failed: lease expired on the last attempt",
                    detail={
                        "by": SWEEP_ACTOR,
                        "via": "worker-lease-expired",
                        "prev_status": JobStatus.RUNNING.value,
                        "executor_id": worker,
                        "attempts": tries,
                        "status": JobStatus.ERROR.value,
                    },
                )
                failed += 1
        return LeaseRecovery(requeued=requeued, failed=failed)

    def expire_stale_queued_batch(self, *, ttl: timedelta, limit: int) -> int:
        """Move up to ``limit`` queued jobs older than ``ttl`` to ``error`` with
        :data:`~jobstate.stores.base.EXPIRED_QUEUED_ERROR`, each with an ``expired``
        audit entry. A job claimed meanwhile is left alone. Returns the jobs moved."""
        candidates = self.stale_queued(ttl=ttl)
        with transaction.atomic(using=self.using):
            picked = dict(
                pick_oldest(candidates, "created_at", limit).values_list("id", "executor_id")
            )
            if not picked:
                return 0
            moved = candidates.filter(id__in=list(picked)).update(
                status=JobStatus.ERROR, error=EXPIRED_QUEUED_ERROR, updated_at=Now()
            )
            audit_moved(
                self.using,
                picked,
                now_status=JobStatus.ERROR,
                event="expired",
                severity=AuditSeverity.WARNING,
                title="Expired in the queue",
                detail=lambda _: {
                    "by": SWEEP_ACTOR,
                    "via": "queued-ttl",
                    "prev_status": JobStatus.QUEUED.value,
                    "status": JobStatus.ERROR.value,
                },
            )
            return moved

    def release_expired_locks_batch(self, *, limit: int) -> int:
        """Delete up to ``limit`` runtime locks whose ``expires_at`` has passed. A lock
        renewed or taken over meanwhile is kept. Returns the locks deleted."""
        return self._deleter.delete_batch(self.expired_locks(), "expires_at", limit)

    def rearm_outbox_leases_batch(self, *, limit: int) -> OutboxLeaseRecovery:
        """Hand back up to ``limit`` notifications whose relay lease ended: pending
        again, or dead when the lost attempt was the last; see
        :meth:`~jobstate.stores.database.notification_outbox.DatabaseNotificationOutbox.rearm_expired_leases`."""
        return self.outbox.rearm_expired_leases(limit=limit)

    # --- retention --------------------------------------------------------------------

    def prune_audit_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Delete up to ``limit`` audit entries older than ``older_than``."""
        return self._deleter.delete_batch(self.old_audit(older_than=older_than), "ts", limit)

    def prune_finished_jobs_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Delete up to ``limit`` finished jobs last written more than ``older_than`` ago.

        Their audit entries, approval markers and undelivered notifications are kept
        (the notifications lose only their link to the job)."""
        return self._deleter.delete_batch(
            self.old_finished_jobs(older_than=older_than), "updated_at", limit
        )

    def prune_delivered_notifications_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Delete up to ``limit`` notifications delivered more than ``older_than`` ago,
        with their ``DeliveryAttempt`` history (by cascade). Pending, delivering and
        dead rows are never deleted, nor are replay markers."""
        return self._deleter.delete_batch(
            self.old_delivered_notifications(older_than=older_than), "updated_at", limit
        )

    # --- internals --------------------------------------------------------------------

    def _jobs(self) -> JobQuerySet:
        return Job.objects.using(self.using)


def requeue_stale_dispatched(
    using: str, dead_after: timedelta, hard_cap: timedelta, scope: list[str] | None, limit: int
) -> int:
    """The state store's ``_requeue_stale_dispatched``: the ``limit`` oldest leases,
    locked, moved by one ``UPDATE`` that re-checks them, and audited."""
    candidates = Job.objects.using(using).stale_dispatched(dead_after, hard_cap).for_targets(scope)
    with transaction.atomic(using=using):
        picked = dict(_pick_by_lease(candidates, limit, "id", "executor_id"))
        if not picked:
            return 0
        moved = candidates.filter(id__in=list(picked)).update(
            status=JobStatus.QUEUED, updated_at=Now(), **CLEARED_CLAIM
        )
        audit_moved(
            using,
            picked,
            now_status=JobStatus.QUEUED,
            event="recovered",
            severity=AuditSeverity.WARNING,
            title="Requeued: executor lease expired",
            detail=lambda executor: {
                "by": SWEEP_ACTOR,
                "via": "executor-lease-expired",
                "prev_status": JobStatus.DISPATCHED.value,
                "executor_id": executor,
            },
        )
        return moved


def audit_moved(
    using: str,
    picked: dict[uuid.UUID, Any],
    *,
    now_status: JobStatus,
    event: str,
    severity: AuditSeverity,
    title: str,
    detail: Callable[[Any], dict[str, Any]],
) -> None:
    """One audit entry per picked job that the update really moved (those now in
    ``now_status``: the rows are still locked by this transaction)."""
    moved = Job.objects.using(using).filter(id__in=list(picked), status=now_status)
    # The entries differ only by what ``picked`` holds (an executor, say), and a
    # batch has few distinct values: check each entry's fields once per value.
    fields_of: dict[Any, AuditFields] = {}
    entries = []
    for job_id, request_id in moved.values_list("id", "request_id"):
        fields = fields_of.get(picked[job_id])
        if fields is None:
            fields = fields_of[picked[job_id]] = complete_audit_fields(
                event=event,
                stage=None,
                severity=severity,
                title=title,
                summary="",
                detail=detail(picked[job_id]),
            )
        entries.append(audit_row(job_id, request_id, event, fields))
    AuditEntry.objects.using(using).bulk_create(entries)


def _pick_by_lease(candidates: JobQuerySet, limit: int, *fields: str) -> list[tuple[Any, ...]]:
    """``fields`` of the ``limit`` candidates with the oldest ``lease_until`` (jobs
    without a lease last, by pk), locked as :func:`pick_oldest` locks them.

    Two picks instead of one ordered by ``lease_until``: the rows holding a lease come
    in order from the lease index, ``(status, lease_until, id)``, so a batch reads
    ``limit`` of them. One pick over both kinds must read and sort every candidate
    instead, which grows with the backlog (200 ms a batch at 100,000 stale jobs)."""
    leased = pick_oldest(candidates.filter(lease_until__isnull=False), "lease_until", limit)
    picked = list(leased.values_list(*fields))
    if len(picked) < limit:
        unleased = candidates.filter(lease_until__isnull=True)
        picked += pick_oldest(unleased, "lease_until", limit - len(picked)).values_list(*fields)
    return picked


@translate_store_errors
class DatabaseRunSweepStore(RunSweepStore):
    """:class:`~jobstate.stores.contracts.sweep_store.RunSweepStore` on the ``JobRun`` table of
    database ``using``; a run store's ``sweep_store()`` makes one.

    Reaping goes through ``runs``, the run store that made this one, so a stale run is
    timed out by exactly the transition its ``reap_stale`` guarantees (S4). Use one
    instance per sweep, as :class:`DatabaseSweepStore` says.
    """

    def __init__(self, using: str = "default", *, runs: JobRunStore) -> None:
        self.using = using
        self.runs = runs
        self._deleter = BatchedDeleter(using)

    def stale_runs(self, *, stale_after: timedelta) -> models.QuerySet[JobRun]:
        """RUNNING runs whose heartbeat is at least ``stale_after`` old."""
        age = validate_duration(stale_after, field="stale_after")
        return JobRun.objects.using(self.using).stale(age)

    def old_finished_runs(self, *, older_than: timedelta) -> models.QuerySet[JobRun]:
        """Settled and skipped runs that finished more than ``older_than`` ago."""
        age = validate_duration(older_than, field="older_than", allow_zero=False)
        return (
            JobRun.objects.using(self.using)
            .filter(status__in=list(TERMINAL_RUN_STATUSES))
            .filter(finished_at__lt=Now() - age)
        )

    def reap_stale_runs_batch(self, *, stale_after: timedelta, limit: int) -> int:
        return self.runs.reap_stale(stale_after=stale_after, limit=limit)

    def count_stale_runs(self, *, stale_after: timedelta, limit: int | None = None) -> int:
        return _count(self.stale_runs(stale_after=stale_after), limit)

    def prune_finished_runs_batch(self, *, older_than: timedelta, limit: int) -> int:
        """Delete up to ``limit`` runs that finished more than ``older_than`` ago;
        RUNNING runs are never deleted."""
        return self._deleter.delete_batch(
            self.old_finished_runs(older_than=older_than), "finished_at", limit
        )

    def count_old_finished_runs(self, *, older_than: timedelta, limit: int | None = None) -> int:
        return _count(self.old_finished_runs(older_than=older_than), limit)


def _count(candidates: models.QuerySet[_M], limit: int | None) -> int:
    """How many ``candidates`` a batch of ``limit`` rows would take (all without one)."""
    cap = validate_reap_limit(limit)
    # A sliced count stops reading at the cap instead of counting the whole backlog.
    return candidates.count() if cap is None else candidates[:cap].count()


def _split_count(
    candidates: models.QuerySet[_M], limit: int | None, *, last_from: int
) -> tuple[int, int]:
    """``(rows, rows with attempts >= last_from)`` among the ``limit`` candidates a
    batch would take first (by ``lease_until``, then pk; all candidates without a
    limit)."""
    cap = validate_reap_limit(limit)
    if cap is None:
        return candidates.count(), candidates.filter(attempts__gte=last_from).count()
    first = candidates.order_by("lease_until", "pk").values_list("attempts", flat=True)
    attempts = list(first[:cap])
    return len(attempts), sum(1 for n in attempts if n >= last_from)


def _attempt_limit(attempt_limit: int) -> int:
    if isinstance(attempt_limit, bool) or not isinstance(attempt_limit, int):
        raise TypeError(f"attempt_limit must be an int, got {attempt_limit!r}.")
    if attempt_limit < 1:
        raise ValueError(f"attempt_limit must be at least 1, got {attempt_limit}.")
    return attempt_limit
