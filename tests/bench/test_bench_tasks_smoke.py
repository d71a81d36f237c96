"""The task benchmark runs end to end on tiny counts: jobstate_worker at one and at two
threads per process (on the no-op task, then on the same task with a policy),
django-tasks-db's db_worker and procrastinate's worker each drain every task they were
given with their own command, in rounds whose order turns, on connections they keep; the
rows against db_worker name both thread counts, the policy rows and the start-up row
come out, and the harness drops its database. The store drains (the seed path, the
raw floor, the pause probe) and MariaDB's give their rows, each with its goal and
verdict. Speed is not asserted here; the figures belong to the benchmark's runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.mysql import connect, execute
from tests.support.bench_runs import postgres_database_exists, run_bench
from tests.support.servers import mysql_server_url

TASKS = 40
JOBS = 30


@pytest.mark.postgres
@pytest.mark.slow
def test_every_contender_drains_every_task_and_the_database_is_dropped(tmp_path: Path) -> None:
    name = f"jobstate_bench_tasks_smoke_{os.getpid()}"
    out = tmp_path / "tasks.json"
    result = run_bench(
        name,
        out,
        *("tasks", "--workers", "2", "--tasks", str(TASKS), "--repeats", "2"),
        *("--concurrency", "1,2", "--startups", "1", "--samples", "3"),
        # The store drains' rows have a test of their own, below.
        *("--skip", "seed,floor,pause"),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    # The workers loaded jobstate compiled, as an installed jobstate is.
    assert json.loads(out.read_text())["bytecode"]["byte_compiled"] == ["jobstate", "bench"]
    assert result.stdout.startswith("bytecode: jobstate and bench compiled first")
    report = json.loads(out.read_text())["tasks"]
    assert [(run["contender"], run["threads"]) for run in report["drain"]] == [
        ("jobstate", 1),
        ("jobstate", 2),
        ("jobstate-policy", 1),
        ("jobstate-policy", 2),
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
    assert len(rounds) == 12
    assert rounds[0].startswith("  round 1, `jobstate_worker --concurrency 1`")
    assert rounds[6].startswith("  round 2, `jobstate_worker --concurrency 2`")
    assert any(", a task with a policy: " in line for line in rounds[:6])
    rows = report["rows"]
    assert (
        "| `jobstate_worker --concurrency 1` (2 processes x 1 thread) vs `db_worker` "
        "(2 processes x 1 thread) |" in rows
    )
    assert (
        "| `jobstate_worker --concurrency 2` (2 processes x 2 threads) vs `db_worker` "
        "(2 processes x 1 thread) |" in rows
    )
    for threads, side in ((1, "2 processes x 1 thread"), (2, "2 processes x 2 threads")):
        assert (
            "| a task with a policy vs the same task without one: `jobstate_worker "
            f"--concurrency {threads}`, with ({side}) vs without ({side}) |" in rows
        )
    policy = [row for row in report["goals"] if row["path"].startswith("a task with a policy")]
    assert [row["goal"] for row in policy] == [">= 0.95x", ">= 0.95x"]
    verdicts = [line for line in report["targets"] if "a task with a policy vs" in line]
    assert len(verdicts) == 2 and all(line.startswith(("met: ", "NOT met: ")) for line in verdicts)
    assert "| worker start-up to first task" in rows
    for contender in ("jobstate", "django-tasks-db"):
        [seconds] = report["startup_seconds"][contender]
        assert 0 < seconds < 30
    assert any(line.endswith("(goal >= 2.5x)") for line in report["targets"])
    assert report["store_cells"] == [] and report["mysql_cells"] == []
    assert 0 <= report["concurrency"]["start_spread_seconds"] < 8
    for figures in (report["latency_listen_notify"], report["latency_polling"]):
        assert figures["p50_ms"] > 0
    assert not postgres_database_exists(name)


@pytest.mark.postgres
@pytest.mark.slow
def test_the_store_and_mariadb_rows_come_out_with_their_goals(tmp_path: Path) -> None:
    name = f"jobstate_bench_tasks_rows_smoke_{os.getpid()}"
    out = tmp_path / "tasks.json"
    server = mysql_server_url()
    result = run_bench(
        name,
        out,
        *("tasks", "--workers", "1", "--jobs", str(JOBS), "--repeats", "1"),
        *("--skip", "workers,policy,startup,concurrency,latency"),
        *("--mysql", server, "--mysql-jobs", str(JOBS), "--batch", "10"),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())["tasks"]
    assert report["drain"] == [] and report["startup_seconds"] == {}
    cells = {(cell["contender"], cell["setting"]): cell for cell in report["store_cells"]}
    # Django's default connection settings for every Django contender.
    assert set(cells) == {
        ("jobstate-seed", "defaults"),
        ("procrastinate", "defaults"),
        ("django-tasks-db", "any"),
        ("raw", "psycopg"),
        ("jobstate", "defaults"),
        ("jobstate-paused", "defaults"),
    }
    mariadb = {cell["contender"] for cell in report["mysql_cells"]}
    assert mariadb == {"raw", "raw-batch", "jobstate", "jobstate-batch"}
    for cell in [*report["store_cells"], *report["mysql_cells"]]:
        assert cell["done"] == cell["jobs"] == JOBS and cell["workers"] == 1, cell
    goals = {row["path"].split(":")[0]: row for row in report["goals"]}
    assert {path: row["goal"] for path, row in goals.items()} == {
        "seed path": ">= 2x",
        "`claim_next_inhub_job` + `complete_claimed_job` (1 process x 1 thread) vs the raw "
        "psycopg floor": ">= 0.6x",
        "pause probe": "no goal",
        "MariaDB one-job drain": ">= 0.5x",
        "MariaDB batch claims": ">= 0.3x",
    }
    for row in goals.values():
        assert row["ratio"] > 0 and row["met"] in (True, False, None), row
        # Every side of a row names its processes and threads.
        assert row["path"].count("(1 process x 1 thread)") == 2, row["path"]
    assert "| pause probe: `claim_next_inhub_job` + `complete_claimed_job` with" in report["rows"]
    assert sum(line.startswith(("met: ", "NOT met: ")) for line in report["targets"]) == 4
    assert not postgres_database_exists(name)
    conn = connect(server, database=False)
    try:
        assert execute(conn, "SHOW DATABASES LIKE %s", [name]) == []
    finally:
        conn.close()


@pytest.mark.backend  # the harness's server is read from the test run's databases
def test_a_mistyped_part_is_refused_before_any_database_is_made(tmp_path: Path) -> None:
    result = run_bench(
        "jobstate_bench_tasks_refused", tmp_path / "out.json", "tasks", "--skip", "seeds"
    )
    assert result.returncode == 1
    assert "--skip takes some of workers, policy, seed, floor, pause" in result.stderr
    assert not (tmp_path / "out.json").exists()
