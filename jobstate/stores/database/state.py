"""The job queue, audit ledger and runtime locks on the Django ORM (``DatabaseStateStore``).

Every transition is one conditional write (``UPDATE ... WHERE status = ...``, ``WHERE
claim_token = ...``) or a short transaction around one, so concurrent web processes,
workers, executors and sweeps never overwrite each other's transitions. The statements
live in one module per concern beside this one; this class checks the arguments and
hands them over.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models.functions import Now

from jobstate.audit import complete_audit_fields
from jobstate.conf import jobstate_settings
from jobstate.exceptions import InvalidJobState
from jobstate.models import AuditEntry, Job
from jobstate.states import (
    TERMINAL_JOB_STATUSES,
    ApprovalRequeueOutcome,
    ClaimReport,
    CompletionOutcome,
    DeliveryRequeueOutcome,
    JobId,
    JobOperationalMetrics,
    JobStatus,
    NotificationRequest,
    Readiness,
)
from jobstate.stores.database import (
    audit_locks,
    claims,
    continuations,
    intake,
    observability,
    outbox,
)
from jobstate.stores.database.tables import is_postgresql, job_rows
from jobstate.stores.errors import translate_store_errors
from jobstate.stores.state_store import (
    NO_DELIVERY_KEY,
    CompletionResult,
    StateStore,
    approval_audit_entry,
    approval_via,
    reject_audit_detail,
)
from jobstate.stores.state_validation import (
    JOB_COMPLETION_FIELDS,
    JOB_CREATE_FIELDS,
    JOB_ENQUEUE_FIELDS,
    JOB_REPORT_FIELDS,
    audit_subject,
    narrowing_job_id,
    parse_batch_limit,
    parse_claim_reports,
    validate_approval_arguments,
    validate_notification_requests,
    validate_reject_arguments,
    validate_requeue_arguments,
)
from jobstate.stores.validation import (
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
    validate_duration,
    validate_instant,
    validate_release_status,
)

__all__ = ["DatabaseStateStore"]


class _Superseded(Exception):
    """Rolls back an approval's savepoint: the job was requeued by someone else."""


