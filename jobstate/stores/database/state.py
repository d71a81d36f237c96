"""The job queue, audit ledger and runtime locks on the Django ORM (``DatabaseStateStore``).

Every transition is one conditional write (``UPDATE ... WHERE status = ...``, ``WHERE
claim_token = ...``) or a short transaction around one, so concurrent web processes,
workers, executors and sweeps never overwrite each other's transitions.
"""

from __future__ import annotations

import functools
import hashlib
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import IntegrityError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Case, Exists, Field, Q, When
from django.db.models.functions import Now

from jobstate.audit import (
    complete_audit_fields,
)
from jobstate.conf import jobstate_settings
from jobstate.exceptions import (
    DuplicateRequestId,
    InvalidJobState,
    ThreadQuotaExceeded,
)
from jobstate.models import (
    JOB_UNIQUE_REQUEST_ID,
    RUNTIME_LOCK_PKEY,
    AuditEntry,
    Job,
    JobQuerySet,
    RuntimeLock,
    thread_blockers,
)
from jobstate.stores.base import (
    CLAIMED_JOB_STATUSES,
    EXPIRED_QUEUED_ERROR,
    ClaimReport,
    CompletionOutcome,
    CompletionResult,
    JobId,
    JobStatus,
    StateStore,
)
from jobstate.stores.database.batched_delete import BatchedDeleter
from jobstate.stores.database.continuations import (
    DatabaseContinuationMixin,
    validate_requeue_arguments,
)
from jobstate.stores.database.observability import DatabaseObservabilityMixin
from jobstate.stores.database.outbox import DatabaseOutboxMixin
from jobstate.stores.database.sweeps import DatabaseSweepStore
from jobstate.stores.errors import translate_store_errors
from jobstate.stores.integrity import violates
from jobstate.stores.validation import (
    BIGINT_MAX,
    ENQUEUE_FIELDS,
    ENQUEUE_PAYLOAD_FIELDS,
    JOB_CLAIM_FIELDS,
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

__all__ = [
    "REJECT_REASON_LIMIT",
    "DatabaseStateStore",
    "ParsedReport",
    "parse_batch_limit",
    "parse_claim_reports",
    "reject_audit_detail",
    "validate_reject_arguments",
]

_CREATE_FIELDS = JOB_PATCH_FIELDS | {"request_id"}
_ENQUEUE_FIELDS = ENQUEUE_FIELDS | {"request_id"}
_REPORT_FIELDS = JOB_PATCH_FIELDS - {"status", *JOB_CLAIM_FIELDS}
_CLEARED_CLAIM = dict.fromkeys(JOB_CLAIM_FIELDS)

#: Longest reason ``reject_queued_job`` accepts (it becomes the job's ``error``).
REJECT_REASON_LIMIT = 2000


def validate_reject_arguments(by: str, reason: str) -> str:
    """Check the arguments of ``reject_queued_job`` (shared by every store) and return
    the text the job's ``error`` gets."""
    require_text(by, field="by")
    if not isinstance(reason, str):
        raise InvalidJobState(f"reason must be a string, got {type(reason).__name__}.")
    if len(reason) > REJECT_REASON_LIMIT or text_problem(reason):
        raise InvalidJobState(
            f"reason must be at most {REJECT_REASON_LIMIT} characters, without NUL."
        )
    return reason.strip() or f"rejected by {by}"


def reject_audit_detail(by: str, reason: str) -> dict[str, Any]:
    """The ``detail`` of the ``rejected`` audit entry ``reject_queued_job`` writes."""
    return {"by": by, "reason": reason, "prev_status": JobStatus.QUEUED.value}


@translate_store_errors
class DatabaseStateStore(
    DatabaseOutboxMixin, DatabaseContinuationMixin, DatabaseObservabilityMixin, StateStore
):
    """:class:`~jobstate.stores.base.StateStore` on the ``Job``, ``AuditEntry`` and
    ``RuntimeLock`` tables of database ``using``.

    - Request-id idempotency rests on the unique constraint
      ``jobstate_job_unique_request_id``; only its violation becomes
      ``DuplicateRequestId`` or an idempotent replay.
    - Claims pick a candidate with ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL
      (concurrent claimers pass over each other's rows instead of queueing behind
      them) and move it with ``UPDATE ... WHERE status = 'queued'``. The per-thread gate
      is re-checked under a transaction-scoped advisory lock on the thread, because a
      gate read from a snapshot can miss a sibling job claimed a moment earlier. On
      SQLite, ``IMMEDIATE`` transactions serialise writers, so the candidate read and
      the update already see the same state. Claims rely on READ COMMITTED isolation
      (Django's default on PostgreSQL).
    - Lease and liveness instants come from the database clock (``Now()``).
    """

    def __init__(self, using: str = "default") -> None:
        self.using = using

    # --- jobs ------------------------------------------------------------------------

    def find_by_request_id(self, request_id: str) -> Job | None:
        require_text(request_id, field="request_id")
        return self._jobs().filter(request_id=request_id).first()

    def get_job(self, job_id: JobId) -> Job | None:
        return self._jobs().filter(id=parse_uuid(job_id, field="job_id")).first()

    def create_job(self, **fields: Any) -> Job:
        cleaned = clean_job_fields(fields, allowed=_CREATE_FIELDS, action="create_job")
        request_id = required_request_id(cleaned, action="create_job")
        try:
            # The savepoint keeps a host's surrounding transaction usable after a duplicate.
            with transaction.atomic(using=self.using):
                job = self._jobs().create(**cleaned)
        except IntegrityError as exc:
            if self._is_duplicate_request(exc):
                raise DuplicateRequestId(
                    f"a job with request_id {request_id!r} already exists.",
                    request_id=request_id,
                ) from exc
            raise
        return self._jobs().get(id=job.id)

    def enqueue(self, **fields: Any) -> tuple[Job, bool]:
        cleaned = clean_job_fields(fields, allowed=_ENQUEUE_FIELDS, action="enqueue")
        request_id = required_request_id(cleaned, action="enqueue")
        existing = self.find_by_request_id(request_id)
        if existing is not None:
            return _replay(existing, cleaned), False
        quota = jobstate_settings.THREAD_INFLIGHT_QUOTA
        thread_id = cleaned.get("thread_id")
        try:
            with transaction.atomic(using=self.using):
                if quota is not None and thread_id is not None:
                    # Serialises enqueues of one thread (and its claims) so the count
                    # below cannot miss a sibling inserted concurrently: exact on
                    # PostgreSQL; SQLite's IMMEDIATE transactions already serialise.
                    self._lock_thread(thread_id)
                    existing = self.find_by_request_id(request_id)
                    if existing is None:
                        inflight = self._jobs().filter(thread_id=thread_id).inflight().count()
                        if inflight >= quota:
                            raise ThreadQuotaExceeded(
                                f"thread {thread_id} already has {inflight} jobs in flight; "
                                f"the quota is {quota} (JOBSTATE['THREAD_INFLIGHT_QUOTA']).",
                                thread_id=thread_id,
                                inflight=inflight,
                                quota=quota,
                            )
                if existing is None:
                    job = self._jobs().create(**cleaned)
        except IntegrityError as exc:
            if not self._is_duplicate_request(exc):
                raise
            # A concurrent enqueue of the same request won the insert.
            existing = self.find_by_request_id(request_id)
            if existing is None:
                raise
        if existing is not None:
            return _replay(existing, cleaned), False
        return self._jobs().get(id=job.id), True

    def update_job(self, job_id: JobId, **patch: Any) -> Job | None:
        return self._update(job_id, None, patch, action="update_job")

    def update_job_if_status(
        self, job_id: JobId, expected_statuses: Iterable[str], **patch: Any
    ) -> Job | None:
        expected = parse_statuses(expected_statuses)
        return self._update(job_id, expected, patch, action="update_job_if_status")

    def reject_queued_job(self, job_id: JobId, *, by: str, reason: str = "") -> Job | None:
        """See :meth:`StateStore.reject_queued_job`.

        The conditional ``UPDATE ... WHERE status = 'queued'`` and the audit entry share
        one transaction: a claim that wins the race leaves nothing written, and a
        rejection never commits without its audit entry.
        """
        pk = parse_uuid(job_id, field="job_id")
        error = validate_reject_arguments(by, reason)
        with transaction.atomic(using=self.using):
            job = self.update_job_if_status(
                pk, [JobStatus.QUEUED], status=JobStatus.REJECTED, error=error
            )
            if job is None:
                return None
            self.append_audit(job=job, event="rejected", detail=reject_audit_detail(by, error))
            return job

    def requeue_expired_lease_job(
        self, job_id: JobId, *, by: str, via: str, event: str = "rerun"
    ) -> Job | None:
        """See :meth:`StateStore.requeue_expired_lease_job`.

        The job row is locked (``SELECT ... FOR UPDATE``) while its lease is compared
        with the database clock, and stays locked through the refire: a renewal or a
        fenced report waits, then finds the claim token cleared. On SQLite the
        ``IMMEDIATE`` transaction already keeps other writers out.
        """
        pk = parse_uuid(job_id, field="job_id")
        validate_requeue_arguments([JobStatus.RUNNING], by, via, event)
        with transaction.atomic(using=self.using):
            status = (
                self._jobs()
                .select_for_update()
                .filter(id=pk, lease_until__lt=Now())
                .claimed()
                .values_list("status", flat=True)
                .first()
            )
            if status is None:
                return None
            return self.requeue_job(pk, from_statuses=[status], by=by, via=via, event=event)

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
        """See :meth:`StateStore.claim_next_inhub_jobs`.

        On PostgreSQL the jobs without a thread are claimed by one statement
        (``UPDATE ... FROM (SELECT ... LIMIT k FOR UPDATE SKIP LOCKED) RETURNING``); when
        that leaves room in the batch, threaded jobs follow one claim at a time through
        the per-thread gate (:meth:`claim_next_inhub_job`). Elsewhere every job is
        claimed one at a time, inside one transaction.
        """
        owner = require_text(worker_id, field="worker_id")
        duration = resolve_lease(lease, jobstate_settings.WORKER_LEASE)
        count = parse_batch_limit(limit)
        scope = parse_claim_targets(targets)
        if not scope:
            return []
        claimed: list[Job] = []
        if self._is_postgresql():
            claimed = self._claim_unthreaded_batch(scope, owner, duration, count)
            while len(claimed) < count:
                job = self._claim(scope, owner, duration, JobStatus.RUNNING)
                if job is None:
                    break
                claimed.append(job)
        else:
            with transaction.atomic(using=self.using):
                while len(claimed) < count:
                    job = self._claim(scope, owner, duration, JobStatus.RUNNING)
                    if job is None:
                        break
                    claimed.append(job)
        return sorted(claimed, key=lambda job: (job.created_at, job.id))

    def complete_claimed_job(
        self, job_id: JobId, claim_token: uuid.UUID | str, status: str, **patch: Any
    ) -> CompletionResult:
        pk = parse_uuid(job_id, field="job_id")
        token = parse_uuid(claim_token, field="claim_token")
        new_status = validate_release_status(status)
        cleaned = clean_job_fields(patch, allowed=_REPORT_FIELDS, action="complete_claimed_job")
        if self._is_postgresql():
            # One round trip on the hot path: the fenced UPDATE hands back the row it
            # wrote. Only a report that did not apply needs a second look.
            written = self._complete_group(
                tuple(sorted(cleaned)), [(pk, token, new_status, cleaned)]
            )
            if pk in written:
                return CompletionResult(CompletionOutcome.COMPLETED, written[pk])
            job = self._jobs().filter(id=pk).first()
        else:
            changes = {**cleaned, **_CLEARED_CLAIM, "status": new_status, "updated_at": Now()}
            with transaction.atomic(using=self.using):
                moved = self._jobs().filter(id=pk, claim_token=token).claimed().update(**changes)
                job = self._jobs().filter(id=pk).first()
            if moved:
                return CompletionResult(CompletionOutcome.COMPLETED, job)
        if job is None:
            return CompletionResult(CompletionOutcome.NOT_FOUND, None)
        return CompletionResult(CompletionOutcome.STALE_CLAIM, job)

    def complete_claimed_jobs(self, reports: Sequence[ClaimReport]) -> list[CompletionResult]:
        """See :meth:`StateStore.complete_claimed_jobs`.

        On PostgreSQL the reports that patch the same fields are applied by one
        ``UPDATE ... FROM (VALUES ...) RETURNING`` statement, each row fenced by its own
        claim token; a batch of uniform reports (the usual case) is one statement.
        Elsewhere the reports are applied one by one inside one transaction.
        """
        parsed = parse_claim_reports(reports)
        if not parsed:
            return []
        if not self._is_postgresql():
            with transaction.atomic(using=self.using):
                return [
                    self.complete_claimed_job(pk, token, status, **cleaned)
                    for pk, token, status, cleaned in parsed
                ]
        shapes: dict[tuple[str, ...], list[ParsedReport]] = {}
        for report in parsed:
            shapes.setdefault(tuple(sorted(report[3])), []).append(report)
        written: dict[uuid.UUID, Job] = {}
        if len(shapes) == 1:
            (columns, group), *_ = shapes.items()
            written.update(self._complete_group(columns, group))
        else:
            with transaction.atomic(using=self.using):
                for columns, group in shapes.items():
                    written.update(self._complete_group(columns, group))
        missed = [pk for pk, *_ in parsed if pk not in written]
        others = {job.id: job for job in self._jobs().filter(id__in=missed)} if missed else {}
        results: list[CompletionResult] = []
        for pk, *_ in parsed:
            if pk in written:
                results.append(CompletionResult(CompletionOutcome.COMPLETED, written[pk]))
            elif pk in others:
                results.append(CompletionResult(CompletionOutcome.STALE_CLAIM, others[pk]))
            else:
                results.append(CompletionResult(CompletionOutcome.NOT_FOUND, None))
        return results

    def extend_claim_lease(
        self, job_id: JobId, claim_token: uuid.UUID | str, lease: timedelta | None = None
    ) -> bool:
        pk = parse_uuid(job_id, field="job_id")
        token = parse_uuid(claim_token, field="claim_token")
        if lease is None:
            lease_until: Any = Case(
                When(status=JobStatus.RUNNING, then=Now() + jobstate_settings.WORKER_LEASE),
                default=Now() + jobstate_settings.EXECUTOR_LEASE,
            )
        else:
            lease_until = Now() + validate_duration(lease, field="lease", allow_zero=False)
        moved = (
            self._jobs()
            .filter(id=pk, claim_token=token)
            .claimed()
            .update(lease_until=lease_until, updated_at=Now())
        )
        return moved > 0

    # --- leases and maintenance ------------------------------------------------------

    def extend_executor_leases(self, executor_id: str, lease: timedelta | None = None) -> int:
        require_text(executor_id, field="executor_id")
        duration = resolve_lease(lease, jobstate_settings.EXECUTOR_LEASE)
        return (
            self._jobs()
            .filter(status=JobStatus.DISPATCHED, executor_id=executor_id)
            .update(lease_until=Now() + duration, updated_at=Now())
        )

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
        if scope == []:
            return 0
        # One UPDATE: a row completed or renewed while the statement waited for its lock
        # is re-checked against the WHERE clause and left alone.
        return (
            self._jobs()
            .stale_dispatched(dead, cap)
            .for_targets(scope)
            .update(status=JobStatus.QUEUED, updated_at=Now(), **_CLEARED_CLAIM)
        )

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
        if not wanted or scope == []:
            return []
        rows = (
            self._jobs()
            .with_status(wanted)
            .expired_leases(fallback_older_than)
            .for_targets(scope)
            .order_by("created_at", "id")
        )
        return list(rows[:count])

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
        if not wanted or scope == []:
            return []
        rows = self._jobs().with_status(wanted).for_targets(scope)
        if older_than is not None:
            rows = rows.not_written_for(older_than)
        return list(rows.order_by("created_at", "id")[:count])

    def expire_stale_queued(
        self, ttl: timedelta | None = None, *, targets: Sequence[str] | None = None
    ) -> int:
        duration = validate_duration(
            jobstate_settings.QUEUED_TTL if ttl is None else ttl, field="ttl"
        )
        scope = parse_targets(targets)
        if scope == []:
            return 0
        # A claim holds its candidate's row lock; this UPDATE waits for it and then skips
        # the row, which is no longer queued.
        return (
            self._jobs()
            .stale_queued(duration)
            .for_targets(scope)
            .update(status=JobStatus.ERROR, error=EXPIRED_QUEUED_ERROR, updated_at=Now())
        )

    def count_inflight_by_thread(self, thread_id: int) -> int:
        return self._jobs().filter(thread_id=parse_thread_id(thread_id)).inflight().count()

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
        job_id, request_id = _audit_subject(job, request_id)
        entry = AuditEntry(
            job_id=job_id,
            request_id=request_id,
            event=event,
            stage=fields.stage,
            severity=fields.severity,
            title=fields.title,
            summary=fields.summary,
            detail=fields.detail,
        )
        if at is not None:
            entry.ts = validate_instant(at, field="at")
        entry.save(using=self.using, force_insert=True)
        if at is None and not connections[self.using].features.can_return_columns_from_insert:
            # Without INSERT ... RETURNING the database-stamped ts is not known yet.
            entry.refresh_from_db(using=self.using, fields=["ts"])
        return entry

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
        rows = AuditEntry.objects.using(self.using).all()
        if job is not None:
            rows = rows.filter(
                job_id=job.id if isinstance(job, Job) else parse_uuid(job, field="job")
            )
        if request_id is not None:
            rows = rows.filter(request_id=require_text(request_id, field="request_id"))
        return list(rows.order_by("ts", "id")[:count])

    def prune_audit_older_than(self, cutoff: datetime, *, batch_size: int | None = None) -> int:
        cutoff = validate_instant(cutoff, field="cutoff")
        batch = parse_limit(batch_size, default=jobstate_settings.AUDIT_PRUNE_BATCH_SIZE)
        entries = AuditEntry.objects.using(self.using).older_than(cutoff)
        # Each batch its own short transaction, starting after the last entry deleted, so
        # a large backlog never holds locks on the whole table nor rescans what is gone.
        deleter = BatchedDeleter(self.using)
        total = 0
        while True:
            deleted = deleter.delete_batch(entries, "ts", batch)
            total += deleted
            if deleted < batch:
                return total

    # --- runtime locks ---------------------------------------------------------------

    def acquire_runtime_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        require_text(lock_key, field="lock_key")
        require_text(owner, field="owner")
        validate_duration(ttl, field="ttl", allow_zero=False)
        locks = RuntimeLock.objects.using(self.using)
        # Three rounds at most: the row can vanish (a release) between a failed insert and
        # the update; after that the key is contended and "held" is the honest answer.
        for _ in range(3):
            try:
                with transaction.atomic(using=self.using):
                    locks.create(lock_key=lock_key, owner=owner, expires_at=Now() + ttl)
                return True
            except IntegrityError as exc:
                if not violates(
                    exc,
                    constraint=RUNTIME_LOCK_PKEY,
                    table=RuntimeLock._meta.db_table,
                    columns=["lock_key"],
                ):
                    raise
            taken = (
                locks.filter(lock_key=lock_key)
                .filter(Q(owner=owner) | Q(expires_at__lte=Now()))
                .update(owner=owner, expires_at=Now() + ttl, updated_at=Now())
            )
            if taken:
                return True
            if locks.filter(lock_key=lock_key).exists():
                return False
        return False

    def release_runtime_lock(self, lock_key: str, owner: str) -> None:
        require_text(lock_key, field="lock_key")
        require_text(owner, field="owner")
        RuntimeLock.objects.using(self.using).filter(lock_key=lock_key, owner=owner).delete()

    # --- internals -------------------------------------------------------------------

    def _jobs(self) -> JobQuerySet:
        return Job.objects.using(self.using)

    def _is_postgresql(self) -> bool:
        return connections[self.using].vendor == "postgresql"

    def _is_duplicate_request(self, exc: IntegrityError) -> bool:
        return violates(
            exc,
            constraint=JOB_UNIQUE_REQUEST_ID,
            table=Job._meta.db_table,
            columns=["request_id"],
        )

    def _lock_thread(self, thread_id: int) -> None:
        """Take a transaction-scoped lock on one thread, waiting for it (PostgreSQL only).

        Raw SQL because advisory locks have no ORM form. The key is hashed from a
        namespaced string so it does not collide with a host's own integer keys; a hash
        collision between two threads only makes them wait for each other briefly.
        """
        if self._is_postgresql():
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_thread_lock_key(thread_id)])

    def _try_lock_thread(self, thread_id: int) -> bool:
        """Like :meth:`_lock_thread` but never waits: ``False`` when another transaction
        holds the thread. A claim uses this because it already holds a candidate's row
        lock; waiting here while another claimer waits for that row would deadlock."""
        with connections[self.using].cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_thread_lock_key(thread_id)])
            row = cursor.fetchone()
        return bool(row and row[0])

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
        with transaction.atomic(using=self.using):
            rows = self._jobs().filter(id=pk)
            if expected is not None:
                rows = rows.with_status(expected)
            if rows.update(**cleaned, updated_at=Now()) != 1:
                return None
            # Re-read inside the transaction: the row lock taken by the UPDATE means this
            # is exactly what was written.
            return self._jobs().get(id=pk)

    def _claim(
        self, targets: Sequence[str], owner: str, lease: timedelta, status: JobStatus
    ) -> Job | None:
        scope = parse_claim_targets(targets)
        if not scope:
            return None
        if self._is_postgresql():
            picked, job = self._claim_in_one_statement(scope, owner, lease, status)
            if not picked or job is not None:
                return job
            # The oldest candidate belongs to a thread: only the gated path below may
            # take it, because the gate must be re-read after the thread's lock.
        return self._claim_gated(scope, owner, lease, status)

    def _claim_in_one_statement(
        self, scope: list[str], owner: str, lease: timedelta, status: JobStatus
    ) -> tuple[bool, Job | None]:
        """The PostgreSQL claim in one round trip: pick the oldest claimable job (``FOR
        UPDATE SKIP LOCKED``) and, when it has no thread, move it in the same statement.

        Returns ``(picked, job)``: ``(False, None)`` when nothing is claimable, ``(True,
        None)`` when the oldest candidate has a thread and needs the gated path. Raw SQL
        because the ORM cannot express ``UPDATE ... RETURNING`` around a locked
        subquery; without a transaction around it the row lock lasts one statement.
        """
        connection = connections[self.using]
        sql = _claim_statement(connection, len(scope), status)
        params: list[Any] = [*scope, status.value, owner, lease, uuid.uuid4()]
        with _hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            return False, None
        if row[1] is None:
            return True, None
        return True, _load_jobs(connection, self.using, [row[1:]])[0]

    def _claim_unthreaded_batch(
        self, scope: list[str], owner: str, lease: timedelta, limit: int
    ) -> list[Job]:
        """Claim up to ``limit`` ready jobs without a thread in one PostgreSQL statement,
        each with its own ``gen_random_uuid()`` claim token."""
        connection = connections[self.using]
        table = connection.ops.quote_name(Job._meta.db_table)
        placeholders = ", ".join(["%s"] * len(scope))
        sql = f"""
            WITH picked AS (
                SELECT c.id FROM {table} AS c
                WHERE c.status = 'queued'
                  AND (c.run_after IS NULL OR c.run_after <= statement_timestamp())
                  AND c.target IN ({placeholders})
                  AND c.thread_id IS NULL
                ORDER BY c.created_at, c.id
                LIMIT %s
                FOR UPDATE OF c SKIP LOCKED
            )
            UPDATE {table} AS j
            SET status = %s, executor_id = %s, claimed_at = statement_timestamp(),
                dispatched_at = NULL, lease_until = statement_timestamp() + %s,
                claim_token = gen_random_uuid(), run_after = NULL,
                updated_at = statement_timestamp()
            FROM picked
            WHERE j.id = picked.id AND j.status = 'queued'
            RETURNING {_returning_columns(connection, "j")}
        """
        params: list[Any] = [*scope, limit, JobStatus.RUNNING.value, owner, lease]
        with _hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return _load_jobs(connection, self.using, rows)

    def _complete_group(
        self, columns: tuple[str, ...], group: list[ParsedReport]
    ) -> dict[uuid.UUID, Job]:
        """Apply reports that patch the same ``columns`` in one fenced statement."""
        connection = connections[self.using]
        sql, fields = _complete_statement(connection, columns, len(group))
        params: list[Any] = []
        for pk, token, status, cleaned in group:
            params.extend((pk, token, status.value))
            params.extend(
                field.get_db_prep_save(cleaned[field.name], connection) for field in fields
            )
        with _hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        return {job.id: job for job in _load_jobs(connection, self.using, fetched)}

    def _claim_gated(
        self, scope: list[str], owner: str, lease: timedelta, status: JobStatus
    ) -> Job | None:
        changes: dict[str, Any] = {
            "status": status,
            "executor_id": owner,
            "claimed_at": Now(),
            "dispatched_at": Now() if status == JobStatus.DISPATCHED else None,
            "lease_until": Now() + lease,
            "claim_token": uuid.uuid4(),
            "run_after": None,
            "updated_at": Now(),
        }
        postgresql = self._is_postgresql()
        passed_ids: list[uuid.UUID] = []
        passed_threads: list[int] = []
        with transaction.atomic(using=self.using):
            # Each round either claims, finds nothing, or rules out one more job or
            # thread, so the loop ends.
            while True:
                candidates = self._jobs().claimable(scope)
                if passed_ids:
                    candidates = candidates.exclude(id__in=passed_ids)
                if passed_threads:
                    candidates = candidates.exclude(thread_id__in=passed_threads)
                if postgresql:
                    candidates = candidates.select_for_update(skip_locked=True, of=("self",))
                picked = candidates.values_list("id", "thread_id").first()
                if picked is None:
                    return None
                job_id, thread_id = picked
                row = self._jobs().filter(id=job_id, status=JobStatus.QUEUED)
                if postgresql and thread_id is not None:
                    if not self._try_lock_thread(thread_id):
                        # Another transaction is claiming from (or enqueueing into) this
                        # thread right now; whatever it claims blocks the thread anyway.
                        passed_threads.append(thread_id)
                        continue
                    # A fresh statement after the lock sees every sibling claim that
                    # committed before it, which the candidate's snapshot may not have.
                    row = row.filter(~Exists(thread_blockers()))
                if row.update(**changes) == 1:
                    return self._jobs().get(id=job_id)
                if thread_id is None:
                    passed_ids.append(job_id)
                else:
                    passed_threads.append(thread_id)

    supports_sweeps = True

    def sweep_store(self) -> DatabaseSweepStore:
        """See :meth:`StateStore.sweep_store`: its lease recovery refires jobs through
        this store, on this store's database."""
        return DatabaseSweepStore(self.using, state=self)


