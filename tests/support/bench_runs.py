"""The benchmark harness run as its users run it, for the bench smoke tests: ``python -m
bench --server ... --database ... --output ... <command>`` in a child process, and
whether a run left its database behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg

from tests.support.servers import postgres_server_url

ROOT = Path(__file__).resolve().parents[2]


def run_bench(
    database: str,
    output: Path,
    *command: str,
    server: str | None = None,
    timeout: float = 240,
) -> subprocess.CompletedProcess[str]:
    """``python -m bench`` on ``server`` (the test run's PostgreSQL server by default),
    making and dropping ``database``, writing its result to ``output``; the child sets
    Django up itself, under the harness's own settings."""
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [
            *(sys.executable, "-m", "bench", "--server", server or postgres_server_url()),
            *("--database", database, "--output", str(output), *command),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def postgres_database_exists(name: str) -> bool:
    """Whether the test run's PostgreSQL server has a database called ``name``."""
    with psycopg.connect(postgres_server_url("postgres"), autocommit=True) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return row is not None
