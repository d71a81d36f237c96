"""The PostgreSQL hot-path statements of the database state store.

A claim and a report are the two calls every job makes, so on PostgreSQL each is one
round trip: ``UPDATE ... RETURNING`` around a ``SELECT ... FOR UPDATE SKIP LOCKED``
subquery (a claim), ``UPDATE ... FROM (VALUES ...) RETURNING`` fenced by claim tokens
(reports), or the fenced ``UPDATE`` with its audit entry and outbox rows inserted by
data-modifying ``WITH`` queries (the outbox completion). Raw SQL because the ORM cannot
express any of them in one statement; the portable paths for the other backends live in
:mod:`jobstate.stores.database.claims` and :mod:`jobstate.stores.database.notification_outbox`. The
advisory locks that serialise one thread's claims and enqueues are here too: they have
no ORM form either.

The statements run on one reusable server-binding cursor per connection, which prepares
them (:mod:`jobstate.stores.database.hotcursor`).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any, cast

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from jobstate.core.states import (
    CLAIMED_JOB_STATUSES,
    JobStatus,
    NotificationRequest,
    NotificationState,
)
from jobstate.models import NO_QUEUE, AuditEntry, Job, Notification, QueuePause, time_ordered_uuid
from jobstate.stores.contracts.validation import JOB_CLAIM_FIELDS, ParsedReport
from jobstate.stores.database.hotcursor import hot_cursor, load_jobs

# hot_cursor and load_jobs are defined in .hotcursor; other statement modules (the task
# claims) import them from here too.
__all__ = [
    "FinishedEntry",
    "claim_one",
    "claim_statement",
    "claim_unthreaded",
    "column_name",
    "complete_group",
    "complete_statement",
    "finish_statement",
    "finish_with_notifications",
    "hot_cursor",
    "load_jobs",
    "lock_thread",
    "paused_sql",
    "try_lock_thread",
]

#: A ``finished`` audit entry's completed stage, severity, title, summary, and detail as
#: JSON text: the parameters :func:`finish_with_notifications` inserts it with.
FinishedEntry = tuple[str, str, str, str, str]

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


#: A candidate ``c`` whose queue is paused, in SQL (``JobQuerySet.unpaused`` on the
#: portable path). The pause table holds a row per paused queue, usually none: the
#: probe is one lookup in its unique index per candidate the claim looks at, and a
#: claim that starts after a pause committed sees it (READ COMMITTED takes each
#: statement's snapshot when the statement starts).
_PAUSED_SQL = """
    SELECT 1 FROM {pauses} AS p
    WHERE p.target = c.target AND p.queue_name = COALESCE(c.queue_name, '{no_queue}')
"""


def paused_sql(connection: BaseDatabaseWrapper) -> str:
    """The ``NOT EXISTS`` operand that passes over a candidate ``c`` of a paused queue."""
    pauses = connection.ops.quote_name(QueuePause._meta.db_table)
    return _PAUSED_SQL.format(pauses=pauses, no_queue=NO_QUEUE)


# --- the statements, run -------------------------------------------------------------


def claim_one(
    using: str, scope: list[str], owner: str, lease: timedelta, status: JobStatus
) -> tuple[bool, Job | None]:
    """The PostgreSQL claim in one round trip: pick the oldest claimable job (``FOR
    UPDATE SKIP LOCKED``) and, when it has no thread, move it in the same statement.

    Returns ``(picked, job)``: ``(False, None)`` when nothing is claimable, ``(True,
    None)`` when the oldest candidate has a thread and needs the gated path. Without a
    transaction around it the row lock lasts one statement.
    """
    connection = connections[using]
    sql = claim_statement(connection, len(scope), status)
    params: list[Any] = [*scope, status.value, owner, lease, uuid.uuid4()]
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False, None
    if row[1] is None:
        return True, None
    return True, load_jobs(connection, using, [row[1:]])[0]


def claim_unthreaded(
    using: str, scope: list[str], owner: str, lease: timedelta, limit: int
) -> list[Job]:
    """Claim up to ``limit`` ready jobs without a thread in one PostgreSQL statement,
    each with its own ``gen_random_uuid()`` claim token."""
    connection = connections[using]
    table = connection.ops.quote_name(Job._meta.db_table)
    placeholders = ", ".join(["%s"] * len(scope))
    sql = f"""
        WITH picked AS (
            SELECT c.id FROM {table} AS c
            WHERE c.status = 'queued'
              AND (c.run_after IS NULL OR c.run_after <= statement_timestamp())
              AND c.target IN ({placeholders})
              AND c.thread_id IS NULL
              AND NOT EXISTS ({paused_sql(connection)})
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
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return load_jobs(connection, using, rows)


def complete_group(
    using: str, columns: tuple[str, ...], group: Sequence[ParsedReport]
) -> dict[uuid.UUID, Job]:
    """Apply reports that patch the same ``columns`` in one fenced statement; return the
    jobs it wrote, by id."""
    connection = connections[using]
    sql, fields = complete_statement(connection, columns, len(group))
    params: list[Any] = []
    for pk, token, status, cleaned in group:
        params.extend((pk, token, status.value))
        params.extend(field.get_db_prep_save(cleaned[field.name], connection) for field in fields)
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    return {job.id: job for job in load_jobs(connection, using, fetched)}


def lock_thread(using: str, thread_id: int) -> None:
    """Take a transaction-scoped lock on one thread, waiting for it (PostgreSQL only).

    The key is hashed from a namespaced string so it does not collide with a host's own
    integer keys; a hash collision between two threads only makes them wait for each
    other briefly.
    """
    if connections[using].vendor == "postgresql":
        with connections[using].cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_thread_lock_key(thread_id)])


