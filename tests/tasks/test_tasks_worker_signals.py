"""How a ``jobstate_worker`` process stops and what happens to its tasks: a graceful
SIGTERM or SIGINT, a grace that runs out, a second signal, and SIGKILL, after which the
task is recovered (by ``reap_stale`` or by another worker) and succeeds on attempt 2
with both workers recorded. Also: a running task's lease is renewed, so nobody recovers
it; and on PostgreSQL an idle worker starts a new task at once (LISTEN/NOTIFY)."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from jobstate.core.attempt_log import read_attempt_log
from jobstate.core.states import TASK_NOTIFY_CHANNEL, JobStatus
from jobstate.models import Job
from jobstate.tasks.compat import TaskResultStatus
from tests.support.task_functions import add, async_sleeps, floods_the_log, started_then_sleeps
from tests.support.tasks_kit import finish, start_worker, stop, use_options, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: How far the database's clock and this process's may disagree in these tests.
CLOCK_SLACK = timedelta(seconds=1)

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def running(result_id: str) -> bool:
    return Job.objects.filter(id=result_id, status=JobStatus.RUNNING).exists()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_lets_the_running_task_finish_and_claims_nothing_more(
    settings: Any, signum: int, tmp_path: Path
) -> None:
    options = use_options(settings)
    marker = tmp_path / "started"
    first = started_then_sleeps.enqueue(1.5, str(marker))
    later = [add.enqueue(n, n) for n in range(3)]
    worker = start_worker("--concurrency", "1", options=options)
    try:
        wait_for(marker.exists, what="the first task to start")
        worker.send_signal(signum)
        signalled = time.monotonic()
        code, _out, err = finish(worker, timeout=20)
    finally:
        stop(worker)
    assert code == 0, err
    assert time.monotonic() - signalled < 10
    assert "Traceback" not in err
    assert started_then_sleeps.get_result(first.id).status == SUCCESSFUL
    for result in later:
        assert add.get_result(result.id).status == READY
        assert add.get_result(result.id).attempts == 0
    assert f"stopped ({signal.Signals(signum).name})" in err


@pytest.mark.parametrize("reload", [False, True], ids=["no-reload", "reload"])
def test_a_worker_started_with_sigint_ignored_stops_gracefully_on_the_sigterm_after_it(
    settings: Any, tmp_path: Path, reload: bool
) -> None:
    # What Ctrl-C in a script's terminal does to the script's background worker: the
    # SIGINT reaches it too, then the script stops it with SIGTERM. The SIGINT stays
    # ignored (by the reload supervisor and the worker it starts alike), so the SIGTERM
    # is the first signal, a graceful stop, not a second that exits at once and leaves
    # the running task to its lease.
    options = use_options(settings)
    marker = tmp_path / "started"
    first = started_then_sleeps.enqueue(1.5, str(marker))
    worker = start_worker(
        "--concurrency",
        "1",
        "--reload" if reload else "--no-reload",
        options=options,
        ignoring_sigint=True,
    )
    try:
        wait_for(marker.exists, what="the task to start")
        worker.send_signal(signal.SIGINT)
        time.sleep(0.3)
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker, timeout=20)
    finally:
        stop(worker)
    assert code == 0, err
    assert "again" not in err and "Traceback" not in err
    assert "stopped (SIGTERM)" in err
    assert started_then_sleeps.get_result(first.id).status == SUCCESSFUL


@pytest.mark.parametrize("reload", [False, True], ids=["no-reload", "reload"])
def test_one_stop_delivered_twice_at_once_stops_the_worker_gracefully(
    settings: Any, tmp_path: Path, reload: bool
) -> None:
    """``timeout`` signals its command and then its own process group, which holds the
    reload supervisor: the supervisor forwarded both, and the worker took the second
    for an operator's second signal, exiting at once with its task left to the lease
    (systemd's default kill, every process of the service, does the same)."""
    options = use_options(settings)
    marker = tmp_path / "started"
    first = started_then_sleeps.enqueue(1.5, str(marker))
    worker = start_worker("--reload" if reload else "--no-reload", options=options)
    try:
        wait_for(marker.exists, what="the task to start")
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.02)  # handled apart, as two deliveries a moment apart are
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker, timeout=20)
    finally:
        stop(worker)
    assert code == 0, err
    assert "again" not in err and "stopped (SIGTERM)" in err
    assert started_then_sleeps.get_result(first.id).status == SUCCESSFUL


