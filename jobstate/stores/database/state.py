"""The job queue, audit ledger and runtime locks on the Django ORM (``DatabaseStateStore``).

Every transition is one conditional write (``UPDATE ... WHERE status = ...``, ``WHERE
claim_token = ...``) or a short transaction around one, so concurrent web processes,
workers, executors and sweeps never overwrite each other's transitions. The public
methods, their argument checks and the transitions written over primitives come from
:class:`~jobstate.stores.base.StateStore`; this class implements the primitives by
handing them to one module per concern beside it.
"""

from __future__ import annotations

import uuid
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from jobstate.core.states import (
    DeliveryRequeueOutcome,
    JobOperationalMetrics,
    JobStatus,
    NotificationRequest,
    Readiness,
)
from jobstate.models import AuditEntry, Job
from jobstate.stores.contracts.audit import AuditFields
from jobstate.stores.contracts.primitives import AuditSubject, Settled
from jobstate.stores.contracts.state_store import StateStore
from jobstate.stores.contracts.validation import ParsedReport
from jobstate.stores.database import (
    audit_locks,
    bulk_transitions,
    claims,
    continuations,
    figures,
    fleet_rows,
    intake,
    keyed_claims,
    notification_outbox,
    set_claims,
    sweep_statements,
    task_queue,
)
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.sweep_statements import DatabaseSweepStore
from jobstate.stores.errors import translate_store_errors

__all__ = ["DatabaseStateStore"]


