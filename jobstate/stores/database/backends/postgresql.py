"""PostgreSQL: the one-statement hot path, transaction-scoped advisory locks for the
per-thread gate, ``NOTIFY`` for idle workers and the planner's statistics for estimates.

The statements' text is in :mod:`.postgresql_statements`; they run on one reusable
server-binding cursor per connection, which prepares them (:mod:`.postgresql_cursor`).
"""

from __future__ import annotations

import functools
import hashlib
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Field, Model, QuerySet
from django.db.models.deletion import Collector

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import (
    REAPED_RUN_ERROR,
    TASK_NOTIFY_CHANNEL,
    JobRunStatus,
    JobStatus,
    NotificationRequest,
    task_notify_payload,
)
from jobstate.models import Job, JobRun, Notification, time_ordered_uuid
from jobstate.stores.contracts.validation import ParsedReport
from jobstate.stores.database.backends.portable import (
    BackendOperations,
    FinishedEntry,
    TableStatistics,
)
from jobstate.stores.database.backends.postgresql_cursor import hot_cursor, load_jobs
from jobstate.stores.database.backends.postgresql_statements import (
    NOW_SQL,
    claim_statement,
    claim_unthreaded_statement,
    complete_and_claim_statement,
    complete_statement,
    enqueue_task_statement,
    finish_statement,
    inserted_fields,
    renew_statement,
    task_claim_statement,
)

__all__ = ["PostgreSQLOperations"]

#: The jobs table's size at its last ``ANALYZE`` (rows, pages), its pages now, and the
#: values of a column ``ANALYZE`` sampled with their frequencies.
_TABLE_STATISTICS_SQL = """
    SELECT c.reltuples, c.relpages,
           pg_relation_size(c.oid) / current_setting('block_size')::float8,
           s.most_common_vals::text::text[], s.most_common_freqs
    FROM pg_class AS c
    LEFT JOIN pg_stats AS s
      ON s.schemaname = c.relnamespace::regnamespace::text
     AND s.tablename = c.relname AND s.attname = %s
    WHERE c.oid = to_regclass(%s)
"""


