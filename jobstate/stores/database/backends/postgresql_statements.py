"""The text of PostgreSQL's one-statement hot path, built once per shape.

A claim and a report are the two calls every job makes, so on PostgreSQL each is one
round trip: ``UPDATE ... RETURNING`` around a ``SELECT ... FOR UPDATE SKIP LOCKED``
subquery (a claim), ``UPDATE ... FROM (VALUES ...) RETURNING`` fenced by claim tokens
(reports), the fenced ``UPDATE`` with its audit entry and outbox rows inserted by
data-modifying ``WITH`` queries (the outbox completion), or a task worker's reports and
its next claim as two data-modifying ``WITH`` queries of one statement. Raw SQL because
the ORM cannot express any of them in one statement. The rules they share with the
portable paths (the claim's ``WHERE`` and order, the per-thread gate, the paused-queue
probe, the task claim's due order) are written beside their ORM twins in
:mod:`jobstate.models.jobs`.

The text of a statement depends only on its shape (how many targets, which columns a
report patches, and for a task claim how many tasks it takes), so each is built once and
the database can keep one plan per shape.
"""

from __future__ import annotations

from typing import Any, cast

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from jobstate.core.states import CLAIMED_JOB_STATUSES, JobStatus, NotificationState
from jobstate.models import AuditEntry, Job, Notification, QueuePause
from jobstate.models.claim_sql import (
    CLAIM_ORDER_SQL,
    READY_SQL,
    TASK_CLAIM_ORDER_SQL,
    TASK_DUE_SQL,
    TASK_READY_SQL,
    THREAD_BLOCKERS_SQL,
    UNPAUSED_SQL,
)
from jobstate.stores.contracts.validation import JOB_CLAIM_FIELDS
from jobstate.stores.database.backends.portable import rule_sql
from jobstate.stores.database.backends.shapes import kept

__all__ = [
    "claim_statement",
    "claim_unthreaded_statement",
    "complete_and_claim_statement",
    "complete_statement",
    "enqueue_task_statement",
    "finish_statement",
    "renew_statement",
    "task_claim_statement",
]

#: The database clock, as ``Now()`` compiles on PostgreSQL.
NOW_SQL = "statement_timestamp()"

#: The hot statements' text, built once per shape: (kind, shape) -> SQL (and the patched
#: fields of a completion). Shapes count what a caller gives (targets, reports,
#: notifications), so the cache is bounded (see :mod:`.shapes`).
_STATEMENTS: dict[tuple[Any, ...], Any] = {}

#: The task claims' and workers' rounds' text, whose shapes include the claim's limit: a
#: worker of concurrency N uses up to N limits and N report counts (see :mod:`.shapes`).
_ROUNDS: dict[tuple[Any, ...], Any] = {}


def rule(connection: BaseDatabaseWrapper, text: str) -> str:
    """A rule's SQL text of :mod:`jobstate.models.jobs` with PostgreSQL's tables and
    clock filled in."""
    return rule_sql(connection, text, NOW_SQL)


# Every claim's ``UPDATE`` finds the rows its ``picked`` query locked by id alone. The
# pick read them ``FOR UPDATE`` in this statement, and a row lock is taken only after
# the pick's ``WHERE`` is checked again on the row's newest version, so each is queued
# and stays so until the claim ends. A status condition beside the id would add no
# guard, but it would let the planner read the row through a partial index of queued
# jobs: statistics taken while nothing was queued make that index look empty, cheaper
# than one probe of the key, and every claim then read every queued job.


def _candidates(connection: BaseDatabaseWrapper, targets: int) -> str:
    """The claim's ``WHERE`` for a candidate ``c`` of ``targets`` targets in an unpaused
    queue (the per-thread gate aside)."""
    placeholders = ", ".join(["%s"] * targets)
    return (
        f"{rule(connection, READY_SQL)} AND c.target IN ({placeholders})"
        f" AND {rule(connection, UNPAUSED_SQL)}"
    )


def claim_statement(connection: BaseDatabaseWrapper, targets: int, status: JobStatus) -> str:
    """The one-statement claim for ``targets`` target placeholders: pick the oldest
    claimable job and, when it has no thread, move it to ``status``. Its parameters: the
    targets, the status, the owner, the lease, the claim token."""
    key = ("claim", targets, status)
    return cast(str, kept(_STATEMENTS, key, _claim_statement, connection, targets, status))


