"""A worker's start-up as a real process: its first claim is made before the last line
of its banner, so a task enqueued before the worker started is claimed without waiting
for the banner's own database reads, the recovery of lost tasks or the schedules; a
worker whose first claim took a task skips the banner's check of queues no worker
serves (a count of the whole backlog); and a worker on a database whose guards are
missing exits before it claims anything."""

from __future__ import annotations

import logging
import re
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobstate.core.states import JobStatus
from jobstate.models import Job
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import task_backends
from jobstate.tasks.worker import TaskWorker, WorkerConfig
from tests.support.task_functions import add, started_then_sleeps
from tests.support.tasks_kit import finish, start_worker, stop, use_options, wait_for

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_task_enqueued_before_start_is_claimed_before_the_banners_last_line(
    settings: Any,
) -> None:
    options = use_options(settings, LEASE=30.0)
    queued = started_then_sleeps.enqueue(1.0)
    worker = start_worker(
        "--batch", "--worker-id", "start-1", options=options, JOBSTATE_TEST_LOG_INSTANTS="1"
    )
    try:
        # The claim's instant is the database's clock when the claim statement ran; the
        # job keeps it while the task runs.
        claimed = wait_for(
            lambda: Job.objects.filter(
                id=queued.id, status=JobStatus.RUNNING, claimed_at__isnull=False
            ).first(),
            what="the task's claim",
        )
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 0, err
    banner = [
        (float(instant), line)
        for instant, line in re.findall(r"(?m)^(\d+\.\d+) (jobstate_worker start-1 .*)$", err)
    ]
    assert banner, err
    started_at, started_line = banner[0]
    assert "started: backend 'default'" in started_line
    # The banner's started line, and so whatever follows it, comes after the claim that
    # took the waiting task.
    assert claimed.claimed_at.timestamp() < started_at, err
    assert Job.objects.get(id=queued.id).status == JobStatus.DONE
    assert "stopped (--batch: no task ready): 1 started, 1 succeeded" in err


def test_a_worker_whose_first_claim_took_a_task_does_not_count_the_backlog_by_queue(
    settings: Any,
) -> None:
    use_options(settings, LEASE=30.0)
    for n in range(3):
        add.enqueue(n, 1)
    # Ready tasks in a queue no worker serves: what the banner's check would warn of,
    # were this worker's own queue empty.
    for n in range(2):
        add.using(queue_name="emails").enqueue(n, 2)
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    config = WorkerConfig(
        queues=("default",), batch=True, schedules=False, interval=30, worker_id="start-3"
    )
    with CaptureQueriesContext(connection) as captured:
        summary = TaskWorker(config, backend).run()
    assert summary.succeeded == 3, summary
    statements = [query["sql"] or "" for query in captured]
    assert not [sql for sql in statements if "COUNT(" in sql.upper()], statements
    # Nor which queues the live workers serve (the registration writes them: not a read).
    reads = [sql for sql in statements if sql.lstrip().upper().startswith("SELECT")]
    assert not [sql for sql in reads if "queues" in sql.split("FROM")[0]], statements
    assert Job.objects.filter(queue_name="emails", status=JobStatus.QUEUED).count() == 2


def test_a_batch_workers_banner_speaks_of_listen_only_where_it_could_listen(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``--batch`` worker never LISTENs; the banner says why only on a database where
    another worker would (PostgreSQL): on SQLite or MariaDB the remark was noise."""
    use_options(settings)
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "LISTEN_NOTIFY": True}
    add.enqueue(1, 1)
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    config = WorkerConfig(batch=True, schedules=False, interval=1, worker_id="start-4")
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    assert TaskWorker(config, backend).run().succeeded == 1
    (banner,) = [line for line in caplog.messages if " started: backend " in line]
    assert "wake-up by polling every 1 s" in banner
    said = "(--batch: it stops once nothing is ready, so it does not LISTEN)" in banner
    assert said == (connection.vendor == "postgresql"), banner


@pytest.mark.only_on("mysql")
def test_a_worker_on_a_mariadb_without_the_thread_gate_exits_before_claiming(
    settings: Any,
) -> None:
    """Migration 0009's guards recorded as applied but gone (a database restored without
    them): the worker refuses to start, naming jobstate.E044, and claims nothing."""
    options = use_options(settings)
    queued = started_then_sleeps.enqueue(0.0)
    index = "jobstate_jobrun_one_running_per_overlap_key"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX `{index}` ON `jobstate_jobrun`")
    try:
        worker = start_worker("--batch", "--worker-id", "start-2", options=options)
        try:
            code, _out, err = finish(worker)
        finally:
            stop(worker)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE UNIQUE INDEX `{index}` ON `jobstate_jobrun` (`running_overlap_key`)"
            )
    assert code == 1, err
    assert "(jobstate.E044)" in err and index in err
    assert "Traceback" not in err
    assert Job.objects.get(id=queued.id).status == JobStatus.QUEUED
