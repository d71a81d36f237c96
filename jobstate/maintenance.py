"""Maintenance sweeps: the one layer behind the cron commands, the Celery tasks and the
demo's loop.

*Reaping* sweeps settle work whose owner is gone; *retention* sweeps delete history past
its retention. Every sweep

- is **bounded**: each statement moves or deletes at most ``batch_size`` rows (default
  ``JOBSTATE['SWEEP_BATCH_SIZE']`` for reaping, ``JOBSTATE['RETENTION_BATCH_SIZE']`` for
  retention) in its own short transaction, and one call starts no new batch once
  ``time_budget`` (default ``JOBSTATE['SWEEP_TIME_BUDGET']``) has passed; ``limit``
  optionally caps the rows of one call;
- is **idempotent**: a second call finds nothing left to do;
- is **safe on several machines at once**: candidates are locked with ``SKIP LOCKED``
  and every write re-checks its condition, so each row is moved and counted by exactly
  one caller;
- **returns what it did** as a :class:`SweepResult`.

:func:`run_reaping_sweeps` and :func:`run_retention_sweeps` run the sweeps listed in
:data:`REAPING_SWEEPS` and :data:`RETENTION_SWEEPS` and return a :class:`SweepReport`.
A new sweep joins them with one line in those dicts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from django.db import DEFAULT_DB_ALIAS
from django.db.models import QuerySet

from jobstate.conf import jobstate_settings
from jobstate.exceptions import InvalidJobState
from jobstate.models import JobRun
from jobstate.runner import FROM_SETTINGS, JobRunner
from jobstate.stores import get_run_store
from jobstate.stores.database.sweeps import DatabaseSweepStore, LeaseRecovery
from jobstate.stores.validation import validate_duration

__all__ = [
    "REAPING_SWEEPS",
    "RETENTION_SWEEPS",
    "ReapingSweep",
    "RetentionSweep",
    "SweepProgress",
    "SweepReport",
    "SweepResult",
    "expire_stale_queued",
    "prune_audit",
    "prune_delivered_notifications",
    "prune_finished_jobs",
    "prune_finished_runs",
    "reap_stale_runs",
    "rearm_outbox_leases",
    "recover_expired_leases",
    "release_expired_locks",
    "requeue_stale_dispatched",
    "run_reaping_sweeps",
    "run_retention_sweeps",
]

logger = logging.getLogger("jobstate.maintenance")

#: Called after every batch with the sweep's name and the rows it has moved so far
#: (for progress displays).
SweepProgress = Callable[[str, int], None]


@dataclass(frozen=True)
class SweepResult:
    """What one sweep call did.

    ``count`` is the rows this call moved or deleted (with ``dry_run``: the rows it
    would move now, nothing written); ``batches`` the statements it ran. ``complete`` is
    ``False`` when the call stopped at its time budget or ``limit`` and candidates may
    be left for the next call. ``detail`` splits ``count`` where a sweep has more than
    one outcome (expired leases: ``requeued`` / ``failed``).
    """

    sweep: str
    count: int
    batches: int = 0
    complete: bool = True
    dry_run: bool = False
    detail: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepReport:
    """The results of a run of several sweeps, in the order they ran."""

    results: tuple[SweepResult, ...]
    dry_run: bool = False

    def __getitem__(self, sweep: str) -> SweepResult:
        for result in self.results:
            if result.sweep == sweep:
                return result
        raise KeyError(sweep)

    @property
    def total(self) -> int:
        return sum(result.count for result in self.results)

    @property
    def complete(self) -> bool:
        return all(result.complete for result in self.results)

    @property
    def counts(self) -> dict[str, int]:
        """Every count, flat: ``{sweep: count, f"{sweep}_{outcome}": n, ...}``."""
        flat: dict[str, int] = {}
        for result in self.results:
            flat[result.sweep] = result.count
            for outcome, count in result.detail.items():
                flat[f"{result.sweep}_{outcome}"] = count
        return flat

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every count, plus ``dry_run`` and ``complete``."""
        return {**self.counts, "dry_run": self.dry_run, "complete": self.complete}


class ReapingSweep(Protocol):
    """The call :func:`run_reaping_sweeps` makes of every entry of :data:`REAPING_SWEEPS`."""

    def __call__(
        self,
        *,
        using: str = ...,
        batch_size: int | None = ...,
        time_budget: timedelta | None = ...,
        limit: int | None = ...,
        dry_run: bool = ...,
        on_batch: SweepProgress | None = ...,
    ) -> SweepResult: ...