#: The per-thread FIFO gate of ``JobQuerySet.thread_unblocked`` for a candidate ``c``,
#: in SQL: a running or dispatched sibling, or a ready queued sibling ahead of it.
_BLOCKERS_SQL = """
    SELECT 1 FROM {table} AS b
    WHERE b.thread_id = c.thread_id AND b.id <> c.id
      AND (b.status IN ('running', 'dispatched')
           OR (b.status = 'queued'
               AND (b.run_after IS NULL OR b.run_after <= statement_timestamp())
               AND (b.created_at < c.created_at
                    OR (b.created_at = c.created_at AND b.id < c.id))))
"""

#: A validated report: job id, claim token, release status, cleaned patch.
ParsedReport = tuple[uuid.UUID, uuid.UUID, JobStatus, dict[str, Any]]


def parse_batch_limit(limit: int) -> int:
    """Check the ``limit`` of a batch claim (shared by every store)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BIGINT_MAX:
        raise InvalidJobState(f"limit must be a positive 64-bit int, got {limit!r}.")
    return limit


def parse_claim_reports(reports: Sequence[ClaimReport]) -> list[ParsedReport]:
    """Validate a batch of reports (shared by every store) before anything is written.
    The same job twice in one batch is refused: its outcome would depend on the order
    in which the reports are applied."""
    if isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence):
        raise InvalidJobState("reports must be a sequence of ClaimReport.")
    parsed: list[ParsedReport] = []
    seen: set[uuid.UUID] = set()
    for report in reports:
        if not isinstance(report, ClaimReport):
            raise InvalidJobState(f"every report must be a ClaimReport, got {report!r}.")
        pk = parse_uuid(report.job_id, field="job_id")
        if pk in seen:
            raise InvalidJobState(f"job {pk} appears twice in one batch of reports.")
        seen.add(pk)
        token = parse_uuid(report.claim_token, field="claim_token")
        status = validate_release_status(report.status)
        cleaned = clean_job_fields(
            dict(report.patch), allowed=_REPORT_FIELDS, action="complete_claimed_jobs"
        )
        parsed.append((pk, token, status, cleaned))
    return parsed


@contextmanager
def _hot_cursor(connection: BaseDatabaseWrapper) -> Iterator[Any]:
    """A cursor for the hot-path statements: on psycopg 3 one that binds parameters on
    the server, so the statement text is constant and PostgreSQL can reuse its plan
    when the host enables prepared statements (``OPTIONS["prepare_threshold"]``, off
    by default because of transaction-mode poolers). It goes through Django's cursor
    wrapper, so query logging and execute wrappers still see the statement.

    One such cursor is kept per connection, with psycopg's compiled ``timestamptz``
    loader instead of the Python one Django installs (the claim and the report each
    return several timestamps); :func:`_load_jobs` then applies Django's time zone
    itself. Creating a cursor, and its adapters, for every call cost more than the
    statement's own Python work."""
    binding = _server_binding_cursor()
    if binding is None:
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    raw = connection.connection
    reused = _HOT_CURSORS.get(connection)
    if reused is None or reused.connection is not raw or reused.closed:
        reused = binding(raw)
        reused.adapters.register_loader("timestamptz", _compiled_timestamptz_loader())
        _HOT_CURSORS[connection] = reused
    # Django wraps its own cursors the same way (``_prepare_cursor``): debug logging,
    # execute wrappers and thread-sharing checks apply unchanged. The wrapper is not
    # closed: the psycopg cursor is reused by the next call on this connection.
    wrapper: Any = connection
    yield wrapper._prepare_cursor(reused)


