"""``MemoryStateStore``: the in-memory reference implementation of the state store.

It keeps every guarantee of :class:`~jobstate.stores.base.StateStore` inside one process
(one re-entrant lock serialises all operations) and passes the same contract cases as
the database store. Use it in a host's unit tests, or as the reading aid for what each
primitive must do: the public methods, their argument checks and the transitions written
over primitives (requeue, reject, approval) are the base class's, so this module holds
only the primitives, written as plainly as the rows they change. It returns unsaved
``Job`` and ``AuditEntry`` instances: never call ``save()`` on them.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import (
    CLAIMED_JOB_STATUSES,
    EXPIRED_QUEUED_ERROR,
    INFLIGHT_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobOperationalMetrics,
    JobStatus,
)
from jobstate.models import NO_QUEUE, AuditEntry, Job, time_ordered_uuid
from jobstate.stores.contracts.audit import AuditFields
from jobstate.stores.contracts.primitives import (
    METRICS_TERMINAL_WINDOW,
    MONITOR_SOURCE,
    AuditSubject,
    Settled,
    operational_metrics,
)
from jobstate.stores.contracts.state_store import StateStore
from jobstate.stores.contracts.state_validation import (
    CLEARED_CLAIM,
    check_thread_quota,
    duplicate_request,
)
from jobstate.stores.contracts.tasks_part import task_claim_order
from jobstate.stores.contracts.validation import JOB_DEFAULTS

__all__ = ["MemoryStateStore"]

Row = dict[str, Any]


class MemoryStateStore(StateStore):
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

    def __init__(
        self, using: str = "default", *, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.using = using
        self._clock = clock or timezone.now
        self._mutex = threading.RLock()
        self._jobs: dict[uuid.UUID, Row] = {}
        self._request_ids: dict[str, uuid.UUID] = {}
        self._audit: list[Row] = []
        self._audit_seq = 0
        self._locks: dict[str, tuple[str, datetime]] = {}
        self._decisions: dict[str, uuid.UUID] = {}
        self._pauses: dict[tuple[str, str], str] = {}
        self._workers: dict[str, Row] = {}

    def _atomic(self) -> AbstractContextManager[object]:
        return self._mutex

    # --- jobs ------------------------------------------------------------------------

    def _find_by_request_id(self, request_id: str) -> Job | None:
        with self._mutex:
            job_id = self._request_ids.get(request_id)
            return None if job_id is None else _job(self._jobs[job_id])

    def _get_job(self, pk: uuid.UUID) -> Job | None:
        with self._mutex:
            row = self._jobs.get(pk)
            return None if row is None else _job(row)

    def _create_job(self, cleaned: dict[str, Any]) -> Job:
        with self._mutex:
            if cleaned["request_id"] in self._request_ids:
                raise duplicate_request(cleaned["request_id"])
            return _job(self._insert(cleaned))

    def _enqueue_job(self, cleaned: dict[str, Any], quota: int | None) -> tuple[Job, bool]:
        with self._mutex:
            existing_id = self._request_ids.get(cleaned["request_id"])
            if existing_id is not None:
                return _job(self._jobs[existing_id]), False
            thread_id = cleaned.get("thread_id")
            if quota is not None and thread_id is not None:
                check_thread_quota(thread_id, self._count_inflight(thread_id), quota)
            return _job(self._insert(cleaned)), True

    def _update_job(
        self, pk: uuid.UUID, cleaned: dict[str, Any], expected: list[JobStatus] | None
    ) -> Job | None:
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None or (expected is not None and row["status"] not in expected):
                return None
            row.update(copy.deepcopy(cleaned))
            row["updated_at"] = self._clock()
            return _job(row)

    def _delete_job(self, pk: uuid.UUID, expected: list[JobStatus]) -> bool:
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None or row["status"] not in expected:
                return False
            del self._jobs[pk]
            del self._request_ids[row["request_id"]]
            return True

    def _lock_job(self, pk: uuid.UUID, *, lease_ended: bool = False) -> Job | None:
        # The caller holds the store's lock through _atomic(), which is the "hold".
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None:
                return None
            if lease_ended and not (
                row["status"] in CLAIMED_JOB_STATUSES
                and row["lease_until"] is not None
                and row["lease_until"] < self._clock()
            ):
                return None
            return _job(row)

    # --- claims and reports ----------------------------------------------------------

    def _claim(
        self, scope: list[str], owner: str, lease: timedelta, status: JobStatus
    ) -> Job | None:
        with self._mutex:
            now = self._clock()
            ready = [
                row
                for row in self._jobs.values()
                if row["target"] in scope
                and _is_ready(row, now)
                and not self._paused(row)
                and not self._blocked(row, now)
            ]
            if not ready:
                return None
            row = _oldest_first(ready)[0]
            row.update(
                status=status,
                executor_id=owner,
                claimed_at=now,
                dispatched_at=now if status == JobStatus.DISPATCHED else None,
                lease_until=now + lease,
                claim_token=uuid.uuid4(),
                run_after=None,
                updated_at=now,
            )
            return _job(row)

    def _complete_claimed(
        self, pk: uuid.UUID, token: uuid.UUID, status: JobStatus, cleaned: dict[str, Any]
    ) -> Settled:
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None:
                return False, None
            if row["status"] not in CLAIMED_JOB_STATUSES or row["claim_token"] != token:
                return False, _job(row)
            row.update(copy.deepcopy(cleaned))
            row.update(CLEARED_CLAIM)
            row["status"] = status
            row["updated_at"] = self._clock()
            return True, _job(row)

    def _extend_claim_lease(self, pk: uuid.UUID, token: uuid.UUID, lease: timedelta | None) -> bool:
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None or row["status"] not in CLAIMED_JOB_STATUSES:
                return False
            if row["claim_token"] != token:
                return False
            if lease is None:
                running = row["status"] == JobStatus.RUNNING
                lease = (
                    jobstate_settings.WORKER_LEASE if running else jobstate_settings.EXECUTOR_LEASE
                )
            now = self._clock()
            row["lease_until"] = now + lease
            row["updated_at"] = now
            return True

    # --- leases and maintenance ------------------------------------------------------

    def _extend_executor_leases(self, executor_id: str, lease: timedelta) -> int:
        with self._mutex:
            now = self._clock()
            moved = 0
            for row in self._jobs.values():
                if row["status"] == JobStatus.DISPATCHED and row["executor_id"] == executor_id:
                    row["lease_until"] = now + lease
                    row["updated_at"] = now
                    moved += 1
            return moved

    def _requeue_stale_dispatched(
        self, dead_after: timedelta, hard_cap: timedelta, scope: list[str] | None
    ) -> int:
        with self._mutex:
            now = self._clock()
            moved = 0
            for row in self._scoped(scope):
                if row["status"] != JobStatus.DISPATCHED:
                    continue
                lease_until = row["lease_until"]
                dispatched_at = row["dispatched_at"]
                stale = (
                    (lease_until is not None and lease_until < now)
                    or (lease_until is None and row["updated_at"] < now - dead_after)
                    or (dispatched_at is not None and dispatched_at < now - hard_cap)
                )
                if stale:
                    row.update(CLEARED_CLAIM)
                    row["status"] = JobStatus.QUEUED
                    row["updated_at"] = now
                    moved += 1
            return moved

    def _list_expired_leases(
        self,
        statuses: list[JobStatus],
        fallback_older_than: timedelta,
        scope: list[str] | None,
        limit: int,
    ) -> list[Job]:
        def expired(row: Row, now: datetime) -> bool:
            if row["lease_until"] is None:
                return bool(row["updated_at"] < now - fallback_older_than)
            return bool(row["lease_until"] < now)

        return self._listed(statuses, scope, limit, expired)

    def _list_jobs_by_status(
        self,
        statuses: list[JobStatus],
        older_than: timedelta | None,
        scope: list[str] | None,
        limit: int,
    ) -> list[Job]:
        def old_enough(row: Row, now: datetime) -> bool:
            return older_than is None or bool(row["updated_at"] < now - older_than)

        return self._listed(statuses, scope, limit, old_enough)

    def _expire_stale_queued(self, ttl: timedelta, scope: list[str] | None) -> int:
        with self._mutex:
            now = self._clock()
            moved = 0
            for row in self._scoped(scope):
                if (
                    row["status"] == JobStatus.QUEUED
                    and row["created_at"] < now - ttl
                    and row["task_path"] is None
                ):
                    row["status"] = JobStatus.ERROR
                    row["error"] = EXPIRED_QUEUED_ERROR
                    row["updated_at"] = now
                    moved += 1
            return moved

    # --- django.tasks ----------------------------------------------------------------

    def _claim_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
    ) -> list[Job]:
        with self._mutex:
            now = self._clock()
            ready = [
                row
                for row in self._jobs.values()
                if row["task_path"] is not None
                and row["target"] == target
                and (queues is None or row["queue_name"] in queues)
                and _is_ready(row, now)
                and not self._paused(row)
            ]
            ready.sort(key=lambda row: task_claim_order(_job(row)))
            claimed = []
            for row in ready[:limit]:
                row.update(
                    status=JobStatus.RUNNING,
                    executor_id=owner,
                    claimed_at=now,
                    dispatched_at=None,
                    lease_until=now + lease,
                    claim_token=uuid.uuid4(),
                    attempts=row["attempts"] + 1,
                    updated_at=now,
                )
                claimed.append(_job(row))
            return claimed

    def _list_expired_tasks(self, limit: int) -> list[Job]:
        with self._mutex:
            now = self._clock()
            expired = [
                row
                for row in self._jobs.values()
                if row["status"] == JobStatus.RUNNING
                and row["task_path"] is not None
                and row["lease_until"] is not None
                and row["lease_until"] < now
            ]
            expired.sort(key=lambda row: (row["lease_until"], row["id"]))
            return [_job(row) for row in expired[:limit]]

    def _count_inflight(self, thread_id: int) -> int:
        with self._mutex:
            return sum(
                1
                for row in self._jobs.values()
                if row["thread_id"] == thread_id and row["status"] in INFLIGHT_JOB_STATUSES
            )

    # --- audit ledger and runtime locks ----------------------------------------------

    def _append_audit_entry(
        self, subject: AuditSubject, event: str, fields: AuditFields, at: datetime | None
    ) -> AuditEntry:
        job_id, request_id = subject
        with self._mutex:
            self._audit_seq += 1
            row: Row = {
                "id": self._audit_seq,
                "ts": at if at is not None else self._clock(),
                "job_id": job_id,
                "request_id": request_id,
                "event": event,
                "stage": fields.stage.value,
                "severity": fields.severity.value,
                "title": fields.title,
                "summary": fields.summary,
                "detail": copy.deepcopy(fields.detail),
            }
            self._audit.append(row)
            return AuditEntry(**copy.deepcopy(row))

    def _list_audit(
        self, job_id: uuid.UUID | None, request_id: str | None, limit: int
    ) -> list[AuditEntry]:
        with self._mutex:
            rows = [
                row
                for row in self._audit
                if (job_id is None or row["job_id"] == job_id)
                and (request_id is None or row["request_id"] == request_id)
            ]
            rows.sort(key=lambda row: (row["ts"], row["id"]))
            return [AuditEntry(**copy.deepcopy(row)) for row in rows[:limit]]

    def _prune_audit(self, cutoff: datetime, batch_size: int) -> int:
        # One list, one lock: there is no table to keep unlocked between batches.
        with self._mutex:
            kept = [row for row in self._audit if row["ts"] >= cutoff]
            deleted = len(self._audit) - len(kept)
            self._audit = kept
            return deleted

    def _acquire_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        with self._mutex:
            now = self._clock()
            held = self._locks.get(lock_key)
            if held is not None and held[0] != owner and held[1] > now:
                return False
            self._locks[lock_key] = (owner, now + ttl)
            return True

    def _release_lock(self, lock_key: str, owner: str) -> None:
        with self._mutex:
            held = self._locks.get(lock_key)
            if held is not None and held[0] == owner:
                del self._locks[lock_key]

    # --- approvals and metrics -------------------------------------------------------

    def _recorded_decision(self, decision_id: str) -> uuid.UUID | None:
        with self._mutex:
            return self._decisions.get(decision_id)

    def _record_decision(
        self, decision_id: str, pk: uuid.UUID, approver: str, comment: str
    ) -> uuid.UUID | None:
        with self._mutex:
            if decision_id in self._decisions:
                return self._decisions[decision_id]
            self._decisions[decision_id] = pk
            return None

    def _metrics_snapshot(self, now: datetime | None, exact: bool) -> JobOperationalMetrics:
        # Every count here is exact, whatever ``exact`` asks.
        at = self._clock() if now is None else now
        cutoff = at - METRICS_TERMINAL_WINDOW
        with self._mutex:
            rows = [copy.copy(row) for row in self._jobs.values()]
        by_status: dict[str, int] = {}
        terminal: dict[str, int] = {}
        oldest: datetime | None = None
        delayed = expired = 0
        queued_threads: set[int] = set()
        claimed_threads: set[int] = set()
        for row in rows:
            status = JobStatus(row["status"]).value
            by_status[status] = by_status.get(status, 0) + 1
            if status in TERMINAL_JOB_STATUSES and row["updated_at"] >= cutoff:
                terminal[status] = terminal.get(status, 0) + 1
            if status == JobStatus.QUEUED:
                if (row["source"] or "") != MONITOR_SOURCE and (
                    oldest is None or row["created_at"] < oldest
                ):
                    oldest = row["created_at"]
                if row["run_after"] is not None and row["run_after"] > at:
                    delayed += 1
                if row["thread_id"] is not None:
                    queued_threads.add(row["thread_id"])
            if status in CLAIMED_JOB_STATUSES:
                if row["lease_until"] is not None and row["lease_until"] < at:
                    expired += 1
                if row["thread_id"] is not None:
                    claimed_threads.add(row["thread_id"])
        return operational_metrics(
            by_status=by_status,
            terminal=terminal,
            oldest_queued_age=None if oldest is None else at - oldest,
            delayed=delayed,
            expired=expired,
            blocked=len(queued_threads & claimed_threads),
        )

    # --- the fleet: queue pauses, registered workers ------------------------------------

    def _pause_queue(self, key: tuple[str, str], by: str) -> bool:
        with self._mutex:
            if key in self._pauses:
                return False
            self._pauses[key] = by
            return True

    def _resume_queue(self, key: tuple[str, str]) -> bool:
        with self._mutex:
            return self._pauses.pop(key, None) is not None

    def _paused_queues(self) -> list[tuple[str, str]]:
        with self._mutex:
            return list(self._pauses)

    def _register_worker(self, fields: dict[str, Any]) -> None:
        with self._mutex:
            now = self._clock()
            self._workers[fields["worker_id"]] = {
                **fields,
                "started_at": now,
                "heartbeat_at": now,
                "stopped_at": None,
                "stopped_reason": "",
            }

    def _beat_worker(self, worker_id: str) -> bool:
        with self._mutex:
            row = self._workers.get(worker_id)
            if row is None or row["stopped_at"] is not None:
                return False
            row["heartbeat_at"] = self._clock()
            return True

    def _stop_worker(self, worker_id: str, reason: str) -> bool:
        with self._mutex:
            row = self._workers.get(worker_id)
            if row is None:
                return False
            now = self._clock()
            row.update(stopped_at=now, heartbeat_at=now, stopped_reason=reason)
            return True

    def registered_workers(self) -> list[Row]:
        """Copies of the registered workers' rows (the console's view of them)."""
        with self._mutex:
            return [dict(row) for row in self._workers.values()]

    # --- internals (callers hold the mutex) -------------------------------------------

    def _paused(self, row: Row) -> bool:
        return (row["target"], row["queue_name"] or NO_QUEUE) in self._pauses

    def _insert(self, cleaned: dict[str, Any]) -> Row:
        now = self._clock()
        row: Row = {field.attname: None for field in Job._meta.concrete_fields}
        row.update(copy.deepcopy(JOB_DEFAULTS))
        row.update(copy.deepcopy(cleaned))
        row["status"] = JobStatus(row["status"])
        row["id"] = time_ordered_uuid()
        row["created_at"] = now
        row["updated_at"] = now
        self._jobs[row["id"]] = row
        self._request_ids[row["request_id"]] = row["id"]
        return row

    def _blocked(self, row: Row, now: datetime) -> bool:
        thread = row["thread_id"]
        if thread is None:
            return False
        position = (row["created_at"], row["id"])
        for other in self._jobs.values():
            if other["thread_id"] != thread or other["id"] == row["id"]:
                continue
            if other["status"] in CLAIMED_JOB_STATUSES:
                return True
            if _is_ready(other, now) and (other["created_at"], other["id"]) < position:
                return True
        return False

    def _listed(
        self,
        statuses: list[JobStatus],
        scope: list[str] | None,
        limit: int,
        keep: Callable[[Row, datetime], bool],
    ) -> list[Job]:
        """The jobs of ``scope`` in ``statuses`` that ``keep`` accepts at the store's
        clock, oldest first, at most ``limit``."""
        with self._mutex:
            now = self._clock()
            rows = [
                row for row in self._scoped(scope) if row["status"] in statuses and keep(row, now)
            ]
            return [_job(row) for row in _oldest_first(rows)[:limit]]

    def _scoped(self, scope: list[str] | None) -> list[Row]:
        return [row for row in self._jobs.values() if scope is None or row["target"] in scope]


def _job(row: Row) -> Job:
    # A deep copy: callers may mutate what they get without touching the store.
    return Job(**copy.deepcopy(row))


def _is_ready(row: Row, now: datetime) -> bool:
    return row["status"] == JobStatus.QUEUED and (
        row["run_after"] is None or row["run_after"] <= now
    )


def _oldest_first(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda row: (row["created_at"], row["id"]))