class RetentionSweep(Protocol):
    """The call :func:`run_retention_sweeps` makes of every entry of
    :data:`RETENTION_SWEEPS`; ``older_than=None`` means the sweep's retention setting."""

    def __call__(
        self,
        *,
        using: str = ...,
        older_than: timedelta | None = ...,
        batch_size: int | None = ...,
        time_budget: timedelta | None = ...,
        limit: int | None = ...,
        dry_run: bool = ...,
        on_batch: SweepProgress | None = ...,
    ) -> SweepResult: ...


# --- argument checks ---------------------------------------------------------------------


def _positive_int(value: int | None, *, field: str, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidJobState(f"{field} must be a positive int, got {value!r}.")
    return value


def _batch_size(value: int | None, default: int | None = None) -> int:
    if default is None:
        default = jobstate_settings.SWEEP_BATCH_SIZE
    size = _positive_int(value, field="batch_size", default=default)
    assert size is not None  # the settings are validated as positive ints
    return size


def _time_budget(value: timedelta | None) -> timedelta:
    if value is None:
        return jobstate_settings.SWEEP_TIME_BUDGET
    return validate_duration(value, field="time_budget", allow_zero=False)


def _retention(value: timedelta | None, default: timedelta) -> timedelta:
    if value is None:
        return default
    return validate_duration(value, field="older_than", allow_zero=False)


# --- the batch loop ----------------------------------------------------------------------


def _run_batches(
    sweep: str,
    step: Callable[[int], int],
    *,
    batch_size: int | None,
    time_budget: timedelta | None,
    limit: int | None,
    on_batch: SweepProgress | None,
    default_batch_size: int | None = None,
) -> SweepResult:
    """Call ``step(n)`` (move at most ``n`` rows, return how many moved) until a batch
    comes back short, ``limit`` rows have moved, or the time budget has passed.
    ``batch_size`` defaults to ``default_batch_size``, else ``SWEEP_BATCH_SIZE``."""
    batch = _batch_size(batch_size, default_batch_size)
    budget = _time_budget(time_budget)
    cap = _positive_int(limit, field="limit", default=None)
    deadline = time.monotonic() + budget.total_seconds()
    total = batches = 0
    while True:
        want = batch if cap is None else min(batch, cap - total)
        moved = step(want)
        total += moved
        batches += 1
        if on_batch is not None:
            on_batch(sweep, total)
        # A short batch means no unlocked candidate was left: the rest, if any, belongs
        # to a concurrent sweeper that holds it.
        if moved < want:
            return SweepResult(sweep, total, batches, complete=True)
        if (cap is not None and total >= cap) or time.monotonic() >= deadline:
            logger.info(
                "sweep %s stopped after %d rows in %d batches (limit or time budget); "
                "the next call continues",
                sweep,
                total,
                batches,
            )
            return SweepResult(sweep, total, batches, complete=False)


def _dry_run(sweep: str, candidates: QuerySet[Any], limit: int | None) -> SweepResult:
    cap = _positive_int(limit, field="limit", default=None)
    count = candidates.count()
    return SweepResult(sweep, count if cap is None else min(count, cap), dry_run=True)


# --- reaping sweeps ----------------------------------------------------------------------


def reap_stale_runs(
    *,
    using: str = DEFAULT_DB_ALIAS,
    stale_after: timedelta | None = None,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``runs``: move RUNNING operations-job runs whose heartbeat is older than
    ``stale_after`` (default ``STALE_RUN_AFTER``, at least twice ``HEARTBEAT_INTERVAL``)
    to TIMED_OUT through the run store, freeing their overlap keys (S4)."""
    runner = JobRunner(
        store=get_run_store(using=using),
        stale_run_after=FROM_SETTINGS if stale_after is None else stale_after,
    )
    if dry_run:
        return _dry_run("runs", JobRun.objects.using(using).stale(runner.stale_run_after), limit)
    return _run_batches(
        "runs",
        lambda n: runner.reap_stale_runs(limit=n),
        batch_size=batch_size,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )


def requeue_stale_dispatched(
    *,
    using: str = DEFAULT_DB_ALIAS,
    dead_after: timedelta | None = None,
    hard_cap: timedelta | None = None,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``dispatched``: hand jobs of remote executors that stopped renewing back to the
    queue: lease expired, no lease and silent for ``dead_after`` (default
    ``EXECUTOR_DEAD_AFTER``), or dispatched longer than ``hard_cap`` (default
    ``EXECUTOR_HARD_CAP``). Each gets a ``recovered`` audit entry."""
    store = DatabaseSweepStore(using)
    dead = jobstate_settings.EXECUTOR_DEAD_AFTER if dead_after is None else dead_after
    cap = jobstate_settings.EXECUTOR_HARD_CAP if hard_cap is None else hard_cap
    if dry_run:
        return _dry_run("dispatched", store.stale_dispatched(dead_after=dead, hard_cap=cap), limit)
    return _run_batches(
        "dispatched",
        lambda n: store.requeue_stale_dispatched_batch(dead_after=dead, hard_cap=cap, limit=n),
        batch_size=batch_size,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )


def recover_expired_leases(
    *,
    using: str = DEFAULT_DB_ALIAS,
    fallback_older_than: timedelta | None = None,
    attempt_limit: int | None = None,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``leases``: recover running jobs of in-process workers whose lease expired (or
    that have no lease and were silent for ``fallback_older_than``, default
    ``WORKER_LEASE``). Each expiry counts as an attempt: below ``attempt_limit``
    (default ``WORKER_ATTEMPT_LIMIT``) the job is requeued with a ``recovered`` audit
    entry, on the last attempt it moves to ``error``. ``detail`` has ``requeued`` and
    ``failed``."""
    store = DatabaseSweepStore(using)
    fallback = (
        jobstate_settings.WORKER_LEASE if fallback_older_than is None else fallback_older_than
    )
    tries = _positive_int(
        attempt_limit, field="attempt_limit", default=jobstate_settings.WORKER_ATTEMPT_LIMIT
    )
    assert tries is not None  # the setting is validated as a positive int
    candidates = store.expired_worker_leases(fallback_older_than=fallback)
    if dry_run:
        cap = _positive_int(limit, field="limit", default=None)
        if cap is None:
            failing = candidates.filter(attempts__gte=tries - 1).count()
            count = candidates.count()
        else:
            first = candidates.order_by("lease_until", "pk").values_list("attempts", flat=True)
            attempts = list(first[:cap])
            failing, count = sum(1 for n in attempts if n + 1 >= tries), len(attempts)
        detail = {"requeued": count - failing, "failed": failing}
        return SweepResult("leases", count, dry_run=True, detail=detail)
    outcome = {"requeued": 0, "failed": 0}

    def step(n: int) -> int:
        batch: LeaseRecovery = store.recover_expired_leases_batch(
            fallback_older_than=fallback, attempt_limit=tries, limit=n
        )
        outcome["requeued"] += batch.requeued
        outcome["failed"] += batch.failed
        return batch.total

    result = _run_batches(
        "leases",
        step,
        batch_size=batch_size,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )
    return SweepResult(
        "leases", result.count, result.batches, result.complete, detail=dict(outcome)
    )


def expire_stale_queued(
    *,
    using: str = DEFAULT_DB_ALIAS,
    ttl: timedelta | None = None,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``queued``: move jobs that waited in the queue longer than ``ttl`` since they were
    created (default ``QUEUED_TTL``) to ``error``, each with an ``expired`` audit entry,
    so stale work is not replayed in bulk once executors come back."""
    store = DatabaseSweepStore(using)
    duration = jobstate_settings.QUEUED_TTL if ttl is None else ttl
    candidates = store.stale_queued(ttl=duration)
    if dry_run:
        return _dry_run("queued", candidates, limit)
    return _run_batches(
        "queued",
        lambda n: store.expire_stale_queued_batch(ttl=duration, limit=n),
        batch_size=batch_size,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )


def release_expired_locks(
    *,
    using: str = DEFAULT_DB_ALIAS,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``locks``: delete runtime locks whose ``expires_at`` has passed. An expired lock
    already lets a new owner in; deleting it keeps the table to the locks that exist."""
    store = DatabaseSweepStore(using)
    if dry_run:
        return _dry_run("locks", store.expired_locks(), limit)
    return _run_batches(
        "locks",
        lambda n: store.release_expired_locks_batch(limit=n),
        batch_size=batch_size,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )


def rearm_outbox_leases(
    *,
    using: str = DEFAULT_DB_ALIAS,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``outbox``: hand back notifications a relay claimed and never settled (its lease
    ended: the relay died or stalled). Each lost attempt is recorded the way a relay's
    claim records it; a row with attempts left goes back to ``pending`` and is due at
    once, a row whose lost attempt was its last (``OUTBOX_MAX_ATTEMPTS``) becomes dead
    with a ``delivery_error`` audit entry. ``detail`` has ``rearmed`` and ``dead``.

    Relays take such rows over by themselves when they claim; the sweep settles them
    while no relay runs, so the outbox shows what is really in flight."""
    store = DatabaseSweepStore(using)
    candidates = store.expired_outbox_leases()
    if dry_run:
        cap = _positive_int(limit, field="limit", default=None)
        last = jobstate_settings.OUTBOX_MAX_ATTEMPTS
        if cap is None:
            dead, count = candidates.filter(attempts__gte=last).count(), candidates.count()
        else:
            first = candidates.order_by("lease_until", "pk").values_list("attempts", flat=True)
            attempts = list(first[:cap])
            dead, count = sum(1 for n in attempts if n >= last), len(attempts)
        detail = {"rearmed": count - dead, "dead": dead}
        return SweepResult("outbox", count, dry_run=True, detail=detail)
    outcome = {"rearmed": 0, "dead": 0}

    def step(n: int) -> int:
        batch = store.rearm_outbox_leases_batch(limit=n)
        outcome["rearmed"] += batch.rearmed
        outcome["dead"] += batch.dead
        return batch.total

    result = _run_batches(
        "outbox",
        step,
        batch_size=batch_size,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )
    return SweepResult(
        "outbox", result.count, result.batches, result.complete, detail=dict(outcome)
    )


# --- retention sweeps --------------------------------------------------------------------


def prune_audit(
    *,
    using: str = DEFAULT_DB_ALIAS,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``audit``: delete audit entries older than ``older_than`` (default
    ``AUDIT_RETENTION``)."""
    store = DatabaseSweepStore(using)
    age = _retention(older_than, jobstate_settings.AUDIT_RETENTION)
    if dry_run:
        return _dry_run("audit", store.old_audit(older_than=age), limit)
    return _run_batches(
        "audit",
        lambda n: store.prune_audit_batch(older_than=age, limit=n),
        batch_size=batch_size,
        default_batch_size=jobstate_settings.RETENTION_BATCH_SIZE,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )


def prune_finished_jobs(
    *,
    using: str = DEFAULT_DB_ALIAS,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``jobs``: delete done, error and rejected jobs last written more than
    ``older_than`` ago (default ``FINISHED_JOB_RETENTION``). Their audit entries and
    approval markers stay; undelivered notifications stay, unlinked from the job."""
    store = DatabaseSweepStore(using)
    age = _retention(older_than, jobstate_settings.FINISHED_JOB_RETENTION)
    if dry_run:
        return _dry_run("jobs", store.old_finished_jobs(older_than=age), limit)
    return _run_batches(
        "jobs",
        lambda n: store.prune_finished_jobs_batch(older_than=age, limit=n),
        batch_size=batch_size,
        default_batch_size=jobstate_settings.RETENTION_BATCH_SIZE,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )


def prune_finished_runs(
    *,
    using: str = DEFAULT_DB_ALIAS,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``runs``: delete operations-job runs (settled or skipped) that finished more than
    ``older_than`` ago (default ``FINISHED_RUN_RETENTION``). RUNNING runs stay."""
    store = DatabaseSweepStore(using)
    age = _retention(older_than, jobstate_settings.FINISHED_RUN_RETENTION)
    if dry_run:
        return _dry_run("runs", store.old_finished_runs(older_than=age), limit)
    return _run_batches(
        "runs",
        lambda n: store.prune_finished_runs_batch(older_than=age, limit=n),
        batch_size=batch_size,
        default_batch_size=jobstate_settings.RETENTION_BATCH_SIZE,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )


def prune_delivered_notifications(
    *,
    using: str = DEFAULT_DB_ALIAS,
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    on_batch: SweepProgress | None = None,
) -> SweepResult:
    """``notifications``: delete notifications delivered more than ``older_than`` ago
    (default ``DELIVERED_NOTIFICATION_RETENTION``), with their delivery attempts.

    Dead letters are never deleted here, whatever their age: they wait for an operator
    to replay them (``requeue_delivery_job_once``) or to delete them by hand. Pending
    and delivering rows stay too, and so do replay markers, so a dead-letter key can
    never replay twice even after its notification is gone."""
    store = DatabaseSweepStore(using)
    age = _retention(older_than, jobstate_settings.DELIVERED_NOTIFICATION_RETENTION)
    if dry_run:
        return _dry_run("notifications", store.old_delivered_notifications(older_than=age), limit)
    return _run_batches(
        "notifications",
        lambda n: store.prune_delivered_notifications_batch(older_than=age, limit=n),
        batch_size=batch_size,
        default_batch_size=jobstate_settings.RETENTION_BATCH_SIZE,
        time_budget=time_budget,
        limit=limit,
        on_batch=on_batch,
    )


# --- registries and runners --------------------------------------------------------------

#: The reaping sweeps, in the order :func:`run_reaping_sweeps` runs them. The queue TTL
#: runs before the requeues, so a job handed back by a dead owner gets one more chance
#: to be claimed before its age can expire it.
REAPING_SWEEPS: dict[str, ReapingSweep] = {
    "runs": reap_stale_runs,
    "queued": expire_stale_queued,
    "dispatched": requeue_stale_dispatched,
    "leases": recover_expired_leases,
    "outbox": rearm_outbox_leases,
    "locks": release_expired_locks,
}

#: The retention sweeps, in the order :func:`run_retention_sweeps` runs them.
RETENTION_SWEEPS: dict[str, RetentionSweep] = {
    "audit": prune_audit,
    "jobs": prune_finished_jobs,
    "runs": prune_finished_runs,
    "notifications": prune_delivered_notifications,
}


def _selected(registry: Mapping[str, Any], sweeps: Iterable[str] | None) -> list[str]:
    if sweeps is None:
        return list(registry)
    if isinstance(sweeps, str):
        raise InvalidJobState(f"sweeps must be a list of sweep names, got {sweeps!r}.")
    chosen = list(sweeps)
    unknown = [name for name in chosen if name not in registry]
    if unknown:
        raise InvalidJobState(
            f"unknown sweep(s) {', '.join(map(repr, unknown))}; known: {', '.join(registry)}."
        )
    return [name for name in registry if name in chosen]


def _check_common(batch_size: int | None, time_budget: timedelta | None, limit: int | None) -> None:
    _batch_size(batch_size)
    _time_budget(time_budget)
    _positive_int(limit, field="limit", default=None)


def run_reaping_sweeps(
    *,
    using: str = DEFAULT_DB_ALIAS,
    batch_size: int | None = None,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
    stale_after: timedelta | None = None,
    sweeps: Iterable[str] | None = None,
    on_batch: SweepProgress | None = None,
) -> SweepReport:
    """Run every reaping sweep (or those named in ``sweeps``) on database ``using``.

    ``batch_size``, ``time_budget`` and ``limit`` apply to each sweep on its own;
    ``stale_after`` is the liveness budget of the ``runs`` sweep. Arguments are checked
    before any sweep runs. A sweep that raises stops the run (the ones before it have
    committed their batches); the next call starts over, which is safe because every
    sweep is idempotent.
    """
    names = _selected(REAPING_SWEEPS, sweeps)
    _check_common(batch_size, time_budget, limit)
    if stale_after is not None:
        JobRunner(store=get_run_store(using=using), stale_run_after=stale_after)
    results = []
    for name in names:
        common: dict[str, Any] = {
            "using": using,
            "batch_size": batch_size,
            "time_budget": time_budget,
            "limit": limit,
            "dry_run": dry_run,
            "on_batch": on_batch,
        }
        if name == "runs" and stale_after is not None:
            result = reap_stale_runs(stale_after=stale_after, **common)
        else:
            result = REAPING_SWEEPS[name](**common)
        results.append(_logged(result))
    return SweepReport(tuple(results), dry_run=dry_run)


def run_retention_sweeps(
    older_than: timedelta | None = None,
    batch_size: int | None = None,
    dry_run: bool = False,
    *,
    using: str = DEFAULT_DB_ALIAS,
    time_budget: timedelta | None = None,
    limit: int | None = None,
    sweeps: Iterable[str] | None = None,
    on_batch: SweepProgress | None = None,
) -> SweepReport:
    """Run every retention sweep (or those named in ``sweeps``) on database ``using``.

    ``older_than`` replaces every sweep's retention setting (``AUDIT_RETENTION``,
    ``FINISHED_JOB_RETENTION``, ``FINISHED_RUN_RETENTION``,
    ``DELIVERED_NOTIFICATION_RETENTION``) when given. Arguments
    are checked before any sweep runs.
    """
    names = _selected(RETENTION_SWEEPS, sweeps)
    _check_common(batch_size, time_budget, limit)
    if older_than is not None:
        _retention(older_than, older_than)
    results = [
        _logged(
            RETENTION_SWEEPS[name](
                using=using,
                older_than=older_than,
                batch_size=batch_size,
                time_budget=time_budget,
                limit=limit,
                dry_run=dry_run,
                on_batch=on_batch,
            )
        )
        for name in names
    ]
    return SweepReport(tuple(results), dry_run=dry_run)


def _logged(result: SweepResult) -> SweepResult:
    if result.count and not result.dry_run:
        logger.info(
            "sweep %s moved %d rows in %d batches",
            result.sweep,
            result.count,
            result.batches,
            extra={"sweep": result.sweep, "count": result.count},
        )
    return result