@translate_store_errors
class DatabaseStateStore(StateStore):
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
        return intake.find_by_request_id(self.using, request_id)

    def get_job(self, job_id: JobId) -> Job | None:
        return intake.get_job(self.using, parse_uuid(job_id, field="job_id"))

    def create_job(self, **fields: Any) -> Job:
        cleaned = clean_job_fields(fields, allowed=JOB_CREATE_FIELDS, action="create_job")
        required_request_id(cleaned, action="create_job")
        return intake.create_job(self.using, cleaned)

    def enqueue(self, **fields: Any) -> tuple[Job, bool]:
        cleaned = clean_job_fields(fields, allowed=JOB_ENQUEUE_FIELDS, action="enqueue")
        required_request_id(cleaned, action="enqueue")
        job, created = intake.enqueue_job(
            self.using, cleaned, jobstate_settings.THREAD_INFLIGHT_QUOTA
        )
        if not created:
            stored = {name: getattr(job, name) for name in ENQUEUE_PAYLOAD_FIELDS}
            check_same_request(job.request_id, stored, cleaned)
        return job, created

    def update_job(self, job_id: JobId, **patch: Any) -> Job | None:
        pk = parse_uuid(job_id, field="job_id")
        cleaned = clean_job_fields(patch, allowed=JOB_PATCH_FIELDS, action="update_job")
        return intake.update_job(self.using, pk, cleaned, None)

    def update_job_if_status(
        self, job_id: JobId, expected_statuses: Iterable[str], **patch: Any
    ) -> Job | None:
        expected = parse_statuses(expected_statuses)
        pk = parse_uuid(job_id, field="job_id")
        cleaned = clean_job_fields(patch, allowed=JOB_PATCH_FIELDS, action="update_job_if_status")
        if not expected:
            return None
        return intake.update_job(self.using, pk, cleaned, expected)

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
            job = intake.lock_job(self.using, pk, lease_ended=True)
            if job is None:
                return None
            return self.requeue_job(pk, from_statuses=[job.status], by=by, via=via, event=event)

    # --- claims ----------------------------------------------------------------------

    def claim_next_job(
        self, targets: Sequence[str], executor_id: str, lease: timedelta | None = None
    ) -> Job | None:
        owner = require_text(executor_id, field="executor_id")
        duration = resolve_lease(lease, jobstate_settings.EXECUTOR_LEASE)
        scope = parse_claim_targets(targets)
        if not scope:
            return None
        return claims.claim(self.using, scope, owner, duration, JobStatus.DISPATCHED)

    def claim_next_inhub_job(
        self, targets: Sequence[str], worker_id: str, lease: timedelta | None = None
    ) -> Job | None:
        owner = require_text(worker_id, field="worker_id")
        duration = resolve_lease(lease, jobstate_settings.WORKER_LEASE)
        scope = parse_claim_targets(targets)
        if not scope:
            return None
        return claims.claim(self.using, scope, owner, duration, JobStatus.RUNNING)

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
        if is_postgresql(self.using):
            claimed = claims.claim_batch(self.using, scope, owner, duration, count)
        else:
            with transaction.atomic(using=self.using):
                while len(claimed) < count:
                    job = claims.claim(self.using, scope, owner, duration, JobStatus.RUNNING)
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
        cleaned = clean_job_fields(patch, allowed=JOB_REPORT_FIELDS, action="complete_claimed_job")
        return _result(*claims.complete_claimed(self.using, pk, token, new_status, cleaned))

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
        if is_postgresql(self.using):
            settled = claims.complete_claimed_batch(self.using, parsed)
        else:
            with transaction.atomic(using=self.using):
                settled = [claims.complete_claimed(self.using, *report) for report in parsed]
        return [_result(*pair) for pair in settled]

    def extend_claim_lease(
        self, job_id: JobId, claim_token: uuid.UUID | str, lease: timedelta | None = None
    ) -> bool:
        pk = parse_uuid(job_id, field="job_id")
        token = parse_uuid(claim_token, field="claim_token")
        if lease is not None:
            lease = validate_duration(lease, field="lease", allow_zero=False)
        return claims.extend_claim_lease(self.using, pk, token, lease)

    # --- leases and maintenance ------------------------------------------------------

    def extend_executor_leases(self, executor_id: str, lease: timedelta | None = None) -> int:
        require_text(executor_id, field="executor_id")
        duration = resolve_lease(lease, jobstate_settings.EXECUTOR_LEASE)
        return claims.extend_executor_leases(self.using, executor_id, duration)

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
        return claims.requeue_stale_dispatched(self.using, dead, cap, scope)

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
        return claims.list_expired_leases(self.using, wanted, fallback_older_than, scope, count)

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
        return claims.list_jobs_by_status(self.using, wanted, older_than, scope, count)

    def expire_stale_queued(
        self, ttl: timedelta | None = None, *, targets: Sequence[str] | None = None
    ) -> int:
        duration = validate_duration(
            jobstate_settings.QUEUED_TTL if ttl is None else ttl, field="ttl"
        )
        scope = parse_targets(targets)
        if scope == []:
            return 0
        return claims.expire_stale_queued(self.using, duration, scope)

    def count_inflight_by_thread(self, thread_id: int) -> int:
        return claims.count_inflight(self.using, parse_thread_id(thread_id))

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
        job_id, request_id = audit_subject(job, request_id)
        instant = None if at is None else validate_instant(at, field="at")
        return audit_locks.append_audit_entry(
            self.using, job_id, request_id, event, fields, instant
        )

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
        job_id = narrowing_job_id(job)
        if request_id is not None:
            require_text(request_id, field="request_id")
        return audit_locks.list_audit(self.using, job_id, request_id, count)

    def prune_audit_older_than(self, cutoff: datetime, *, batch_size: int | None = None) -> int:
        cutoff = validate_instant(cutoff, field="cutoff")
        batch = parse_limit(batch_size, default=jobstate_settings.AUDIT_PRUNE_BATCH_SIZE)
        return audit_locks.prune_audit(self.using, cutoff, batch)

    # --- runtime locks ---------------------------------------------------------------

    def acquire_runtime_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        require_text(lock_key, field="lock_key")
        require_text(owner, field="owner")
        validate_duration(ttl, field="ttl", allow_zero=False)
        return audit_locks.acquire_lock(self.using, lock_key, owner, ttl)

    def release_runtime_lock(self, lock_key: str, owner: str) -> None:
        require_text(lock_key, field="lock_key")
        require_text(owner, field="owner")
        audit_locks.release_lock(self.using, lock_key, owner)

    # --- continuations ---------------------------------------------------------------

    def requeue_job(
        self,
        job_id: JobId,
        *,
        from_statuses: Sequence[str],
        by: str,
        via: str,
        event: str = "rerun",
    ) -> Job | None:
        """See :meth:`StateStore.requeue_job`.

        The job row is locked first (``SELECT ... FOR UPDATE``) so the audit entry's
        ``prev_status`` is exactly the status the refire replaced; the UPDATE itself stays
        conditional on ``from_statuses``. ``metadata['no_delivery']`` is removed. Runs in
        the caller's transaction when there is one.
        """
        pk = parse_uuid(job_id, field="job_id")
        statuses = validate_requeue_arguments(from_statuses, by, via, event)
        if not statuses:
            return None
        with transaction.atomic(using=self.using):
            jobs = job_rows(self.using)
            prev_status = (
                jobs.select_for_update()
                .filter(id=pk, status__in=statuses)
                .values_list("status", flat=True)
                .first()
            )
            if prev_status is None:
                return None
            moved = jobs.filter(id=pk, status__in=statuses).update(
                status=JobStatus.QUEUED,
                attempts=0,
                run_after=None,
                error=None,
                metadata=continuations.WithoutKey("metadata", NO_DELIVERY_KEY),
                updated_at=Now(),
                **dict.fromkeys(JOB_CLAIM_FIELDS),
            )
            if moved != 1:
                return None
            job = jobs.get(id=pk)
            self.append_audit(
                job=job,
                event=event,
                detail={"by": by, "via": via, "prev_status": prev_status},
            )
            return job

    def requeue_approved_job_once(
        self, *, job_id: JobId, decision_id: str, approver: str, comment: str = ""
    ) -> ApprovalRequeueOutcome:
        """See :meth:`StateStore.requeue_approved_job_once`.

        One transaction: the job row is locked, so concurrent approvals of one job (same
        or different ``decision_id``) run one after another and each later one sees
        either its own marker (``ALREADY_REQUEUED``) or the job back in the queue
        (``JOB_IN_FLIGHT``). A ``decision_id`` raced for two jobs is settled by the
        marker's primary key: the loser answers ``DECISION_CONFLICT``. On ``REQUEUED`` the
        audit has an ``approved`` entry (stage approval: approver, decision, comment) and
        the ``rerun`` entry of the refire.
        """
        pk = parse_uuid(job_id, field="job_id")
        validate_approval_arguments(decision_id, approver, comment)
        with transaction.atomic(using=self.using):
            job = intake.lock_job(self.using, pk, lease_ended=False)
            if job is None:
                return ApprovalRequeueOutcome.NOT_FOUND
            decided = continuations.recorded_decision(self.using, decision_id)
            if decided is not None:
                return _decided(decided, pk)
            if job.status not in TERMINAL_JOB_STATUSES:
                return ApprovalRequeueOutcome.JOB_IN_FLIGHT
            try:
                # A savepoint: a job that left its terminal status regardless of the
                # lock undoes the marker and the audit entries.
                with transaction.atomic(using=self.using):
                    winner = continuations.record_decision(
                        self.using, decision_id, pk, approver, comment
                    )
                    if winner is not None:
                        return _decided(winner, pk)
                    self.append_audit(
                        job=job, **approval_audit_entry(decision_id, approver, comment)
                    )
                    refired = self.requeue_job(
                        pk,
                        from_statuses=[job.status],
                        by=approver,
                        via=approval_via(decision_id),
                    )
                    if refired is None:
                        raise _Superseded
            except _Superseded:
                return ApprovalRequeueOutcome.JOB_IN_FLIGHT
            return ApprovalRequeueOutcome.REQUEUED

    # --- outbox ----------------------------------------------------------------------

    def complete_job_with_notifications(
        self,
        original: Job,
        patch: dict[str, Any],
        notifications: Iterable[NotificationRequest] = (),
    ) -> Job | None:
        """See :meth:`StateStore.complete_job_with_notifications` and
        :func:`~jobstate.stores.database.outbox.complete_with_notifications`."""
        if not isinstance(original, Job):
            raise InvalidJobState(f"original must be a Job, got {type(original).__name__}.")
        if not isinstance(patch, dict):
            raise InvalidJobState(f"patch must be a dict, got {type(patch).__name__}.")
        cleaned = clean_job_fields(
            patch, allowed=JOB_COMPLETION_FIELDS, action="complete_job_with_notifications"
        )
        status = cleaned.get("status")
        if status not in TERMINAL_JOB_STATUSES:
            raise InvalidJobState(
                "complete_job_with_notifications needs a terminal status in patch "
                f"(done, error or rejected), got {status!r}."
            )
        requests = validate_notification_requests(original, notifications)
        if original.status in TERMINAL_JOB_STATUSES:
            return None
        return outbox.complete_with_notifications(self.using, original, cleaned, requests)

    @property
    def notification_outbox(self) -> outbox.DatabaseNotificationOutbox:
        return outbox.DatabaseNotificationOutbox(self.using, store=self)

    def requeue_delivery_job_once(
        self, *, notification_id: JobId, dlq_key: str, requested_by: str
    ) -> DeliveryRequeueOutcome:
        """See :meth:`StateStore.requeue_delivery_job_once` and
        :func:`~jobstate.stores.database.continuations.requeue_delivery`."""
        pk = parse_uuid(notification_id, field="notification_id")
        require_text(dlq_key, field="dlq_key")
        require_text(requested_by, field="requested_by")
        return continuations.requeue_delivery(self.using, pk, dlq_key, requested_by)

    # --- observability ---------------------------------------------------------------

    def operational_metrics_snapshot(
        self, now: datetime | None = None, *, exact: bool = False
    ) -> JobOperationalMetrics:
        """See :meth:`StateStore.operational_metrics_snapshot` and
        :func:`~jobstate.stores.database.observability.metrics_snapshot`."""
        instant = None if now is None else validate_instant(now, field="now")
        return observability.metrics_snapshot(self.using, instant, exact)

    def schema_readiness(self) -> Readiness:
        """See :meth:`StateStore.schema_readiness` and
        :func:`~jobstate.stores.database.observability.schema_readiness`."""
        return observability.schema_readiness(self.using)


def _result(applied: bool, job: Job | None) -> CompletionResult:
    if applied:
        return CompletionResult(CompletionOutcome.COMPLETED, job)
    if job is None:
        return CompletionResult(CompletionOutcome.NOT_FOUND, None)
    return CompletionResult(CompletionOutcome.STALE_CLAIM, job)


def _decided(decided_job: uuid.UUID, pk: uuid.UUID) -> ApprovalRequeueOutcome:
    if decided_job == pk:
        return ApprovalRequeueOutcome.ALREADY_REQUEUED
    return ApprovalRequeueOutcome.DECISION_CONFLICT