def test_a_task_still_running_when_the_grace_ends_is_handed_back_with_its_attempt(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2)
    marker = tmp_path / "started"
    slow = started_then_sleeps.enqueue(30, str(marker))
    worker = start_worker("--grace", "1", "--worker-id", "graceful", options=options)
    try:
        wait_for(marker.exists, what="the task to start")
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker, timeout=20)
    finally:
        stop(worker)
    assert code == 0, err
    result = started_then_sleeps.get_result(slow.id)
    assert result.status == READY and result.attempts == 1
    assert result.worker_ids == ["graceful"]
    assert result.errors[0].exception_class_path == "jobstate.exceptions.WorkerLost"
    assert "grace of 1 s ran out" in result.errors[0].traceback
    assert "1 interrupted" in err
    # The attempt ran through the whole grace (and before the signal): its log line says
    # so, not "in 0 ms".
    ran = re.search(r"attempt 1/2 worker lost .* in (\d+) ms", err)
    assert ran is not None, err
    assert int(ran.group(1)) >= 1000


def test_a_worker_that_gave_up_on_an_async_task_exits_without_waiting_for_it(
    settings: Any, tmp_path: Path
) -> None:
    """An ``async def`` task runs in an event loop's thread, which no interrupt reaches
    and which Python waits for at exit: the worker had reported the attempt lost and
    logged that it stopped, then lived on until the coroutine returned, while the
    task's next attempt could start elsewhere once the lease ran out."""
    options = use_options(settings, MAX_ATTEMPTS=2)
    marker = tmp_path / "started"
    slow = async_sleeps.enqueue(60, str(marker))
    worker = start_worker("--grace", "1", "--worker-id", "gives-up", options=options)
    try:
        wait_for(marker.exists, what="the task to start")
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker, timeout=30)
        took = time.monotonic() - signalled
    finally:
        stop(worker)
    assert code == 0, err
    assert took < 15, (took, err)
    assert "1 interrupted" in err
    assert "Exiting without waiting for the threads of the 1 task the worker gave up on" in err
    result = async_sleeps.get_result(slow.id)
    assert result.status == READY and result.attempts == 1
    assert result.errors[0].exception_class_path == "jobstate.exceptions.WorkerLost"


def signal_twice(worker: subprocess.Popen[str]) -> None:
    """SIGTERM, and half a second later SIGTERM again: stop at once."""
    worker.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    worker.send_signal(signal.SIGTERM)


def test_a_second_signal_exits_at_once_and_the_lease_brings_the_task_back(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2, LEASE=1.0)
    marker = tmp_path / "started"
    slow = started_then_sleeps.enqueue(30, str(marker))
    worker = start_worker("--grace", "60", "--worker-id", "impatient", options=options)
    try:
        # The task's own start, not its claim: a graceful stop hands back a task claimed
        # but not yet started and the worker exits before the second signal comes.
        wait_for(marker.exists, what="the task to start")
        signal_twice(worker)
        code, _out, err = finish(worker, timeout=10)
    finally:
        stop(worker)
    assert code == 128 + signal.SIGTERM, err
    assert "exiting at once" in err
    assert started_then_sleeps.get_result(slow.id).status == RUNNING  # until its lease ends
    time.sleep(1.2)
    call_command("reap_stale", verbosity=0)
    result = started_then_sleeps.get_result(slow.id)
    assert result.status == READY and result.worker_ids == ["impatient"]


