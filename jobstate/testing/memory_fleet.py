"""Queue pauses, registered workers and django.tasks tasks of the in-memory state store
(the primitives behind :mod:`~jobstate.stores.contracts.fleet_part` and
:mod:`~jobstate.stores.contracts.tasks_part`)."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from jobstate.core.states import JobStatus, task_claim_token
from jobstate.models import Job
from jobstate.stores.contracts.primitives import QueueKey
from jobstate.stores.contracts.tasks_part import task_claim_order
from jobstate.testing.memory_rows import MemoryRows, Row, is_ready, job_of

__all__ = ["MemoryFleet", "MemoryTasks"]


class MemoryFleet(MemoryRows):
    """Queue pauses and the worker registry."""

    # --- the fleet: queue pauses, registered workers ------------------------------------

    def _pause_queue(self, key: QueueKey, by: str) -> bool:
        with self._mutex:
            if key in self._pauses:
                return False
            self._pauses[key] = by
            return True

    def _resume_queue(self, key: QueueKey) -> bool:
        with self._mutex:
            return self._pauses.pop(key, None) is not None

    def _paused_queues(self) -> list[QueueKey]:
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


class MemoryTasks(MemoryRows):
    """django.tasks tasks: their claims in claim order and the expired ones."""

    # --- django.tasks ----------------------------------------------------------------

    def _claim_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> list[Job]:
        return self._claim_due(target, queues, owner, lease, limit, claim_round, keyed=False)

    def _claim_keyed_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> list[Job]:
        return self._claim_due(target, queues, owner, lease, limit, claim_round, keyed=True)

    def _claim_due(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
        *,
        keyed: bool,
    ) -> list[Job]:
        """The due tasks without a concurrency key, or (``keyed``) those with one, each
        while fewer than its limit of its key's tasks run."""
        with self._mutex:
            now = self._clock()
            ready = [
                row
                for row in self._jobs.values()
                if row["task_path"] is not None
                and row["target"] == target
                and (row.get("concurrency_digest") is not None) == keyed
                and (queues is None or row["queue_name"] in queues)
                and is_ready(row, now)
                and not self._paused(row)
            ]
            ready.sort(key=lambda row: task_claim_order(job_of(row)))
            claimed: list[Job] = []
            for row in ready:
                if len(claimed) == limit:
                    break
                if keyed and self._key_running(target, row) >= (row["concurrency_limit"] or 1):
                    continue
                row.update(
                    status=JobStatus.RUNNING,
                    executor_id=owner,
                    claimed_at=now,
                    dispatched_at=None,
                    lease_until=now + lease,
                    claim_token=task_claim_token(claim_round, row["id"]),
                    attempts=row["attempts"] + 1,
                    updated_at=now,
                )
                claimed.append(job_of(row))
            return claimed

    def _key_running(self, target: str, row: dict[str, Any]) -> int:
        digest = row["concurrency_digest"]
        return sum(
            1
            for other in self._jobs.values()
            if other["target"] == target
            and other.get("concurrency_digest") == digest
            and other["status"] == JobStatus.RUNNING
        )

    def _list_claimed_tasks(self, owner: str) -> list[Job]:
        with self._mutex:
            rows = [
                row
                for row in self._jobs.values()
                if row["status"] == JobStatus.RUNNING
                and row["task_path"] is not None
                and row["executor_id"] == owner
            ]
            return [job_of(row) for row in sorted(rows, key=lambda row: row["id"])]

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
            return [job_of(row) for row in expired[:limit]]
