"""The PostgreSQL hot-path statements of the database state store.

A claim and a report are the two calls every job makes, so on PostgreSQL each is one
round trip: ``UPDATE ... RETURNING`` around a ``SELECT ... FOR UPDATE SKIP LOCKED``
subquery (a claim), or ``UPDATE ... FROM (VALUES ...) RETURNING`` fenced by claim tokens
(reports). Raw SQL because the ORM cannot express either in one statement; the portable
paths for the other backends live in :mod:`jobstate.stores.database.claims`. The
advisory locks that serialise one thread's claims and enqueues are here too: they have
no ORM form either.

The statements run on one reusable server-binding cursor per connection
(:func:`hot_cursor`), and their rows become ``Job`` instances through the same converters
a queryset applies (:func:`load_jobs`).
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

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from jobstate.models import Job
from jobstate.states import CLAIMED_JOB_STATUSES, JobStatus
from jobstate.stores.state_validation import ParsedReport
from jobstate.stores.validation import JOB_CLAIM_FIELDS

__all__ = [
    "claim_one",
    "claim_statement",
    "claim_unthreaded",
    "complete_group",
    "complete_statement",
    "hot_cursor",
    "load_jobs",
    "lock_thread",
    "try_lock_thread",
]

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


# --- the reusable cursor --------------------------------------------------------------


@contextmanager
def hot_cursor(connection: BaseDatabaseWrapper) -> Iterator[Any]:
    """A cursor for the hot-path statements: on psycopg 3 one that binds parameters on
    the server, so the statement text is constant and PostgreSQL can reuse its plan
    when the host enables prepared statements (``OPTIONS["prepare_threshold"]``, off
    by default because of transaction-mode poolers). It goes through Django's cursor
    wrapper, so query logging and execute wrappers still see the statement.

    One such cursor is kept per connection, with psycopg's compiled ``timestamptz``
    loader instead of the Python one Django installs (the claim and the report each
    return several timestamps); :func:`load_jobs` then applies Django's time zone
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


#: Per connection: its reusable hot-path cursor (see :func:`hot_cursor`).
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


# --- statement text, built once per shape -------------------------------------------

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
    order :func:`load_jobs` expects)."""
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


# --- rows into jobs -------------------------------------------------------------------


def load_jobs(
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