class PostgreSQLOperations(BackendOperations):
    # The hot-path methods look this thread's connection up themselves rather than
    # through the ``connection`` property: a Python call less on every claim and report.

    vendor = "postgresql"
    hot_statements = True
    # input @> value, served by the GIN index of migration 0011.
    indexes_input_search = True
    server_errors_carry_sqlstate = True
    now_sql = NOW_SQL

    # --- the per-thread gate: advisory locks ----------------------------------------

    def lock_thread(self, thread_id: int) -> None:
        """A transaction-scoped advisory lock on the thread. The key is hashed from a
        namespaced string so it does not collide with a host's own integer keys; a hash
        collision between two threads only makes them wait for each other briefly."""
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [_thread_lock_key(thread_id)])

    def try_lock_thread(self, thread_id: int) -> bool:
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT pg_try_advisory_xact_lock(%s)", [_thread_lock_key(thread_id)])
            row = cursor.fetchone()
        return bool(row and row[0])

    def try_lock_key(self, digest: str) -> bool:
        """A transaction-scoped advisory lock on a concurrency key, from a namespaced
        hash as for threads."""
        key = hashlib.blake2b(f"jobstate.job.concurrency:{digest}".encode(), digest_size=8)
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_try_advisory_xact_lock(%s)",
                [int.from_bytes(key.digest(), "big", signed=True)],
            )
            row = cursor.fetchone()
        return bool(row and row[0])

    # --- the hot path ----------------------------------------------------------------

    def claim_one(
        self, scope: list[str], owner: str, lease: timedelta, status: JobStatus
    ) -> tuple[bool, Job | None]:
        """One round trip: pick the oldest claimable job (``FOR UPDATE SKIP LOCKED``)
        and, when it has no thread, move it in the same statement. Without a
        transaction around it the row lock lasts one statement."""
        connection = connections[self.using]
        sql = claim_statement(connection, len(scope), status)
        params: list[Any] = [*scope, status.value, owner, lease, uuid.uuid4()]
        with hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        if row is None:
            return False, None
        if row[1] is None:
            return True, None
        return True, load_jobs(connection, self.using, [row[1:]])[0]

    def claim_unthreaded(
        self, scope: list[str], owner: str, lease: timedelta, limit: int
    ) -> list[Job]:
        connection = connections[self.using]
        sql = claim_unthreaded_statement(connection, len(scope))
        params: list[Any] = [*scope, limit, JobStatus.RUNNING.value, owner, lease]
        with hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return load_jobs(connection, self.using, rows)

    def complete_group(
        self, columns: tuple[str, ...], group: Sequence[ParsedReport]
    ) -> dict[uuid.UUID, Job]:
        connection = connections[self.using]
        sql, fields = complete_statement(connection, columns, len(group))
        params: list[Any] = []
        for pk, token, status, cleaned in group:
            params.extend((pk, token, status.value))
            params.extend(
                field.get_db_prep_save(cleaned[field.name], connection) for field in fields
            )
        with hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        return {job.id: job for job in load_jobs(connection, self.using, fetched)}

    def renew_claims(
        self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]], lease: timedelta
    ) -> set[uuid.UUID]:
        """One statement (``UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)
        RETURNING``), atomic on its own."""
        connection = connections[self.using]
        params = [lease, [pk for pk, _token in pairs], [token for _pk, token in pairs]]
        with hot_cursor(connection) as cursor:
            cursor.execute(renew_statement(connection), params)
            return {row[0] for row in cursor.fetchall()}

    def finish_with_notifications(
        self,
        original: Job,
        cleaned: dict[str, Any],
        entry: FinishedEntry,
        requests: Sequence[NotificationRequest],
    ) -> Job | None:
        """One statement, atomic on its own: in autocommit it commits or fails whole,
        and inside the caller's transaction it joins it. A key already in the outbox
        fails the whole statement with the unique violation the caller turns into
        ``DuplicateNotification``; ``None`` when the fence failed, in which case nothing
        was inserted either."""
        connection = connections[self.using]
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
        return None if row is None else load_jobs(connection, self.using, [row])[0]

    def enqueue_task(self, cleaned: dict[str, Any]) -> Job | None:
        """The insert and, with ``JOBSTATE['LISTEN_NOTIFY']``, ``NOTIFY`` on
        :data:`~jobstate.core.states.TASK_NOTIFY_CHANNEL` in one statement (``enqueue``
        runs in web requests, where every round trip shows). PostgreSQL delivers the
        notification when the caller's transaction commits (never if it rolls back), and
        folds identical notifications of one transaction into one, so enqueueing many
        tasks of one queue in a transaction wakes the workers once. ``None``, with
        nothing written, when the task is unique and a job holds its key."""
        connection = connections[self.using]
        job = Job(**cleaned)  # the model's defaults: a time-ordered id, queued, no attempts
        sql = enqueue_task_statement(connection, unique=job.unique_digest is not None)
        params: list[Any] = [
            field.get_db_prep_save(getattr(job, field.attname), connection)
            for field in inserted_fields()
        ]
        payload = task_notify_payload(job.target or "", job.queue_name or "")
        params += [jobstate_settings.LISTEN_NOTIFY, TASK_NOTIFY_CHANNEL, payload]
        with hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
        return None if row is None else load_jobs(connection, self.using, [row[:-1]])[0]

    def claim_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> list[Job]:
        connection = connections[self.using]
        sql, params = task_claim(connection, target, queues, owner, lease, limit, claim_round)
        with hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return load_jobs(connection, self.using, rows)

    def complete_and_claim_tasks(
        self,
        columns: tuple[str, ...],
        group: Sequence[ParsedReport],
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> tuple[dict[uuid.UUID, Job], list[Job]]:
        """One round trip for a task worker's round (see
        :func:`~.postgresql_statements.complete_and_claim_statement`)."""
        connection = connections[self.using]
        shape, claim_params = _task_claim_shape(target, queues, owner, lease, claim_round)
        sql, fields = complete_and_claim_statement(connection, columns, len(group), shape, limit)
        params: list[Any] = []
        for pk, token, status, cleaned in group:
            params.extend((pk, token, status.value))
            params.extend(
                field.get_db_prep_save(cleaned[field.name], connection) for field in fields
            )
        params.extend(claim_params)
        with hot_cursor(connection) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        jobs = load_jobs(connection, self.using, [row[1:] for row in rows])
        written = {job.id: job for job, row in zip(jobs, rows, strict=True) if row[0]}
        return written, [job for job, row in zip(jobs, rows, strict=True) if not row[0]]

    def reap_stale_runs(
        self,
        stale_after: timedelta,
        job_key: str | None,
        overlap_key: str | None,
        limit: int | None,
    ) -> int:
        # Raw SQL because the ORM cannot lock with FOR UPDATE SKIP LOCKED inside an
        # UPDATE. SKIP LOCKED lets a second reaper pass over rows the first one holds
        # instead of waiting and counting them again (S4); the outer status check keeps
        # the count exact even if a row settled in between. The candidates are a
        # MATERIALIZED CTE, not an IN (subquery): the planner may rescan such a subquery
        # once per outer row, and each rescan skips the rows already moved and locks the
        # next ones, overrunning LIMIT.
        table = self.connection.ops.quote_name(JobRun._meta.db_table)
        sql = f"""
            WITH picked AS MATERIALIZED (
                SELECT id FROM {table}
                 WHERE status = %s
                   AND heartbeat_at <= statement_timestamp() - %s
                   AND (%s::text IS NULL OR job_key = %s)
                   AND (%s::text IS NULL OR overlap_key = %s)
                 ORDER BY heartbeat_at
                 LIMIT %s
                   FOR UPDATE SKIP LOCKED)
            UPDATE {table} AS run
               SET status = %s, finished_at = statement_timestamp(), error = %s
              FROM picked
             WHERE run.id = picked.id AND run.status = %s
        """
        params: list[Any] = [
            JobRunStatus.RUNNING.value,
            stale_after,
            job_key,
            job_key,
            overlap_key,
            overlap_key,
            limit,
            JobRunStatus.TIMED_OUT.value,
            REAPED_RUN_ERROR,
            JobRunStatus.RUNNING.value,
        ]
        with transaction.atomic(using=self.using), self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def deletes_in_one_statement(self, candidates: QuerySet[Any]) -> bool:
        """When Django can delete the model's rows without loading them (no cascades,
        no delete signals: ``Collector.can_fast_delete``)."""
        return bool(Collector(using=self.using, origin=None).can_fast_delete(candidates))

    def delete_picked(self, picked: QuerySet[Any]) -> list[tuple[Any, Any]]:
        """The locked pick is materialized first, so the delete can never take more rows
        than the batch's limit, and no keys travel to Python and back."""
        connection = connections[self.using]
        pick_sql, params = picked.query.get_compiler(self.using).as_sql()
        model = picked.model
        table = connection.ops.quote_name(model._meta.db_table)
        pk = connection.ops.quote_name(model._meta.pk.column)
        # MATERIALIZED: the pick runs once, so the delete takes exactly the rows it locked.
        sql = (
            f"WITH picked (sort_key, pk) AS MATERIALIZED ({pick_sql}) "
            f"DELETE FROM {table} AS gone USING picked WHERE gone.{pk} = picked.pk "
            "RETURNING picked.sort_key, picked.pk"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [tuple(row) for row in cursor.fetchall()]

    # --- estimates -------------------------------------------------------------------

    def table_statistics(self, model: type[Model], column: str) -> TableStatistics | None:
        """The table's size estimated the way the planner does (rows per page at the
        last ``ANALYZE`` times the pages it has now), and the frequencies of the
        ``column`` values ``ANALYZE`` sampled; ``None`` before the first ``ANALYZE``."""
        with self.connection.cursor() as cursor:
            cursor.execute(_TABLE_STATISTICS_SQL, [column, model._meta.db_table])
            row = cursor.fetchone()
        if row is None:
            return None
        reltuples, relpages, pages, values, frequencies = row
        if reltuples is None or reltuples < 0:
            return None  # never analyzed
        rows = reltuples / relpages * pages if relpages else reltuples
        sampled = dict(zip(values or [], frequencies or [], strict=True))
        return TableStatistics(rows=rows, frequencies=sampled)

    def estimated_rows(self, model: type[Model]) -> int | None:
        """``-1`` for a table never analysed (PostgreSQL 14 and later; 0 before)."""
        table = self.connection.ops.quote_name(model._meta.db_table)
        with self.connection.cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)", [table]
            )
            row = cursor.fetchone()
        return int(row[0]) if row and row[0] is not None else -1

    @property
    def can_listen(self) -> bool:
        """``LISTEN`` needs psycopg 3."""
        try:
            import psycopg  # noqa: F401
        except ImportError:
            return False
        return True


