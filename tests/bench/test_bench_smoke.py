"""The admin scale benchmark runs end to end on tiny counts: it seeds, measures every
page on both admin configurations and cleans up after itself. Speed is not asserted
here; the figures belong to the benchmark's own runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from bench.admin_scale import main
from bench.pg import BenchError
from tests.support.servers import postgres_server_url

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"jobs", "jobs_error", "audit", "dashboard"}
#: Measured on jobstate only: the stock admin has nothing like them.
OURS_ONLY = {
    "workers",
    "queues",
    "throughput",
    # bench.admin_pages: the other lists and a row's page of each.
    "runs",
    "notifications",
    "schedules",
    "locks",
    "bulk",
    "run_page",
    "notification_page",
    "schedule_page",
    "worker_page",
}


def _database_exists(url: str, name: str) -> bool:
    maintenance = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(maintenance) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
    return row is not None


@pytest.mark.postgres
@pytest.mark.slow
def test_quick_run_measures_every_page_on_both_configurations_and_drops_its_database(
    tmp_path: Path,
) -> None:
    name = f"jobstate_bench_smoke_{os.getpid()}"
    url = postgres_server_url(name)
    out = tmp_path / "admin-scale.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.admin_scale",
            "--quick",
            "--jobs",
            "2000",
            "--audit",
            "2000",
            "--warm",
            "1",
            "--url",
            url,
            "--json",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads(out.read_text())
    assert report["rows"] == {"jobs": 2000, "audit": 2000}
    assert sum(report["database"]["jobs_by_status"].values()) == 2000
    assert report["database"]["server_version"]
    measured = {(m["config"], m["page"]) for m in report["measurements"]}
    assert measured == {(config, page) for config in ("jobstate", "stock") for page in PAGES} | {
        ("jobstate", page) for page in OURS_ONLY
    }
    for m in report["measurements"]:
        assert m["queries"] > 0, m
        assert m["median_ms"] > 0, m
    assert "stock ÷ jobstate" in result.stdout
    console = {m["page"]: m for m in report["console"]["pages"]}
    assert {"search_input", "search_task", "search_worker", "job_page"} <= set(console)
    for m in console.values():
        assert m["queries"] > 0, m
    bulk = report["console"]["bulk"]
    assert bulk["state"] == "done" and bulk["done"] == bulk["matching"] > 0
    assert bulk["statements"] > 0 and bulk["slowest_statement_ms"] > 0
    assert "bulk requeue over" in result.stdout and "search: input key" in result.stdout
    assert "jobs, status = error" in result.stdout
    assert "workers page" in result.stdout and "throughput chart (24 h)" in result.stdout
    assert not _database_exists(url, name), "the benchmark left its database behind"


@pytest.mark.parametrize(
    "url",
    [
        "postgres://postgres@127.0.0.1:5432/jobstate",
        "postgres://postgres@127.0.0.1:5432/production",
        "postgres://postgres@127.0.0.1:5432/",
        "postgres://postgres@127.0.0.1:5432/bench; DROP TABLE x",
        "sqlite:///jobstate_bench.sqlite3",
    ],
)
def test_refuses_a_database_it_must_not_drop(url: str) -> None:
    with pytest.raises(BenchError):
        main(["--quick", "--url", url])
