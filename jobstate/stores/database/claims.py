"""Claims, reports and leases on the Django ORM.

On MariaDB and MySQL claims take the set-based path of :mod:`.set_claims`. Elsewhere a
claim picks a candidate with ``SELECT ... FOR UPDATE SKIP LOCKED`` where rows are locked
(concurrent claimers pass over each other's rows instead of queueing behind them) and
moves it with ``UPDATE ... WHERE status = 'queued'``. The per-thread gate is re-checked
under a transaction-scoped lock on the thread (PostgreSQL's advisory lock), because a
gate read from a snapshot can miss a sibling job claimed a moment earlier. On SQLite,
``IMMEDIATE`` transactions serialise writers, so the candidate read and the update
already see the same state. Claims rely on READ COMMITTED isolation (Django's default on
PostgreSQL, MariaDB and MySQL): each statement sees what committed before it, which the
re-check after the lock needs.

Reports are fenced by the claim token in the ``WHERE`` clause, and every sweep here is
one conditional ``UPDATE``, so a row that changed while the statement waited for its lock
is re-checked and left alone. Lease instants come from the database clock (``Now()``).
Every function takes values the state store has already validated.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import Case, Exists, When
from django.db.models.functions import Now

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import EXPIRED_QUEUED_ERROR, JobStatus
from jobstate.models import Job, thread_blockers
from jobstate.stores.contracts.primitives import Settled
from jobstate.stores.contracts.validation import CLEARED_CLAIM, ParsedReport
from jobstate.stores.database import set_claims
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.tables import job_rows

__all__ = [
    "claim",
    "claim_batch",
    "complete_claimed",
    "complete_claimed_batch",
    "count_inflight",
    "expire_stale_queued",
    "extend_claim_lease",
    "extend_executor_leases",
    "list_expired_leases",
    "list_jobs_by_status",
    "settled_reports",
]

# --- claims ----------------------------------------------------------------------------


def claim(
    using: str, scope: list[str], owner: str, lease: timedelta, status: JobStatus
) -> Job | None:
    """Claim the oldest ready job of ``scope`` that passes the per-thread gate."""
    ops = database_ops(using)
    if ops.claims_in_sets:
        claimed = set_claims.claim(using, scope, owner, lease, status, 1)
        return claimed[0] if claimed else None
    if ops.hot_statements:
        picked, job = ops.claim_one(scope, owner, lease, status)
        if not picked or job is not None:
            return job
        # The oldest candidate belongs to a thread: only the gated path below may
        # take it, because the gate must be re-read after the thread's lock.
    return _claim_gated(using, scope, owner, lease, status)


def claim_batch(
    using: str, scope: list[str], owner: str, lease: timedelta, limit: int
) -> list[Job]:
    """Claim up to ``limit`` jobs where the backend has the one-statement forms: the
    jobs without a thread by one statement; when that leaves room in the batch, threaded
    jobs follow one claim at a time through the per-thread gate."""
    claimed = database_ops(using).claim_unthreaded(scope, owner, lease, limit)
    while len(claimed) < limit:
        job = claim(using, scope, owner, lease, JobStatus.RUNNING)
        if job is None:
            break
        claimed.append(job)
    return claimed


def _claim_gated(
    using: str, scope: list[str], owner: str, lease: timedelta, status: JobStatus
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
    ops = database_ops(using)
    locking = ops.locks_rows
    jobs = job_rows(using)
    passed_ids: list[uuid.UUID] = []
    passed_threads: list[int] = []
    with transaction.atomic(using=using):
        # Each round either claims, finds nothing, or rules out one more job or
        # thread, so the loop ends.
        while True:
            candidates = jobs.claimable(scope)
            if passed_ids:
                candidates = candidates.exclude(id__in=passed_ids)
            if passed_threads:
                candidates = candidates.exclude(thread_id__in=passed_threads)
            picked = ops.lock_candidates(candidates).values_list("id", "thread_id").first()
            if picked is None:
                return None
            job_id, thread_id = picked
            row = jobs.filter(id=job_id, status=JobStatus.QUEUED)
            if locking and thread_id is not None:
                if not ops.try_lock_thread(thread_id):
                    # Another transaction is claiming from (or enqueueing into) this
                    # thread right now; whatever it claims blocks the thread anyway.
                    passed_threads.append(thread_id)
                    continue
                # A fresh statement after the lock sees every sibling claim that
                # committed before it, which the candidate's snapshot may not have.
                # Where the UPDATE may not read its own table in a subquery (MariaDB
                # and MySQL) the gate is read by its own statement under the same lock.
                if ops.gate_in_update:
                    row = row.filter(~Exists(thread_blockers()))
                elif row.filter(Exists(thread_blockers())).exists():
                    passed_threads.append(thread_id)
                    continue
            if row.update(**changes) == 1:
                return jobs.get(id=job_id)
            if thread_id is None:
                passed_ids.append(job_id)
            else:
                passed_threads.append(thread_id)


# --- reports ---------------------------------------------------------------------------


def complete_claimed(
    using: str, pk: uuid.UUID, token: uuid.UUID, status: JobStatus, cleaned: dict[str, Any]
) -> Settled:
    """Apply one fenced report."""
    ops = database_ops(using)
    if ops.hot_statements:
        # One round trip on the hot path: the fenced UPDATE hands back the row it
        # wrote. Only a report that did not apply needs a second look.
        written = ops.complete_group(tuple(sorted(cleaned)), [(pk, token, status, cleaned)])
        if pk in written:
            return True, written[pk]
        return False, job_rows(using).filter(id=pk).first()
    if ops.claims_in_sets:
        return set_claims.complete_one(using, pk, token, status, cleaned)
    changes = {**cleaned, **CLEARED_CLAIM, "status": status, "updated_at": Now()}
    with transaction.atomic(using=using):
        moved = job_rows(using).filter(id=pk, claim_token=token).claimed().update(**changes)
        return moved > 0, job_rows(using).filter(id=pk).first()


def complete_claimed_batch(using: str, parsed: list[ParsedReport]) -> list[Settled]:
    """Apply many fenced reports where the backend has the one-statement forms: the
    reports that patch the same fields by one statement, each row fenced by its own
    claim token; a batch of uniform reports (the usual case) is one statement."""
    ops = database_ops(using)
    shapes: dict[tuple[str, ...], list[ParsedReport]] = {}
    for report in parsed:
        shapes.setdefault(tuple(sorted(report[3])), []).append(report)
    written: dict[uuid.UUID, Job] = {}
    if len(shapes) == 1:
        (columns, group), *_ = shapes.items()
        written.update(ops.complete_group(columns, group))
    else:
        with transaction.atomic(using=using):
            for columns, group in shapes.items():
                written.update(ops.complete_group(columns, group))
    return settled_reports(using, parsed, written)


def settled_reports(
    using: str, parsed: list[ParsedReport], written: dict[uuid.UUID, Job]
) -> list[Settled]:
    """Each report's answer, given the jobs the reports ``written`` by id: a report
    that did not apply answers with its job as it is now, read in one query."""
    missed = [pk for pk, *_ in parsed if pk not in written]
    others = {job.id: job for job in job_rows(using).filter(id__in=missed)} if missed else {}
    return [(True, written[pk]) if pk in written else (False, others.get(pk)) for pk, *_ in parsed]


# --- leases ----------------------------------------------------------------------------


def extend_claim_lease(
    using: str, pk: uuid.UUID, token: uuid.UUID, lease: timedelta | None
) -> bool:
    """Move a claimed job's lease while ``token`` is current; without a ``lease`` the
    worker or executor lease for its status."""
    lease_until: Any
    if lease is None:
        lease_until = Case(
            When(status=JobStatus.RUNNING, then=Now() + jobstate_settings.WORKER_LEASE),
            default=Now() + jobstate_settings.EXECUTOR_LEASE,
        )
    else:
        lease_until = Now() + lease
    moved = (
        job_rows(using)
        .filter(id=pk, claim_token=token)
        .claimed()
        .update(lease_until=lease_until, updated_at=Now())
    )
    return moved > 0


def extend_executor_leases(using: str, executor_id: str, lease: timedelta) -> int:
    return (
        job_rows(using)
        .filter(status=JobStatus.DISPATCHED, executor_id=executor_id)
        .update(lease_until=Now() + lease, updated_at=Now())
    )


# --- maintenance -----------------------------------------------------------------------


def list_expired_leases(
    using: str,
    statuses: list[JobStatus],
    fallback_older_than: timedelta,
    scope: list[str] | None,
    limit: int,
) -> list[Job]:
    rows = (
        job_rows(using)
        .with_status(statuses)
        .expired_leases(fallback_older_than)
        .for_targets(scope)
        .order_by("created_at", "id")
    )
    return list(rows[:limit])


def list_jobs_by_status(
    using: str,
    statuses: list[JobStatus],
    older_than: timedelta | None,
    scope: list[str] | None,
    limit: int,
) -> list[Job]:
    rows = job_rows(using).with_status(statuses).for_targets(scope)
    if older_than is not None:
        rows = rows.not_written_for(older_than)
    return list(rows.order_by("created_at", "id")[:limit])


def expire_stale_queued(using: str, ttl: timedelta, scope: list[str] | None) -> int:
    # A claim holds its candidate's row lock; this UPDATE waits for it and then skips
    # the row, which is no longer queued.
    return (
        job_rows(using)
        .stale_queued(ttl)
        .for_targets(scope)
        .update(status=JobStatus.ERROR, error=EXPIRED_QUEUED_ERROR, updated_at=Now())
    )


def count_inflight(using: str, thread_id: int) -> int:
    return job_rows(using).filter(thread_id=thread_id).inflight().count()
