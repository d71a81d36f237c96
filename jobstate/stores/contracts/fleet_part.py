"""The state store's fleet methods: pausing and resuming a queue, and the registry of
worker processes (``supports_queue_pauses``, ``supports_worker_registry``).

A queue is a ``(target, queue)`` pair: a task's queue is its ``queue_name``; the jobs
of hub workers and remote executors have none, and their queue is ``""``
(:data:`~jobstate.core.states.NO_QUEUE`). While a queue is paused, no claim takes a job of
it: ``claim_next_job``, ``claim_next_inhub_job(s)`` and ``claim_tasks`` all pass its jobs
over. What a pause guarantees: a claim that starts after the pause committed claims no
job of the queue; a claim already under way when it commits may still take one (its
snapshot predates the pause); jobs already running or dispatched are not touched, they
finish, renew and report as usual. A resume makes the queue claimable again for the
next claim.
"""

from __future__ import annotations

from typing import Any

from jobstate.core.states import NO_QUEUE, WorkerKind, WorkerRegistration
from jobstate.exceptions import InvalidJobState
from jobstate.stores.contracts.audit import AuditSeverity
from jobstate.stores.contracts.claimer_presence import claimer_beats
from jobstate.stores.contracts.ledger_part import LedgerPart
from jobstate.stores.contracts.primitives import QueueKey
from jobstate.stores.contracts.validation import (
    column_limit,
    require_text,
    validate_duration,
    validate_positive_int,
)

__all__ = ["FleetPart", "QueueKey", "parse_queue_key"]


def parse_queue_key(target: Any, queue: Any) -> QueueKey:
    """``(target, queue)`` checked: a target and a queue name (``""``: the target's jobs
    without a queue) that fit their columns, or ``InvalidJobState``."""
    name = require_text(target, field="target", max_length=column_limit("QueuePause", "target"))
    if queue == NO_QUEUE:
        return name, NO_QUEUE
    return name, require_text(
        queue, field="queue", max_length=column_limit("QueuePause", "queue_name")
    )


def _worker_fields(registration: WorkerRegistration) -> dict[str, Any]:
    if not isinstance(registration, WorkerRegistration):
        raise InvalidJobState(f"expected a WorkerRegistration, got {registration!r}.")
    if registration.kind not in WorkerKind.values:
        raise InvalidJobState(
            f"kind must be one of {', '.join(WorkerKind.values)}, got {registration.kind!r}."
        )
    queues = registration.queues
    if queues is not None:
        if isinstance(queues, str) or not all(isinstance(name, str) for name in queues):
            raise InvalidJobState(f"queues must be queue names or None, got {queues!r}.")
        longest = column_limit("QueuePause", "queue_name")
        queues = tuple(require_text(name, field="queue", max_length=longest) for name in queues)
    return {
        "worker_id": require_text(registration.worker_id, field="worker_id"),
        "kind": registration.kind,
        "host": require_text(
            registration.host, field="host", max_length=column_limit("Worker", "host")
        ),
        "pid": validate_positive_int(registration.pid, field="pid"),
        "lease": validate_duration(registration.lease, field="lease", allow_zero=False),
        "backend": (
            require_text(
                registration.backend, field="backend", max_length=column_limit("Worker", "backend")
            )
            if registration.backend
            else ""
        ),
        "queues": None if queues is None else list(queues),
        "concurrency": validate_positive_int(registration.concurrency, field="concurrency"),
    }


class FleetPart(LedgerPart):
    """Queue pauses and the worker registry; see the module docstring."""

    # --- queue pauses ------------------------------------------------------------------

    def pause_queue(self, *, target: str, queue: str = NO_QUEUE, by: str) -> bool:
        """Pause the queue ``(target, queue)``: from the commit on, no claim starts on
        its jobs (see the module docstring for what runs already). Writes a
        ``queue_paused`` audit entry naming ``by`` in the same transaction. ``False``
        (and nothing written) when it was paused already."""
        self._require(self.supports_queue_pauses, "supports_queue_pauses", "pause_queue")
        key = parse_queue_key(target, queue)
        operator = require_text(by, field="by")
        with self._atomic():
            if not self._pause_queue(key, operator):
                return False
            self._audit_queue("queue_paused", key, operator, AuditSeverity.WARNING)
        return True

    def resume_queue(self, *, target: str, queue: str = NO_QUEUE, by: str) -> bool:
        """Resume a paused queue: the next claim may take its jobs again. Writes a
        ``queue_resumed`` audit entry naming ``by``. ``False`` (and nothing written) when
        it was not paused."""
        self._require(self.supports_queue_pauses, "supports_queue_pauses", "resume_queue")
        key = parse_queue_key(target, queue)
        operator = require_text(by, field="by")
        with self._atomic():
            if not self._resume_queue(key):
                return False
            self._audit_queue("queue_resumed", key, operator, AuditSeverity.INFO)
        return True

    def paused_queues(self) -> list[QueueKey]:
        """Every paused queue, by target and queue name."""
        self._require(self.supports_queue_pauses, "supports_queue_pauses", "paused_queues")
        return sorted(self._paused_queues())

    def _audit_queue(self, event: str, key: QueueKey, by: str, severity: AuditSeverity) -> None:
        target, queue = key
        self.append_audit(
            event=event,
            severity=severity,
            title=f"{'Paused' if event == 'queue_paused' else 'Resumed'}: {target} / "
            f"{queue or '(no queue)'}",
            detail={"target": target, "queue": queue, "by": by, "via": "console"},
        )

    # --- the worker registry -----------------------------------------------------------

    def register_worker(self, registration: WorkerRegistration) -> None:
        """Record a worker process that starts: its host, pid, backend, queues,
        concurrency and lease, started and last beat = the store's clock. A worker id
        registered before (a restart with the same ``--worker-id``) starts afresh."""
        self._require(self.supports_worker_registry, "supports_worker_registry", "register_worker")
        self._register_worker(_worker_fields(registration))

    def beat_worker(self, *, worker_id: str) -> bool:
        """Move a registered, running worker's last beat to the store's clock. ``False``
        when no such worker is registered (it was forgotten by the retention sweep, or
        said it stopped): the caller registers again."""
        self._require(self.supports_worker_registry, "supports_worker_registry", "beat_worker")
        return self._beat_worker(require_text(worker_id, field="worker_id"))

    def stop_worker(self, *, worker_id: str, reason: str) -> bool:
        """Record that a worker stopped gracefully (``reason``: what stopped it), so the
        console shows it stopped rather than lost. An executor registered by its claims
        is stopped the same way, by whatever ends its work; if it claims again, it shows
        live again (at once through this process, through another at that process's next
        beat of it). ``False`` when it is not registered."""
        self._require(self.supports_worker_registry, "supports_worker_registry", "stop_worker")
        owner = require_text(worker_id, field="worker_id")
        why = require_text(reason, field="reason")
        stopped = self._stop_worker(owner, why[: column_limit("Worker", "stopped_reason")])
        claimer_beats.stopped(self, owner)
        return stopped
