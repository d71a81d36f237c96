"""A short restart run (``python -m reliability.restart``): a private PostgreSQL cluster
is restarted twice under load (once ``-m fast``, once ``-m immediate``) while a producer,
two workers, the relay, the runner and a reaper are busy. Every component must
reconnect by itself and carry on, with nothing committed lost and no notification
skipped. The long version is the same command with a longer ``--duration``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def restart_run(*options: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name != "DJANGO_SETTINGS_MODULE"}
    return subprocess.run(
        [sys.executable, "-m", "reliability.restart", *options],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.mark.backend
@pytest.mark.slow
def test_without_postgresql_server_binaries_the_run_fails_loudly() -> None:
    done = restart_run("--duration", "5", "--pg-bindir", str(ROOT / "no-such-directory"))
    assert done.returncode == 2
    assert "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.postgres
@pytest.mark.slow
def test_every_component_rides_out_postgresql_restarts() -> None:
    done = restart_run("--duration", "30", "--restarts", "2", "--json")
    assert done.stdout.strip(), done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["violations"] == [], summary
    assert done.returncode == 0, done.stderr
    assert [restart["mode"] for restart in summary["restarts"]] == ["fast", "immediate"]
    # Each component met at least one failed store call and carried on after it.
    reconnects = summary["reconnects"]
    assert set(reconnects) == {"producer", "worker-1", "worker-2", "relay", "runner", "reaper"}
    assert all(count >= 1 for count in reconnects.values()), reconnects
    jobs, notes, runs = (summary["figures"][key] for key in ("jobs", "notifications", "runs"))
    assert jobs["acknowledged"] > 0 and jobs["done"] == jobs["in_database"] >= jobs["acknowledged"]
    assert notes["created"] == notes["delivered"] == jobs["done"]
    assert notes["received"] >= notes["created"]
    assert runs["reported"] > 0 and runs["left_running"] == 0
