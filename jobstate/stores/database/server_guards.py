"""Whether a MariaDB or MySQL database carries what migration ``0009_mysql_guards``
adds there: the unique indexes on generated columns that enforce jobstate's partial
unique constraints, and the thread gate table. Readiness fails closed without them and
the deploy check names them (``jobstate.E044``); on other backends nothing is missing.
"""

from __future__ import annotations

from django.db.backends.base.base import BaseDatabaseWrapper

from jobstate.models import ONCE_PER_SLOT, ONE_RUNNING_PER_OVERLAP_KEY, JobRun, ScheduleOccurrence
from jobstate.stores.database.thread_gate import THREAD_GATE_TABLE

__all__ = ["missing_server_guards"]


def _unique_guards() -> list[tuple[str, str]]:
    return [
        (JobRun._meta.db_table, ONE_RUNNING_PER_OVERLAP_KEY),
        (ScheduleOccurrence._meta.db_table, ONCE_PER_SLOT),
    ]


def missing_server_guards(connection: BaseDatabaseWrapper) -> list[str]:
    """The guards database ``connection`` lacks, as ``table.index`` or table names;
    empty on PostgreSQL and SQLite, which enforce the constraints themselves. Raises
    ``DatabaseError`` when the catalogue cannot be read."""
    if connection.vendor != "mysql":
        return []
    guards = _unique_guards()
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