def test_a_second_signal_exits_at_once_even_when_the_log_blocks(
    settings: Any, tmp_path: Path
) -> None:
    # The worker's stderr is a pipe nobody reads (a supervisor that stopped reading it):
    # a task logging a lot fills it and blocks while writing, holding the stream. The
    # worker's own log lines, and the flush before it exits, then block too; the second
    # signal must still end the process.
    options = use_options(settings, MAX_ATTEMPTS=1, LEASE=1.0)
    marker = tmp_path / "started"
    floods_the_log.enqueue(2000, str(marker))
    worker = start_worker("--grace", "60", options=options)
    try:
        wait_for(marker.exists, what="the flooding task to start")
        time.sleep(1)  # the pipe fills
        signal_twice(worker)
        try:
            code = worker.wait(timeout=15)  # the pipe still unread
        except subprocess.TimeoutExpired:
            pytest.fail("the worker hung on its blocked log after a second SIGTERM")
    finally:
        stop(worker)
    assert code == 128 + signal.SIGTERM


def test_a_receiver_that_never_returns_delays_a_stop_by_a_bounded_wait(settings: Any) -> None:
    """A ``task_finished`` receiver that never returns: the worker goes on with its
    tasks, and when told to stop it waits for the announcements until its grace is
    over (5 s at least), says what it could not announce, and exits, settled."""
    options = use_options(settings)
    queued = [add.enqueue(n, n) for n in range(3)]
    worker = start_worker("--grace", "1", options=options, JOBSTATE_TEST_STUCK_RECEIVER="1")
    try:
        # The receiver of the first task never returns; the others run all the same.
        wait_for(
            lambda: all(add.get_result(r.id).status == SUCCESSFUL for r in queued),
            what="every task to succeed",
        )
        worker.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    assert code == 0, err
    assert 4 < time.monotonic() - signalled < 15, err
    assert "log line(s) or task_finished announcement(s) were not made" in err, err
    assert err.rstrip().endswith("0 handed back, 0 interrupted"), err
    assert "3 started, 3 succeeded" in err


@pytest.mark.parametrize("raised", ["SystemExit", "KeyboardInterrupt"])
def test_a_receiver_that_raises_what_is_not_an_exception_is_logged_and_the_next_still_runs(
    settings: Any, raised: str, tmp_path: Path
) -> None:
    """Django's ``send_robust`` catches ``Exception`` only: a ``task_finished`` receiver
    that raised ``SystemExit`` or ``KeyboardInterrupt`` kept the receivers after it from
    running, for every task, and was named only in a plain line on stderr."""
    options = use_options(settings)
    notes = tmp_path / "notes"
    queued = [add.enqueue(n, n) for n in range(3)]
    worker = start_worker(
        "--batch",
        options=options,
        JOBSTATE_TEST_RAISING_RECEIVER=raised,
        JOBSTATE_TEST_RECEIVER_NOTES=str(notes),
    )
    try:
        code, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    assert code == 0, err
    assert "3 started, 3 succeeded" in err
    assert notes.exists() and sorted(notes.read_text().split()) == sorted(r.id for r in queued)
    for result in queued:
        # As a receiver that raises an Exception is logged.
        assert f"raised for task {result.id}: {raised}('a receiver gives up')" in err, err