@translate_store_errors
class DatabaseStateStore(StateStore):
    """:class:`~jobstate.stores.base.StateStore` on the ``Job``, ``AuditEntry`` and
    ``RuntimeLock`` tables of database ``using``, with every optional capability.

    - Request-id idempotency rests on the unique constraint
      ``jobstate_job_unique_request_id``; only its violation becomes
      ``DuplicateRequestId`` or an idempotent replay (:mod:`.intake`).
    - Claims pick a candidate with ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL
      and re-check the per-thread gate under the thread's advisory lock; on SQLite,
      ``IMMEDIATE`` transactions serialise writers (:mod:`.claims`). On PostgreSQL a
      claim and a report are one statement each (:mod:`.backends.postgresql`).
    - Lease and liveness instants come from the database clock (``Now()``).
    - :meth:`_atomic` is ``transaction.atomic(using)``: the transitions the base writes
      over primitives run in the caller's transaction when there is one.
    """

    supports_outbox = True
    supports_approvals = True
    supports_delivery_replay = True
    supports_metrics = True
    supports_readiness = True
    supports_tasks = True
    supports_sweeps = True
    supports_queue_pauses = True
    supports_worker_registry = True
    supports_job_deletion = True

    def __init__(self, using: str = "default") -> None:
        self.using = using

    def _atomic(self) -> AbstractContextManager[object]:
        return transaction.atomic(using=self.using)

    # --- jobs ------------------------------------------------------------------------

    def _find_by_request_id(self, request_id: str) -> Job | None:
        return intake.find_by_request_id(self.using, request_id)

    def _get_job(self, pk: uuid.UUID) -> Job | None:
        return intake.get_job(self.using, pk)

    def _create_job(self, cleaned: dict[str, Any]) -> Job:
        return intake.create_job(self.using, cleaned)

    def _enqueue_job(self, cleaned: dict[str, Any], quota: int | None) -> tuple[Job, bool]:
        return intake.enqueue_job(self.using, cleaned, quota)

    def _update_job(
        self, pk: uuid.UUID, cleaned: dict[str, Any], expected: list[JobStatus] | None
    ) -> Job | None:
        return intake.update_job(self.using, pk, cleaned, expected)

    def _lock_job(self, pk: uuid.UUID, *, lease_ended: bool = False) -> Job | None:
        return intake.lock_job(self.using, pk, lease_ended=lease_ended)

    # --- claims and reports ----------------------------------------------------------

    def _requeue_batch(
        self, jobs: list[tuple[uuid.UUID, JobStatus]], *, by: str, via: str, event: str
    ) -> list[uuid.UUID]:
        return bulk_transitions.requeue_batch(self.using, jobs, by=by, via=via, event=event)

    def _reject_batch(
        self, pks: list[uuid.UUID], *, by: str, error: str, via: str
    ) -> list[uuid.UUID]:
        return bulk_transitions.reject_batch(self.using, pks, by=by, error=error, via=via)

    def _delete_batch(self, pks: list[uuid.UUID], *, by: str, via: str) -> list[uuid.UUID]:
        return bulk_transitions.delete_batch(self.using, pks, by=by, via=via)

    def _delete_job(self, pk: uuid.UUID, expected: list[JobStatus]) -> bool:
        return intake.delete_job(self.using, pk, expected)

    def _claim(
        self, scope: list[str], owner: str, lease: timedelta, status: JobStatus
    ) -> Job | None:
        return claims.claim(self.using, scope, owner, lease, status)

    def _claim_batch(self, scope: list[str], owner: str, lease: timedelta, limit: int) -> list[Job]:
        """Where the backend has the one-statement forms (PostgreSQL) the jobs without a
        thread are claimed by one statement (``UPDATE ... FROM (SELECT ... LIMIT k FOR
        UPDATE SKIP LOCKED) RETURNING``); when that leaves room in the batch, threaded
        jobs follow one claim at a time through the per-thread gate. Where rows are
        locked but not returned by an ``UPDATE`` (MariaDB, MySQL) the batch is one
        locking read and one ``UPDATE ... WHERE id IN`` (:mod:`.set_claims`). Elsewhere
        every job is claimed one at a time, inside one transaction."""
        ops = database_ops(self.using)
        if ops.hot_statements:
            return claims.claim_batch(self.using, scope, owner, lease, limit)
        if ops.claims_in_sets:
            return set_claims.claim(self.using, scope, owner, lease, JobStatus.RUNNING, limit)
        return super()._claim_batch(scope, owner, lease, limit)

    def _complete_claimed(
        self, pk: uuid.UUID, token: uuid.UUID, status: JobStatus, cleaned: dict[str, Any]
    ) -> Settled:
        return claims.complete_claimed(self.using, pk, token, status, cleaned)

    def _complete_claimed_batch(self, reports: list[ParsedReport]) -> list[Settled]:
        """Where the backend has the one-statement forms (PostgreSQL) the reports that
        patch the same fields are applied by one ``UPDATE ... FROM (VALUES ...)
        RETURNING`` statement, each row fenced by its own claim token; a batch of uniform
        reports (the usual case) is one statement. On MariaDB and MySQL the current
        claims are locked by one read, each shape of patch is one ``UPDATE``, and the
        rows are read back once (:mod:`.set_claims`). Elsewhere the reports are applied
        one by one inside one transaction."""
        ops = database_ops(self.using)
        if ops.hot_statements:
            return claims.complete_claimed_batch(self.using, reports)
        if ops.claims_in_sets:
            return set_claims.complete_batch(self.using, reports)
        return super()._complete_claimed_batch(reports)

    def _extend_claim_lease(self, pk: uuid.UUID, token: uuid.UUID, lease: timedelta | None) -> bool:
        return claims.extend_claim_lease(self.using, pk, token, lease)

    def _extend_claim_leases(
        self, pairs: list[tuple[uuid.UUID, uuid.UUID]], lease: timedelta
    ) -> list[uuid.UUID]:
        """One ``UPDATE`` for the whole batch (a worker's beat)."""
        return task_queue.extend_claim_leases(self.using, pairs, lease)

    def _claims_now(self, pks: list[uuid.UUID]) -> dict[uuid.UUID, tuple[JobStatus, Any]]:
        return task_queue.claims_now(self.using, pks)

    # --- django.tasks ----------------------------------------------------------------

    def _enqueue_task(self, cleaned: dict[str, Any]) -> Job:
        return task_queue.enqueue_task(self.using, cleaned)

    def _claim_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> list[Job]:
        return task_queue.claim_tasks(self.using, target, queues, owner, lease, limit, claim_round)

    def _claim_keyed_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> list[Job]:
        return keyed_claims.claim_keyed_tasks(
            self.using, target, queues, owner, lease, limit, claim_round
        )

    def _list_claimed_tasks(self, owner: str) -> list[Job]:
        return task_queue.list_claimed_tasks(self.using, owner)

    def _complete_and_claim_tasks(
        self,
        reports: list[ParsedReport],
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> tuple[list[Settled], list[Job]]:
        """Where the backend has the one-statement forms (PostgreSQL), reports that
        patch the same fields and the claim are one statement (:mod:`.task_queue`);
        elsewhere the reports and then the claim."""
        if database_ops(self.using).hot_statements and queues != []:
            return task_queue.complete_and_claim_tasks(
                self.using, reports, target, queues, owner, lease, limit, claim_round
            )
        return super()._complete_and_claim_tasks(
            reports, target, queues, owner, lease, limit, claim_round
        )

    def _list_expired_tasks(self, limit: int) -> list[Job]:
        return task_queue.list_expired_tasks(self.using, limit)

    # --- leases and maintenance ------------------------------------------------------

    def _extend_executor_leases(self, executor_id: str, lease: timedelta) -> int:
        return claims.extend_executor_leases(self.using, executor_id, lease)

    def _requeue_stale_dispatched(
        self, dead_after: timedelta, hard_cap: timedelta, scope: list[str] | None, limit: int
    ) -> int:
        return sweep_statements.requeue_stale_dispatched(
            self.using, dead_after, hard_cap, scope, limit
        )

    def _list_expired_leases(
        self,
        statuses: list[JobStatus],
        fallback_older_than: timedelta,
        scope: list[str] | None,
        limit: int,
    ) -> list[Job]:
        return claims.list_expired_leases(self.using, statuses, fallback_older_than, scope, limit)

    def _list_jobs_by_status(
        self,
        statuses: list[JobStatus],
        older_than: timedelta | None,
        scope: list[str] | None,
        limit: int,
    ) -> list[Job]:
        return claims.list_jobs_by_status(self.using, statuses, older_than, scope, limit)

    def _expire_stale_queued(self, ttl: timedelta, scope: list[str] | None) -> int:
        return claims.expire_stale_queued(self.using, ttl, scope)

    def _count_inflight(self, thread_id: int) -> int:
        return claims.count_inflight(self.using, thread_id)

    # --- audit ledger and runtime locks ----------------------------------------------

    def _append_audit_entry(
        self, subject: AuditSubject, event: str, fields: AuditFields, at: datetime | None
    ) -> AuditEntry:
        return audit_locks.append_audit_entry(self.using, *subject, event, fields, at)

    def _list_audit(
        self, job_id: uuid.UUID | None, request_id: str | None, limit: int
    ) -> list[AuditEntry]:
        return audit_locks.list_audit(self.using, job_id, request_id, limit)

    def _prune_audit(self, cutoff: datetime, batch_size: int) -> int:
        return audit_locks.prune_audit(self.using, cutoff, batch_size)

    def _acquire_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        return audit_locks.acquire_lock(self.using, lock_key, owner, ttl)

    def _release_lock(self, lock_key: str, owner: str) -> None:
        audit_locks.release_lock(self.using, lock_key, owner)

    # --- outbox, approvals, replay ---------------------------------------------------

    def _complete_with_notifications(
        self, original: Job, cleaned: dict[str, Any], requests: list[NotificationRequest]
    ) -> Job | None:
        """One statement-and-rows transaction rather than the base's primitives: a key
        already in the outbox must be answered after the failed insert rolled back (see
        :func:`~jobstate.stores.database.notification_outbox.complete_with_notifications`)."""
        return notification_outbox.complete_with_notifications(
            self.using, original, cleaned, requests
        )

    def _notification_outbox(self) -> notification_outbox.DatabaseNotificationOutbox:
        return notification_outbox.DatabaseNotificationOutbox(self.using, store=self)

    def _recorded_decision(self, decision_id: str) -> uuid.UUID | None:
        return continuations.recorded_decision(self.using, decision_id)

    def _record_decision(
        self, decision_id: str, pk: uuid.UUID, approver: str, comment: str
    ) -> uuid.UUID | None:
        return continuations.record_decision(self.using, decision_id, pk, approver, comment)

    def _requeue_delivery(
        self, pk: uuid.UUID, dlq_key: str, requested_by: str
    ) -> DeliveryRequeueOutcome:
        return continuations.requeue_delivery(self.using, pk, dlq_key, requested_by)

    # --- observability ---------------------------------------------------------------

    def _metrics_snapshot(self, now: datetime | None, exact: bool) -> JobOperationalMetrics:
        return figures.metrics_snapshot(self.using, now, exact)

    def _schema_readiness(self) -> Readiness:
        return figures.schema_readiness(self.using)

    # --- the fleet: queue pauses, registered workers ------------------------------------

    def _pause_queue(self, key: tuple[str, str], by: str) -> bool:
        return fleet_rows.pause_queue(self.using, *key, by)

    def _resume_queue(self, key: tuple[str, str]) -> bool:
        return fleet_rows.resume_queue(self.using, *key)

    def _paused_queues(self) -> list[tuple[str, str]]:
        return fleet_rows.paused_queues(self.using)

    def _register_worker(self, fields: dict[str, Any]) -> None:
        fleet_rows.register_worker(self.using, fields)

    def _beat_worker(self, worker_id: str) -> bool:
        return fleet_rows.beat_worker(self.using, worker_id)

    def _stop_worker(self, worker_id: str, reason: str) -> bool:
        return fleet_rows.stop_worker(self.using, worker_id, reason)

    # --- maintenance -----------------------------------------------------------------

    def _sweep_store(self) -> DatabaseSweepStore:
        # The lease recovery refires jobs through this store, on this store's database.
        return DatabaseSweepStore(self.using, state=self)
