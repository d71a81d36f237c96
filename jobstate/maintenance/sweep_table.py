"""The one registry of the maintenance sweeps: one :class:`Sweep` per sweep, in the
order the runners run them. :data:`REAPING_SWEEPS` and :data:`RETENTION_SWEEPS` are what
:func:`~jobstate.maintenance.run_reaping_sweeps` and
:func:`~jobstate.maintenance.run_retention_sweeps` run (and through them the commands
and the Celery tasks); a sweep's own function runs its entry too.

An entry says which configured store the sweep runs on, which sweep-store operation
moves one batch and which counts the candidates for a dry run, the arguments it takes
beyond the shared options (each with the setting that gives it when the caller passes
``None``), how its result splits, and the transition its log line names. Its kind gives
its default batch size. :func:`jobstate.maintenance.sweep_loop.run_sweep` runs any entry.

Sweep stores come from the configured stores (``JOBSTATE['STATE_STORE']`` and
``JOBSTATE['RUN_STORE']``) through their ``sweep_store()`` hook, never from a backend
module, so a host's store subclass is what the sweeps use.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, Protocol, TypeVar

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import TaskRecovery
from jobstate.exceptions import ImproperlyConfiguredStore
from jobstate.stores import get_run_store, get_state_store
from jobstate.stores.base import StateStore
from jobstate.stores.contracts.sweep_store import (
    LeaseRecovery,
    OutboxRecovery,
    RunSweepStore,
    SweepStore,
)
from jobstate.stores.contracts.validation import (
    validate_duration,
    validate_positive_int,
    validate_stale_run_after,
)

__all__ = [
    "REAPING_SWEEPS",
    "RETENTION_SWEEPS",
    "Argument",
    "Batch",
    "Sweep",
    "SweepKind",
    "check_retention",
    "check_stale_after",
    "run_sweep_store",
    "state_sweep_store",
    "task_store",
]

_S = TypeVar("_S")
_S_co = TypeVar("_S_co", covariant=True)

#: What one batch (or a dry run's count) of a sweep store operation returns.
Batch = int | LeaseRecovery | OutboxRecovery | TaskRecovery


class SweepKind(enum.StrEnum):
    """*Reaping* sweeps settle work whose owner is gone; *retention* sweeps delete
    history past its age."""

    REAPING = "reaping"
    RETENTION = "retention"

    @property
    def batch_size_setting(self) -> str:
        """The setting that gives a sweep of this kind its rows per batch. Deleting
        competes with live inserts, so retention batches are smaller."""
        return "SWEEP_BATCH_SIZE" if self is SweepKind.REAPING else "RETENTION_BATCH_SIZE"


@dataclass(frozen=True)
class Argument:
    """An argument of one sweep beyond the shared options: its name, which is also the
    keyword of the store methods it is passed to; the ``JOBSTATE`` setting that gives
    it when the caller passes ``None``; and the check it must pass before anything runs
    (``None``: the store's own checks suffice)."""

    name: str
    setting: str
    check: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class Sweep(Generic[_S]):
    """One maintenance sweep (see the module docstring)."""

    name: str
    kind: SweepKind
    store: Callable[[str], _S]
    """The sweep store of the configured store on a database alias."""
    transition: str
    """What happens to a swept row, as the log line says it."""
    move: Callable[[_S, int, Mapping[str, Any]], Batch]
    """``move(store, n, arguments)`` moves at most ``n`` rows."""
    count: Callable[[_S, int | None, Mapping[str, Any]], Batch]
    """``count(store, limit, arguments)`` says what ``move`` would do now with at most
    ``limit`` rows (``None``: no cap), writing nothing: the dry run."""
    arguments: tuple[Argument, ...] = ()
    outcomes: tuple[str, ...] = ()
    """The fields of a split result (:class:`~jobstate.stores.contracts.sweep_store.LeaseRecovery`,
    :class:`~jobstate.stores.contracts.sweep_store.OutboxRecovery`) that ``SweepResult.detail``
    keeps."""

    def resolve(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every argument as ``given``, or from its setting when ``None`` or absent,
        checked."""
        resolved: dict[str, Any] = {}
        for argument in self.arguments:
            value = given.get(argument.name)
            if value is None:
                value = getattr(jobstate_settings, argument.setting)
            resolved[argument.name] = value if argument.check is None else argument.check(value)
        return resolved

    def tally(self, batch: Batch) -> tuple[int, dict[str, int]]:
        """``(rows, detail)`` of one batch's result."""
        if isinstance(batch, int):
            return batch, {}
        return batch.total, {outcome: getattr(batch, outcome) for outcome in self.outcomes}


# --- the stores the sweeps run on ------------------------------------------------------


class _Sweepable(Protocol[_S_co]):
    @property
    def supports_sweeps(self) -> bool: ...

    def sweep_store(self) -> _S_co: ...


def _sweeps_of(store: _Sweepable[_S], setting: str, path: str) -> _S:
    if not store.supports_sweeps:
        raise ImproperlyConfiguredStore(
            f"JOBSTATE[{setting!r}] = {path!r} does not support the maintenance sweeps "
            f"({type(store).__qualname__}.supports_sweeps is False). Configure a store "
            "that does, or give this one a sweep_store() and supports_sweeps = True."
        )
    return store.sweep_store()


def state_sweep_store(using: str) -> SweepStore:
    """A new sweep store of the configured state store on database ``using``;
    :class:`~jobstate.exceptions.ImproperlyConfiguredStore` if it cannot be swept."""
    return _sweeps_of(get_state_store(using=using), "STATE_STORE", jobstate_settings.STATE_STORE)


def task_store(using: str) -> StateStore:
    """The configured state store on database ``using``: the ``tasks`` sweep runs its
    task recovery (a store without ``supports_tasks`` holds no task to recover)."""
    return get_state_store(using=using)


def _recover_tasks(store: StateStore, limit: int) -> TaskRecovery:
    return store.recover_expired_tasks(limit=limit) if store.supports_tasks else TaskRecovery()


def _count_lost_tasks(store: StateStore, limit: int | None) -> TaskRecovery:
    return store.count_expired_tasks(limit=limit) if store.supports_tasks else TaskRecovery()


def run_sweep_store(using: str) -> RunSweepStore:
    """A new sweep store of the configured run store on database ``using``;
    :class:`~jobstate.exceptions.ImproperlyConfiguredStore` if it cannot be swept."""
    return _sweeps_of(get_run_store(using=using), "RUN_STORE", jobstate_settings.RUN_STORE)


# --- checks the store cannot make ------------------------------------------------------


def check_stale_after(stale_after: timedelta) -> timedelta:
    """A run's liveness budget is at least twice ``HEARTBEAT_INTERVAL``, the interval
    the runner beats at, so one late beat never makes a live run look dead."""
    return validate_stale_run_after(
        stale_after, heartbeat_interval=jobstate_settings.HEARTBEAT_INTERVAL
    )


def check_retention(older_than: timedelta) -> timedelta:
    """A retention of zero would delete history the moment it is written."""
    return validate_duration(older_than, field="older_than", allow_zero=False)


def _check_attempt_limit(attempt_limit: int) -> int:
    return validate_positive_int(attempt_limit, field="attempt_limit")


def _by_name(*sweeps: Sweep[Any]) -> dict[str, Sweep[Any]]:
    return {sweep.name: sweep for sweep in sweeps}


def _retention(
    name: str,
    store: Callable[[str], _S],
    setting: str,
    move: Callable[[_S, int, Mapping[str, Any]], Batch],
    count: Callable[[_S, int | None, Mapping[str, Any]], Batch],
) -> Sweep[_S]:
    """A retention sweep: it deletes what is older than ``older_than`` (default: the
    ``setting``)."""
    older_than = Argument("older_than", setting, check_retention)
    return Sweep(name, SweepKind.RETENTION, store, "deleted", move, count, (older_than,))


# --- the table -------------------------------------------------------------------------

_REAPING = SweepKind.REAPING

# Laid out by hand, a few lines to a sweep, so that the table reads as a table.
# fmt: off

#: The reaping sweeps, in the order they run. The queue TTL runs before the requeues, so
#: a job handed back by a dead owner gets one more chance to be claimed before its age
#: can expire it.
REAPING_SWEEPS: dict[str, Sweep[Any]] = _by_name(
    Sweep("runs", _REAPING, run_sweep_store, "RUNNING -> TIMED_OUT",
          lambda s, n, a: s.reap_stale_runs_batch(**a, limit=n),
          lambda s, n, a: s.count_stale_runs(**a, limit=n),
          (Argument("stale_after", "STALE_RUN_AFTER", check_stale_after),)),
    Sweep("queued", _REAPING, state_sweep_store, "queued -> error",
          lambda s, n, a: s.expire_stale_queued_batch(**a, limit=n),
          lambda s, n, a: s.count_stale_queued(**a, limit=n),
          (Argument("ttl", "QUEUED_TTL"),)),
    Sweep("dispatched", _REAPING, state_sweep_store, "dispatched -> queued",
          lambda s, n, a: s.requeue_stale_dispatched_batch(**a, limit=n),
          lambda s, n, a: s.count_stale_dispatched(**a, limit=n),
          (Argument("dead_after", "EXECUTOR_DEAD_AFTER"),
           Argument("hard_cap", "EXECUTOR_HARD_CAP"))),
    Sweep("leases", _REAPING, state_sweep_store, "running -> queued, or error on the last attempt",
          lambda s, n, a: s.recover_expired_leases_batch(**a, limit=n),
          lambda s, n, a: s.count_expired_leases(**a, limit=n),
          (Argument("fallback_older_than", "WORKER_LEASE"),
           Argument("attempt_limit", "WORKER_ATTEMPT_LIMIT", _check_attempt_limit)),
          outcomes=("requeued", "failed")),
    Sweep("tasks", _REAPING, task_store, "running -> queued, or error after the last attempt",
          lambda s, n, _: _recover_tasks(s, n),
          lambda s, n, _: _count_lost_tasks(s, n),
          outcomes=("requeued", "failed")),
    Sweep("outbox", _REAPING, state_sweep_store, "delivering -> pending, or dead at the last",
          lambda s, n, _: s.rearm_outbox_leases_batch(limit=n),
          lambda s, n, _: s.count_expired_outbox_leases(limit=n),
          outcomes=("rearmed", "dead")),
    Sweep("locks", _REAPING, state_sweep_store, "deleted",
          lambda s, n, _: s.release_expired_locks_batch(limit=n),
          lambda s, n, _: s.count_expired_locks(limit=n)),
)

#: The retention sweeps, in the order they run.
RETENTION_SWEEPS: dict[str, Sweep[Any]] = _by_name(
    _retention("audit", state_sweep_store, "AUDIT_RETENTION",
               lambda s, n, a: s.prune_audit_batch(**a, limit=n),
               lambda s, n, a: s.count_old_audit(**a, limit=n)),
    _retention("jobs", state_sweep_store, "FINISHED_JOB_RETENTION",
               lambda s, n, a: s.prune_finished_jobs_batch(**a, limit=n),
               lambda s, n, a: s.count_old_finished_jobs(**a, limit=n)),
    _retention("runs", run_sweep_store, "FINISHED_RUN_RETENTION",
               lambda s, n, a: s.prune_finished_runs_batch(**a, limit=n),
               lambda s, n, a: s.count_old_finished_runs(**a, limit=n)),
    _retention("notifications", state_sweep_store, "DELIVERED_NOTIFICATION_RETENTION",
               lambda s, n, a: s.prune_delivered_notifications_batch(**a, limit=n),
               lambda s, n, a: s.count_old_delivered_notifications(**a, limit=n)),
    _retention("workers", state_sweep_store, "WORKER_RETENTION",
               lambda s, n, a: s.prune_workers_batch(**a, limit=n),
               lambda s, n, a: s.count_old_workers(**a, limit=n)),
)

# fmt: on