def test_a_killed_workers_task_is_recovered_and_succeeds_on_attempt_two(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2, LEASE=1.0)
    task = started_then_sleeps.enqueue(2)
    doomed = start_worker("--worker-id", "doomed", options=options)
    try:
        wait_for(lambda: running(task.id), what="the task to start")
        doomed.send_signal(signal.SIGKILL)
        code, _out, _err = finish(doomed)
    finally:
        stop(doomed)
    assert code == -signal.SIGKILL
    assert started_then_sleeps.get_result(task.id).status == RUNNING
    # Once its lease has run out, the sweep puts it back with the lost attempt counted.
    wait_for(
        lambda: Job.objects.filter(id=task.id, lease_until__lt=Now()).exists(),
        what="the lease to run out",
    )
    before_sweep = timezone.now()
    call_command("reap_stale", verbosity=0)
    recovered = started_then_sleeps.get_result(task.id)
    assert recovered.status == READY and recovered.worker_ids == ["doomed"]
    # The lost attempt ends when the sweep found it lost, so the job's page can place
    # it in time and say how long it was held.
    (lost_attempt,) = read_attempt_log(Job.objects.get(id=task.id).attempt_log)
    assert lost_attempt.started_at is not None and lost_attempt.finished_at is not None
    assert lost_attempt.finished_at >= before_sweep - CLOCK_SLACK
    assert lost_attempt.finished_at > lost_attempt.started_at

    worker = start_worker("--batch", "--worker-id", "rescuer", options=options)
    try:
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 0, err
    result = started_then_sleeps.get_result(task.id)
    assert result.status == SUCCESSFUL and result.attempts == 2
    assert result.worker_ids == ["doomed", "rescuer"]
    (lost,) = result.errors
    assert lost.exception_class_path == "jobstate.exceptions.WorkerLost"


def test_a_running_worker_recovers_a_killed_workers_task_by_itself(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2, LEASE=1.0)
    task = started_then_sleeps.enqueue(1)
    doomed = start_worker("--worker-id", "doomed", options=options)
    try:
        wait_for(lambda: running(task.id), what="the task to start")
        doomed.send_signal(signal.SIGKILL)
        finish(doomed)
    finally:
        stop(doomed)
    survivor = start_worker("--worker-id", "survivor", options=options)
    try:
        wait_for(
            lambda: started_then_sleeps.get_result(task.id).status == SUCCESSFUL,
            timeout=30,
            what="the survivor to recover and run the task",
        )
        survivor.send_signal(signal.SIGTERM)
        code, _out, err = finish(survivor)
    finally:
        stop(survivor)
    assert code == 0, err
    result = started_then_sleeps.get_result(task.id)
    assert result.worker_ids == ["doomed", "survivor"] and result.attempts == 2
    assert "Recovered 1 task(s)" in err


def test_a_running_tasks_lease_is_renewed_so_nobody_recovers_it(settings: Any) -> None:
    options = use_options(settings, LEASE=1.0)
    task = started_then_sleeps.enqueue(3)
    worker = start_worker("--batch", options=options)
    try:
        wait_for(lambda: running(task.id), what="the task to start")
        deadline = time.monotonic() + 2.5
        while time.monotonic() < deadline:  # well past the 1 s lease
            call_command("reap_stale", verbosity=0)
            time.sleep(0.3)
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 0, err
    result = started_then_sleeps.get_result(task.id)
    assert result.status == SUCCESSFUL and result.attempts == 1 and result.errors == []


def listening() -> bool:
    """Whether a connection to the test database has run ``LISTEN`` on the tasks' channel
    as its last statement (a worker's listener, waiting for notifications)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query = %s",
            [f"LISTEN {TASK_NOTIFY_CHANNEL}"],
        )
        (count,) = cursor.fetchone()
    return count > 0


@pytest.mark.postgres
def test_an_idle_worker_starts_a_new_task_at_once_on_postgresql(settings: Any) -> None:
    options = use_options(settings)
    assert not listening()
    worker = start_worker("--interval", "30", options=options)
    try:
        wait_for(listening, timeout=60, what="the worker's LISTEN connection")
        queued = add.enqueue(1, 1)
        enqueued = time.monotonic()
        wait_for(lambda: add.get_result(queued.id).status == SUCCESSFUL, timeout=10)
        latency = time.monotonic() - enqueued
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 0, err
    assert "wake-up by LISTEN/NOTIFY" in err
    assert latency < 5  # polling alone would wait up to 30 s
