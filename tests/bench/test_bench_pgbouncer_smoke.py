"""The PgBouncer benchmark runs end to end on tiny counts: workers through a PgBouncer of
the harness's own (pool of 2) and workers connected directly drain every task once,
then PgBouncer is killed and started again mid-drain and still no task is lost or runs
twice and no worker exits; the database never sees more server connections than the
pool, the CPU each arm spent is reported by who spent it, and the harness drops its
database. Speed is not asserted here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.support.bench_runs import postgres_database_exists, run_bench

TASKS = 120


@pytest.mark.postgres
@pytest.mark.slow
def test_workers_through_pgbouncer_killed_mid_drain_lose_nothing(tmp_path: Path) -> None:
    name = f"jobstate_bench_pgbouncer_smoke_{os.getpid()}"
    out = tmp_path / "pgbouncer.json"
    logs = tmp_path / "logs"
    result = run_bench(
        name,
        out,
        *("pgbouncer", "--workers", "3", "--direct", "2", "--pool-size", "2"),
        *("--tasks", str(TASKS), "--kill-at", "0.5", "--lease", "2", "--logs", str(logs)),
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    arms = {arm["name"]: arm for arm in json.loads(out.read_text())["pgbouncer"]["arms"]}
    assert sorted(arms) == ["direct", "pooled", "pooled-killed"]
    assert [arms[name]["workers"] for name in ("pooled", "direct")] == [3, 2]
    for arm in arms.values():
        assert arm["tasks"] == TASKS and arm["seconds"] > 0
        assert (arm["not_done"], arm["lost"], arm["ran_twice"]) == (0, 0, 0), arm
        assert arm["exited_early"] == [] and arm["exited_badly"] == [], arm
        assert arm["tracebacks"] == 0, arm
        # Where the drain's CPU went: the workers always spent some. The server's share
        # of 120 tasks can stay under the clock tick /proc counts in (10 ms), and a
        # killed pooler's server connections are left out with what they spent.
        assert arm["cpu_ms_per_task"]["workers"] > 0 and arm["cpu_ms_per_task"]["server"] >= 0
        assert 0 < arm["cores_busy"] <= 1, arm
    assert arms["direct"]["cpu_ms_per_task"]["pgbouncer"] == 0
    for name in ("pooled", "pooled-killed"):
        assert 0 < arms[name]["most_server_connections"] <= 2
    killed = arms["pooled-killed"]
    assert killed["kills"] == 1
    # The kill cut the workers' connections: they said so and tried again.
    assert killed["retries_logged"] > 0
    assert arms["pooled"]["kills"] == 0 and arms["pooled"]["retries_logged"] == 0
    assert sorted(path.name for path in logs.glob("pooled-killed-*.log")) == [
        f"pooled-killed-{n}.log" for n in range(3)
    ]
    assert not postgres_database_exists(name)
