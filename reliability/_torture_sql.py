"""The torture run's own SQL on PostgreSQL and on MariaDB / MySQL: one connection type
for the harness (controller probe, monitor, checks) and the few fragments that differ
between the two servers.

The run's server is chosen by its URL (``postgres://`` or ``mysql://``). Everything the
harness asks the database is written once, with the dialect filling in JSON access,
null-safe comparison, the database clock, uuid text and how a process's sessions are
found:

- PostgreSQL names each session with ``application_name`` and lists them in
  ``pg_stat_activity``;
- MariaDB has no session name a client can set, so every connection of a run's process
  notes its ``CONNECTION_ID()`` in ``torture_session`` as it opens (Django's
  ``init_command``), and the processlist says which of those are still there.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

#: What a process name may hold (it is written into the MariaDB ``init_command``).
_PROCESS_NAME = re.compile(r"[\w.-]{1,64}")


class Dialect:
    """PostgreSQL's fragments; :class:`MySQLDialect` overrides what MariaDB spells
    differently."""

    name = "postgresql"
    now = "clock_timestamp()"

    def json_text(self, expr: str, key: str) -> str:
        """The text of member ``key`` of a JSON object (NULL when absent)."""
        return f"{expr}->>'{key}'"

    def same(self, left: str, right: str) -> str:
        """Null-safe equality."""
        return f"{left} IS NOT DISTINCT FROM {right}"

    def concat(self, *parts: str) -> str:
        return " || ".join(parts)

    def uuid_text(self, column: str) -> str:
        """A uuid column as canonical text (lower-case hex with hyphens)."""
        return f"{column}::text"

    def id_text(self, column: str) -> str:
        """A uuid column as the text the harness compares and prints."""
        return f"{column}::text"

    def in_ids(self, column: str, ids: Sequence[str]) -> tuple[str, list[Any]]:
        return f"{column} = ANY(%s::uuid[])", [list(ids)]

    def not_in(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        return f"{column} <> ALL(%s)", [list(values)]

    def ids_aggregate(self, column: str) -> str:
        return f"array_agg({column}::text ORDER BY {column})"

    def ids_of_aggregate(self, value: Any) -> tuple[str, ...]:
        return tuple(value)

    def elements(self, expr: str, alias: str) -> str:
        """A FROM item: one row per element of the JSON array ``expr``; read members
        with :meth:`element_text`."""
        return f"jsonb_array_elements({expr}) AS {alias}"

    def element_text(self, alias: str, key: str) -> str:
        return f"{alias}->>'{key}'"

    def array_length(self, expr: str) -> str:
        return f"jsonb_array_length({expr})"

    def last_element_text(self, expr: str, key: str) -> str:
        return f"{expr} -> (jsonb_array_length({expr}) - 1) ->> '{key}'"

    def json_differs_from_int(self, expr: str, number: str) -> str:
        return f"{expr} <> to_jsonb({number})"

    def uuid_value(self, value: uuid.UUID | str) -> Any:
        """A uuid as a ledger column stores it."""
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))

    def session_options(self, process_name: str) -> dict[str, Any]:
        """The Django ``OPTIONS`` that name a process's sessions."""
        return {"application_name": process_name}

    def sessions_sql(self) -> str:
        """Counts the live sessions of the process named by the one parameter."""
        return "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"


