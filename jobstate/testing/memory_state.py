"""``MemoryStateStore``: the in-memory reference implementation of the state store.

It keeps every guarantee of :class:`~jobstate.stores.base.StateStore` inside one process
(one re-entrant lock serialises all calls) and passes the same contract cases as
the database store. Use it in a host's unit tests, or as the reading aid for what each
primitive must do: the public methods, their argument checks and the transitions written
over primitives (requeue, reject, approval) are the base class's, so the store holds
only the primitives, written as plainly as the rows they change, in one module per
capability part of the contract: :mod:`.memory_queue` (the job queue),
:mod:`.memory_ledger` (audit ledger, runtime locks, approvals, metrics) and
:mod:`.memory_fleet` (queue pauses, workers, tasks), over the rows of
:mod:`.memory_rows`. It returns unsaved
``Job`` and ``AuditEntry`` instances: never call ``save()`` on them.
"""

from __future__ import annotations

from jobstate.testing.memory_fleet import MemoryFleet, MemoryTasks
from jobstate.testing.memory_ledger import MemoryLedger
from jobstate.testing.memory_queue import MemoryJobQueue

__all__ = ["MemoryStateStore"]


class MemoryStateStore(MemoryJobQueue, MemoryLedger, MemoryFleet, MemoryTasks):
    """A thread-safe, process-local :class:`~jobstate.stores.base.StateStore`, with
    approvals, metrics and django.tasks tasks (no outbox, no replay, no schema to be
    ready).

    ``clock`` (default :func:`django.utils.timezone.now`) is the store's clock: it stamps
    ``created_at``, ``updated_at``, claims, leases and locks. ``using`` is accepted so
    the class can be named in ``JOBSTATE['STATE_STORE']``; it is ignored. Every
    primitive runs under the store's lock, and :meth:`_atomic` holds the same lock, so a
    transition the base writes over several primitives is one step for other callers.
    """

    supports_approvals = True
    supports_metrics = True
    supports_tasks = True
    supports_queue_pauses = True
    supports_worker_registry = True
    supports_job_deletion = True
