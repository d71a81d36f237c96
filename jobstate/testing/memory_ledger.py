"""The audit ledger, runtime locks, approval markers and metrics of the in-memory state
store (the primitives behind :mod:`~jobstate.stores.contracts.ledger_part`,
:mod:`~jobstate.stores.contracts.transitions_part` and
:mod:`~jobstate.stores.contracts.optional_part`)."""

from __future__ import annotations

import copy
import uuid
from datetime import datetime, timedelta

from jobstate.core.states import (
    CLAIMED_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobOperationalMetrics,
    JobStatus,
)
from jobstate.models import AuditEntry
from jobstate.stores.contracts.audit import AuditFields
from jobstate.stores.contracts.primitives import (
    METRICS_TERMINAL_WINDOW,
    MONITOR_SOURCE,
    AuditSubject,
    operational_metrics,
)
from jobstate.testing.memory_rows import MemoryRows, Row

__all__ = ["MemoryLedger"]


class MemoryLedger(MemoryRows):
    """Audit entries, runtime locks, approval markers and the metrics snapshot."""

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