#: Per connection: its reusable hot-path cursor (see :func:`_hot_cursor`).
_HOT_CURSORS: weakref.WeakKeyDictionary[BaseDatabaseWrapper, Any] = weakref.WeakKeyDictionary()


@functools.cache
def _compiled_timestamptz_loader() -> type[Any]:
    """psycopg's own ``timestamptz`` text loader (registering it picks the compiled
    version when psycopg has one)."""
    from psycopg.types.datetime import TimestamptzLoader

    return TimestamptzLoader


@functools.cache
def _server_binding_cursor() -> Callable[[Any], Any] | None:
    """Django's server-binding cursor class for psycopg 3, or ``None`` (psycopg 2)."""
    try:
        from django.db.backends.postgresql.base import ServerBindingCursor
    except (ImportError, AttributeError):
        return None
    factory: Any = ServerBindingCursor
    return cast(Callable[[Any], Any], factory)


#: Per connection: the converters of each ``Job`` column that has any (they are bound to
#: the connection, and working them out costs more than a claim's other Python work).
_CONVERTERS: weakref.WeakKeyDictionary[BaseDatabaseWrapper, list[tuple[int, Any, list[Any]]]] = (
    weakref.WeakKeyDictionary()
)


#: ``_returning_columns`` by (database vendor, table alias): the text never changes.
_RETURNING: dict[tuple[str, str], str] = {}


