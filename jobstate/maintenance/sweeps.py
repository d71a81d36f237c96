"""Each sweep as a function of its own, and the two runners, all running entries of the
one sweep registry (:mod:`jobstate.maintenance.sweep_table`).

Every sweep function takes its own arguments (``None``: the setting named in its
docstring) and the :class:`~jobstate.maintenance.sweep_loop.SweepOptions` every sweep takes
(``using``, ``batch_size``, ``time_budget``, ``limit``, ``dry_run``, ``on_batch``), all
keyword-only, and returns a :class:`~jobstate.maintenance.sweep_results.SweepResult`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Unpack

from django.db import DEFAULT_DB_ALIAS

from jobstate.exceptions import InvalidJobState
from jobstate.maintenance.sweep_loop import SweepOptions, check_options, run_sweep
from jobstate.maintenance.sweep_results import SweepProgress, SweepReport, SweepResult
from jobstate.maintenance.sweep_table import (
    REAPING_SWEEPS,
    RETENTION_SWEEPS,
    SweepKind,
    check_retention,
    check_stale_after,
)

# In groups: the registry, the runners, the reaping sweeps, the retention sweeps.
__all__ = ["REAPING_SWEEPS", "RETENTION_SWEEPS"]
__all__ += ["run_reaping_sweeps", "run_retention_sweeps"]
__all__ += ["expire_stale_queued", "reap_stale_runs", "requeue_stale_dispatched"]
__all__ += ["rearm_outbox_leases", "recover_expired_leases", "recover_lost_tasks"]
__all__ += ["release_expired_locks"]
__all__ += ["prune_audit", "prune_delivered_notifications"]
__all__ += ["prune_finished_jobs", "prune_finished_runs", "prune_workers"]


# --- reaping sweeps ----------------------------------------------------------------------


def reap_stale_runs(
    *, stale_after: timedelta | None = None, **options: Unpack[SweepOptions]
) -> SweepResult:
    """``runs``: move RUNNING operations-job runs whose heartbeat is older than
    ``stale_after`` (default ``STALE_RUN_AFTER``, at least twice ``HEARTBEAT_INTERVAL``)
    to TIMED_OUT through the run store, freeing their overlap keys (S4)."""
    return run_sweep(REAPING_SWEEPS["runs"], {"stale_after": stale_after}, **options)


def requeue_stale_dispatched(
    *,
    dead_after: timedelta | None = None,
    hard_cap: timedelta | None = None,
    **options: Unpack[SweepOptions],
) -> SweepResult:
    """``dispatched``: hand jobs of remote executors that stopped renewing back to the
    queue: lease expired, no lease and silent for ``dead_after`` (default
    ``EXECUTOR_DEAD_AFTER``), or dispatched longer than ``hard_cap`` (default
    ``EXECUTOR_HARD_CAP``). Each gets a ``recovered`` audit entry."""
    given = {"dead_after": dead_after, "hard_cap": hard_cap}
    return run_sweep(REAPING_SWEEPS["dispatched"], given, **options)


def recover_expired_leases(
    *,
    fallback_older_than: timedelta | None = None,
    attempt_limit: int | None = None,
    **options: Unpack[SweepOptions],
) -> SweepResult:
    """``leases``: recover running jobs of in-process workers whose lease expired (or
    that have no lease and were silent for ``fallback_older_than``, default
    ``WORKER_LEASE``). Each expiry counts as an attempt: below ``attempt_limit``
    (default ``WORKER_ATTEMPT_LIMIT``) the job is requeued with a ``recovered`` audit
    entry, on the last attempt it moves to ``error``. ``detail`` has ``requeued`` and
    ``failed``."""
    given = {"fallback_older_than": fallback_older_than, "attempt_limit": attempt_limit}
    return run_sweep(REAPING_SWEEPS["leases"], given, **options)


def recover_lost_tasks(**options: Unpack[SweepOptions]) -> SweepResult:
    """``tasks``: recover django.tasks tasks whose worker stopped renewing their lease
    (it was killed, hung or lost its database). The lost attempt is recorded with a
    ``WorkerLost`` error; with attempts left (the task's ``max_attempts``) the task goes
    back to the queue, due at once, otherwise it fails. Each gets a ``recovered`` audit
    entry. ``detail`` has ``requeued`` and ``failed``. Running workers do the same now
    and then; the sweep settles such tasks while no worker runs."""
    return run_sweep(REAPING_SWEEPS["tasks"], **options)


def expire_stale_queued(
    *, ttl: timedelta | None = None, **options: Unpack[SweepOptions]
) -> SweepResult:
    """``queued``: move jobs (not tasks) that waited in the queue longer than ``ttl``
    since they were created (default ``QUEUED_TTL``) to ``error``, each with an
    ``expired`` audit entry, so stale work is not replayed in bulk once executors come
    back."""
    return run_sweep(REAPING_SWEEPS["queued"], {"ttl": ttl}, **options)


def release_expired_locks(**options: Unpack[SweepOptions]) -> SweepResult:
    """``locks``: delete runtime locks whose ``expires_at`` has passed. An expired lock
    already lets a new owner in; deleting it keeps the table to the locks that exist."""
    return run_sweep(REAPING_SWEEPS["locks"], **options)


def rearm_outbox_leases(**options: Unpack[SweepOptions]) -> SweepResult:
    """``outbox``: hand back notifications a relay claimed and never settled (its lease
    ended: the relay died or stalled). Each lost attempt is recorded the way a relay's
    claim records it; a row with attempts left goes back to ``pending`` and is due at
    once, a row whose lost attempt was its last (``OUTBOX_MAX_ATTEMPTS``) becomes dead
    with a ``delivery_error`` audit entry. ``detail`` has ``rearmed`` and ``dead``.

    Relays take such rows over by themselves when they claim; the sweep settles them
    while no relay runs, so the outbox shows what is really in flight."""
    return run_sweep(REAPING_SWEEPS["outbox"], **options)


# --- retention sweeps --------------------------------------------------------------------


def prune_audit(
    *, older_than: timedelta | None = None, **options: Unpack[SweepOptions]
) -> SweepResult:
    """``audit``: delete audit entries older than ``older_than`` (default
    ``AUDIT_RETENTION``)."""
    return run_sweep(RETENTION_SWEEPS["audit"], {"older_than": older_than}, **options)


def prune_finished_jobs(
    *, older_than: timedelta | None = None, **options: Unpack[SweepOptions]
) -> SweepResult:
    """``jobs``: delete done, error and rejected jobs last written more than
    ``older_than`` ago (default ``FINISHED_JOB_RETENTION``). Their audit entries and
    approval markers stay; undelivered notifications stay, unlinked from the job."""
    return run_sweep(RETENTION_SWEEPS["jobs"], {"older_than": older_than}, **options)


def prune_finished_runs(
    *, older_than: timedelta | None = None, **options: Unpack[SweepOptions]
) -> SweepResult:
    """``runs``: delete operations-job runs (settled or skipped) that finished more than
    ``older_than`` ago (default ``FINISHED_RUN_RETENTION``). RUNNING runs stay."""
    return run_sweep(RETENTION_SWEEPS["runs"], {"older_than": older_than}, **options)


def prune_delivered_notifications(
    *, older_than: timedelta | None = None, **options: Unpack[SweepOptions]
) -> SweepResult:
    """``notifications``: delete notifications delivered more than ``older_than`` ago
    (default ``DELIVERED_NOTIFICATION_RETENTION``), with their delivery attempts.

    Dead letters are never deleted here, whatever their age: they wait for an operator
    to replay them (``requeue_delivery_job_once``) or to delete them by hand. Pending
    and delivering rows stay too, and so do replay markers, so a dead-letter key can
    never replay twice even after its notification is gone."""
    return run_sweep(RETENTION_SWEEPS["notifications"], {"older_than": older_than}, **options)


def prune_workers(
    *, older_than: timedelta | None = None, **options: Unpack[SweepOptions]
) -> SweepResult:
    """``workers``: forget registered workers (stopped or lost) whose last beat is more
    than ``older_than`` old (default ``WORKER_RETENTION``), so the Workers page lists
    the fleet of the last day, not of every deploy since the first."""
    return run_sweep(RETENTION_SWEEPS["workers"], {"older_than": older_than}, **options)


# --- runners --------------------------------------------------------------


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


def run_reaping_sweeps(
    *,
    stale_after: timedelta | None = None,
    sweeps: Iterable[str] | None = None,
    **options: Unpack[SweepOptions],
) -> SweepReport:
    """Run every reaping sweep (or those named in ``sweeps``) on database ``using``.

    ``batch_size``, ``time_budget`` and ``limit`` apply to each sweep on its own;
    ``stale_after`` is the liveness budget of the ``runs`` sweep. Arguments are checked
    before any sweep runs. A sweep that raises stops the run (the ones before it have
    committed their batches); the next call starts over, which is safe because every
    sweep is idempotent.
    """
    names = _selected(REAPING_SWEEPS, sweeps)
    check_options(SweepKind.REAPING, options)
    if stale_after is not None:
        check_stale_after(stale_after)
    given = {"stale_after": stale_after}
    results = [run_sweep(REAPING_SWEEPS[name], given, **options) for name in names]
    return SweepReport(tuple(results), dry_run=options.get("dry_run", False))


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
    ``DELIVERED_NOTIFICATION_RETENTION``, ``WORKER_RETENTION``) when given. Arguments
    are checked before any sweep runs.
    """
    names = _selected(RETENTION_SWEEPS, sweeps)
    options = SweepOptions(
        using=using,
        batch_size=batch_size,
        time_budget=time_budget,
        limit=limit,
        dry_run=dry_run,
        on_batch=on_batch,
    )
    check_options(SweepKind.RETENTION, options)
    if older_than is not None:
        check_retention(older_than)
    given = {"older_than": older_than}
    results = [run_sweep(RETENTION_SWEEPS[name], given, **options) for name in names]
    return SweepReport(tuple(results), dry_run=dry_run)
