"""``MemoryStateStore``: the in-memory reference implementation of the state store.

It keeps every guarantee of :class:`~jobstate.stores.base.StateStore` inside one process
(one re-entrant lock serialises all operations) and passes the same contract cases as
the database store. Use it in a host's unit tests, or as the reading aid for what each
operation must do. It returns unsaved ``Job`` and ``AuditEntry`` instances: never call
``save()`` on them.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from jobstate.audit import (
    complete_audit_fields,
)
from jobstate.conf import jobstate_settings
from jobstate.exceptions import (
    DuplicateRequestId,
    InvalidJobState,
    ThreadQuotaExceeded,
)
from jobstate.models import AuditEntry, Job, time_ordered_uuid
from jobstate.stores.base import (
    CLAIMED_JOB_STATUSES,
    EXPIRED_QUEUED_ERROR,
    INFLIGHT_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    ApprovalRequeueOutcome,
    ClaimReport,
    CompletionOutcome,
    CompletionResult,
    JobId,
    JobOperationalMetrics,
    JobStatus,
    StateStore,
)
from jobstate.stores.state_store import (
    METRICS_TERMINAL_WINDOW,
    MONITOR_SOURCE,
    NO_DELIVERY_KEY,
    approval_audit_entry,
    approval_via,
    reject_audit_detail,
)
from jobstate.stores.state_validation import (
    parse_batch_limit,
    parse_claim_reports,
    validate_approval_arguments,
    validate_reject_arguments,
    validate_requeue_arguments,
)
from jobstate.stores.validation import (
    ENQUEUE_FIELDS,
    JOB_CLAIM_FIELDS,
    JOB_DEFAULTS,
    JOB_PATCH_FIELDS,
    check_same_request,
    clean_job_fields,
    parse_claim_targets,
    parse_limit,
    parse_statuses,
    parse_targets,
    parse_thread_id,
    parse_uuid,
    require_text,
    required_request_id,
    resolve_lease,
    text_problem,
    validate_duration,
    validate_instant,
    validate_release_status,
)

__all__ = ["MemoryStateStore"]

_CREATE_FIELDS = JOB_PATCH_FIELDS | {"request_id"}
_ENQUEUE_FIELDS = ENQUEUE_FIELDS | {"request_id"}
_REPORT_FIELDS = JOB_PATCH_FIELDS - {"status", *JOB_CLAIM_FIELDS}

Row = dict[str, Any]


class MemoryStateStore(StateStore):
    """A thread-safe, process-local :class:`~jobstate.stores.base.StateStore`.

    ``clock`` (default :func:`django.utils.timezone.now`) is the store's clock: it stamps
    ``created_at``, ``updated_at``, claims, leases and locks. ``using`` is accepted so
    the class can be named in ``JOBSTATE['STATE_STORE']``; it is ignored.
    """

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

    # --- jobs ------------------------------------------------------------------------

    def find_by_request_id(self, request_id: str) -> Job | None:
        require_text(request_id, field="request_id")
        with self._mutex:
            job_id = self._request_ids.get(request_id)
            return None if job_id is None else _job(self._jobs[job_id])

    def get_job(self, job_id: JobId) -> Job | None:
        pk = parse_uuid(job_id, field="job_id")
        with self._mutex:
            row = self._jobs.get(pk)
            return None if row is None else _job(row)

    def create_job(self, **fields: Any) -> Job:
        cleaned = clean_job_fields(fields, allowed=_CREATE_FIELDS, action="create_job")
        request_id = required_request_id(cleaned, action="create_job")
        with self._mutex:
            if request_id in self._request_ids:
                raise DuplicateRequestId(
                    f"a job with request_id {request_id!r} already exists.",
                    request_id=request_id,
                )
            return _job(self._insert(cleaned))

    def enqueue(self, **fields: Any) -> tuple[Job, bool]:
        cleaned = clean_job_fields(fields, allowed=_ENQUEUE_FIELDS, action="enqueue")
        request_id = required_request_id(cleaned, action="enqueue")
        quota = jobstate_settings.THREAD_INFLIGHT_QUOTA
        with self._mutex:
            existing_id = self._request_ids.get(request_id)
            if existing_id is not None:
                return _replay(self._jobs[existing_id], cleaned), False
            thread_id = cleaned.get("thread_id")
            if quota is not None and thread_id is not None:
                inflight = self._count_inflight(thread_id)
                if inflight >= quota:
                    raise ThreadQuotaExceeded(
                        f"thread {thread_id} already has {inflight} jobs in flight; "
                        f"the quota is {quota} (JOBSTATE['THREAD_INFLIGHT_QUOTA']).",
                        thread_id=thread_id,
                        inflight=inflight,
                        quota=quota,
                    )
            return _job(self._insert(cleaned)), True

    def update_job(self, job_id: JobId, **patch: Any) -> Job | None:
        return self._update(job_id, None, patch, action="update_job")

    def update_job_if_status(
        self, job_id: JobId, expected_statuses: Iterable[str], **patch: Any
    ) -> Job | None:
        expected = parse_statuses(expected_statuses)
        return self._update(job_id, expected, patch, action="update_job_if_status")

    # --- claims ----------------------------------------------------------------------

    def claim_next_job(
        self, targets: Sequence[str], executor_id: str, lease: timedelta | None = None
    ) -> Job | None:
        return self._claim(
            targets,
            require_text(executor_id, field="executor_id"),
            resolve_lease(lease, jobstate_settings.EXECUTOR_LEASE),
            JobStatus.DISPATCHED,
        )

    def claim_next_inhub_job(
        self, targets: Sequence[str], worker_id: str, lease: timedelta | None = None
    ) -> Job | None:
        return self._claim(
            targets,
            require_text(worker_id, field="worker_id"),
            resolve_lease(lease, jobstate_settings.WORKER_LEASE),
            JobStatus.RUNNING,
        )

    def claim_next_inhub_jobs(
        self,
        targets: Sequence[str],
        worker_id: str,
        lease: timedelta | None = None,
        *,
        limit: int,
    ) -> list[Job]:
        owner = require_text(worker_id, field="worker_id")
        duration = resolve_lease(lease, jobstate_settings.WORKER_LEASE)
        count = parse_batch_limit(limit)
        claimed: list[Job] = []
        # One claim after another under the store's mutex: each passes the thread gate
        # with every earlier claim of the batch already applied.
        with self._mutex:
            while len(claimed) < count:
                job = self._claim(targets, owner, duration, JobStatus.RUNNING)
                if job is None:
                    break
                claimed.append(job)
        return claimed

    def complete_claimed_jobs(self, reports: Sequence[ClaimReport]) -> list[CompletionResult]:
        parsed = parse_claim_reports(reports)
        with self._mutex:
            return [
                self.complete_claimed_job(pk, token, status, **cleaned)
                for pk, token, status, cleaned in parsed
            ]

    def complete_claimed_job(
        self, job_id: JobId, claim_token: uuid.UUID | str, status: str, **patch: Any
    ) -> CompletionResult:
        pk = parse_uuid(job_id, field="job_id")
        token = parse_uuid(claim_token, field="claim_token")
        new_status = validate_release_status(status)
        cleaned = clean_job_fields(patch, allowed=_REPORT_FIELDS, action="complete_claimed_job")
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None:
                return CompletionResult(CompletionOutcome.NOT_FOUND, None)
            if row["status"] not in CLAIMED_JOB_STATUSES or row["claim_token"] != token:
                return CompletionResult(CompletionOutcome.STALE_CLAIM, _job(row))
            row.update(copy.deepcopy(cleaned))
            row.update(dict.fromkeys(JOB_CLAIM_FIELDS))
            row["status"] = new_status
            row["updated_at"] = self._clock()
            return CompletionResult(CompletionOutcome.COMPLETED, _job(row))

    def extend_claim_lease(
        self, job_id: JobId, claim_token: uuid.UUID | str, lease: timedelta | None = None
    ) -> bool:
        pk = parse_uuid(job_id, field="job_id")
        token = parse_uuid(claim_token, field="claim_token")
        if lease is not None:
            validate_duration(lease, field="lease", allow_zero=False)
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

    def extend_executor_leases(self, executor_id: str, lease: timedelta | None = None) -> int:
        require_text(executor_id, field="executor_id")
        duration = resolve_lease(lease, jobstate_settings.EXECUTOR_LEASE)
        with self._mutex:
            now = self._clock()
            moved = 0
            for row in self._jobs.values():
                if row["status"] == JobStatus.DISPATCHED and row["executor_id"] == executor_id:
                    row["lease_until"] = now + duration
                    row["updated_at"] = now
                    moved += 1
            return moved

    def requeue_stale_dispatched(
        self,
        dead_after: timedelta | None = None,
        hard_cap: timedelta | None = None,
        *,
        targets: Sequence[str] | None = None,
    ) -> int:
        dead = validate_duration(
            jobstate_settings.EXECUTOR_DEAD_AFTER if dead_after is None else dead_after,
            field="dead_after",
        )
        cap = validate_duration(
            jobstate_settings.EXECUTOR_HARD_CAP if hard_cap is None else hard_cap,
            field="hard_cap",
        )
        scope = parse_targets(targets)
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
                    or (lease_until is None and row["updated_at"] < now - dead)
                    or (dispatched_at is not None and dispatched_at < now - cap)
                )
                if stale:
                    row.update(dict.fromkeys(JOB_CLAIM_FIELDS))
                    row["status"] = JobStatus.QUEUED
                    row["updated_at"] = now
                    moved += 1
            return moved

    def list_expired_leases(
        self,
        statuses: Iterable[str],
        fallback_older_than: timedelta,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        wanted = parse_statuses(statuses)
        validate_duration(fallback_older_than, field="fallback_older_than")
        scope = parse_targets(targets)
        count = parse_limit(limit, default=jobstate_settings.LIST_LIMIT)
        with self._mutex:
            now = self._clock()
            rows = [
                row
                for row in self._scoped(scope)
                if row["status"] in wanted
                and (
                    (row["lease_until"] is not None and row["lease_until"] < now)
                    or (
                        row["lease_until"] is None and row["updated_at"] < now - fallback_older_than
                    )
                )
            ]
            return [_job(row) for row in _oldest_first(rows)[:count]]

    def list_jobs_by_status(
        self,
        statuses: Iterable[str],
        older_than: timedelta | None = None,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        wanted = parse_statuses(statuses)
        if older_than is not None:
            validate_duration(older_than, field="older_than")
        scope = parse_targets(targets)
        count = parse_limit(limit, default=jobstate_settings.LIST_LIMIT)
        with self._mutex:
            now = self._clock()
            rows = [
                row
                for row in self._scoped(scope)
                if row["status"] in wanted
                and (older_than is None or row["updated_at"] < now - older_than)
            ]
            return [_job(row) for row in _oldest_first(rows)[:count]]

    def expire_stale_queued(
        self, ttl: timedelta | None = None, *, targets: Sequence[str] | None = None
    ) -> int:
        duration = validate_duration(
            jobstate_settings.QUEUED_TTL if ttl is None else ttl, field="ttl"
        )
        scope = parse_targets(targets)
        with self._mutex:
            now = self._clock()
            moved = 0
            for row in self._scoped(scope):
                if row["status"] == JobStatus.QUEUED and row["created_at"] < now - duration:
                    row["status"] = JobStatus.ERROR
                    row["error"] = EXPIRED_QUEUED_ERROR
                    row["updated_at"] = now
                    moved += 1
            return moved

    def count_inflight_by_thread(self, thread_id: int) -> int:
        thread = parse_thread_id(thread_id)
        with self._mutex:
            return self._count_inflight(thread)

    # --- audit ledger ----------------------------------------------------------------

    def append_audit(
        self,
        *,
        job: Job | JobId | None = None,
        request_id: str = "",
        event: str,
        stage: str | None = None,
        severity: str | None = None,
        title: str = "",
        summary: str = "",
        detail: dict[str, Any] | None = None,
        at: datetime | None = None,
    ) -> AuditEntry:
        fields = complete_audit_fields(
            event=event,
            stage=stage,
            severity=severity,
            title=title,
            summary=summary,
            detail=detail,
        )
        if not isinstance(request_id, str) or len(request_id) > 200 or text_problem(request_id):
            raise InvalidJobState(
                "request_id must be a string of at most 200 characters, without NUL."
            )
        job_id: uuid.UUID | None = None
        if isinstance(job, Job):
            job_id, request_id = job.id, request_id or job.request_id
        elif job is not None:
            job_id = parse_uuid(job, field="job")
        if at is not None:
            at = validate_instant(at, field="at")
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

    def list_audit(
        self,
        *,
        job: Job | JobId | None = None,
        request_id: str | None = None,
        limit: int | None = None,
    ) -> list[AuditEntry]:
        count = parse_limit(limit, default=jobstate_settings.LIST_LIMIT)
        if job is None and request_id is None:
            raise InvalidJobState("list_audit needs a job or a request_id to narrow to.")
        job_id = None
        if job is not None:
            job_id = job.id if isinstance(job, Job) else parse_uuid(job, field="job")
        if request_id is not None:
            require_text(request_id, field="request_id")
        with self._mutex:
            rows = [
                row
                for row in self._audit
                if (job_id is None or row["job_id"] == job_id)
                and (request_id is None or row["request_id"] == request_id)
            ]
            rows.sort(key=lambda row: (row["ts"], row["id"]))
            return [AuditEntry(**copy.deepcopy(row)) for row in rows[:count]]

    def prune_audit_older_than(self, cutoff: datetime, *, batch_size: int | None = None) -> int:
        cutoff = validate_instant(cutoff, field="cutoff")
        parse_limit(batch_size, default=jobstate_settings.AUDIT_PRUNE_BATCH_SIZE)
        with self._mutex:
            kept = [row for row in self._audit if row["ts"] >= cutoff]
            deleted = len(self._audit) - len(kept)
            self._audit = kept
            return deleted

    # --- runtime locks ---------------------------------------------------------------

    def acquire_runtime_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        require_text(lock_key, field="lock_key")
        require_text(owner, field="owner")
        validate_duration(ttl, field="ttl", allow_zero=False)
        with self._mutex:
            now = self._clock()
            held = self._locks.get(lock_key)
            if held is not None and held[0] != owner and held[1] > now:
                return False
            self._locks[lock_key] = (owner, now + ttl)
            return True

    def release_runtime_lock(self, lock_key: str, owner: str) -> None:
        require_text(lock_key, field="lock_key")
        require_text(owner, field="owner")
        with self._mutex:
            held = self._locks.get(lock_key)
            if held is not None and held[0] == owner:
                del self._locks[lock_key]

    # --- continuations and metrics -------------------------------------------------

    def requeue_job(
        self,
        job_id: JobId,
        *,
        from_statuses: Sequence[str],
        by: str,
        via: str,
        event: str = "rerun",
    ) -> Job | None:
        pk = parse_uuid(job_id, field="job_id")
        statuses = validate_requeue_arguments(from_statuses, by, via, event)
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None or row["status"] not in statuses:
                return None
            prev_status = JobStatus(row["status"]).value
            row.update(dict.fromkeys(JOB_CLAIM_FIELDS))
            row.update(
                status=JobStatus.QUEUED,
                attempts=0,
                run_after=None,
                error=None,
                metadata={k: v for k, v in row["metadata"].items() if k != NO_DELIVERY_KEY},
                updated_at=self._clock(),
            )
            self.append_audit(
                job=pk,
                request_id=row["request_id"],
                event=event,
                detail={"by": by, "via": via, "prev_status": prev_status},
            )
            return _job(row)

    def requeue_expired_lease_job(
        self, job_id: JobId, *, by: str, via: str, event: str = "rerun"
    ) -> Job | None:
        pk = parse_uuid(job_id, field="job_id")
        validate_requeue_arguments([JobStatus.RUNNING], by, via, event)
        with self._mutex:
            row = self._jobs.get(pk)
            if (
                row is None
                or row["status"] not in CLAIMED_JOB_STATUSES
                or row["lease_until"] is None
                or row["lease_until"] >= self._clock()
            ):
                return None
            return self.requeue_job(pk, from_statuses=[row["status"]], by=by, via=via, event=event)

    def reject_queued_job(self, job_id: JobId, *, by: str, reason: str = "") -> Job | None:
        pk = parse_uuid(job_id, field="job_id")
        error = validate_reject_arguments(by, reason)
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None or row["status"] != JobStatus.QUEUED:
                return None
            row.update(status=JobStatus.REJECTED, error=error, updated_at=self._clock())
            self.append_audit(
                job=pk,
                request_id=row["request_id"],
                event="rejected",
                detail=reject_audit_detail(by, error),
            )
            return _job(row)

    def requeue_approved_job_once(
        self, *, job_id: JobId, decision_id: str, approver: str, comment: str = ""
    ) -> ApprovalRequeueOutcome:
        pk = parse_uuid(job_id, field="job_id")
        validate_approval_arguments(decision_id, approver, comment)
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None:
                return ApprovalRequeueOutcome.NOT_FOUND
            decided = self._decisions.get(decision_id)
            if decided is not None:
                if decided == pk:
                    return ApprovalRequeueOutcome.ALREADY_REQUEUED
                return ApprovalRequeueOutcome.DECISION_CONFLICT
            if row["status"] not in TERMINAL_JOB_STATUSES:
                return ApprovalRequeueOutcome.JOB_IN_FLIGHT
            self._decisions[decision_id] = pk
            self.append_audit(
                job=pk,
                request_id=row["request_id"],
                **approval_audit_entry(decision_id, approver, comment),
            )
            self.requeue_job(
                pk, from_statuses=[row["status"]], by=approver, via=approval_via(decision_id)
            )
            return ApprovalRequeueOutcome.REQUEUED

    def operational_metrics_snapshot(
        self, now: datetime | None = None, *, exact: bool = False
    ) -> JobOperationalMetrics:
        # Every count here is exact, whatever ``exact`` asks.
        at = self._clock() if now is None else validate_instant(now, field="now")
        cutoff = at - METRICS_TERMINAL_WINDOW
        with self._mutex:
            rows = [copy.copy(row) for row in self._jobs.values()]
        by_status = dict.fromkeys(JobStatus.values, 0)
        terminal = dict.fromkeys(sorted(s.value for s in TERMINAL_JOB_STATUSES), 0)
        oldest: datetime | None = None
        delayed = expired = 0
        queued_threads: set[int] = set()
        claimed_threads: set[int] = set()
        for row in rows:
            status = JobStatus(row["status"]).value
            by_status[status] += 1
            if status in terminal and row["updated_at"] >= cutoff:
                terminal[status] += 1
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
        return JobOperationalMetrics(
            by_status=by_status,
            terminal_last_15m=terminal,
            oldest_queued_age_seconds=(
                max(0.0, (at - oldest).total_seconds()) if oldest is not None else 0.0
            ),
            delayed_queued_jobs=delayed,
            expired_leases=expired,
            blocked_threads=len(queued_threads & claimed_threads),
        )

    # --- internals (callers hold the mutex) -------------------------------------------

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

    def _update(
        self,
        job_id: JobId,
        expected: list[JobStatus] | None,
        patch: dict[str, Any],
        *,
        action: str,
    ) -> Job | None:
        pk = parse_uuid(job_id, field="job_id")
        cleaned = clean_job_fields(patch, allowed=JOB_PATCH_FIELDS, action=action)
        if expected is not None and not expected:
            return None
        with self._mutex:
            row = self._jobs.get(pk)
            if row is None or (expected is not None and row["status"] not in expected):
                return None
            row.update(copy.deepcopy(cleaned))
            row["updated_at"] = self._clock()
            return _job(row)

    def _claim(
        self, targets: Sequence[str], owner: str, lease: timedelta, status: JobStatus
    ) -> Job | None:
        scope = parse_claim_targets(targets)
        if not scope:
            return None
        with self._mutex:
            now = self._clock()
            ready = [
                row
                for row in self._jobs.values()
                if row["target"] in scope and _is_ready(row, now) and not self._blocked(row, now)
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

    def _count_inflight(self, thread_id: int) -> int:
        return sum(
            1
            for row in self._jobs.values()
            if row["thread_id"] == thread_id and row["status"] in INFLIGHT_JOB_STATUSES
        )

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


def _replay(row: Row, given: dict[str, Any]) -> Job:
    check_same_request(row["request_id"], row, given)
    return _job(row)
