"""MariaDB and MySQL (Django's ``mysql`` backend for both): row locks on the thread gate
table for the per-thread gate, the guards of migration ``0009_mysql_guards``, the
session's clock on UTC, InnoDB's deadlocks and ``JSON_CONTAINS`` for the input search.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import BooleanField, CharField, F, Func, QuerySet, TextField, Value

from jobstate.models import (
    ONCE_PER_SLOT,
    ONE_RUNNING_PER_OVERLAP_KEY,
    Job,
    JobRun,
    ScheduleOccurrence,
)
from jobstate.models.jobs import CLAIM_ORDER_SQL, PAUSED_SQL, READY_SQL, THREAD_BLOCKERS_SQL
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
        #: The claim's locking read per (targets, ids passed over, threads passed over).
        self._claim_reads: dict[tuple[int, int, int], str] = {}
        #: Per column loaded by the claim's read (and the clock last), its converters.
        self._converters: list[tuple[Any, list[Any]]] | None = None

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
    ) -> list[tuple[Job, datetime]]:
        """The claim's locking read as SQL text built once per shape from the rules of
        :mod:`jobstate.models.jobs` (their ORM twins are proven equal by the SQL twins
        test): a claim runs it on every poll, and building and compiling the queryset
        each time cost more than the statement."""
        connection = self.connection
        pk = Job._meta.pk
        sql = self._claim_read(len(scope), len(passed_ids), len(passed_threads))
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

    def _claim_read(self, targets: int, passed_ids: int, passed_threads: int) -> str:
        key = (targets, passed_ids, passed_threads)
        sql = self._claim_reads.get(key)
        if sql is None:
            quote = self.connection.ops.quote_name
            columns = ", ".join(
                f"c.{quote(field.column or field.attname)}" for field in Job._meta.concrete_fields
            )
            passed = ""
            if passed_ids:
                passed += f" AND c.id NOT IN ({_marks(range(passed_ids))})"
            if passed_threads:
                passed += (
                    f" AND (c.thread_id IS NULL OR c.thread_id NOT IN "
                    f"({_marks(range(passed_threads))}))"
                )
            sql = self._claim_reads[key] = (
                f"SELECT {columns}, {self.now_sql} FROM {self.sql('{job}')} AS c "
                f"WHERE {self.sql(READY_SQL)} AND c.target IN ({_marks(range(targets))}) "
                f"AND NOT EXISTS ({self.sql(PAUSED_SQL)}) "
                f"AND (c.thread_id IS NULL OR NOT EXISTS ({self.sql(THREAD_BLOCKERS_SQL)}))"
                f"{passed} ORDER BY {CLAIM_ORDER_SQL} LIMIT %s FOR UPDATE SKIP LOCKED"
            )
        return sql

    def _loaded(self, rows: Sequence[Sequence[Any]]) -> list[tuple[Job, datetime]]:
        """Rows of every concrete ``Job`` column in model order and the clock, as jobs:
        through the backend's and the fields' converters, as a queryset loads them."""
        connection = self.connection
        fields = Job._meta.concrete_fields
        if self._converters is None:
            converters = []
            for field in [*fields, Job._meta.get_field("created_at")]:
                column = field.get_col(Job._meta.db_table)
                functions = [
                    *connection.ops.get_db_converters(column),
                    *column.get_db_converters(connection),
                ]
                converters.append((column, functions))
            self._converters = converters
        names = [field.attname for field in fields]
        loaded: list[tuple[Job, datetime]] = []
        for row in rows:
            values = list(row)
            for position, (column, functions) in enumerate(self._converters):
                for function in functions:
                    values[position] = function(values[position], column, connection)
            loaded.append((Job.from_db(self.using, names, values[:-1]), values[-1]))
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
                f"({_marks(wanted)}) FOR UPDATE SKIP LOCKED",
                wanted,
            )
            held = {int(row[0]) for row in cursor.fetchall()}
            rest = [thread_id for thread_id in wanted if thread_id not in held]
            if not rest:
                return held
            cursor.execute(
                f"SELECT thread_id FROM {THREAD_GATE_TABLE} WHERE thread_id IN ({_marks(rest)})",
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
                f"({_marks(new)}) FOR UPDATE SKIP LOCKED",
                new,
            )
            return held | {int(row[0]) for row in cursor.fetchall()}

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


def _marks(values: Sequence[object] | range) -> str:
    """One placeholder per value, for ``IN (...)``."""
    return ", ".join(["%s"] * len(values))
