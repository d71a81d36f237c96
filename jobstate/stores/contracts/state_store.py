"""The state store's contract (the job part of RuntimeStateStore): the job queue, the
audit ledger, runtime locks and the optional extensions (outbox, approvals, replay,
readiness, metrics).

:class:`StateStore` works like Django's ``SessionBase``: its public methods hold the
behaviour every store shares (argument checks, defaults, audit entries, and the
transitions written once over primitives) and call the protected primitives a backend
implements, every one of them declared in
:class:`~jobstate.stores.contracts.primitives.StateStorePrimitives`. The public methods
come in capability parts, one module each:

- :mod:`~jobstate.stores.contracts.queue_part`: intake, updates, claims, fenced reports,
  leases and the queue's maintenance;
- :mod:`~jobstate.stores.contracts.ledger_part`: the audit ledger and runtime locks;
- :mod:`~jobstate.stores.contracts.transitions_part`: refire, reject, delete, their batch
  forms and approvals;
- :mod:`~jobstate.stores.contracts.fleet_part`: queue pauses and the worker registry;
- :mod:`~jobstate.stores.contracts.tasks_part`: django.tasks tasks;
- :mod:`~jobstate.stores.contracts.optional_part`: outbox, replay, metrics, readiness and
  sweeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta

from jobstate.exceptions import LockHeld
from jobstate.stores.contracts.fleet_part import FleetPart
from jobstate.stores.contracts.ledger_part import LedgerPart
from jobstate.stores.contracts.operator_part import OperatorPart
from jobstate.stores.contracts.optional_part import OptionalPart
from jobstate.stores.contracts.outbox_repository import NotificationOutbox
from jobstate.stores.contracts.primitives import METRICS_TERMINAL_WINDOW, MONITOR_SOURCE
from jobstate.stores.contracts.queue_part import CompletionResult, JobQueuePart
from jobstate.stores.contracts.tasks_part import TasksPart
from jobstate.stores.contracts.transitions_part import NO_DELIVERY_KEY, TransitionsPart

__all__ = [
    "METRICS_TERMINAL_WINDOW",
    "MONITOR_SOURCE",
    "NO_DELIVERY_KEY",
    "CompletionResult",
    "NotificationOutbox",
    "StateStore",
    "runtime_lock",
]


class StateStore(
    JobQueuePart, TransitionsPart, OperatorPart, FleetPart, TasksPart, LedgerPart, OptionalPart
):
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


#: The runtime locks the ``runtime_lock`` blocks of this thread (or task) hold: (the
#: store's database or the store, key, owner).
_HELD: ContextVar[frozenset[tuple[object, str, str]]] = ContextVar("jobstate_runtime_locks")


@contextmanager
def runtime_lock(store: StateStore, lock_key: str, owner: str, ttl: timedelta) -> Iterator[None]:
    """Hold a runtime lock for the ``with`` block and release it afterwards.

    Raises :class:`~jobstate.exceptions.LockHeld` (and runs nothing) when another owner
    holds the key. The lock is not renewed while the block runs: pick a ``ttl`` longer
    than the block, or renew with ``acquire_runtime_lock`` from inside it.

    A block for the same key and owner nested inside one of this thread renews the lock
    and leaves it held when it ends: only the outermost block releases it (the inner
    block's release would otherwise free the key while the outer one still relies on
    it). Blocks of other threads or processes are not counted: give each its own owner.
    """
    if not store.acquire_runtime_lock(lock_key, owner, ttl):
        raise LockHeld(f"runtime lock {lock_key!r} is held by another owner.", lock_key=lock_key)
    held = _HELD.get(frozenset())
    entry = (getattr(store, "using", store), lock_key, owner)
    token = _HELD.set(held | {entry})
    try:
        yield
    finally:
        _HELD.reset(token)
        if entry not in held:
            store.release_runtime_lock(lock_key, owner)
