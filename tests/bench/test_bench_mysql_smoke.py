"""The MariaDB drain benchmark runs end to end on tiny counts: the raw floor (one row and
k rows at a time) and jobstate (one job and k jobs at a time) each drain every job they
were given through mysqlclient, the round trips are counted in the workers, the ratios
to the floor are printed, and the harness drops its database. Speed is not asserted
here; the figures belong to the benchmark's own runs (docs/benchmarks.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.mysql import connect, execute
from tests.support.bench_runs import ROOT, run_bench
from tests.support.servers import mysql_server_url

JOBS = 120


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.slow
def test_the_mariadb_drain_empties_every_contender_and_drops_its_database(tmp_path: Path) -> None:
    name = f"jobstate_bench_mysql_smoke_{os.getpid()}"
    out = tmp_path / "drain.json"
    server = mysql_server_url()
    result = run_bench(
        name,
        out,
        *("drain", "--workers", "2", "--jobs", str(JOBS), "--repeats", "1", "--batch", "10"),
        server=server,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads(out.read_text())
    cells = report["drain"]["cells"]
    assert [cell["contender"] for cell in cells] == [
        "raw",
        "raw-batch",
        "jobstate",
        "jobstate-batch",
    ]
    for cell in cells:
        assert cell["done"] == cell["jobs"] == JOBS, cell
        assert cell["statements"] > 0, cell
    raw = next(cell for cell in cells if cell["contender"] == "raw")
    # Per job: the locking SELECT and the UPDATE of the claim, the guarded completion,
    # and two commits; plus each worker's last SELECT that found nothing, and its commit.
    assert raw["statements"] == 3 * JOBS + 2
    assert raw["transactions"] == 2 * JOBS + 2
    assert report["manifest"]["mysql"].split(".")[0].isdigit()
    assert "| jobstate | 2 |" in result.stdout
    assert "jobstate / raw on MariaDB at 2 workers:" in result.stdout
    conn = connect(server, database=False)
    try:
        left = execute(conn, "SHOW DATABASES LIKE %s", [name])
    finally:
        conn.close()
    assert left == [], "the benchmark left its database behind"


@pytest.mark.backend
def test_the_harness_refuses_to_drop_a_database_without_bench_in_its_name() -> None:
    result = subprocess.run(
        [
            *(sys.executable, "-m", "bench", "--server", "mysql://root@127.0.0.1:3306/"),
            *("--database", "jobstate", "drain", "--jobs", "10"),
        ],
        cwd=ROOT,
        env={key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "refusing to recreate database 'jobstate'" in result.stderr
