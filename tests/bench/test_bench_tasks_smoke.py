"""The task benchmark runs end to end on tiny counts: jobstate_worker at one and at two
threads per process, django-tasks-db's db_worker and procrastinate's worker each drain
every task they were given with their own command, in rounds whose order turns, on
connections they keep; the rows against db_worker name both thread counts, the start-up
row comes out, and the harness drops its database. Speed is not asserted here; the
figures belong to the benchmark's runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.support.servers import postgres_server_url

ROOT = Path(__file__).resolve().parents[2]
TASKS = 40


@pytest.mark.postgres
@pytest.mark.slow
def test_every_contender_drains_every_task_and_the_database_is_dropped(tmp_path: Path) -> None:
    name = f"jobstate_bench_tasks_smoke_{os.getpid()}"
    out = tmp_path / "tasks.json"
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--server",
            postgres_server_url(),
            "--database",
            name,
            "--output",
            str(out),
            "tasks",
            "--workers",
            "2",
            "--tasks",
            str(TASKS),
            "--repeats",
            "2",
            "--concurrency",
            "1,2",
            "--startups",
            "1",
            "--samples",
            "3",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())["tasks"]
    assert [(run["contender"], run["threads"]) for run in report["drain"]] == [
        ("jobstate", 1),
        ("jobstate", 2),
        ("django-tasks-db", 1),
        ("procrastinate", 1),
    ]
    for run in report["drain"]:
        assert run["tasks"] == TASKS and run["workers"] == 2
        assert len(run["runs"]) == 2 and min(run["runs"]) > 0
        # Connections are kept: a contender reconnecting per task would open one each.
        assert 0 < max(run["connections"]) < TASKS, run
    # The contenders take turns: the second round starts with the second contender.
    rounds = [line for line in result.stdout.splitlines() if line.startswith("  round ")]
    assert len(rounds) == 8
    assert rounds[0].startswith("  round 1, `jobstate_worker --concurrency 1`")
    assert rounds[4].startswith("  round 2, `jobstate_worker --concurrency 2`")
    rows = report["rows"]
    assert (
        "| `jobstate_worker --concurrency 1` (2 processes x 1 thread) vs `db_worker` "
        "(2 processes x 1 thread) |" in rows
    )
    assert (
        "| `jobstate_worker --concurrency 2` (2 processes x 2 threads) vs `db_worker` "
        "(2 processes x 1 thread) |" in rows
    )
    assert "| worker start-up to first task" in rows
    for contender in ("jobstate", "django-tasks-db"):
        [seconds] = report["startup_seconds"][contender]
        assert 0 < seconds < 30
    assert any(line.endswith("(goal 2.5x)") for line in report["targets"])
    assert 0 <= report["concurrency"]["start_spread_seconds"] < 8
    for figures in (report["latency_listen_notify"], report["latency_polling"]):
        assert figures["p50_ms"] > 0
    with psycopg.connect(postgres_server_url("postgres"), autocommit=True) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    assert left is None