#: The hot statements' text, built once per shape: (vendor, kind, shape) -> SQL (and the
#: patched fields of a completion).
_STATEMENTS: dict[tuple[Any, ...], Any] = {}


def _claim_statement(connection: BaseDatabaseWrapper, targets: int, status: JobStatus) -> str:
    """The one-statement claim of :meth:`DatabaseStateStore._claim_in_one_statement` for
    ``targets`` target placeholders."""
    key = (connection.vendor, "claim", targets, status)
    sql = _STATEMENTS.get(key)
    if sql is None:
        table = connection.ops.quote_name(Job._meta.db_table)
        placeholders = ", ".join(["%s"] * targets)
        dispatched = "statement_timestamp()" if status == JobStatus.DISPATCHED else "NULL"
        sql = f"""
            WITH picked AS (
                SELECT c.id, c.thread_id FROM {table} AS c
                WHERE c.status = 'queued'
                  AND (c.run_after IS NULL OR c.run_after <= statement_timestamp())
                  AND c.target IN ({placeholders})
                  AND (c.thread_id IS NULL OR NOT EXISTS ({_BLOCKERS_SQL.format(table=table)}))
                ORDER BY c.created_at, c.id
                LIMIT 1
                FOR UPDATE OF c SKIP LOCKED
            ), moved AS (
                UPDATE {table} AS j
                SET status = %s, executor_id = %s, claimed_at = statement_timestamp(),
                    dispatched_at = {dispatched}, lease_until = statement_timestamp() + %s,
                    claim_token = %s, run_after = NULL, updated_at = statement_timestamp()
                FROM picked
                WHERE j.id = picked.id AND picked.thread_id IS NULL AND j.status = 'queued'
                RETURNING {_returning_columns(connection, "j")}
            )
            SELECT picked.id, moved.* FROM picked LEFT JOIN moved ON moved.id = picked.id
        """
        _STATEMENTS[key] = sql
    return sql


