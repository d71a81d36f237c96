"""Celery: the tasks call the same sweeps and relay as the commands, the beat schedule is
a plain dict a host merges, operations jobs run through the runner's overlap guard, and
a real worker and beat against Redis reap, prune and deliver notifications on
schedule."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connections
from django.db.models.functions import Now

from jobstate.contrib.celery.beat import JOBSTATE_BEAT_SCHEDULE, beat_schedule
from jobstate.contrib.celery.celery_tasks import (
    deliver_notifications_task,
    enqueue_due_schedules_task,
    prune_task,
    reap_stale_task,
    run_operations_job_task,
)
from jobstate.models import AuditEntry, DeliveryAttempt, Job, JobRun, Notification
from jobstate.stores.base import JobRunStatus, JobStatus, NotificationRequest, NotificationState
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.factories import AuditEntryFactory, JobFactory, JobRunFactory
from project.demo.notifications import ACCEPTS
from tests.support.processes import child_env

pytestmark = pytest.mark.django_db(transaction=True)

BROKER_URL = os.environ.get("JOBSTATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def stale_runs(count: int) -> list[Any]:
    runs = JobRunFactory.bulk_create_batch(
        count,
        running=True,
        job_key="tests.celery",
        trigger_source="SCHEDULER",
        started_at=LONG_AGO,
        heartbeat_at=LONG_AGO,
    )
    return [run.id for run in runs]


def finished_with_notification(request_id: str) -> Notification:
    """A finished job whose completion wrote one notification to the demo's healthy
    receiver."""
    store = DatabaseStateStore()
    store.create_job(request_id=request_id, target="celery")
    job = store.claim_next_inhub_job(["celery"], "worker-1")
    assert job is not None
    notes = [NotificationRequest("callable", ACCEPTS, {"job": request_id})]
    assert store.complete_job_with_notifications(job, {"status": JobStatus.DONE}, notes)
    return Notification.objects.get(job_id=job.id)


def old_audit(count: int) -> None:
    AuditEntryFactory.bulk_create_batch(
        count, event="received", ts=datetime.now(UTC) - timedelta(days=90)
    )


# --- the schedule and the tasks, in this process ------------------------------------------


def test_the_beat_schedule_names_the_registered_tasks_and_merges_as_a_dict() -> None:
    from project.celery import app

    app.loader.import_default_modules()
    for entry in JOBSTATE_BEAT_SCHEDULE.values():
        assert entry["task"] in app.tasks
    assert JOBSTATE_BEAT_SCHEDULE["jobstate-reap-stale"]["schedule"] == timedelta(minutes=1)
    assert JOBSTATE_BEAT_SCHEDULE["jobstate-prune"]["schedule"] == timedelta(hours=6)
    relay = JOBSTATE_BEAT_SCHEDULE["jobstate-deliver-notifications"]
    assert (relay["task"], relay["schedule"]) == (
        "jobstate.deliver_notifications",
        timedelta(seconds=10),
    )
    assert "jobstate-deliver-notifications" not in beat_schedule(deliver_every=None)
    assert settings.CELERY_BEAT_SCHEDULE.keys() >= JOBSTATE_BEAT_SCHEDULE.keys()
    fast = beat_schedule(reap_every=timedelta(seconds=10))
    assert fast["jobstate-reap-stale"]["options"] == {"expires": 10.0}
    with pytest.raises(ValueError, match="prune_every"):
        beat_schedule(prune_every=timedelta(0))


def test_the_sweep_tasks_return_every_count() -> None:
    stale_runs(2)
    old_audit(3)
    reaped = reap_stale_task.apply().get()
    assert (reaped["runs"], reaped["dry_run"], reaped["complete"]) == (2, False, True)
    assert prune_task.apply().get()["audit"] == 3
    assert not JobRun.objects.running().exists()
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("using", [None, "nope", 5])
def test_a_task_given_no_database_alias_says_so(using: object) -> None:
    """``reap_stale(None)`` failed deep in a sweep: ``attribute name must be string``."""
    tasks = [
        reap_stale_task,
        prune_task,
        deliver_notifications_task,
        enqueue_due_schedules_task,
    ]
    for task in tasks:
        with pytest.raises(ValueError, match=r"using must be an alias of settings\.DATABASES"):
            task.apply(kwargs={"using": using}).get()
    with pytest.raises(ValueError, match="using must be an alias"):
        run_operations_job_task.apply(args=["demo.report-build"], kwargs={"using": using}).get()


def test_the_relay_task_delivers_due_notifications_and_returns_its_report() -> None:
    row = finished_with_notification("celery-relay")
    report = deliver_notifications_task.apply(kwargs={"limit": 5}).get()
    assert (report["claimed"], report["delivered"], report["dead"]) == (1, 1, 0)
    row.refresh_from_db()
    assert row.state == NotificationState.DELIVERED
    assert DeliveryAttempt.objects.get(notification=row).relay_id == report["relay_id"]
    assert deliver_notifications_task.apply().get()["claimed"] == 0


def test_an_operations_job_task_records_a_celery_run() -> None:
    result = run_operations_job_task.apply(
        args=("demo.report-build",), kwargs={"input": {"rows": 10}, "triggered_by": "beat"}
    ).get()
    assert (result["status"], result["recorded"]) == ("SUCCEEDED", "settled")
    run = JobRun.objects.get(id=result["run_id"])
    assert (run.trigger_source, run.triggered_by, run.input) == ("CELERY", "beat", {"rows": 10})
    failed = run_operations_job_task.apply(args=("demo.always-fails",)).get()
    assert failed["status"] == "FAILED"
    assert JobRun.objects.get(id=failed["run_id"]).status == JobRunStatus.FAILED


@pytest.mark.postgres
def test_two_workers_starting_one_forbid_job_run_it_once() -> None:
    barrier = threading.Barrier(2)
    results: list[dict[str, Any]] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=10)
            task = run_operations_job_task.apply(
                args=("demo.nightly-close",), kwargs={"input": {"seconds": 0.5}}
            )
            results.append(task.get())
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(result["status"] for result in results) == ["SKIPPED", "SUCCEEDED"]
    runs = JobRun.objects.filter(job_key="demo.nightly-close")
    assert sorted(runs.values_list("status", "trigger_source")) == [
        (JobRunStatus.SKIPPED, "CELERY"),
        (JobRunStatus.SUCCEEDED, "CELERY"),
    ]


# --- a real worker and beat against Redis ---------------------------------------------


@pytest.fixture
def broker() -> Iterator[str]:
    client = redis.Redis.from_url(BROKER_URL, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        problem = str(exc)
    else:
        problem = ""
    if problem:
        pytest.fail(
            f"Redis does not answer at {BROKER_URL} ({problem}); the Celery test needs it. "
            "Start it with scripts/ensure-redis.",
            pytrace=False,
        )
    client.flushdb()
    yield BROKER_URL
    client.flushdb()


def celery(*args: str, log: Path, broker: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "project", *args, "--loglevel", "INFO"],
        cwd=Path(settings.BASE_DIR),
        env=child_env(CELERY_BROKER_URL=broker, CELERY_BEAT_EVERY="0.5"),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def wait_for(condition: Callable[[], bool], what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs)
            pytest.fail(f"not within 30 s: {what}\n{tails}")
        time.sleep(0.2)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.mark.slow
@pytest.mark.postgres
def test_a_real_worker_and_beat_reap_prune_and_deliver_on_schedule(
    broker: str, tmp_path: Path
) -> None:
    stale = stale_runs(3)
    old_audit(4)
    lost = JobFactory(
        dispatched=True,
        request_id="lost-executor",
        target="exec",
        executor_id="gone",
        lease_until=LONG_AGO,
    )
    finished = JobFactory(done=True, request_id="old")
    Job.objects.filter(id=finished.id).update(updated_at=Now() - timedelta(days=30))
    note = finished_with_notification("notify-on-schedule")
    logs = [tmp_path / "worker.log", tmp_path / "beat.log"]
    worker = celery(
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        "2",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        log=logs[0],
        broker=broker,
    )
    beat = celery("beat", "--schedule", str(tmp_path / "beat-schedule"), log=logs[1], broker=broker)
    try:
        wait_for(
            lambda: not JobRun.objects.filter(id__in=stale, status=JobRunStatus.RUNNING).exists(),
            "the stale runs were reaped",
            logs,
        )
        wait_for(
            lambda: not AuditEntry.objects.filter(ts__lt=Now() - timedelta(days=60)).exists(),
            "the old audit entries were pruned",
            logs,
        )
        wait_for(
            lambda: Notification.objects.filter(
                id=note.id, state=NotificationState.DELIVERED
            ).exists(),
            "the scheduled relay delivered the notification",
            logs,
        )
        wait_for(
            lambda: JobRun.objects.filter(
                job_key="demo.nightly-close", status=JobRunStatus.SKIPPED
            ).exists(),
            "a scheduled nightly close found the previous one running and was skipped",
            logs,
        )
    finally:
        stop(beat)
        stop(worker)
    assert set(JobRun.objects.filter(id__in=stale).values_list("status", flat=True)) == {
        JobRunStatus.TIMED_OUT
    }
    assert Job.objects.get(id=lost.id).status == JobStatus.QUEUED
    assert not Job.objects.filter(id=finished.id).exists()
    closes = JobRun.objects.filter(job_key="demo.nightly-close")
    assert set(closes.values_list("trigger_source", flat=True)) == {"CELERY"}
    assert closes.filter(status=JobRunStatus.SUCCEEDED).exists()
    assert (worker.returncode, beat.returncode) == (0, 0)
