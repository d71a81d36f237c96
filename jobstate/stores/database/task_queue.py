"""django.tasks on the Django ORM: enqueueing a task (with ``NOTIFY`` on PostgreSQL),
claiming tasks in priority order, renewing a worker's leases and listing the tasks whose
lease ran out.

On PostgreSQL a claim is one statement: ``UPDATE ... FROM (SELECT ... ORDER BY ... LIMIT
n FOR UPDATE SKIP LOCKED) RETURNING``, reading the partial index
``jobstate_job_task_claim_idx`` (target, queue, then claim order) in claim order. A worker
of several queues reads each queue's part of the index in order (a ``LATERAL`` subquery
per queue, each locking at most ``n`` rows) and keeps the first ``n`` overall; a worker
of any queue first finds the queues that hold tasks by skipping through the index. No
claim sorts a backlog. Raw SQL
because the ORM has no ``UPDATE ... FROM ... RETURNING``; elsewhere the portable path
picks and moves the tasks one by one inside one transaction, which SQLite's
``IMMEDIATE`` transactions serialise.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import F
from django.db.models.functions import Now

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import TASK_NOTIFY_CHANNEL, JobStatus, task_notify_payload
from jobstate.models import TASK_DUE, Job, QueuePause
from jobstate.stores.database.hotpath import column_name, hot_cursor, load_jobs
from jobstate.stores.database.intake import create_job
from jobstate.stores.database.tables import is_postgresql, job_rows, locks_rows

#: The statements' text: the enqueue, and a claim by queue filter (``"any"``, ``"one"``
#: or ``"several"``).
_STATEMENTS: dict[str, str] = {}

__all__ = [
    "claim_statement",
    "claim_tasks",
    "enqueue_task",
    "extend_claim_leases",
    "list_expired_tasks",
]


def enqueue_task(using: str, cleaned: dict[str, Any]) -> Job:
    """Insert a task's job and, on PostgreSQL with ``JOBSTATE['LISTEN_NOTIFY']``, send
    ``NOTIFY`` on :data:`~jobstate.core.states.TASK_NOTIFY_CHANNEL` in the same transaction:
    PostgreSQL delivers it when the caller's transaction commits (never if it rolls
    back), and folds identical notifications of one transaction into one, so enqueueing
    many tasks of one queue in a transaction wakes the workers once.

    On PostgreSQL the insert and the notification are one statement (``enqueue`` runs in
    web requests, where every round trip shows); elsewhere the ORM inserts. A task's
    request id is fresh (``task-<uuid4>``), so no duplicate needs answering here."""
    if not is_postgresql(using):
        return create_job(using, cleaned)
    connection = connections[using]
    job = Job(**cleaned)  # the model's defaults: a time-ordered id, queued, no attempts
    fields = [field for field in Job._meta.concrete_fields if field.name not in _DATABASE_STAMPED]
    sql = _STATEMENTS.get("enqueue")
    if sql is None:
        quote = connection.ops.quote_name
        table = quote(Job._meta.db_table)
        columns = ", ".join(quote(column_name(field)) for field in fields)
        values = ", ".join(["%s"] * len(fields))
        returning = ", ".join(
            f"inserted.{quote(column_name(field))}" for field in Job._meta.concrete_fields
        )
        sql = _STATEMENTS["enqueue"] = f"""
            WITH inserted AS (
                INSERT INTO {table} ({columns}) VALUES ({values}) RETURNING *
            )
            SELECT {returning}, CASE WHEN %s THEN pg_notify(%s, %s) END FROM inserted
        """
    params: list[Any] = [
        field.get_db_prep_save(getattr(job, field.attname), connection) for field in fields
    ]
    payload = task_notify_payload(job.target or "", job.queue_name or "")
    params += [jobstate_settings.LISTEN_NOTIFY, TASK_NOTIFY_CHANNEL, payload]
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return load_jobs(connection, using, [row[:-1]])[0]


#: The columns the database stamps when a row is inserted (``db_default=Now()``).
_DATABASE_STAMPED = frozenset({"created_at", "updated_at"})


def claim_tasks(
    using: str,
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
) -> list[Job]:
    """Claim up to ``limit`` ready tasks of ``target`` in ``queues`` (``None``: any)."""
    if is_postgresql(using):
        return _claim_postgresql(using, target, queues, owner, lease, limit)
    return _claim_portable(using, target, queues, owner, lease, limit)


def extend_claim_leases(
    using: str, claims: list[tuple[uuid.UUID, uuid.UUID]], lease: timedelta
) -> list[uuid.UUID]:
    """Renew every claim in one ``UPDATE``; the ids renewed. A claim token belongs to one
    job and is replaced by every claim, so matching ids and tokens as two sets matches
    exactly the pairs given. Only when some claim was not renewed does a second query
    find out which."""
    ids = [pk for pk, _token in claims]
    rows = job_rows(using).filter(id__in=ids, claim_token__in=[token for _pk, token in claims])
    renewed = rows.claimed().update(lease_until=Now() + lease, updated_at=Now())
    if renewed == len(claims):
        return ids
    held = set(rows.claimed().values_list("id", flat=True))
    return [pk for pk in ids if pk in held]


def list_expired_tasks(using: str, limit: int) -> list[Job]:
    """Running tasks whose lease ended, oldest lease first. The lease index,
    ``(status, lease_until, id)``, serves the order."""
    rows = job_rows(using).filter(
        status=JobStatus.RUNNING, task_path__isnull=False, lease_until__lt=Now()
    )
    return list(rows.order_by("lease_until", "id")[:limit])


# --- PostgreSQL: one statement ---------------------------------------------------------

#: A queued task of the target that is due, written exactly as the claim index states
#: its condition and its due column, so the planner reads the index in claim order.
_READY = """
    c.status = 'queued' AND c.task_path IS NOT NULL AND c.target = %s
    AND COALESCE(c.run_after, c.created_at) <= statement_timestamp()
