"""PostgreSQL plumbing shared by the benchmarks: a database of their own, the run
manifest, server-side counters and a client-side statement counter."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/"

#: Every database the harness drops and recreates must carry this in its name.
NAME_GUARD = "bench"


class BenchError(RuntimeError):
    """The harness cannot run (no server, a refused database name, a contender that did
    not drain)."""


def database_url(server: str, name: str) -> str:
    """``server`` with its database path replaced by ``name``."""
    parts = urlsplit(server)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, ""))


def database_name(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def recreate_database(url: str) -> None:
    """Drop (if present) and create the database ``url`` names. Refuses a name without
    ``bench`` in it, so a mistyped URL cannot drop a real database."""
    name = database_name(url)
    if NAME_GUARD not in name or not name.replace("_", "").isalnum():
        raise BenchError(
            f"refusing to recreate database {name!r}: its name must contain "
            f"{NAME_GUARD!r} and only letters, digits and underscores."
        )
    try:
        with psycopg.connect(database_url(url, "postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        raise BenchError(f"cannot reach PostgreSQL at {url}: {exc}") from exc


def drop_database(url: str) -> None:
    name = database_name(url)
    if NAME_GUARD not in name:
        raise BenchError(f"refusing to drop database {name!r}.")
    with psycopg.connect(database_url(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def setup_django(url: str) -> None:
    """Configure Django with :mod:`bench.settings` on ``url`` (once per process)."""
    os.environ["JOBSTATE_BENCH_DATABASE_URL"] = url
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    import django

    django.setup()


def transactions(conn: psycopg.Connection[Any]) -> int:
    """Committed plus rolled-back transactions of the current database so far."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database "
        "WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def wal_lsn(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    return str(row[0]) if row else "0/0"


def wal_bytes(conn: psycopg.Connection[Any], since: str) -> int:
    row = conn.execute(
        "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)", [since]
    ).fetchone()
    return int(row[0]) if row else 0


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}, {five:.2f}, {fifteen:.2f}"


def manifest(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """What a result needs beside it to be read: machine, server settings, versions."""
    settings = conn.execute(
        "SELECT name, setting, unit FROM pg_settings WHERE source NOT IN ('default', 'override') "
        "ORDER BY name"
    ).fetchall()
    wanted = (
        "synchronous_commit",
        "shared_buffers",
        "max_wal_size",
        "fsync",
        "wal_level",
        "work_mem",
        "max_connections",
        "autovacuum",
        "checkpoint_timeout",
    )
    key_settings = dict(
        conn.execute(
            "SELECT name, setting || coalesce(' ' || unit, '') FROM pg_settings "
            "WHERE name = ANY(%s)",
            [list(wanted)],
        ).fetchall()
    )
    version = conn.execute("SELECT version()").fetchone()
    return {
        **machine_manifest(),
        "postgresql": version[0] if version else "unknown",
        "postgresql_settings": key_settings,
        "postgresql_non_default": [f"{n} = {s}{(' ' + u) if u else ''}" for n, s, u in settings],
    }


def machine_manifest() -> dict[str, Any]:
    """The server-independent part of a manifest: machine, Python, packages, git."""
    cpu = "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    meminfo = Path("/proc/meminfo")
    if meminfo.exists():
        memory = meminfo.read_text().splitlines()[0].split(":", 1)[1].strip()
    packages = {}
    for name in (
        "Django",
        "psycopg",
        "mysqlclient",
        "procrastinate",
        "django-tasks-db",
        "django-tasks",
        "psutil",
    ):
        try:
            packages[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            packages[name] = "not installed"
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        sha, dirty = "unknown", ""
    return {
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "machine": {
            "cpu": cpu,
            "cores": os.cpu_count(),
            "memory": memory,
            "kernel": platform.release(),
            "load_average_at_start": load_average(),
        },
        "python": sys.version.split()[0],
        "packages": packages,
        "git": f"{sha}{' (with uncommitted changes)' if dirty else ''}",
    }


class StatementCounter:
    """Counts statements a process sends through psycopg (sync and async cursors), the
    client's view of round trips. Transaction control (BEGIN/COMMIT) is not counted
    here; the server's transaction counter covers it."""

    count = 0

    @classmethod
    def install(cls) -> None:
        def wrap(original: Any, is_async: bool) -> Any:
            if is_async:

                async def counted_async(self: Any, *args: Any, **kwargs: Any) -> Any:
                    cls.count += 1
                    return await original(self, *args, **kwargs)

                return counted_async

            def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
                cls.count += 1
                return original(self, *args, **kwargs)

            return counted

        psycopg.Cursor.execute = wrap(psycopg.Cursor.execute, False)  # type: ignore[method-assign]
        psycopg.AsyncCursor.execute = wrap(psycopg.AsyncCursor.execute, True)  # type: ignore[method-assign]


@contextmanager
def connect(url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]