class MySQLDialect(Dialect):
    """MariaDB and MySQL. Django keeps a ``UUIDField`` in MariaDB 10.7+'s native
    ``UUID`` type, elsewhere as 32 hex digits in ``CHAR(32)``; the ledger's uuid
    columns follow, so joins with jobstate's tables compare like with like."""

    name = "mysql"
    now = "NOW(6)"

    def __init__(self, native_uuid: bool) -> None:
        self.native_uuid = native_uuid
        self.uuid_type = "UUID" if native_uuid else "CHAR(32)"

    # JSON_TABLE needs the members' types; these fit every value the checks read.
    _ELEMENT_COLUMNS = (
        "outcome VARCHAR(64) PATH '$.outcome', worker_id VARCHAR(255) PATH '$.worker_id'"
    )

    def json_text(self, expr: str, key: str) -> str:
        return f"JSON_VALUE({expr}, '$.{key}')"

    def same(self, left: str, right: str) -> str:
        return f"{left} <=> {right}"

    def concat(self, *parts: str) -> str:
        return f"CONCAT({', '.join(parts)})"

    def uuid_text(self, column: str) -> str:
        if self.native_uuid:
            return f"CAST({column} AS CHAR)"
        return (
            f"LOWER(CONCAT_WS('-', SUBSTR({column}, 1, 8), SUBSTR({column}, 9, 4), "
            f"SUBSTR({column}, 13, 4), SUBSTR({column}, 17, 4), SUBSTR({column}, 21)))"
        )

    def id_text(self, column: str) -> str:
        return f"CAST({column} AS CHAR)" if self.native_uuid else column

    def in_ids(self, column: str, ids: Sequence[str]) -> tuple[str, list[Any]]:
        if not ids:
            return "FALSE", []
        return f"{column} IN ({', '.join(['%s'] * len(ids))})", list(ids)

    def not_in(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        if not values:
            return "TRUE", []
        return f"{column} NOT IN ({', '.join(['%s'] * len(values))})", list(values)

    def ids_aggregate(self, column: str) -> str:
        return f"GROUP_CONCAT({column} ORDER BY {column})"

    def ids_of_aggregate(self, value: Any) -> tuple[str, ...]:
        return tuple(str(value).split(","))

    def elements(self, expr: str, alias: str) -> str:
        return f"JSON_TABLE({expr}, '$[*]' COLUMNS ({self._ELEMENT_COLUMNS})) AS {alias}"

    def element_text(self, alias: str, key: str) -> str:
        return f"{alias}.{key}"

    def array_length(self, expr: str) -> str:
        return f"JSON_LENGTH({expr})"

    def last_element_text(self, expr: str, key: str) -> str:
        return f"JSON_VALUE({expr}, CONCAT('$[', JSON_LENGTH({expr}) - 1, '].{key}'))"

    def json_differs_from_int(self, expr: str, number: str) -> str:
        return f"NOT (JSON_VALUE({expr}, '$') <=> CAST({number} AS CHAR))"

    def uuid_value(self, value: uuid.UUID | str) -> Any:
        parsed = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
        return str(parsed) if self.native_uuid else parsed.hex

    def session_options(self, process_name: str) -> dict[str, Any]:
        if not _PROCESS_NAME.fullmatch(process_name):
            raise ValueError(f"process name {process_name!r}: letters, digits, '.', '-', '_'")
        return {
            "init_command": "INSERT INTO torture_session (process, connection_id) "
            f"VALUES ('{process_name}', CONNECTION_ID())"
        }

    def sessions_sql(self) -> str:
        return (
            "SELECT count(*) FROM information_schema.PROCESSLIST p "
            "JOIN torture_session s ON s.connection_id = p.ID WHERE s.process = %s"
        )


#: The table MariaDB sessions note themselves in; made with the database, before any
#: Django connection (whose ``init_command`` writes to it) opens.
MYSQL_SESSION_DDL = (
    "CREATE TABLE torture_session (process VARCHAR(64) NOT NULL, "
    "connection_id BIGINT UNSIGNED NOT NULL, PRIMARY KEY (connection_id), KEY (process))"
)


def dialect_of(url: str) -> Dialect:
    """The dialect of ``url``'s server, as far as the URL tells (the settings need no
    more); :func:`connect` completes it from the server's version."""
    scheme = urlsplit(url).scheme
    if scheme in ("mysql", "mariadb"):
        return MySQLDialect(native_uuid=False)
    if scheme in ("postgres", "postgresql", "pgsql"):
        return Dialect()
    raise ValueError(f"the torture run needs a postgres:// or mysql:// URL, not {url!r}")


def dialect_of_django(alias: str = "default") -> Dialect:
    """The dialect of a Django connection of the run (Django must be set up)."""
    from django.db import connections

    connection = connections[alias]
    if connection.vendor == "mysql":
        return MySQLDialect(native_uuid=connection.features.has_native_uuid_field)
    return Dialect()


class Rows:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


class Connection:
    """An autocommit connection of the harness, on either server: ``execute`` returns
    the rows, ``dialect`` spells what differs."""

    def __init__(self, raw: Any, dialect: Dialect) -> None:
        self.raw = raw
        self.dialect = dialect

    def execute(self, sql: str, params: Sequence[Any] | None = None) -> Rows:
        cursor = self.raw.cursor()
        try:
            cursor.execute(sql, params)
            return Rows(list(cursor.fetchall()) if cursor.description else [])
        finally:
            cursor.close()

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(url: str, process_name: str, *, database: bool = True) -> Connection:
    """An autocommit connection to ``url``'s database (or, with ``database=False``, to
    its server only), its session named ``process_name`` on PostgreSQL."""
    dialect = dialect_of(url)
    if isinstance(dialect, MySQLDialect):
        import MySQLdb

        parts = urlsplit(url)
        raw = MySQLdb.connect(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 3306,
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            charset="utf8mb4",
            connect_timeout=10,
            **({"database": parts.path.lstrip("/")} if database else {}),
        )
        raw.autocommit(True)
        conn = Connection(raw, MySQLDialect(native_uuid=_native_uuid(raw)))
        # The database clock in UTC, as Django's connections read it; READ COMMITTED,
        # Django's isolation on MySQL, so the watch sees each commit at once.
        conn.execute("SET time_zone = '+00:00'")
        conn.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return conn
    import psycopg

    target = url if database else _with_database(url, "postgres")
    return Connection(
        psycopg.connect(target, autocommit=True, application_name=process_name), dialect
    )


def _native_uuid(raw: Any) -> bool:
    """Django's rule (``has_native_uuid_field``): MariaDB 10.7 and later."""
    cursor = raw.cursor()
    cursor.execute("SELECT VERSION()")
    version = str(cursor.fetchone()[0])
    cursor.close()
    numbers = tuple(int(n) for n in re.findall(r"\d+", version)[:2])
    return "mariadb" in version.lower() and numbers >= (10, 7)


def _with_database(url: str, name: str) -> str:
    from bench.pg import database_url

    return database_url(url, name)