"""

_PICK_COLUMNS = "c.id, c.priority, COALESCE(c.run_after, c.created_at) AS due, c.created_at"

_INDEX_ORDER = "c.priority DESC, COALESCE(c.run_after, c.created_at), c.created_at, c.id"


def _claim_postgresql(
    using: str,
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
) -> list[Job]:
    connection = connections[using]
    sql, params = claim_statement(connection, target, queues, owner, lease, limit)
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return load_jobs(connection, using, rows)


def claim_statement(
    connection: Any,
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
) -> tuple[str, list[Any]]:
    """The PostgreSQL claim statement and its parameters. Its text depends only on
    whether ``queues`` is ``None``, one queue or several, so the database can keep one
    plan per kind of worker."""
    shape = "any" if queues is None else "one" if len(queues) == 1 else "several"
    sql = _STATEMENTS.get(shape)
    if sql is None:
        sql = _STATEMENTS[shape] = _claim_statement(connection, shape)
    params: list[Any]
    if shape == "one":
        params = [target, *(queues or []), target, *(queues or []), limit]
    elif shape == "several":
        params = [queues, target, target, limit, limit]
    else:
        params = [target, target, target, target, limit, limit]
    return sql, [*params, JobStatus.RUNNING.value, owner, lease]


def _claim_statement(connection: Any, shape: str) -> str:
    table = connection.ops.quote_name(Job._meta.db_table)
    pauses = connection.ops.quote_name(QueuePause._meta.db_table)
    queues = ""
    # A paused queue is left out before its part of the claim index is read: one probe
    # of the pause table's unique key per queue, not per task.
    if shape == "one":
        picked = f"""
            SELECT c.id FROM {table} AS c
            WHERE {_READY} AND c.queue_name = %s
              AND NOT EXISTS (SELECT 1 FROM {pauses} AS p
                              WHERE p.target = %s AND p.queue_name = %s)
            ORDER BY {_INDEX_ORDER}
            LIMIT %s
            FOR UPDATE OF c SKIP LOCKED
        """
    else:
        if shape == "several":
            names = f"""
                SELECT name FROM unnest(%s::text[]) AS given(name)
                WHERE NOT EXISTS (SELECT 1 FROM {pauses} AS p
                                  WHERE p.target = %s AND p.queue_name = given.name)
            """
        else:
            # Every queue that holds a waiting task of the target, found by skipping
            # through the claim index one queue name at a time (a handful of probes,
            # however long each queue is).
            waiting = "c.status = 'queued' AND c.task_path IS NOT NULL AND c.target = %s"
            queues = f"""
                RECURSIVE waiting(name) AS (
                    (SELECT c.queue_name FROM {table} AS c WHERE {waiting}
                     ORDER BY c.queue_name LIMIT 1)
                    UNION ALL
                    SELECT (SELECT c.queue_name FROM {table} AS c
                            WHERE {waiting} AND c.queue_name > waiting.name
                            ORDER BY c.queue_name LIMIT 1)
                    FROM waiting WHERE waiting.name IS NOT NULL
                ),
            """
            names = f"""
                SELECT name FROM waiting
                WHERE name IS NOT NULL
                  AND NOT EXISTS (SELECT 1 FROM {pauses} AS p
                                  WHERE p.target = %s AND p.queue_name = waiting.name)
            """
        # One ordered read of the index per queue, each locking at most LIMIT rows;
        # the first LIMIT of all of them are claimed, the others unlocked at the end of
        # the statement.
        picked = f"""
            SELECT p.id FROM ({names}) AS q,
            LATERAL (
                SELECT {_PICK_COLUMNS} FROM {table} AS c
                WHERE {_READY} AND c.queue_name = q.name
                ORDER BY {_INDEX_ORDER}
                LIMIT %s
                FOR UPDATE OF c SKIP LOCKED
            ) AS p
            ORDER BY p.priority DESC, p.due, p.created_at, p.id
            LIMIT %s
        """
    returning = ", ".join(
        f"j.{connection.ops.quote_name(column_name(field))}" for field in Job._meta.concrete_fields
    )
    # The claim starts an attempt: ``attempts`` counts the attempts that started.
    return f"""
        WITH {queues} picked AS ({picked})
        UPDATE {table} AS j
        SET status = %s, executor_id = %s, claimed_at = statement_timestamp(),
            dispatched_at = NULL, lease_until = statement_timestamp() + %s,
            claim_token = gen_random_uuid(), attempts = j.attempts + 1,
            updated_at = statement_timestamp()
        FROM picked
        WHERE j.id = picked.id AND j.status = 'queued'
        RETURNING {returning}
    """


# --- elsewhere: one task at a time, in one transaction --------------------------------


def _claim_portable(
    using: str,
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
) -> list[Job]:
    candidates = (
        job_rows(using)
        .filter(status=JobStatus.QUEUED, task_path__isnull=False, target=target)
        .unpaused()
    )
    if queues is not None:
        candidates = candidates.filter(queue_name__in=queues)
    candidates = candidates.alias(due=TASK_DUE).filter(due__lte=Now())
    ordered = candidates.order_by(F("priority").desc(), "due", "created_at", "id")
    if locks_rows(using):
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
                .update(
                    status=JobStatus.RUNNING,
                    executor_id=owner,
                    claimed_at=Now(),
                    dispatched_at=None,
                    lease_until=Now() + lease,
                    claim_token=uuid.uuid4(),
                    attempts=F("attempts") + 1,
                    updated_at=Now(),
                )
            )
            if moved:
                claimed.append(pk)
        return list(job_rows(using).filter(id__in=claimed)) if claimed else []