def task_claim(
    connection: Any,
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
    claim_round: uuid.UUID,
) -> tuple[str, list[Any]]:
    """The task claim statement and its parameters. Its text depends only on whether
    ``queues`` is ``None``, one queue or several, and on ``limit``, so the database can
    keep one plan per kind of worker and number of free slots."""
    shape, params = _task_claim_shape(target, queues, owner, lease, claim_round)
    return task_claim_statement(connection, shape, limit), params


def _task_claim_shape(
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    claim_round: uuid.UUID,
) -> tuple[str, list[Any]]:
    """The shape of a task claim (``"any"``, ``"one"`` or ``"several"`` queues) and its
    parameters."""
    shape = "any" if queues is None else "one" if len(queues) == 1 else "several"
    params: list[Any]
    if shape == "one":
        params = [target, *(queues or []), target, *(queues or [])]
    elif shape == "several":
        params = [queues, target, target]
    else:
        params = [target, target, target, target]
    return shape, [*params, JobStatus.RUNNING.value, owner, lease, str(claim_round)]


def _thread_lock_key(thread_id: int) -> int:
    """The advisory-lock key of a thread: a 64-bit hash of a namespaced name."""
    digest = hashlib.blake2b(f"jobstate.job.thread:{thread_id}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "big", signed=True)


@functools.cache
def _payload_field() -> Field[Any, Any]:
    """The notification's ``payload`` field, whose ``get_db_prep_save`` adapts a value as
    the ORM would."""
    payload = Notification._meta.get_field("payload")
    if not isinstance(payload, Field):
        raise TypeError("Notification.payload is a concrete field.")
    return payload
