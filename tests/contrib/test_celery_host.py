"""Celery the way a host runs it: ``celery -A <host app> worker`` and ``beat`` as real
processes against Redis, with a host app that has exactly the documented line
(:mod:`tests.contrib.celery_host_app`). The worker registers jobstate's five tasks,
and beat, running jobstate's beat schedule at one-second intervals, makes the worker
reap a stale run and enqueue a due schedule slot in the shared database. A host app
still written the old way (plain ``autodiscover_tasks()``) registers none of them, and
its worker and beat say so and name the missing line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from celery import Celery
from django.conf import settings
from django.db import connection
from django.db.models.functions import Now

from jobstate.contrib.celery.beat import JOBSTATE_BEAT_SCHEDULE
from jobstate.contrib.celery.discovery import DISCOVERY_LINE, TASK_NAMES
from jobstate.models import Job, JobRun, Schedule, ScheduleOccurrence
from jobstate.schedules import sync_schedules
from jobstate.stores.base import JobRunStatus
from jobstate.testing.factories import JobRunFactory
from tests.contrib import celery_host_settings

# The worker and beat are other processes: they see only what this test commits.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.postgres]

BROKER_URL = os.environ.get("JOBSTATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
HOST_APP = "tests.contrib.celery_host_app"
OLD_HOST_APP = "tests.contrib.celery_old_host_app"
LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)
WAIT = 30.0
#: The task names the docs promise a host (docs/production.md, *Celery*).
DOCUMENTED_TASKS = {
    "jobstate.reap_stale",
    "jobstate.prune",
    "jobstate.deliver_notifications",
    "jobstate.run_operations_job",
    "jobstate.enqueue_due_schedules",
}


@pytest.fixture
def broker() -> Iterator[str]:
    """The Redis database of the test run, emptied before and after; the test fails,
    never skips, when Redis does not answer."""
    client = redis.Redis.from_url(BROKER_URL, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        pytest.fail(
            f"Redis does not answer at {BROKER_URL} ({exc}); the Celery host test needs "
            "it (JOBSTATE_TEST_REDIS_URL). Start it with scripts/ensure-redis.",
            pytrace=False,
        )
    client.flushdb()
    yield BROKER_URL
    client.flushdb()
    client.close()


def shared_database_url() -> str:
    """The URL of the test database this test commits to, for the worker and beat."""
    db = connection.settings_dict
    auth = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        auth += ":" + quote(db["PASSWORD"], safe="")
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{auth}@{db['HOST'] or ''}{port}/{quote(db['NAME'], safe='')}"


def celery(app: str, *args: str, log: Path, broker: str) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DATABASE_URL": shared_database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.contrib.celery_host_settings",
        "CELERY_BROKER_URL": broker,
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", app, *args, "--loglevel", "INFO"],
        cwd=Path(settings.BASE_DIR),
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )


def worker(app: str, log: Path, broker: str) -> subprocess.Popen[bytes]:
    # The prefork pool a host runs by default, one child to keep the machine free.
    return celery(
        app, "worker", "--concurrency", "1", "--hostname", f"{app}@%h", log=log, broker=broker
    )


def beat(app: str, tmp_path: Path, log: Path, broker: str) -> subprocess.Popen[bytes]:
    schedule = str(tmp_path / f"{app}-beat-schedule")
    return celery(app, "beat", "--schedule", schedule, log=log, broker=broker)


def wait_for(condition: Callable[[], bool], what: str, logs: list[Path]) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {log.name}\n{log.read_text()[-4000:]}" for log in logs)
            pytest.fail(f"not within {WAIT:.0f} s: {what}\n{tails}")
        time.sleep(0.2)


def stop(*processes: subprocess.Popen[bytes]) -> None:
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in processes:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def registered_by_workers(broker: str) -> dict[str, set[str]]:
    """The task names each running worker reports over the broker (``celery inspect
    registered``; Celery's own tasks left out), by worker; empty until one answers."""
    probe = Celery("probe", broker=broker, set_as_current=False, fixups=[])
    try:
        replies = probe.control.inspect(timeout=1.0).registered() or {}
    finally:
        probe.close()
    return {worker: set(names) for worker, names in replies.items()}


def all_registered(broker: str) -> set[str]:
    return {name for names in registered_by_workers(broker).values() for name in names}


def test_a_host_app_with_the_documented_line_registers_the_tasks_and_beat_runs_them(
    broker: str, tmp_path: Path, settings: Any
) -> None:
    assert {entry["task"] for entry in JOBSTATE_BEAT_SCHEDULE.values()} == {
        entry["task"] for entry in celery_host_settings.CELERY_BEAT_SCHEDULE.values()
    }
    stale = [
        run.id
        for run in JobRunFactory.bulk_create_batch(
            2,
            running=True,
            job_key="tests.celery-host",
            trigger_source="SCHEDULER",
            started_at=LONG_AGO,
            heartbeat_at=LONG_AGO,
        )
    ]
    # The schedule as the worker and beat declare it, made effective five minutes ago so
    # that its latest minute slot is due at beat's first schedule pass.
    settings.JOBSTATE = celery_host_settings.JOBSTATE
    sync_schedules()
    key = celery_host_settings.HOST_SCHEDULE_KEY
    Schedule.objects.filter(key=key).update(effective_from=Now() - timedelta(minutes=5))

    logs = [tmp_path / "worker.log", tmp_path / "beat.log"]
    processes = [worker(HOST_APP, logs[0], broker)]
    try:
        wait_for(
            lambda: all_registered(broker) >= DOCUMENTED_TASKS,
            "the worker registered jobstate's five tasks",
            logs,
        )
        processes.append(beat(HOST_APP, tmp_path, logs[1], broker))
        wait_for(
            lambda: not JobRun.objects.filter(id__in=stale, status=JobRunStatus.RUNNING).exists(),
            "beat's reap_stale made the worker reap the stale runs",
            logs,
        )
        wait_for(
            lambda: ScheduleOccurrence.objects.filter(schedule__key=key).exists(),
            "beat's enqueue_due_schedules made the worker enqueue the due slot",
            logs,
        )
    finally:
        stop(*reversed(processes))
    assert [process.returncode for process in processes] == [0, 0]
    assert set(JobRun.objects.filter(id__in=stale).values_list("status", flat=True)) == {
        JobRunStatus.TIMED_OUT
    }
    # One slot, or two when the test ran across a minute boundary; each enqueued once.
    occurrences = list(ScheduleOccurrence.objects.filter(schedule__key=key))
    assert {(row.trigger, row.enqueued_by) for row in occurrences} == {("cron", "celery beat")}
    jobs = Job.objects.filter(id__in=[row.result_id for row in occurrences])
    assert list(jobs.values_list("queue_name", flat=True)) == ["emails"] * len(occurrences)
    worker_log = logs[0].read_text()
    for name in ("jobstate.reap_stale", "jobstate.enqueue_due_schedules"):
        assert f"Task {name}[" in worker_log
    assert "not register" not in worker_log + logs[1].read_text()


def test_a_host_app_with_plain_autodiscovery_is_told_the_line_it_misses(
    broker: str, tmp_path: Path
) -> None:
    logs = [tmp_path / "worker.log", tmp_path / "beat.log"]
    processes = [
        worker(OLD_HOST_APP, logs[0], broker),
        beat(OLD_HOST_APP, tmp_path, logs[1], broker),
    ]
    try:
        wait_for(lambda: bool(registered_by_workers(broker)), "the worker answered", logs)
        registered = all_registered(broker)
        wait_for(
            lambda: "Received unregistered task of type 'jobstate." in logs[0].read_text(),
            "the worker discarded a jobstate task beat sent",
            logs,
        )
    finally:
        stop(*reversed(processes))
    assert TASK_NAMES == DOCUMENTED_TASKS
    assert not DOCUMENTED_TASKS & registered
    for log, process in zip(logs, ("worker", "beat"), strict=True):
        text = log.read_text()
        assert f"This Celery {process}'s app does not register jobstate." in text, text
        assert DISCOVERY_LINE in text