def _claim_statement(connection: BaseDatabaseWrapper, targets: int, status: JobStatus) -> str:
    table = connection.ops.quote_name(Job._meta.db_table)
    dispatched = NOW_SQL if status == JobStatus.DISPATCHED else "NULL"
    return f"""
            WITH picked AS (
                SELECT c.id, c.thread_id FROM {table} AS c
                WHERE {_candidates(connection, targets)}
                  AND (c.thread_id IS NULL
                       OR NOT EXISTS ({rule(connection, THREAD_BLOCKERS_SQL)}))
                ORDER BY {CLAIM_ORDER_SQL}
                LIMIT 1
                FOR UPDATE OF c SKIP LOCKED
            ), moved AS (
                UPDATE {table} AS j
                SET status = %s, executor_id = %s, claimed_at = {NOW_SQL},
                    dispatched_at = {dispatched}, lease_until = {NOW_SQL} + %s,
                    claim_token = %s, run_after = NULL, updated_at = {NOW_SQL}
                FROM picked
                WHERE j.id = picked.id AND picked.thread_id IS NULL
                RETURNING {returning_columns(connection, "j")}
            )
            SELECT picked.id, moved.* FROM picked LEFT JOIN moved ON moved.id = picked.id
        """


def claim_unthreaded_statement(connection: BaseDatabaseWrapper, targets: int) -> str:
    """The batch claim of the ready jobs without a thread, each with its own
    ``gen_random_uuid()`` claim token. Its parameters: the targets, the limit, the
    status, the owner, the lease."""
    key = ("claim_unthreaded", targets)
    return cast(str, kept(_STATEMENTS, key, _claim_unthreaded_statement, connection, targets))


def _claim_unthreaded_statement(connection: BaseDatabaseWrapper, targets: int) -> str:
    table = connection.ops.quote_name(Job._meta.db_table)
    return f"""
            WITH picked AS (
                SELECT c.id FROM {table} AS c
                WHERE {_candidates(connection, targets)} AND c.thread_id IS NULL
                ORDER BY {CLAIM_ORDER_SQL}
                LIMIT %s
                FOR UPDATE OF c SKIP LOCKED
            )
            UPDATE {table} AS j
            SET status = %s, executor_id = %s, claimed_at = {NOW_SQL},
                dispatched_at = NULL, lease_until = {NOW_SQL} + %s,
                claim_token = gen_random_uuid(), run_after = NULL,
                updated_at = {NOW_SQL}
            FROM picked
            WHERE j.id = picked.id
            RETURNING {returning_columns(connection, "j")}
        """


def complete_statement(
    connection: BaseDatabaseWrapper, columns: tuple[str, ...], reports: int
) -> tuple[str, list[Field[Any, Any]]]:
    """The fenced completion of ``reports`` reports that patch ``columns``: one
    ``UPDATE ... FROM (VALUES ...)``, each row matched by id and claim token. Its
    parameters per report: id, token, status, then the fields returned, in order."""
    key = ("complete", columns, reports)
    cached = kept(_STATEMENTS, key, _report_update, connection, columns, reports)
    return cast("tuple[str, list[Field[Any, Any]]]", cached)


def complete_and_claim_statement(
    connection: BaseDatabaseWrapper,
    columns: tuple[str, ...],
    reports: int,
    shape: str,
    limit: int,
) -> tuple[str, list[Field[Any, Any]]]:
    """A worker's round in one statement: the fenced completion of ``reports`` reports
    that patch ``columns`` (as :func:`complete_statement`) and the task claim of
    ``shape`` for ``limit`` tasks (as :func:`task_claim_statement`), each a
    data-modifying ``WITH`` query.
    Each returned row starts with ``true`` for a job a report wrote, ``false`` for a
    task claimed. Its parameters: the completion's, then the claim's.

    Both queries read the same snapshot, taken before either writes: a task a report
    releases is not claimed by the same statement, and a reported task is ``running``
    in that snapshot, so the claim never picks it (no row is written twice). The
    completion's rows are read first, so its row locks (it waits for one an operator's
    transaction holds) are taken before the claim locks anything, and a worker never
    waits holding a task it just claimed."""
    key = ("complete_and_claim", columns, reports, shape, limit)
    text = kept(_ROUNDS, key, _round_statement, connection, columns, reports, shape, limit)
    return cast("tuple[str, list[Field[Any, Any]]]", text)