def _complete_statement(
    connection: BaseDatabaseWrapper, columns: tuple[str, ...], reports: int
) -> tuple[str, list[Field[Any, Any]]]:
    """The fenced completion of ``reports`` reports that patch ``columns``: one
    ``UPDATE ... FROM (VALUES ...)``, each row matched by id and claim token. Its
    parameters per report: id, token, status, then the fields returned, in order."""
    key = (connection.vendor, "complete", columns, reports)
    cached = _STATEMENTS.get(key)
    if cached is None:
        quote = connection.ops.quote_name
        table = quote(Job._meta.db_table)
        fields = [_job_field(name) for name in ("id", "claim_token", "status", *columns)]
        patched_fields = fields[3:]
        casts = ", ".join(f"CAST(%s AS {field.db_type(connection)})" for field in fields)
        values = ", ".join([f"({casts})"] * reports)
        aliases = ", ".join(f"v{index}" for index in range(len(fields)))
        patched = "".join(
            f"{quote(_column(field))} = v.v{index + 3}, "
            for index, field in enumerate(patched_fields)
        )
        cleared = ", ".join(
            f"{quote(_column(_job_field(name)))} = NULL" for name in JOB_CLAIM_FIELDS
        )
        statuses = ", ".join(f"'{status.value}'" for status in sorted(CLAIMED_JOB_STATUSES))
        sql = f"""
            UPDATE {table} AS j
            SET {patched}status = v.v2, {cleared}, updated_at = statement_timestamp()
            FROM (VALUES {values}) AS v({aliases})
            WHERE j.id = v.v0 AND j.claim_token = v.v1 AND j.status IN ({statuses})
            RETURNING {_returning_columns(connection, "j")}
        """
        cached = _STATEMENTS[key] = (sql, patched_fields)
    return cast("tuple[str, list[Field[Any, Any]]]", cached)


