"""Workers behind PgBouncer in transaction mode (``JOBSTATE["CONNECTION_POOLER"] =
"transaction"``), a pooler of the test's own: a fleet drains the queue while the pooler is
killed with SIGKILL and started again, and no worker exits, no task is lost or runs
twice, and the database never sees more server connections than the pool; a report sent
while the pooler is down is written once it is back; a worker started while it is down
starts once it is back; and a worker behind the pooler says it polls, at a short
interval, rather than claiming to listen."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from jobstate.core.states import JobStatus
from jobstate.models import Job
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import TaskResultStatus, task_backends
from jobstate.tasks.worker import TaskWorker, WorkerConfig
from tests.support.pgbouncer import PgBouncer
from tests.support.task_functions import add, kills_then_fails, records_its_run
from tests.support.tasks_kit import finish, start_worker, stop, use_options, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

POOLED = {"CONNECTION_POOLER": "transaction", "PREPARED_STATEMENTS": False, "LISTEN_NOTIFY": False}


@contextmanager
def through(pooler: PgBouncer) -> Iterator[None]:
    """This process's connections to the test database go through ``pooler`` in the
    block (a worker run in-process), and straight to the server again after it."""
    params = connection.settings_dict
    direct = params["HOST"], params["PORT"]
    connection.close()
    params["HOST"], params["PORT"] = "127.0.0.1", str(pooler.port)
    try:
        yield
    finally:
        connection.close()
        params["HOST"], params["PORT"] = direct


def run_worker(**config: Any) -> TaskWorker:
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    worker = TaskWorker(WorkerConfig(**config), backend)
    worker.run()
    return worker


def batch_through(pooler: PgBouncer, *, restarted_after: float) -> TaskWorker:
    """A ``--batch`` worker run in-process through ``pooler``, which is started again
    ``restarted_after`` seconds after the worker starts (the test or its task kills it)."""
    restart = threading.Timer(restarted_after, pooler.start)
    with through(pooler):
        restart.start()
        try:
            return run_worker(batch=True, interval=0.1, schedules=False)
        finally:
            restart.join()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_fleet_rides_out_pgbouncer_killed_and_restarted_mid_drain(
    settings: Any, pgbouncer: PgBouncer, tmp_path: Path
) -> None:
    # Three attempts: a claim whose reply the kill cut off never ran here, and comes
    # back, counted, when its lease (8 s) has run out.
    options = use_options(settings, LEASE=8.0, MAX_ATTEMPTS=3)
    runs = tmp_path / "runs"
    count = 400
    for key in range(count):
        records_its_run.enqueue(str(runs), key)
    workers = [
        start_worker(
            "--worker-id",
            f"pooled-{n}",
            "--no-schedules",
            options=options,
            DATABASE_URL=pgbouncer.url,
            JOBSTATE_TEST_POOLER="transaction",
        )
        for n in range(6)
    ]
    most = 0
    try:

        def drained_past(done: int) -> bool:
            nonlocal most
            most = max(most, pgbouncer.server_connections())
            return len(lines(runs)) >= done

        for share in (count // 4, count // 2):
            wait_for(lambda share=share: drained_past(share), timeout=40, what=f"{share} runs")
            pgbouncer.kill()
            time.sleep(0.3)
            pgbouncer.start()
        wait_for(
            lambda: drained_past(count) and not Job.objects.exclude(status=JobStatus.DONE).exists(),
            timeout=40,
            what="every task to be done",
        )
        exited = [worker for worker in workers if worker.poll() is not None]
        assert not exited, "\n".join(
            f"{worker.args[4]} exited with status {worker.returncode}:\n{worker.communicate()[1]}"
            for worker in exited
        )
        logs = []
        for worker in workers:
            worker.send_signal(signal.SIGTERM)
            code, _out, err = finish(worker)
            assert code == 0, err
            logs.append(err)
    finally:
        for worker in workers:
            stop(worker)
    log = "\n".join(logs)
    ran = Counter(int(line.split()[0]) for line in lines(runs))
    assert sorted(ran) == list(range(count)), "a task never ran"
    assert [key for key, times in ran.items() if times > 1] == [], "a task ran twice"
    assert 0 < most <= pgbouncer.pool_size
    # The kills cut the workers' connections: they said so, tried again and went on.
    assert "The database failed" in log and "trying again" in log
    assert "Traceback" not in log, log
    # No lease ran out: a report whose reply the kill cut off is not taken for a claim
    # lost to a recovery, neither by the report sent again nor by the cancel watch.
    assert "its claim was lost" not in log, log
    assert "its lease ran out" not in log, log


def test_a_failure_reported_while_the_pooler_is_down_is_written_once_it_is_back(
    settings: Any, pgbouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    # The task kills the pooler, so the worker's report (a failure: written with its
    # audit entry in one transaction) meets a cut connection, then a refused one.
    use_options(settings, MAX_ATTEMPTS=1)
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), **POOLED}
    assert pgbouncer.process is not None
    result = kills_then_fails.enqueue(pgbouncer.process.pid)
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    worker = batch_through(pgbouncer, restarted_after=1.5)
    assert worker.summary.failed == 1 and worker.summary.lost == 0
    read = kills_then_fails.get_result(result.id)
    assert read.status == TaskResultStatus.FAILED
    assert read.errors[0].exception_class_path == "tests.support.task_functions.Boom"
    assert "The report of ended task attempts failed" in caplog.text
    assert "trying again" in caplog.text


def test_a_worker_started_while_the_pooler_is_down_starts_once_it_is_back(
    settings: Any, pgbouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    use_options(settings)
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), **POOLED}
    result = add.enqueue(2, 2)
    pgbouncer.kill()
    worker = batch_through(pgbouncer, restarted_after=1.0)
    assert worker.summary.succeeded == 1
    assert add.get_result(result.id).return_value == 4
    assert "DatabaseStateStore.register_worker failed" in caplog.text
    assert "trying again" in caplog.text


def test_a_worker_behind_the_pooler_says_it_polls_at_a_short_interval(
    settings: Any, pgbouncer: PgBouncer, caplog: pytest.LogCaptureFixture
) -> None:
    options = use_options(settings)
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), **POOLED, "LISTEN_NOTIFY": True}
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    result = add.enqueue(2, 3)
    with through(pgbouncer):
        worker = run_worker(max_tasks=1, schedules=False)
    assert add.get_result(result.id).return_value == 5
    assert worker._listener is None
    assert "wake-up by polling every" in caplog.text
    assert "no LISTEN/NOTIFY: JOBSTATE['CONNECTION_POOLER'] is 'transaction'" in caplog.text
    assert "wake-up by LISTEN/NOTIFY" not in caplog.text

    # The command's own default interval behind the pooler is a quarter of a second.
    process = start_worker(
        "--max-tasks",
        "1",
        "--no-schedules",
        options=options,
        DATABASE_URL=pgbouncer.url,
        JOBSTATE_TEST_POOLER="transaction",
    )
    add.enqueue(1, 1)
    try:
        code, _out, err = finish(process)
    finally:
        stop(process)
    assert code == 0, err
    assert "wake-up by polling every 0.25 s" in err
