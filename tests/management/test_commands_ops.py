"""``reap_stale`` (every reaping sweep), ``prune_jobstate`` and the demo's live traffic:
output, exit status and what they change, through ``call_command`` and through real
processes, including two cron-style reapers started at the same instant."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError, OutputWrapper
from django.db.models.functions import Now

from jobstate.management.commands._common import ProgressLine
from jobstate.models import AuditEntry, Job, JobRun, RuntimeLock
from jobstate.stores.base import JobRunStatus, JobStatus
from jobstate.testing.factories import (
    AuditEntryFactory,
    JobFactory,
    JobRunFactory,
    RuntimeLockFactory,
)
from tests.support.processes import Terminal, child_env, finish, manage_py

pytestmark = pytest.mark.django_db(transaction=True)

LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def run(*args: str, **options: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def failing(*args: str, **options: Any) -> CommandError:
    with pytest.raises(CommandError) as raised:
        run(*args, **options)
    return raised.value


# --- seeding ----------------------------------------------------------------------------


def stale_runs(count: int) -> None:
    JobRunFactory.bulk_create_batch(
        count,
        running=True,
        job_key="tests.cron",
        trigger_source="SCHEDULER",
        started_at=LONG_AGO,
        heartbeat_at=LONG_AGO,
    )


def stale_dispatched(count: int) -> list[uuid.UUID]:
    jobs = JobFactory.bulk_create_batch(
        count, dispatched=True, executor_id="gone", claimed_at=LONG_AGO, lease_until=LONG_AGO
    )
    return [job.id for job in jobs]


def expired_leases(count: int, attempts: int = 0) -> list[uuid.UUID]:
    jobs = JobFactory.bulk_create_batch(
        count,
        running=True,
        executor_id="gone",
        claimed_at=LONG_AGO,
        lease_until=LONG_AGO,
        attempts=attempts,
    )
    return [job.id for job in jobs]


def stale_queued(count: int) -> list[uuid.UUID]:
    ids = [job.id for job in JobFactory.bulk_create_batch(count, queued=True)]
    Job.objects.filter(id__in=ids).update(created_at=Now() - timedelta(hours=2))
    return ids


def expired_locks(count: int) -> None:
    RuntimeLockFactory.bulk_create_batch(count, owner="gone", expires_at=LONG_AGO)


def old_history() -> None:
    for days in (60, 45, 1):
        AuditEntryFactory(event="received", ts=datetime.now(UTC) - timedelta(days=days))
    done = JobFactory.create_batch(2, done=True)
    Job.objects.filter(id=done[0].id).update(updated_at=Now() - timedelta(days=20))
    for at in (datetime.now(UTC) - timedelta(days=40), datetime.now(UTC)):
        JobRunFactory(skipped=True, job_key="tests.cron", started_at=at, finished_at=at)


# --- reap_stale: every reaping sweep ----------------------------------------------------


def test_reap_stale_runs_every_sweep_and_says_what_each_did(settings: Any) -> None:
    settings.JOBSTATE = {**settings.JOBSTATE, "WORKER_ATTEMPT_LIMIT": 2}
    stale_runs(2)
    stale_queued(1)
    stale_dispatched(3)
    expired_leases(1)
    expired_leases(1, attempts=1)
    expired_locks(1)

    out, err = run("reap_stale")

    assert err == ""
    assert out.splitlines() == [
        "Reaped 2 stale job runs (RUNNING -> TIMED_OUT).",
        "Expired 1 job that waited too long in the queue (queued -> error).",
        "Requeued 3 jobs whose executor stopped renewing their lease (dispatched -> queued).",
        "Recovered 2 jobs whose worker lease expired (1 requeued, 1 failed).",
        "Released 1 expired runtime lock (deleted).",
    ]
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 4
    assert Job.objects.filter(status=JobStatus.ERROR).count() == 2
    assert not RuntimeLock.objects.exists()
    assert run("reap_stale") == ("", "")


def test_reap_stale_json_prints_every_count_even_zero() -> None:
    stale_dispatched(2)
    out, _ = run("reap_stale", "--json")
    assert json.loads(out) == {
        "runs": 0,
        "queued": 0,
        "dispatched": 2,
        "leases": 0,
        "leases_requeued": 0,
        "leases_failed": 0,
        "tasks": 0,
        "tasks_requeued": 0,
        "tasks_failed": 0,
        "outbox": 0,
        "outbox_rearmed": 0,
        "outbox_dead": 0,
        "locks": 0,
        "dry_run": False,
        "complete": True,
    }


def test_reap_stale_dry_run_counts_every_sweep_and_writes_nothing() -> None:
    stale_runs(1)
    stale_dispatched(2)
    expired_leases(3)
    out, _ = run("reap_stale", "--dry-run")
    assert out.splitlines() == [
        "Would reap 1 stale job run (dry run: nothing was written).",
        "Would requeue 2 jobs whose executor stopped renewing their lease "
        "(dry run: nothing was written).",
        "Would recover 3 jobs whose worker lease expired (dry run: nothing was written).",
    ]
    assert JobRun.objects.running().count() == 1
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 0
    assert not AuditEntry.objects.exists()


def test_reap_stale_verbosity_two_lists_every_sweep() -> None:
    out, _ = run("reap_stale", verbosity=2)
    assert len(out.splitlines()) == 7
    assert out.splitlines()[0] == "Reaped 0 stale job runs (RUNNING -> TIMED_OUT)."


def test_reap_stale_time_budget_leaves_the_rest_for_the_next_run() -> None:
    stale_dispatched(5)
    out, _ = run("reap_stale", "--batch-size", "2", "--time-budget", "0.000001")
    assert out.splitlines() == [
        "Requeued 2 jobs whose executor stopped renewing their lease (dispatched -> queued).",
        "Some sweeps stopped at their time budget or --limit; the next run continues.",
    ]
    out, _ = run("reap_stale", "--json", "--batch-size", "2")
    assert json.loads(out)["dispatched"] == 3
    assert json.loads(out)["complete"] is True


def test_reap_stale_refuses_an_unknown_database() -> None:
    stale_runs(1)
    error = failing("reap_stale", "--database", "nope")
    assert error.returncode == 2
    assert "'nope' is not in settings.DATABASES" in str(error)
    assert JobRun.objects.running().count() == 1


# --- prune_jobstate --------------------------------------------------------------------


def test_prune_jobstate_deletes_what_is_past_each_retention_and_is_quiet_after() -> None:
    old_history()
    out, err = run("prune_jobstate")
    assert (out.splitlines(), err) == (
        ["Deleted 2 audit entries.", "Deleted 1 finished job.", "Deleted 1 finished job run."],
        "",
    )
    assert (AuditEntry.objects.count(), Job.objects.count(), JobRun.objects.count()) == (1, 1, 1)
    assert run("prune_jobstate") == ("", "")


def test_prune_jobstate_older_than_batch_size_dry_run_and_json() -> None:
    old_history()
    out, _ = run("prune_jobstate", "--older-than", "10", "--dry-run", "--json")
    assert json.loads(out) == {
        "audit": 2,
        "jobs": 1,
        "runs": 1,
        "notifications": 0,
        "workers": 0,
        "dry_run": True,
        "complete": True,
    }
    assert AuditEntry.objects.count() == 3
    out, _ = run("prune_jobstate", "--older-than", "50", "--batch-size", "1", "--json")
    assert json.loads(out) == {
        "audit": 1,
        "jobs": 0,
        "runs": 0,
        "notifications": 0,
        "workers": 0,
        "dry_run": False,
        "complete": True,
    }
    out, _ = run("prune_jobstate", "--older-than", "2", "--database", "default")
    assert out.splitlines() == [
        "Deleted 1 audit entry.",
        "Deleted 1 finished job.",
        "Deleted 1 finished job run.",
    ]
    assert Job.objects.count() == 1 and AuditEntry.objects.count() == 1


def test_prune_jobstate_shows_progress_only_on_a_terminal() -> None:
    old_history()
    terminal = Terminal()
    out = StringIO()
    call_command(
        "prune_jobstate", "--older-than", "10", "--batch-size", "1", stdout=out, stderr=terminal
    )
    shown = terminal.getvalue()
    assert "\r\033[KPruning audit: 1 rows so far" in shown
    assert "\r\033[KPruning audit: 2 rows so far" in shown
    assert shown.endswith("\r\033[K")  # wiped before the summary
    assert out.getvalue().splitlines()[0] == "Deleted 2 audit entries."
    old_history()
    _, err = run("prune_jobstate", "--older-than", "10", "--batch-size", "1")
    assert err == ""


def test_the_progress_line_stays_silent_off_a_terminal() -> None:
    pipe = StringIO()
    progress = ProgressLine(OutputWrapper(pipe), action="Reaping")
    progress("runs", 10)
    progress.clear()
    assert pipe.getvalue() == ""


# --- real processes: exit status and two cron reapers at once ----------------------------


@pytest.mark.slow
def test_exit_status_of_the_maintenance_commands() -> None:
    stale_runs(1)
    processes = {
        "reap": manage_py("reap_stale"),
        "prune": manage_py("prune_jobstate"),
        "bad batch size": manage_py("reap_stale", "--batch-size", "0"),
        "bad older-than": manage_py("prune_jobstate", "--older-than", "-3"),
        "bad budget": manage_py("reap_stale", "--stale-after", "10"),
    }
    done = {name: finish(process) for name, process in processes.items()}
    assert done["reap"] == (0, "Reaped 1 stale job run (RUNNING -> TIMED_OUT).\n", "")
    assert done["prune"] == (0, "", "")
    assert done["bad batch size"][0] == 2 and "at least 1" in done["bad batch size"][2]
    assert done["bad older-than"][0] == 2
    assert (
        done["bad budget"][0] == 2
        and "--stale-after: 10 s is less than twice" in done["bad budget"][2]
    )


# Starts Django first, then waits for the go signal, so both reapers begin together.
_AFTER_GO = """
import os, sys, time
import django
django.setup()
ready, go = sys.argv[1], sys.argv[2]
open(ready, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit("the start signal never came")
    time.sleep(0.002)
from django.core.management import execute_from_command_line
execute_from_command_line(["manage.py", *sys.argv[3:]])
"""


@pytest.mark.slow
@pytest.mark.concurrent
@pytest.mark.mysql
def test_two_cron_reapers_started_at_once_report_disjoint_work_that_sums_to_the_stale_rows(
    tmp_path: Path,
) -> None:
    stale_runs(2000)
    stale_queued(1000)
    dispatched = stale_dispatched(1500)
    leases = expired_leases(500)
    seeded = {"runs": 2000, "queued": 1000, "dispatched": 1500, "leases": 500}
    base = Path(settings.BASE_DIR)
    go = tmp_path / "go"
    reapers = []
    for n in range(2):
        reapers.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    _AFTER_GO,
                    str(tmp_path / f"ready-{n}"),
                    str(go),
                    "reap_stale",
                    "--json",
                    "--batch-size",
                    "100",
                ],
                cwd=base,
                env=child_env(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready-{n}").exists() for n in range(2)):
        assert time.monotonic() < deadline, "the reapers never started"
        assert all(p.poll() is None for p in reapers), [finish(p) for p in reapers]
        time.sleep(0.01)
    go.touch()
    results = [finish(p) for p in reapers]

    assert [code for code, _, _ in results] == [0, 0], results
    reports = [json.loads(out) for _, out, _ in results]
    for sweep, count in seeded.items():
        assert reports[0][sweep] + reports[1][sweep] == count, (sweep, reports)
    # Both did part of the work: they really ran at the same time.
    assert all(sum(report[s] for s in seeded) > 0 for report in reports), reports
    assert not JobRun.objects.running().exists()
    assert Job.objects.filter(id__in=dispatched, status=JobStatus.QUEUED).count() == 1500
    assert Job.objects.filter(id__in=leases, status=JobStatus.QUEUED, attempts=1).count() == 500
    assert Job.objects.filter(status=JobStatus.ERROR).count() == 1000
    # One audit entry per moved job: no job was moved twice.
    assert AuditEntry.objects.count() == 3000
    assert AuditEntry.objects.values("job_id").distinct().count() == 3000


# --- the demo's live traffic -----------------------------------------------------------


@pytest.mark.slow
def test_demo_traffic_moves_jobs_through_every_state_and_recovers_crashes() -> None:
    # The lease is long next to a tick so a slow machine does not turn ordinary reports
    # into stale ones, and short enough that crashed claims are recovered within the run.
    out, _ = run(
        "demo_traffic",
        "--iterations",
        "150",
        "--tick",
        "0.01",
        "--lease",
        "0.5",
        "--sweep-every",
        "0.1",
        "--seed",
        "3",
    )
    statuses = set(Job.objects.values_list("status", flat=True))
    assert {JobStatus.DONE, JobStatus.ERROR, JobStatus.REJECTED, JobStatus.QUEUED} <= statuses
    # Crashed claims were recovered by the sweep. Which owner's crash comes due first
    # depends on timing (the executor renews all its leases while it holds other work),
    # so only the worker's, whose leases are renewed one by one, is certain in a short run.
    recovered = AuditEntry.objects.filter(event="recovered")
    assert recovered.filter(detail__prev_status="running").exists()
    assert "reaped:" in out
    assert JobRun.objects.filter(status=JobRunStatus.SUCCEEDED).exists()
    assert out.splitlines()[-1].endswith(
        " project.demo.traffic: Demo traffic stopped after 150 ticks."
    )


@pytest.fixture
def traffic() -> Iterator[subprocess.Popen[str]]:
    process = manage_py("demo_traffic", "--tick", "0.05", "--sweep-every", "0.2")
    yield process
    if process.poll() is None:
        process.kill()
        process.communicate()


@pytest.mark.slow
def test_demo_traffic_stops_cleanly_on_sigterm(traffic: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while not Job.objects.exists():
        assert traffic.poll() is None, finish(traffic)
        assert time.monotonic() < deadline, "no traffic within 30 s"
        time.sleep(0.05)
    traffic.send_signal(signal.SIGTERM)
    code, out, err = finish(traffic, timeout=15)
    assert code == 0, err
    assert "Demo traffic stopped after" in out.splitlines()[-1]
    assert "Traceback" not in err