def _returning_columns(connection: BaseDatabaseWrapper, alias: str) -> str:
    """Every concrete column of ``Job`` qualified by ``alias``, in model field order (the
    order :func:`_load_jobs` expects)."""
    key = (connection.vendor, alias)
    text = _RETURNING.get(key)
    if text is None:
        quote = connection.ops.quote_name
        text = ", ".join(f"{alias}.{quote(_column(field))}" for field in Job._meta.concrete_fields)
        _RETURNING[key] = text
    return text


def _column(field: Field[Any, Any]) -> str:
    return field.column or field.attname


def _job_field(name: str) -> Field[Any, Any]:
    field = Job._meta.get_field(name)
    if not isinstance(field, Field):
        raise TypeError(f"Job.{name} is not a concrete field.")
    return field


def _load_jobs(
    connection: BaseDatabaseWrapper, using: str, rows: Iterable[Sequence[Any]]
) -> list[Job]:
    """Turn raw rows of :func:`_returning_columns` into ``Job`` instances, through the
    same backend and field converters (JSON decoding, time zones) a queryset applies."""
    fields = Job._meta.concrete_fields
    converters = _CONVERTERS.get(connection)
    if converters is None:
        converters = []
        for position, field in enumerate(fields):
            column = field.get_col(Job._meta.db_table)
            functions = [
                *connection.ops.get_db_converters(column),
                *column.get_db_converters(connection),
            ]
            if field.get_internal_type() == "DateTimeField":
                functions.insert(0, _in_connection_time_zone)
            if functions:
                converters.append((position, column, functions))
        _CONVERTERS[connection] = converters
    names = [field.attname for field in fields]
    jobs: list[Job] = []
    for row in rows:
        values = list(row)
        for position, column, functions in converters:
            value = values[position]
            for function in functions:
                value = function(value, column, connection)
            values[position] = value
        jobs.append(Job.from_db(using, names, values))
    return jobs