def try_lock_thread(using: str, thread_id: int) -> bool:
    """Like :func:`lock_thread` but never waits: ``False`` when another transaction
    holds the thread. A claim uses this because it already holds a candidate's row
    lock; waiting here while another claimer waits for that row would deadlock."""
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_thread_lock_key(thread_id)])
        row = cursor.fetchone()
    return bool(row and row[0])


def _thread_lock_key(thread_id: int) -> int:
    """The advisory-lock key of a thread: a 64-bit hash of a namespaced name."""
    digest = hashlib.blake2b(f"jobstate.job.thread:{thread_id}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


# --- statement text, built once per shape -------------------------------------------

#: ``_returning_columns`` by (database vendor, table alias): the text never changes.
_RETURNING: dict[tuple[str, str], str] = {}


#: The hot statements' text, built once per shape: (vendor, kind, shape) -> SQL (and the
#: patched fields of a completion).
_STATEMENTS: dict[tuple[Any, ...], Any] = {}


def claim_statement(connection: BaseDatabaseWrapper, targets: int, status: JobStatus) -> str:
    """The one-statement claim of :func:`claim_one` for ``targets`` target
    placeholders."""
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
                  AND NOT EXISTS ({paused_sql(connection)})
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


def complete_statement(
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
            f"{quote(column_name(field))} = v.v{index + 3}, "
            for index, field in enumerate(patched_fields)
        )
        cleared = ", ".join(
            f"{quote(column_name(_job_field(name)))} = NULL" for name in JOB_CLAIM_FIELDS
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
    order :func:`load_jobs` expects)."""
    key = (connection.vendor, alias)
    text = _RETURNING.get(key)
    if text is None:
        quote = connection.ops.quote_name
        text = ", ".join(
            f"{alias}.{quote(column_name(field))}" for field in Job._meta.concrete_fields
        )
        _RETURNING[key] = text
    return text


def column_name(field: Field[Any, Any]) -> str:
    """The column of a concrete field (its ``column``, typed optional by the stubs)."""
    return field.column or field.attname


def _job_field(name: str) -> Field[Any, Any]:
    field = Job._meta.get_field(name)
    if not isinstance(field, Field):
        raise TypeError(f"Job.{name} is not a concrete field.")
    return field


# --- the outbox completion ------------------------------------------------------------


def finish_with_notifications(
    using: str,
    original: Job,
    cleaned: dict[str, Any],
    entry: FinishedEntry,
    requests: Sequence[NotificationRequest],
) -> Job | None:
    """``complete_job_with_notifications`` on PostgreSQL in one statement: the fenced
    terminal ``UPDATE ... RETURNING`` of the job, its ``finished`` audit entry (the
    completed fields ``entry``) and one outbox row per request, inserted from what the
    ``UPDATE`` returned. Returns the job as written, or ``None`` when the fence failed,
    in which case nothing was inserted either.

    One statement is atomic on its own: in autocommit it commits or fails whole, and
    inside the caller's transaction it joins it. A key already in the outbox fails the
    whole statement with the unique violation the caller turns into
    ``DuplicateNotification``."""
    connection = connections[using]
    columns = tuple(sorted(cleaned))
    tokened = original.claim_token is not None
    sql, fields = finish_statement(connection, columns, tokened, len(requests))
    params: list[Any] = [
        field.get_db_prep_save(cleaned[field.name], connection) for field in fields
    ]
    params += [original.id, original.status]
    if tokened:
        params.append(original.claim_token)
    params += entry
    payload = _payload_field()
    for request in requests:
        params += [
            time_ordered_uuid(),
            request.channel,
            request.destination,
            payload.get_db_prep_save(request.payload, connection),
            request.idempotency_key,
        ]
    with hot_cursor(connection) as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    return None if row is None else load_jobs(connection, using, [row])[0]


def finish_statement(
    connection: BaseDatabaseWrapper, columns: tuple[str, ...], tokened: bool, notifications: int
) -> tuple[str, list[Field[Any, Any]]]:
    """The statement of :func:`finish_with_notifications` for a patch of ``columns``,
    an original with (``tokened``) or without a claim token, and ``notifications``
    outbox rows. Data-modifying ``WITH`` queries all run, once, on the same snapshot;
    the inserts select from the ``UPDATE``'s ``RETURNING`` rows, so they write nothing
    when it wrote nothing. The entry's ``ts`` and the rows' due and creation times are
    the tables' database defaults (the database clock), as the ORM leaves them.

    Its parameters: the patched fields in order, the job id, the original status, its
    claim token (when ``tokened``), the entry's stage, severity, title, summary and
    detail, then per notification its id, channel, destination, payload and key."""
    key = (connection.vendor, "finish", columns, tokened, notifications)
    cached = _STATEMENTS.get(key)
    if cached is None:
        quote = connection.ops.quote_name
        table = quote(Job._meta.db_table)
        fields = [_job_field(name) for name in columns]
        patched = "".join(
            f"{quote(column_name(field))} = CAST(%s AS {field.db_type(connection)}), "
            for field in fields
        )
        cleared = ", ".join(
            f"{quote(column_name(_job_field(name)))} = NULL" for name in JOB_CLAIM_FIELDS
        )
        token = "j.claim_token = %s" if tokened else "j.claim_token IS NULL"
        entries = quote(AuditEntry._meta.db_table)
        outbox = ""
        if notifications:
            rows = quote(Notification._meta.db_table)
            row = "(CAST(%s AS uuid), %s, %s, CAST(%s AS jsonb), %s)"
            outbox = f""",
            outbox AS (
                INSERT INTO {rows}
                    (id, job_id, channel, destination, payload, idempotency_key, state, attempts)
                SELECT v.id, moved.id, v.channel, v.destination, v.payload, v.idempotency_key,
                       '{NotificationState.PENDING.value}', 0
                FROM moved, (VALUES {", ".join([row] * notifications)})
                    AS v(id, channel, destination, payload, idempotency_key)
            )"""
        sql = f"""
            WITH moved AS (
                UPDATE {table} AS j
                SET {patched}{cleared}, updated_at = statement_timestamp()
                WHERE j.id = %s AND j.status = %s AND {token}
                RETURNING {_returning_columns(connection, "j")}
            ),
            finished AS (
                INSERT INTO {entries}
                    (job_id, request_id, event, stage, severity, title, summary, detail)
                SELECT moved.id, moved.request_id, 'finished', %s, %s, %s, %s, CAST(%s AS jsonb)
                FROM moved
            ){outbox}
            SELECT * FROM moved
        """
        cached = _STATEMENTS[key] = (sql, fields)
    return cast("tuple[str, list[Field[Any, Any]]]", cached)


@functools.cache
def _payload_field() -> Field[Any, Any]:
    """The notification's ``payload`` field, whose ``get_db_prep_save`` adapts a value as
    the ORM would."""
    payload = Notification._meta.get_field("payload")
    if not isinstance(payload, Field):
        raise TypeError("Notification.payload is a concrete field.")
    return payload
