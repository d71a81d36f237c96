"""The drain benchmark runs end to end on tiny counts: every contender (the raw SQL
floor, jobstate one job at a time with no queue paused and with another target's
paused, in batches and on the seed's outbox path, procrastinate, django-tasks-db)
drains every job it was given under every setting that changes its statements, and
the harness cleans up after itself. Speed is not asserted
here; the figures belong to the benchmark's own runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.contenders import CONTENDERS
from bench.pg import BenchError, recreate_database
from tests.support.bench_runs import postgres_database_exists, run_bench

JOBS = 200


@pytest.mark.postgres
@pytest.mark.slow
def test_every_contender_drains_every_job_and_the_database_is_dropped(tmp_path: Path) -> None:
    name = f"jobstate_bench_drain_smoke_{os.getpid()}"
    out = tmp_path / "drain.json"
    result = run_bench(
        name,
        out,
        *("drain", "--workers", "2", "--jobs", str(JOBS), "--repeats", "1"),
        *("--batch", "20", "--memory-every", "50"),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads(out.read_text())
    cells = report["drain"]["cells"]
    assert {cell["contender"] for cell in cells} == set(CONTENDERS)
    for cell in cells:
        assert cell["done"] == cell["jobs"] == JOBS, cell
        assert cell["transactions"] > 0, cell
        assert cell["statements"] > 0, cell
    settings = {(cell["contender"], cell["setting"]) for cell in cells}
    # Every jobstate contender under Django's defaults, with prepared statements, and
    # with jobstate's own preparation off; the peers under what changes theirs.
    for name in (
        "jobstate",
        "jobstate-batch",
        "jobstate-paused",
        "jobstate-seed",
        "jobstate-seed-2",
    ):
        assert {s for n, s in settings if n == name} == {"defaults", "prepared", "unprepared"}
    assert {s for n, s in settings if n == "procrastinate"} == {"defaults", "prepared"}
    seed = [cell for cell in cells if cell["contender"].startswith("jobstate-seed")]
    # A claim and a completion per job; besides, each worker's last claim that found
    # nothing and, once per worker, the claim's registration of its claimer on the
    # Workers page (a few statements): nothing more per job.
    for cell in seed:
        assert 2 <= cell["statements"] - 2 * cell["done"] <= 10, cell
    ours = [c for c in cells if (c["contender"], c["setting"]) == ("jobstate", "defaults")]
    assert ours[0]["rss_growth"] is not None, "worker memory was not sampled"
    manifest = report["manifest"]
    assert manifest["postgresql"].startswith("PostgreSQL")
    assert manifest["postgresql_settings"]["synchronous_commit"] in {"on", "off", "local"}
    assert "| jobstate | defaults | 2 |" in result.stdout
    assert "jobstate-seed [defaults] / faster peer at 2 workers" in result.stdout
    assert "jobstate-batch [prepared] / jobstate [prepared] at 2 workers" in result.stdout
    assert not postgres_database_exists(name), "the benchmark left its database behind"


@pytest.mark.postgres
@pytest.mark.slow
def test_the_profile_splits_a_seed_job_and_names_where_the_python_goes(tmp_path: Path) -> None:
    name = f"jobstate_bench_profile_smoke_{os.getpid()}"
    out = tmp_path / "profile.json"
    result = run_bench(
        name,
        out,
        *("profile", "--jobs", "100", "--notifications", "2", "--cprofile", "5"),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    profile = json.loads(out.read_text())["profile"]
    assert (profile["contender"], profile["setting"], profile["jobs"]) == (
        "jobstate-seed-2",
        "defaults",
        100,
    )
    # The claim and the one-statement completion per job, and a last claim finding none.
    assert profile["statements"] == pytest.approx(2 + 1 / 100)
    assert profile["wall_us"] >= profile["worker_cpu_us"] > 0
    assert "function calls" in profile["cprofile"]
    assert not postgres_database_exists(name), "the benchmark left its database behind"


@pytest.mark.postgres
@pytest.mark.slow
def test_the_sweeps_run_reaps_and_prunes_every_row_and_reports_its_targets(
    tmp_path: Path,
) -> None:
    name = f"jobstate_bench_sweeps_smoke_{os.getpid()}"
    out = tmp_path / "sweeps.json"
    result = run_bench(
        name,
        out,
        *("sweeps", "--rows", "3000", "--stale", "300", "--audit", "2000", "--baseline", "1"),
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    sweeps = json.loads(out.read_text())["sweeps"]
    assert sweeps["reap"]["rows"] == 300 and sweeps["reap"]["complete"]
    assert sweeps["prune"]["rows"] == 2000 and sweeps["prune"]["complete"]
    assert sweeps["reap"]["traffic_before"]["calls"] > 0  # the claimer ran beside it
    # 3,000 rows is under METRICS_EXACT_LIMIT: both paths count exactly.
    assert sweeps["metrics_snapshot"]["estimated"]["estimated_statuses"] == []
    assert len(sweeps["targets"]) == 5
    assert "metrics snapshot at 3,000 jobs" in result.stdout


@pytest.mark.parametrize(
    "name", ["jobstate", "production", "bench; DROP TABLE x", "bench-name", ""]
)
def test_refuses_to_recreate_a_database_it_must_not_drop(name: str) -> None:
    with pytest.raises(BenchError):
        recreate_database(f"postgres://postgres@127.0.0.1:5432/{name}")


@pytest.mark.postgres
@pytest.mark.slow
def test_the_call_count_drains_every_path_and_reports_per_job_figures(tmp_path: Path) -> None:
    name = f"jobstate_bench_calls_smoke_{os.getpid()}"
    out = tmp_path / "calls.json"
    result = run_bench(
        name, out, "calls", "--jobs", "60", "--batch", "25", "--tasks", "40", timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    calls = json.loads(out.read_text())["calls"]
    assert set(calls) == {"one-job", "batch", "seed", "seed-2", "worker", "worker-policy"}
    for row in ("one-job", "batch", "seed", "seed-2"):
        path = calls[row]
        assert path["jobs"] == 60
        # Claiming and completing a job is real work: far more than a handful of calls.
        assert path["calls_per_job"] > 50 and path["cpu_us_per_job"] > 0
    for row in ("worker", "worker-policy"):
        worker = calls[row]
        assert worker["tasks"] == 40 and worker["calls_per_task"] > 50
        # One statement per task: the report of one attempt claims the next.
        assert 0.9 <= worker["statements_per_task"] <= 1.5, worker
    assert "Python calls per job" in result.stdout
    assert "Python calls per task" in result.stdout