def _in_connection_time_zone(
    value: datetime | None, expression: Any, connection: BaseDatabaseWrapper
) -> datetime | None:
    """What Django's own ``timestamptz`` loader does to a loaded timestamp: keep the
    wall time in the session's time zone and attach ``connection.timezone`` (UTC with
    ``USE_TZ``, naive without)."""
    if value is None:
        return None
    return value.replace(tzinfo=connection.timezone)


def _thread_lock_key(thread_id: int) -> int:
    """The advisory-lock key of a thread: a 64-bit hash of a namespaced name."""
    digest = hashlib.blake2b(f"jobstate.job.thread:{thread_id}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


def _replay(existing: Job, given: dict[str, Any]) -> Job:
    stored = {name: getattr(existing, name) for name in ENQUEUE_PAYLOAD_FIELDS}
    check_same_request(existing.request_id, stored, given)
    return existing


def _audit_subject(job: Job | JobId | None, request_id: str) -> tuple[uuid.UUID | None, str]:
    if not isinstance(request_id, str) or len(request_id) > 200 or text_problem(request_id):
        raise InvalidJobState("request_id must be a string of at most 200 characters, without NUL.")
    if job is None:
        return None, request_id
    if isinstance(job, Job):
        return job.id, request_id or job.request_id
    return parse_uuid(job, field="job"), request_id
