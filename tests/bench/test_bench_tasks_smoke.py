"""The task benchmark runs end to end on tiny counts: each contender (jobstate_worker,
django-tasks-db's db_worker, procrastinate's worker) drains every task it was given with
its own command, the concurrency and latency figures come out, and the harness drops
its database. Speed is not asserted here; the figures belong to the benchmark's runs."""

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
TASKS = 60


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
            "--samples",
            "5",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())["tasks"]
    assert [run["contender"] for run in report["drain"]] == [
        "jobstate",
        "django-tasks-db",
        "procrastinate",
    ]
    for run in report["drain"]:
        assert run["tasks"] == TASKS and len(run["runs"]) == 1 and run["runs"][0] > 0
    assert 0 <= report["concurrency"]["start_spread_seconds"] < 8
    for figures in (report["latency_listen_notify"], report["latency_polling"]):
        assert figures["p50_ms"] > 0
    with psycopg.connect(postgres_server_url("postgres"), autocommit=True) as conn:
        left = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    assert left is None
