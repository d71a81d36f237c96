"""MariaDB / MySQL plumbing of the benchmarks (``--server mysql://...``): a database of
their own, the run manifest, and a client-side round-trip counter.

mysqlclient (``MySQLdb``) is the driver, as Django's MySQL backend uses it: the raw
floor and jobstate talk to the server through the same library.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

from bench.pg import NAME_GUARD, BenchError, database_name, load_average, machine_manifest

SCHEMES = ("mysql", "mariadb")


def is_mysql(url: str) -> bool:
    return urlsplit(url).scheme in SCHEMES


def _params(url: str, database: str | None) -> dict[str, Any]:
    parts = urlsplit(url)
    params: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": parts.port or 3306,
        "user": unquote(parts.username or "root"),
        "password": unquote(parts.password or ""),
        "charset": "utf8mb4",
        "connect_timeout": 5,
    }
    if database:
        params["database"] = database
    return params


def connect(url: str, *, database: bool = True, autocommit: bool = True) -> Any:
    """A MySQLdb connection to ``url``'s database (or to the server only), in UTC,
    READ COMMITTED (Django's default isolation on MySQL)."""
    import MySQLdb

    try:
        conn = MySQLdb.connect(**_params(url, database_name(url) if database else None))
    except MySQLdb.OperationalError as exc:
        raise BenchError(f"cannot reach MariaDB/MySQL at {url}: {exc}") from exc
    conn.autocommit(autocommit)
    cursor = conn.cursor()
    cursor.execute("SET time_zone = '+00:00'")
    cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
    cursor.close()
    return conn


@contextmanager
def connected(url: str, *, database: bool = True) -> Iterator[Any]:
    conn = connect(url, database=database)
    try:
        yield conn
    finally:
        conn.close()


def execute(conn: Any, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    """Run ``sql`` and return its rows (none for a statement without a result)."""
    cursor = conn.cursor()
    try:
        cursor.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []
    finally:
        cursor.close()


def _guarded(url: str) -> str:
    name = database_name(url)
    if NAME_GUARD not in name or not re.fullmatch(r"\w+", name):
        raise BenchError(
            f"refusing to recreate database {name!r}: its name must contain "
            f"{NAME_GUARD!r} and only letters, digits and underscores."
        )
    return name


def recreate_database(url: str) -> None:
    """Drop (if present) and create the database ``url`` names; only a name with
    ``bench`` in it is accepted."""
    name = _guarded(url)
    with connected(url, database=False) as conn:
        execute(conn, f"DROP DATABASE IF EXISTS `{name}`")
        execute(conn, f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")


def drop_database(url: str) -> None:
    name = _guarded(url)
    with connected(url, database=False) as conn:
        execute(conn, f"DROP DATABASE IF EXISTS `{name}`")


#: Server variables a figure depends on (durability, buffer pool, isolation).
KEY_VARIABLES = (
    "version",
    "innodb_flush_log_at_trx_commit",
    "sync_binlog",
    "log_bin",
    "innodb_buffer_pool_size",
    "innodb_log_file_size",
    "innodb_doublewrite",
    "max_connections",
    "tx_isolation",
    "transaction_isolation",
)


def manifest(conn: Any) -> dict[str, Any]:
    """The machine, Python, package and git part, and the server's version and key
    variables."""
    rows = execute(
        conn,
        "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_VARIABLES "
        f"WHERE VARIABLE_NAME IN ({', '.join(['%s'] * len(KEY_VARIABLES))})",
        [name.upper() for name in KEY_VARIABLES],
    )
    variables = {str(name).lower(): str(value) for name, value in rows}
    return {
        **machine_manifest(),
        "mysql": variables.get("version", "unknown"),
        "mysql_settings": variables,
    }


def server_cpu_seconds() -> float | None:
    """User + system CPU seconds of the local ``mariadbd`` (or ``mysqld``) so far; the
    whole server, so other databases' clients count too. ``None`` without psutil or a
    local server."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is in the bench dependency group
        return None
    total = None
    for process in psutil.process_iter(["name"]):
        if process.info["name"] in ("mariadbd", "mysqld"):
            try:
                times = process.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            total = (total or 0.0) + times.user + times.system
    return total


class RoundTrips:
    """Counts what a process sends through MySQLdb: statements (cursor ``execute``) and
    transaction control (``commit``, ``rollback``, ``autocommit`` switches, which Django
    sends around every ``atomic`` block). MariaDB has no per-database transaction
    counter to read from outside, so both are counted here, in the client."""

    statements = 0
    transactions = 0

    @classmethod
    def install(cls) -> None:
        from MySQLdb import connections, cursors

        def counted(original: Any, field: str) -> Any:
            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                setattr(cls, field, getattr(cls, field) + 1)
                return original(self, *args, **kwargs)

            return wrapper

        cursors.BaseCursor.execute = counted(cursors.BaseCursor.execute, "statements")
        for name in ("commit", "rollback", "autocommit"):
            method = getattr(connections.Connection, name)
            setattr(connections.Connection, name, counted(method, "transactions"))


__all__ = [
    "RoundTrips",
    "connect",
    "connected",
    "drop_database",
    "execute",
    "is_mysql",
    "load_average",
    "manifest",
    "recreate_database",
    "server_cpu_seconds",
]
