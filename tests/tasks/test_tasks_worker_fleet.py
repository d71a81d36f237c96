"""``jobstate_worker`` processes on the Workers page and under queue pauses: a worker
registers itself, beats while it runs, says it stopped on SIGTERM, shows as lost once
SIGKILLed and its lease has passed, and is forgotten by ``prune_jobstate`` after the
retention; a paused queue is not claimed by a running worker until it is resumed, while
its other queue is; and the relay loop registers too."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.db.models.functions import Now

from jobstate.admin.workers import worker_state
from jobstate.core.states import JobStatus
from jobstate.models import Job, Worker
from jobstate.stores import get_state_store
from tests.support.processes import database_url
from tests.support.task_functions import add, started_then_sleeps
from tests.support.tasks_kit import finish, start_worker, stop, use_options, wait_for

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def state_of(worker_id: str) -> str | None:
    row = Worker.objects.filter(worker_id=worker_id).annotate(state=worker_state()).first()
    return None if row is None else str(row.state)


def test_a_worker_registers_beats_and_says_it_stopped(settings: Any) -> None:
    # A lease of 4 s: the worker beats every 1.3 s, and a loaded machine may delay a
    # beat or two without the worker turning lost.
    options = use_options(settings, LEASE=4.0)
    worker = start_worker(
        "--worker-id",
        "fleet-a",
        "--queue-name",
        "default,emails",
        "--concurrency",
        "3",
        options=options,
    )
    try:
        row = wait_for(lambda: Worker.objects.filter(worker_id="fleet-a").first(), what="a row")
        assert row.kind == "tasks" and row.backend == "default"
        assert row.queues == ["default", "emails"] and row.concurrency == 3
        assert row.pid == worker.pid and row.lease == timedelta(seconds=4)
        assert state_of("fleet-a") == "live"
        first_beat = row.heartbeat_at
        wait_for(
            lambda: Worker.objects.get(worker_id="fleet-a").heartbeat_at > first_beat,
            what="a later beat",
        )
        # More than a lease later it is still live: the beat carries it.
        time.sleep(6)
        assert state_of("fleet-a") == "live"
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 0, err
    row = Worker.objects.get(worker_id="fleet-a")
    assert row.stopped_at is not None and row.stopped_reason == "SIGTERM"
    assert state_of("fleet-a") == "stopped"
    time.sleep(4.5)
    assert state_of("fleet-a") == "stopped", "a stopped worker never turns lost"


def test_a_killed_worker_shows_as_lost_and_is_pruned_after_the_retention(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings, LEASE=2.0)
    marker = tmp_path / "started"
    held = started_then_sleeps.enqueue(60, str(marker))
    worker = start_worker("--worker-id", "fleet-k", options=options)
    try:
        wait_for(marker.exists, what="the task to start")
        assert state_of("fleet-k") == "live"
        job = Job.objects.get(id=held.id)
        assert job.status == JobStatus.RUNNING and job.executor_id == "fleet-k"
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)
    finally:
        stop(worker)
    wait_for(lambda: state_of("fleet-k") == "lost", timeout=15, what="the worker to be lost")
    assert Worker.objects.get(worker_id="fleet-k").stopped_at is None

    # Not old enough for the retention: kept.
    call_command("prune_jobstate", "--older-than", "1")
    assert Worker.objects.filter(worker_id="fleet-k").exists()
    Worker.objects.filter(worker_id="fleet-k").update(heartbeat_at=Now() - timedelta(days=2))
    live = Worker.objects.create(
        worker_id="fleet-live", kind="tasks", host="h", pid=1, lease=timedelta(minutes=1)
    )
    # The command as cron runs it, at the default WORKER_RETENTION of a day.
    process = subprocess.run(
        [sys.executable, str(Path(django_settings.BASE_DIR) / "manage.py"), "prune_jobstate"],
        cwd=django_settings.BASE_DIR,
        env={**os.environ, "DATABASE_URL": database_url()},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 0, process.stderr
    assert "Deleted 1 registered worker." in process.stdout
    assert not Worker.objects.filter(worker_id="fleet-k").exists()
    assert Worker.objects.filter(id=live.id).exists()


def test_a_paused_queue_is_not_claimed_until_it_is_resumed(settings: Any) -> None:
    options = use_options(settings, LEASE=5.0)
    store = get_state_store()
    target = "tasks:default"
    store.pause_queue(target=target, queue="emails", by="olga")
    held = add.using(queue_name="emails").enqueue(1, 1)
    free = add.using(queue_name="default").enqueue(2, 2)
    worker = start_worker(
        "--worker-id",
        "fleet-p",
        "--queue-name",
        "default,emails",
        "--interval",
        "0.2",
        options=options,
    )
    try:
        wait_for(lambda: Job.objects.get(id=free.id).status == JobStatus.DONE, what="the free task")
        # Several polls later the paused queue's task still waits.
        time.sleep(1.5)
        assert Job.objects.get(id=held.id).status == JobStatus.QUEUED
        more = add.using(queue_name="default").enqueue(3, 3)
        wait_for(lambda: Job.objects.get(id=more.id).status == JobStatus.DONE, what="more")
        assert Job.objects.get(id=held.id).status == JobStatus.QUEUED

        store.resume_queue(target=target, queue="emails", by="olga")
        done = wait_for(
            lambda: Job.objects.filter(id=held.id, status=JobStatus.DONE).first(),
            what="the resumed queue's task",
        )
        assert done.executor_id is None and done.result == 2
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 0, err


def test_the_relay_loop_registers_and_says_it_stopped(settings: Any) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(django_settings.BASE_DIR) / "manage.py"),
            "deliver_notifications",
            "--loop",
            "--interval",
            "0.2",
            "--relay-id",
            "relay-fleet",
        ],
        cwd=django_settings.BASE_DIR,
        env={**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        row = wait_for(
            lambda: Worker.objects.filter(worker_id="relay-fleet").first(), what="the relay"
        )
        assert row.kind == "relay" and row.pid == process.pid
        assert state_of("relay-fleet") == "live"
        process.send_signal(signal.SIGTERM)
        code, _out, err = finish(process)
    finally:
        stop(process)
    assert code == 0, err
    assert state_of("relay-fleet") == "stopped"