def _round_statement(
    connection: BaseDatabaseWrapper,
    columns: tuple[str, ...],
    reports: int,
    shape: str,
    limit: int,
) -> tuple[str, list[Field[Any, Any]]]:
    report, fields = _report_update(connection, columns, reports)
    waiting, picked, claim = _task_claim_parts(connection, shape, limit)
    recursive = "RECURSIVE " if waiting else ""
    sql = f"""
        WITH {recursive}reported AS ({report}),
        {waiting} picked AS ({picked}),
        claimed AS ({claim})
        SELECT true, reported.* FROM reported
        UNION ALL
        SELECT false, claimed.* FROM claimed
    """
    return sql, fields


def _report_update(
    connection: BaseDatabaseWrapper, columns: tuple[str, ...], reports: int
) -> tuple[str, list[Field[Any, Any]]]:
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    fields = [job_field(name) for name in ("id", "claim_token", "status", *columns)]
    patched_fields = fields[3:]
    casts = ", ".join(f"CAST(%s AS {field.db_type(connection)})" for field in fields)
    values = ", ".join([f"({casts})"] * reports)
    aliases = ", ".join(f"v{index}" for index in range(len(fields)))
    patched = "".join(
        f"{quote(column(field))} = v.v{index + 3}, " for index, field in enumerate(patched_fields)
    )
    statuses = ", ".join(f"'{status.value}'" for status in sorted(CLAIMED_JOB_STATUSES))
    # The fence's status test is on ``j.status || ''``, an expression no index holds:
    # the rows are found by id alone. Statistics taken while nothing was claimed make an
    # index that leads with the status look empty, and a report of several jobs then
    # read every claimed job through it (see the note above _candidates).
    sql = f"""
        UPDATE {table} AS j
        SET {patched}status = v.v2, {_cleared_claim(connection)}, updated_at = {NOW_SQL}
        FROM (VALUES {values}) AS v({aliases})
        WHERE j.id = v.v0 AND j.claim_token = v.v1 AND j.status || '' IN ({statuses})
        RETURNING {returning_columns(connection, "j")}
    """
    return sql, patched_fields


def finish_statement(
    connection: BaseDatabaseWrapper, columns: tuple[str, ...], tokened: bool, notifications: int
) -> tuple[str, list[Field[Any, Any]]]:
    """The outbox completion for a patch of ``columns``, an original with (``tokened``)
    or without a claim token, and ``notifications`` outbox rows. Data-modifying ``WITH``
    queries all run, once, on the same snapshot; the inserts select from the
    ``UPDATE``'s ``RETURNING`` rows, so they write nothing when it wrote nothing. The
    entry's ``ts`` and the rows' due and creation times are the tables' database
    defaults (the database clock), as the ORM leaves them.

    Its parameters: the patched fields in order, the job id, the original status, its
    claim token (when ``tokened``), the entry's stage, severity, title, summary and
    detail, then per notification its id, channel, destination, payload and key."""
    key = ("finish", columns, tokened, notifications)
    cached = kept(_STATEMENTS, key, _finish_statement, connection, columns, tokened, notifications)
    return cast("tuple[str, list[Field[Any, Any]]]", cached)


