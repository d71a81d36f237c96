"""django.tasks on the Django ORM: enqueueing a task, claiming tasks in priority order,
renewing a worker's leases and listing the tasks whose lease ran out.

Where the backend has the one-statement forms (PostgreSQL), an enqueue is the insert and
its ``NOTIFY`` in one statement and a claim one ``UPDATE ... FROM (SELECT ... FOR UPDATE
SKIP LOCKED) RETURNING`` that reads the task claim index in claim order (see
:mod:`jobstate.stores.database.backends.postgresql_statements`); on MariaDB and MySQL a
claim is one locking read and one ``UPDATE ... WHERE id IN`` (:mod:`.set_claims`).
Elsewhere the portable path below picks and moves the tasks one by one inside one
transaction, which SQLite's ``IMMEDIATE`` transactions serialise.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import F
from django.db.models.functions import Now

from jobstate.core.states import JobStatus, task_claim_token
from jobstate.exceptions import StoreConflict
from jobstate.models import Job
from jobstate.stores.contracts.primitives import Settled
from jobstate.stores.contracts.validation import ParsedReport
from jobstate.stores.database import claims, set_claims, unique_tasks
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.intake import create_job
from jobstate.stores.database.tables import job_rows

__all__ = [
    "attempt_started",
    "claim_tasks",
    "complete_and_claim_tasks",
    "enqueue_task",
    "extend_claim_leases",
    "list_claimed_tasks",
    "list_expired_tasks",
]


def enqueue_task(using: str, cleaned: dict[str, Any]) -> Job:
    """Insert a task's job; where the backend can (PostgreSQL with
    ``JOBSTATE['LISTEN_NOTIFY']``), wake the workers of its queue when the caller's
    transaction commits. A task's request id is fresh (``task-<uuid4>``), so no
    duplicate needs answering here; a unique task's key is
    (:func:`~jobstate.stores.database.unique_tasks.enqueue_unique_task`)."""
    if cleaned.get("unique_digest") is not None:
        return unique_tasks.enqueue_unique_task(using, cleaned)
    ops = database_ops(using)
    if ops.hot_statements:
        job = ops.enqueue_task(cleaned)
        if job is None:  # only a unique task's insert can do nothing
            raise StoreConflict("the task's insert wrote nothing.")
        return job
    return create_job(using, cleaned)


def attempt_started(
    owner: str, lease: timedelta, claim_round: uuid.UUID, pk: uuid.UUID
) -> dict[str, Any]:
    """What a task claim writes on the queued task ``pk``: running for ``owner`` under
    a lease, with its token of ``claim_round`` and one more attempt (the claim starts
    one); ``run_after`` is kept."""
    return {
        "status": JobStatus.RUNNING,
        "executor_id": owner,
        "claimed_at": Now(),
        "dispatched_at": None,
        "lease_until": Now() + lease,
        "claim_token": task_claim_token(claim_round, pk),
        "attempts": F("attempts") + 1,
        "updated_at": Now(),
    }


def claim_tasks(
    using: str,
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
    claim_round: uuid.UUID,
) -> list[Job]:
    """Claim up to ``limit`` ready tasks of ``target`` in ``queues`` (``None``: any),
    each with its token of ``claim_round``."""
    ops = database_ops(using)
    if ops.hot_statements:
        return ops.claim_tasks(target, queues, owner, lease, limit, claim_round)
    return _claim_portable(using, target, queues, owner, lease, limit, claim_round)


def complete_and_claim_tasks(
    using: str,
    reports: list[ParsedReport],
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
    claim_round: uuid.UUID,
) -> tuple[list[Settled], list[Job]]:
    """A worker's round where the backend has the one-statement forms: reports that all
    patch the same fields (a round of successes) and the claim in one statement; other
    rounds as the two calls. A report that did not apply is read back afterwards, as
    :func:`~jobstate.stores.database.claims.complete_claimed_batch` reads it."""
    shapes = {tuple(sorted(report[3])) for report in reports}
    if len(shapes) != 1:
        settled = claims.complete_claimed_batch(using, reports) if reports else []
        return settled, claim_tasks(using, target, queues, owner, lease, limit, claim_round)
    (columns,) = shapes
    written, claimed = database_ops(using).complete_and_claim_tasks(
        columns, reports, target, queues, owner, lease, limit, claim_round
    )
    return claims.settled_reports(using, reports, written), claimed


def extend_claim_leases(
    using: str, claims: list[tuple[uuid.UUID, uuid.UUID]], lease: timedelta
) -> list[uuid.UUID]:
    """Renew every claim in one ``UPDATE`` (after a locking read on MariaDB and MySQL);
    the ids renewed. A claim token belongs to one job and is replaced by every claim, so
    matching ids and tokens as two sets matches exactly the pairs given. On SQLite, only
    when some claim was not renewed does a second query find out which.

    A row another transaction holds is passed over (``SKIP LOCKED``), not waited for: a
    task that locks its own job's row in a long transaction would hold up its worker's
    whole loop, and the renewal of every other lease with it. Its claim stays; a later
    renewal renews it."""
    ids = [pk for pk, _token in claims]
    ops = database_ops(using)
    if ops.hot_statements:
        renewed_ids = ops.renew_claims(claims, lease)
        return [pk for pk in ids if pk in renewed_ids]
    rows = job_rows(using).filter(id__in=ids, claim_token__in=[token for _pk, token in claims])
    renew = {"lease_until": Now() + lease, "updated_at": Now()}
    if ops.locks_rows:
        # MariaDB and MySQL: a locking read, then the UPDATE (which may not read its
        # own table on MySQL).
        with transaction.atomic(using=using):
            free = ops.lock_candidates(rows.claimed().order_by())
            picked = set(free.values_list("id", flat=True))
            job_rows(using).filter(id__in=picked).update(**renew)
        return [pk for pk in ids if pk in picked]
    renewed = rows.claimed().update(**renew)
    if renewed == len(claims):
        return ids
    held = set(rows.claimed().values_list("id", flat=True))
    return [pk for pk in ids if pk in held]


def claims_now(using: str, pks: list[uuid.UUID]) -> dict[uuid.UUID, tuple[JobStatus, Any]]:
    """The status and claim token of each job, in one primary-key lookup (a worker asks
    every turn of its loop for the tasks it runs)."""
    rows = job_rows(using).filter(id__in=pks).values_list("id", "status", "claim_token")
    return {pk: (JobStatus(status), token) for pk, status, token in rows}


def list_claimed_tasks(using: str, owner: str) -> list[Job]:
    """The running tasks of the worker ``owner``."""
    rows = job_rows(using).filter(
        status=JobStatus.RUNNING, task_path__isnull=False, executor_id=owner
    )
    return list(rows.order_by("id"))


def list_expired_tasks(using: str, limit: int) -> list[Job]:
    """Running tasks whose lease ended, oldest lease first. The lease index,
    ``(status, lease_until, id)``, serves the order."""
    rows = job_rows(using).filter(
        status=JobStatus.RUNNING, task_path__isnull=False, lease_until__lt=Now()
    )
    return list(rows.order_by("lease_until", "id")[:limit])


# --- elsewhere: one task at a time, in one transaction --------------------------------


def _claim_portable(
    using: str,
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
    claim_round: uuid.UUID,
) -> list[Job]:
    candidates = job_rows(using).due_tasks(target).unpaused()
    if queues is not None:
        candidates = candidates.filter(queue_name__in=queues)
    ordered = candidates.in_task_claim_order()
    if database_ops(using).claims_in_sets:
        return set_claims.claim_tasks(using, ordered, owner, lease, limit, claim_round)
    if database_ops(using).locks_rows:
        # Concurrent workers pass over each other's picks instead of waiting for them
        # and then finding them taken.
        ordered = ordered.select_for_update(skip_locked=True)
    with transaction.atomic(using=using):
        picked = list(ordered.values_list("id", flat=True)[:limit])
        claimed = []
        for pk in picked:
            moved = (
                job_rows(using)
                .filter(id=pk, status=JobStatus.QUEUED)
                .update(**attempt_started(owner, lease, claim_round, pk))
            )
            if moved:
                claimed.append(pk)
        return list(job_rows(using).filter(id__in=claimed)) if claimed else []
