"""The job queue of the in-memory state store: intake, updates, claims, fenced reports,
leases and the queue's maintenance (the primitives of
:mod:`~jobstate.stores.contracts.queue_part`)."""

from __future__ import annotations

import copy
import uuid
from datetime import datetime, timedelta
from typing import Any

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import (
    CLAIMED_JOB_STATUSES,
    EXPIRED_QUEUED_ERROR,
    INFLIGHT_JOB_STATUSES,
    TASK_RESULT_STATUS_NAMES,
    UNIQUE_STATE_BITS,
    JobStatus,
)
from jobstate.exceptions import UniqueTaskHeld
from jobstate.models import Job
from jobstate.stores.contracts.audit import AuditSeverity, complete_audit_fields
from jobstate.stores.contracts.primitives import Settled
from jobstate.stores.contracts.validation import (
    CLEARED_CLAIM,
    check_thread_quota,
    duplicate_request,
)
from jobstate.testing.memory_rows import (
    SWEEP_ACTOR,
    MemoryRows,
    Row,
    is_ready,
    job_of,
    oldest_first,
)

__all__ = ["MemoryJobQueue", "holds_unique_key"]


def holds_unique_key(row: Row, digest: str) -> bool:
    """Whether ``row`` holds the uniqueness key of ``digest``: the database's unique
    index condition (``jobstate.models.unique_hold``) on one row."""
    if row.get("unique_digest") != digest or row["status"] == JobStatus.DISPATCHED:
        return False
    bit = UNIQUE_STATE_BITS[TASK_RESULT_STATUS_NAMES[row["status"]]]
    return bool((row.get("unique_states") or 0) & bit)


class MemoryJobQueue(MemoryRows):
    """Jobs, claims, reports, leases and maintenance over the store's rows."""

    # --- jobs ------------------------------------------------------------------------

    def _find_by_request_id(self, request_id: str) -> Job | None:
        with self._mutex:
            job_id = self._request_ids.get(request_id)
            return None if job_id is None else job_of(self._jobs[job_id])

    def _get_job(self, pk: uuid.UUID) -> Job | None:
        with self._mutex:
            row = self._jobs.get(pk)
            return None if row is None else job_of(row)

    def _create_job(self, cleaned: dict[str, Any]) -> Job:
        with self._mutex:
            if cleaned["request_id"] in self._request_ids:
                raise duplicate_request(cleaned["request_id"])
            return job_of(self._insert(cleaned))

    def _enqueue_task(self, cleaned: dict[str, Any]) -> Job:
        with self._mutex:
            digest = cleaned.get("unique_digest")
            if digest is not None:
                for row in self._jobs.values():
                    if row["target"] == cleaned["target"] and holds_unique_key(row, digest):
                        return job_of(row)
            if cleaned["request_id"] in self._request_ids:
                raise duplicate_request(cleaned["request_id"])
            return job_of(self._insert(cleaned))

    def _key_held_elsewhere(self, row: Row, written: Row) -> bool:
        """Whether ``written`` (``row`` updated) would hold a uniqueness key that another
        job of its backend holds: the database's unique index refuses that write."""
        digest = row.get("unique_digest")
        if digest is None or not holds_unique_key(written, digest):
            return False
        return any(
            other is not row
            and other["target"] == row["target"]
            and holds_unique_key(other, digest)
            for other in self._jobs.values()
        )

    def _enqueue_job(self, cleaned: dict[str, Any], quota: int | None) -> tuple[Job, bool]:
        with self._mutex:
            existing_id = self._request_ids.get(cleaned["request_id"])
            if existing_id is not None:
                return job_of(self._jobs[existing_id]), False
            thread_id = cleaned.get("thread_id")
            if quota is not None and thread_id is not None:
                check_thread_quota(thread_id, self._count_inflight(thread_id), quota)
            return job_of(self._insert(cleaned)), True

    def _update_job(
        self, pk: uuid.UUID, cleaned: dict[str, Any], expected: list[JobStatus] | None
    ) -> Job | None:
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None or (expected is not None and row["status"] not in expected):
                return None
            if self._key_held_elsewhere(row, {**row, **cleaned}):
                raise UniqueTaskHeld(
                    "a unique task cannot be requeued while another job of its "
                    "backend holds its key: finish or cancel that job first."
                )
            row.update(copy.deepcopy(cleaned))
            row["updated_at"] = self._clock()
            return job_of(row)

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
            return job_of(row)

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
                and is_ready(row, now)
                and not self._paused(row)
                and not self._blocked(row, now)
            ]
            if not ready:
                return None
            row = oldest_first(ready)[0]
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
            return job_of(row)

    def _complete_claimed(
        self, pk: uuid.UUID, token: uuid.UUID, status: JobStatus, cleaned: dict[str, Any]
    ) -> Settled:
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None:
                return False, None
            if row["status"] not in CLAIMED_JOB_STATUSES or row["claim_token"] != token:
                return False, job_of(row)
            row.update(copy.deepcopy(cleaned))
            row.update(CLEARED_CLAIM)
            row["status"] = status
            row["updated_at"] = self._clock()
            return True, job_of(row)

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
        self, dead_after: timedelta, hard_cap: timedelta, scope: list[str] | None, limit: int
    ) -> int:
        with self._mutex:
            now = self._clock()
            stale = [
                row
                for row in self._scoped(scope)
                if row["status"] == JobStatus.DISPATCHED
                and (
                    (row["lease_until"] is not None and row["lease_until"] < now)
                    or (row["lease_until"] is None and row["updated_at"] < now - dead_after)
                    or (row["dispatched_at"] is not None and row["dispatched_at"] < now - hard_cap)
                )
            ]
            # Oldest lease first, the jobs without a lease last.
            stale.sort(key=lambda row: (row["lease_until"] is None, row["lease_until"] or now))
            for row in stale[:limit]:
                executor = row["executor_id"]
                row.update(CLEARED_CLAIM)
                row["status"] = JobStatus.QUEUED
                row["updated_at"] = now
                fields = complete_audit_fields(
                    event="recovered",
                    stage=None,
                    severity=AuditSeverity.WARNING,
                    title="Requeued: executor lease expired",
                    summary="",
                    detail={
                        "by": SWEEP_ACTOR,
                        "via": "executor-lease-expired",
                        "prev_status": JobStatus.DISPATCHED.value,
                        "executor_id": executor,
                    },
                )
                self._append_audit_entry((row["id"], row["request_id"]), "recovered", fields, None)
            return len(stale[:limit])

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

    def _count_inflight(self, thread_id: int) -> int:
        with self._mutex:
            return sum(
                1
                for row in self._jobs.values()
                if row["thread_id"] == thread_id and row["status"] in INFLIGHT_JOB_STATUSES
            )