def _finish_statement(
    connection: BaseDatabaseWrapper, columns: tuple[str, ...], tokened: bool, notifications: int
) -> tuple[str, list[Field[Any, Any]]]:
    quote = connection.ops.quote_name
    table = quote(Job._meta.db_table)
    fields = [job_field(name) for name in columns]
    patched = "".join(
        f"{quote(column(field))} = CAST(%s AS {field.db_type(connection)}), " for field in fields
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
            SET {patched}{_cleared_claim(connection)}, updated_at = {NOW_SQL}
            WHERE j.id = %s AND j.status = %s AND {token}
            RETURNING {returning_columns(connection, "j")}
        ),
        finished AS (
            INSERT INTO {entries}
                (job_id, request_id, event, stage, severity, title, summary, detail)
            SELECT moved.id, moved.request_id, 'finished', %s, %s, %s, %s, CAST(%s AS jsonb)
            FROM moved
        ){outbox}
        SELECT * FROM moved
    """
    return sql, fields


#: The columns the database stamps when a row is inserted (``db_default=Now()``).
DATABASE_STAMPED = frozenset({"created_at", "updated_at"})


def enqueue_task_statement(connection: BaseDatabaseWrapper, *, unique: bool = False) -> str:
    """The task enqueue: the insert of every column but :data:`DATABASE_STAMPED`, and
    ``pg_notify`` in the same statement when its first parameter after the values is
    true. Returns the row and the notification's (empty) result. A ``unique`` task's
    insert does nothing when a job holds its key (``ON CONFLICT DO NOTHING``, which waits
    for an uncommitted holder's transaction to end): then no row, and no notification."""
    sql = _STATEMENTS.get(("enqueue", unique))
    if sql is None:
        quote = connection.ops.quote_name
        table = quote(Job._meta.db_table)
        fields = inserted_fields()
        columns = ", ".join(quote(column(field)) for field in fields)
        values = ", ".join(["%s"] * len(fields))
        conflict = "ON CONFLICT DO NOTHING" if unique else ""
        sql = _STATEMENTS["enqueue", unique] = f"""
            WITH inserted AS (
                INSERT INTO {table} ({columns}) VALUES ({values}) {conflict} RETURNING *
            )
            SELECT {returning_columns(connection, "inserted")},
                   CASE WHEN %s THEN pg_notify(%s, %s) END
            FROM inserted
        """
    return sql


def inserted_fields() -> list[Field[Any, Any]]:
    """The fields an enqueue gives values for, in model order."""
    return [field for field in Job._meta.concrete_fields if field.name not in DATABASE_STAMPED]


def task_claim_statement(connection: BaseDatabaseWrapper, shape: str, limit: int) -> str:
    """The task claim of at most ``limit`` tasks for a worker of any queue (``shape``
    ``"any"``), one queue (``"one"``) or several (``"several"``).

    ``limit`` is part of the text, not a parameter: given as a parameter, PostgreSQL's
    generic plan of a prepared claim expects a tenth of the ready tasks rather than the
    one or few a worker asks for, looks dearer than a plan for the values at hand, and
    so is never kept: every claim was planned again (as long as running it). A worker
    asks for at most its concurrency, so it uses a few texts, each planned once.

    It reads the partial index ``jobstate_job_task_claim_idx`` (target, queue, then
    claim order) in claim order. A worker of several queues reads each queue's part of
    the index in order (a ``LATERAL`` subquery per queue, each locking at most ``n``
    rows) and keeps the first ``n`` overall; a worker of any queue first finds the
    queues that hold tasks by skipping through the index. No claim sorts a backlog."""
    return cast(
        str, kept(_ROUNDS, ("tasks", shape, limit), _task_claim_statement, connection, shape, limit)
    )


def _task_claim_statement(connection: BaseDatabaseWrapper, shape: str, limit: int) -> str:
    waiting, picked, claim = _task_claim_parts(connection, shape, limit)
    recursive = "RECURSIVE " if waiting else ""
    return f"WITH {recursive}{waiting} picked AS ({picked}) {claim}"


def _task_claim_parts(
    connection: BaseDatabaseWrapper, shape: str, limit: int
) -> tuple[str, str, str]:
    """The task claim of ``shape`` for at most ``limit`` tasks in parts: the recursive
    ``WITH`` query that finds the waiting queues (a worker of any queue; followed by a
    comma) or ``""``, the pick (the ``picked`` query) and the ``UPDATE`` of what was
    picked."""
    table = connection.ops.quote_name(Job._meta.db_table)
    pauses = connection.ops.quote_name(QueuePause._meta.db_table)
    ready = rule(connection, TASK_READY_SQL)
    # Written into the text (see task_claim_statement); int() keeps it a number.
    limit = int(limit)
    queues = ""
    # A paused queue is left out before its part of the claim index is read: one probe
    # of the pause table's unique key per queue, not per task.
    if shape == "one":
        picked = f"""
            SELECT c.id FROM {table} AS c
            WHERE {ready} AND c.queue_name = %s
              AND NOT EXISTS (SELECT 1 FROM {pauses} AS p
                              WHERE p.target = %s AND p.queue_name = %s)
            ORDER BY {TASK_CLAIM_ORDER_SQL}
            LIMIT {limit}
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
                waiting(name) AS (
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
                SELECT c.id, c.priority, {TASK_DUE_SQL} AS due, c.created_at
                FROM {table} AS c
                WHERE {ready} AND c.queue_name = q.name
                ORDER BY {TASK_CLAIM_ORDER_SQL}
                LIMIT {limit}
                FOR UPDATE OF c SKIP LOCKED
            ) AS p
            ORDER BY p.priority DESC, p.due, p.created_at, p.id
            LIMIT {limit}
        """
    # The claim starts an attempt: ``attempts`` counts the attempts that started. Each
    # task's token is ``jobstate.core.states.task_claim_token`` of the claim's round and
    # its id, computed here as there: the digest with the version nibble (13th) set to 4
    # and the variant nibble (17th) to 8, 9, a or b by its two low bits.
    token = (
        "(substr(d.h, 1, 12) || '4' || substr(d.h, 14, 3)"
        " || substr('89ab', (('x' || substr(d.h, 17, 1))::bit(4)::int & 3) + 1, 1)"
        " || substr(d.h, 18))::uuid"
    )
    claim = f"""
        UPDATE {table} AS j
        SET status = %s, executor_id = %s, claimed_at = {NOW_SQL},
            dispatched_at = NULL, lease_until = {NOW_SQL} + %s,
            claim_token = {token}, attempts = j.attempts + 1,
            updated_at = {NOW_SQL}
        FROM picked, LATERAL (SELECT md5(%s::text || picked.id::text) AS h) AS d
        WHERE j.id = picked.id
        RETURNING {returning_columns(connection, "j")}
    """
    return queues, picked, claim


def renew_statement(connection: BaseDatabaseWrapper) -> str:
    """A worker's beat: renew its claims still current, passing over rows another
    transaction holds. Its parameters: the lease, the ids, the claim tokens."""
    return cast(str, kept(_STATEMENTS, ("renew",), _renew_statement, connection))


def _renew_statement(connection: BaseDatabaseWrapper) -> str:
    table = connection.ops.quote_name(Job._meta.db_table)
    claimed = ", ".join(f"'{status.value}'" for status in sorted(CLAIMED_JOB_STATUSES))
    return f"""
            UPDATE {table} AS j SET lease_until = {NOW_SQL} + %s, updated_at = {NOW_SQL}
            FROM (
                SELECT id FROM {table}
                WHERE id = ANY(%s) AND claim_token = ANY(%s) AND status IN ({claimed})
                FOR UPDATE SKIP LOCKED
            ) AS held
            WHERE j.id = held.id
            RETURNING j.id
        """


# --- columns --------------------------------------------------------------------------


def returning_columns(connection: BaseDatabaseWrapper, alias: str) -> str:
    """Every concrete column of ``Job`` qualified by ``alias``, in model field order (the
    order ``load_jobs`` expects)."""
    key = ("returning", alias)
    text = _STATEMENTS.get(key)
    if text is None:
        quote = connection.ops.quote_name
        text = ", ".join(f"{alias}.{quote(column(field))}" for field in Job._meta.concrete_fields)
        _STATEMENTS[key] = text
    return text


def _cleared_claim(connection: BaseDatabaseWrapper) -> str:
    quote = connection.ops.quote_name
    return ", ".join(f"{quote(column(job_field(name)))} = NULL" for name in JOB_CLAIM_FIELDS)


def column(field: Field[Any, Any]) -> str:
    return field.column or field.attname


def job_field(name: str) -> Field[Any, Any]:
    field = Job._meta.get_field(name)
    if not isinstance(field, Field):
        raise TypeError(f"Job.{name} is not a concrete field.")
    return field
