"""MariaDB and MySQL (Django's ``mysql`` backend for both): row locks on the thread gate
table for the per-thread gate, the guards of migration ``0009_mysql_guards``, the
session's clock on UTC, InnoDB's deadlocks and ``JSON_CONTAINS`` for the input search.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BooleanField, CharField, F, Func, QuerySet, TextField, Value

from jobstate.core.states import CLAIMED_JOB_STATUSES, JobStatus
from jobstate.models import (
    ONCE_PER_SLOT,
    ONE_RUNNING_PER_OVERLAP_KEY,
    Job,
    JobRun,
    ScheduleOccurrence,
)
from jobstate.models.claim_sql import CLAIM_ORDER_SQL, PAUSED_SQL, READY_SQL, THREAD_BLOCKERS_SQL
from jobstate.stores.database.backends import mysql_statements as statements
from jobstate.stores.database.backends import mysql_transaction
from jobstate.stores.database.backends.mysql_statements import (
    job_field,
    marks,
    prep,
    to_uuid,
)
from jobstate.stores.database.backends.portable import BackendOperations, input_path

__all__ = ["THREAD_GATE_TABLE", "MySQLOperations"]

#: The table migration 0009 creates on MariaDB and MySQL only.
THREAD_GATE_TABLE = "jobstate_threadgate"

#: ER_LOCK_DEADLOCK.
_DEADLOCK = 1213


class MySQLOperations(BackendOperations):
    vendor = "mysql"
    now_sql = "CURRENT_TIMESTAMP(6)"

    def __init__(self, using: str) -> None:
        super().__init__(using)
        #: The claim's locking read per (targets, ids passed over, threads passed over,
        #: gated).
        self._claim_reads: dict[tuple[int, int, int, bool], str] = {}
        #: Per column loaded by the claim's read (and the clock last) that has
        #: converters: its position, the column and the converters.
        self._converters: list[tuple[int, Any, list[Any]]] | None = None

    # No UPDATE ... RETURNING (MariaDB has RETURNING for INSERT and DELETE only), so a
    # claim of one job or many is one locking read of the rows and one UPDATE of them.
    claims_in_sets = True

    # MySQL refuses an UPDATE whose subquery reads the updated table. MariaDB accepts
    # it (Django's update_can_self_select), but it shares this backend and the claim's
    # gate is proven on both with the gate read by its own statement.
    gate_in_update = False

    # InnoDB's DELETE waits for every row it reads, matching or not, so two sweepers
    # deleting disjoint batches of a small table can deadlock; InnoDB then rolls the
    # loser's whole transaction back, and the batch can simply run again.
    delete_rounds = 5

    # A claim creates the gate rows of threads never gated before with one INSERT, which
    # waits for a concurrent claim inserting the same thread's row; if that claim waits
    # for a row this one holds, InnoDB rolls one of them back whole, and it can simply
    # run again.
    claim_rounds = 3

    # A locking read whose order no index serves (a sort) locks every candidate it reads
    # before the limit applies, so a second sweeper would find all of them held.
    locks_every_row_read = True

    # --- the per-thread gate: the thread's row of the gate table ---------------------
    #
    # MariaDB's and MySQL's named locks (GET_LOCK) belong to the session, not the
    # transaction, so they would outlive a rollback or a caller's transaction; an InnoDB
    # row lock ends exactly with the transaction, as PostgreSQL's advisory lock does. A
    # thread's row is created by its first lock and kept: one short row per thread ever
    # gated.

    def lock_thread(self, thread_id: int) -> None:
        """Lock ``thread_id``'s row until the transaction ends, waiting for it. On a
        duplicate key ``INSERT ... ON DUPLICATE KEY UPDATE`` takes the existing row's
        exclusive lock, so one statement both creates and locks it."""
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {THREAD_GATE_TABLE} (thread_id) VALUES (%s) "
                "ON DUPLICATE KEY UPDATE thread_id = thread_id",
                [thread_id],
            )

    def try_lock_thread(self, thread_id: int) -> bool:
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT thread_id FROM {THREAD_GATE_TABLE} WHERE thread_id = %s "
                "FOR UPDATE SKIP LOCKED",
                [thread_id],
            )
            if cursor.fetchone() is not None:
                return True
            # Not handed over: the row is held, or the thread was never gated.
            cursor.execute(f"SELECT 1 FROM {THREAD_GATE_TABLE} WHERE thread_id = %s", [thread_id])
            if cursor.fetchone() is not None:
                return False
            # A new row is locked by its insert; a concurrent first lock of the same
            # thread makes this one a duplicate, which IGNORE answers with no row: held.
            cursor.execute(
                f"INSERT IGNORE INTO {THREAD_GATE_TABLE} (thread_id) VALUES (%s)", [thread_id]
            )
            return bool(cursor.rowcount == 1)

    def claim_candidates(
        self,
        scope: list[str],
        limit: int,
        passed_ids: Sequence[uuid.UUID],
        passed_threads: Collection[int],
        *,
        gated: bool = True,
    ) -> list[tuple[Job, datetime]]:
        """The claim's locking read as SQL text built once per shape from the rules of
        :mod:`jobstate.models.jobs` (their ORM twins are proven equal by the SQL twins
        test): a claim runs it on every poll, and building and compiling the queryset
        each time cost more than the statement."""
        connection = self.connection
        pk = Job._meta.pk
        sql = self._claim_read(len(scope), len(passed_ids), len(passed_threads), gated)
        params: list[Any] = [
            *scope,
            *(pk.get_db_prep_value(pk_value, connection) for pk_value in passed_ids),
            *passed_threads,
            limit,
        ]
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        return self._loaded(rows)

    def _claim_read(self, targets: int, passed_ids: int, passed_threads: int, gated: bool) -> str:
        key = (targets, passed_ids, passed_threads, gated)
        sql = self._claim_reads.get(key)
        if sql is None:
            columns = statements.columns(self.connection, "c.")
            passed = ""
            if passed_ids:
                passed += f" AND c.id NOT IN ({marks(range(passed_ids))})"
            if passed_threads:
                passed += (
                    f" AND (c.thread_id IS NULL OR c.thread_id NOT IN "
                    f"({marks(range(passed_threads))}))"
                )
            if gated:
                blockers = self.sql(THREAD_BLOCKERS_SQL)
                passed += f" AND (c.thread_id IS NULL OR NOT EXISTS ({blockers}))"
            sql = self._claim_reads[key] = (
                f"SELECT {columns}, {self.now_sql} FROM {self.sql('{job}')} AS c "
                f"WHERE {self.sql(READY_SQL)} AND c.target IN ({marks(range(targets))}) "
                f"AND NOT EXISTS ({self.sql(PAUSED_SQL)})"
                f"{passed} ORDER BY {CLAIM_ORDER_SQL} LIMIT %s FOR UPDATE SKIP LOCKED"
            )
        return sql

    def _loaded(self, rows: Sequence[Sequence[Any]]) -> list[tuple[Job, datetime]]:
        """Rows of every concrete ``Job`` column in model order and the clock, as jobs
        and the clock."""
        return [(job, clock) for job, clock in self._converted(rows, clock=True)]

    def _converted(self, rows: Sequence[Sequence[Any]], *, clock: bool) -> list[tuple[Job, Any]]:
        """Rows of every concrete ``Job`` column in model order (and, with ``clock``, the
        database clock after them) as jobs: through the backend's and the fields'
        converters, as a queryset loads them. Each job comes with the clock, or ``None``.
        Only the columns that have converters are visited, and a NULL is left as it is:
        every converter of these fields (Django's JSON, UUID, boolean and time zone
        ones) hands ``None`` back unchanged."""
        connection = self.connection
        fields = Job._meta.concrete_fields
        if self._converters is None:
            converters = []
            for position, field in enumerate([*fields, Job._meta.get_field("created_at")]):
                column = field.get_col(Job._meta.db_table)
                functions = [
                    *connection.ops.get_db_converters(column),
                    *column.get_db_converters(connection),
                ]
                if functions:
                    converters.append((position, column, functions))
            self._converters = converters
        names = [field.attname for field in fields]
        count = len(fields)
        used = [entry for entry in self._converters if clock or entry[0] < count]
        loaded: list[tuple[Job, Any]] = []
        for row in rows:
            values = list(row)
            for position, column, functions in used:
                value = values[position]
                if value is None:
                    continue
                for function in functions:
                    value = function(value, column, connection)
                values[position] = value
            job = Job.from_db(self.using, names, values[:count])
            loaded.append((job, values[count] if clock else None))
        return loaded

    def try_lock_threads(self, thread_ids: Collection[int]) -> set[int]:
        """The rows of every thread locked by one ``SKIP LOCKED`` read; only threads it
        did not hand over are looked at again, as :meth:`try_lock_thread` does, and the
        never-gated ones created (and so locked) by one multi-row insert. Raw SQL
        because the gate table has no model: it exists on these servers only."""
        wanted = sorted(set(thread_ids))
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT thread_id FROM {THREAD_GATE_TABLE} WHERE thread_id IN "
                f"({marks(wanted)}) FOR UPDATE SKIP LOCKED",
                wanted,
            )
            held = {int(row[0]) for row in cursor.fetchall()}
            rest = [thread_id for thread_id in wanted if thread_id not in held]
            if not rest:
                return held
            cursor.execute(
                f"SELECT thread_id FROM {THREAD_GATE_TABLE} WHERE thread_id IN ({marks(rest)})",
                rest,
            )
            gated = {int(row[0]) for row in cursor.fetchall()}
            new = [thread_id for thread_id in rest if thread_id not in gated]
            if not new:
                return held
            cursor.execute(
                f"INSERT IGNORE INTO {THREAD_GATE_TABLE} (thread_id) VALUES "
                + ", ".join(["(%s)"] * len(new)),
                new,
            )
            if cursor.rowcount == len(new):
                return held | set(new)
            # A concurrent first lock made some of them duplicates: the rows this insert
            # created are this transaction's, and it does not skip its own locks.
            cursor.execute(
                f"SELECT thread_id FROM {THREAD_GATE_TABLE} WHERE thread_id IN "
                f"({marks(new)}) FOR UPDATE SKIP LOCKED",
                new,
            )
            return held | {int(row[0]) for row in cursor.fetchall()}

    def lock_by_key(self, model: type[models.Model], keys: Collection[Any]) -> set[Any]:
        """With the primary key's index forced: on a small table the optimizer would
        walk a covering index, and InnoDB keeps the lock of every row the walk passed."""
        wanted = list(keys)
        if not wanted:
            return set()
        pk = model._meta.pk
        assert pk is not None and pk.column is not None  # every concrete model has one
        quote = self.connection.ops.quote_name
        column, table = quote(pk.column), quote(model._meta.db_table)
        prepared = prep(self.connection)
        with self.connection.cursor() as cursor:
            cursor.execute(
                f"SELECT {column} FROM {table} FORCE INDEX (PRIMARY) "
                f"WHERE {column} IN ({marks(wanted)}) FOR UPDATE SKIP LOCKED",
                [prepared(pk, key) for key in wanted],
            )
            # The keys as the ORM reads them (a UUID column's value is text or bytes).
            return {pk.to_python(row[0]) for row in cursor.fetchall()}

    # --- the set-based statements --------------------------------------------------
    #
    # The claims and reports of :mod:`jobstate.stores.database.set_claims` send their
    # statements as SQL text built here: a claim or a report runs them on every job, and
    # building and compiling a queryset each time cost more than the statements did.

    def short_transaction(self) -> AbstractContextManager[object]:
        """A claim's or report's transaction in one round trip of its own, the
        ``COMMIT`` (:mod:`.mysql_transaction`)."""
        return mysql_transaction.short_transaction(self.connection, self.using)

    def update_jobs(
        self,
        ids: Sequence[uuid.UUID],
        same: dict[str, Any],
        per_row: dict[str, dict[uuid.UUID, Any]],
        *,
        statuses: Collection[JobStatus],
        token: uuid.UUID | None = None,
        stamped: Sequence[str] = (),
        attempt: bool = False,
    ) -> int:
        """Django's MySQL backend asks for found rows, so the count is of the rows the
        ``WHERE`` matched (written or already holding the values), as an ORM update
        counts them. The text is kept per shape (:mod:`.mysql_statements`)."""
        sql, params = statements.update_jobs(
            self.connection,
            self.now_sql,
            ids,
            same,
            per_row,
            statuses=statuses,
            token=token,
            stamped=stamped,
            attempt=attempt,
        )
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)
            return int(cursor.rowcount)

    def update_and_read(
        self,
        pk: uuid.UUID,
        same: dict[str, Any],
        *,
        statuses: Collection[JobStatus],
        token: uuid.UUID,
        stamped: Sequence[str] = (),
    ) -> tuple[int, Job | None]:
        """The ``UPDATE`` and the read of the row in one text, one round trip, where the
        connection sends several statements in one text; the server runs the read
        after the ``UPDATE``, in its transaction."""
        connection = self.connection
        connection.ensure_connection()
        if not mysql_transaction.several_statements(connection):
            return super().update_and_read(
                pk, same, statuses=statuses, token=token, stamped=stamped
            )
        update, params = statements.update_jobs(
            connection,
            self.now_sql,
            [pk],
            same,
            {},
            statuses=statuses,
            token=token,
            stamped=stamped,
            attempt=False,
        )
        read = statements.select_jobs(connection, self.now_sql, 1)
        with connection.cursor() as cursor:
            cursor.execute(f"{update}; {read}", [*params, prep(connection)(Job._meta.pk, pk)])
            moved = int(cursor.rowcount)
            mysql_transaction.next_result(cursor)
            rows = cursor.fetchall()
        jobs = [job for job, _clock in self._converted(rows, clock=False)]
        return moved, jobs[0] if jobs else None

    def lock_claims(self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> set[uuid.UUID]:
        """One locking read in id order (two batches never wait on each other
        crosswise). It names every id and every token; a row whose token is not its own
        report's (a later claim's) is dropped here and, not matching the read under READ
        COMMITTED, its lock released by InnoDB at once."""
        connection = self.connection
        prepared = prep(connection)
        token_field = job_field("claim_token")
        given = dict(pairs)
        statuses = sorted(status.value for status in CLAIMED_JOB_STATUSES)
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT id, claim_token FROM {self.sql('{job}')} WHERE id IN ({marks(given)}) "
                f"AND claim_token IN ({marks(given)}) AND status IN ({marks(statuses)}) "
                "ORDER BY id FOR UPDATE",
                [
                    *(prepared(Job._meta.pk, pk) for pk in given),
                    *(prepared(token_field, token) for token in given.values()),
                    *statuses,
                ],
            )
            rows = cursor.fetchall()
        # Stored as CHAR(32) hex on MySQL and as the native UUID type on MariaDB 10.7+.
        read = {to_uuid(pk): to_uuid(token) for pk, token in rows}
        return {pk for pk, token in read.items() if given.get(pk) == token}

    def jobs_by_id(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Job]:
        prepared = prep(self.connection)
        keys = [prepared(Job._meta.pk, pk) for pk in ids]
        with self.connection.cursor() as cursor:
            cursor.execute(statements.select_jobs(self.connection, self.now_sql, len(keys)), keys)
            rows = cursor.fetchall()
        return {job.id: job for job, _clock in self._converted(rows, clock=False)}

    # --- migration 0009's guards ------------------------------------------------------

    def missing_server_guards(self) -> list[str]:
        """The unique indexes on generated columns that enforce jobstate's partial
        unique constraints here, and the thread gate table. Raises ``DatabaseError``
        when the catalogue cannot be read."""
        guards = [
            (JobRun._meta.db_table, ONE_RUNNING_PER_OVERLAP_KEY),
            (ScheduleOccurrence._meta.db_table, ONCE_PER_SLOT),
        ]
        connection = self.connection
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT table_name, index_name FROM information_schema.statistics "
                "WHERE table_schema = DATABASE() AND non_unique = 0 AND index_name IN (%s, %s)",
                [index for _table, index in guards],
            )
            found = {(str(table), str(index)) for table, index in cursor.fetchall()}
        missing = [f"{table}.{index}" for table, index in guards if (table, index) not in found]
        if THREAD_GATE_TABLE not in connection.introspection.table_names():
            missing.append(THREAD_GATE_TABLE)
        return missing

    # --- connections and errors ------------------------------------------------------

    def prepare_connection(self, connection: BaseDatabaseWrapper) -> None:
        """The database clock (``CURRENT_TIMESTAMP``) speaks the session's time zone, the
        server's own (``SYSTEM``) unless set, while Django writes and reads UTC here: a
        server whose machine is not on UTC would stamp schedules' starts, jobs and audit
        entries hours off, and run delayed jobs and retries hours early or late. So a
        new connection that Django reads and writes in UTC (``USE_TZ`` and no
        ``TIME_ZONE`` of the database's own) puts its session on UTC; hosts that keep
        local times are left as they are."""
        if not settings.USE_TZ or connection.timezone_name != "UTC":
            return
        with connection.cursor() as cursor:
            cursor.execute("SET time_zone = '+00:00'")

    def deadlocked(self, exc: BaseException) -> bool:
        args: tuple[object, ...] = getattr(exc.__cause__, "args", ())
        return bool(args) and args[0] == _DEADLOCK

    # --- the jobs list's search ------------------------------------------------------

    def filter_input(self, rows: QuerySet[Job], value: dict[str, Any]) -> QuerySet[Job]:
        """``JSON_CONTAINS`` at the path, which also takes a value inside a list there as
        contained (PostgreSQL does not): the value at the path must not be a list."""
        path, leaf, alias = input_path(rows, value)
        contains = Func(
            F("input"),
            Value(json.dumps(leaf)),
            path,
            function="JSON_CONTAINS",
            output_field=BooleanField(),
        )
        json_type = Func(
            Func(F("input"), path, function="JSON_EXTRACT", output_field=TextField()),
            function="JSON_TYPE",
            output_field=CharField(),
        )
        return (
            rows.alias(**{alias: contains, f"{alias}_type": json_type})
            .filter(**{alias: True})
            .exclude(**{f"{alias}_type": "ARRAY"})
        )
