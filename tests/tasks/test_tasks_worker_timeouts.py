"""Tasks that hang past ``TIMEOUT`` and tasks a worker cannot import, with real
``jobstate_worker`` processes: a timed-out attempt is interrupted and its next attempt
starts only once its thread has stopped; a task that swallows the interrupt makes its
worker exit with status 4, and its retry waits until that process is gone; a worker
whose code lacks a task hands it back uncounted, a newer worker runs it, and past
``UNKNOWN_TASK_TIMEOUT`` it fails; the result reads in a process that cannot import
the task."""

from __future__ import annotations

import math
import signal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from jobstate.core.states import JobStatus, NewTask
from jobstate.models import Job
from jobstate.stores import get_state_store
from jobstate.tasks.compat import TaskResultStatus, task_backends
from tests.support.task_functions import (
    add,
    async_sleeps,
    ignores_the_interrupt_once,
    notes_its_run,
)
from tests.support.tasks_kit import finish, run_batch, start_worker, stop, use_options, wait_for

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True), pytest.mark.slow]

READY, SUCCESSFUL, FAILED = (
    TaskResultStatus.READY,
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
)
TIMED_OUT = "jobstate.exceptions.TaskTimedOut"

#: A task module only the newer worker of a test can import.
FRESH_MODULE = """
from jobstate.tasks.compat import task


@task
def greet(name):
    return f"hello {name}"
"""


def notes(path: Path) -> list[tuple[int, str, float]]:
    """The lines a task wrote: (attempt, what, when)."""
    found = []
    for line in path.read_text().splitlines():
        attempt, what, when = line.split()
        found.append((int(attempt), what, float(when)))
    return found


def enqueue_path(task_path: str, *args: Any) -> Job:
    """A task of a dotted path this process need not import."""
    return get_state_store().enqueue_task(
        NewTask(
            target="tasks:default",
            task_path=task_path,
            queue_name="default",
            priority=0,
            args=list(args),
            kwargs={},
            max_attempts=1,
        )
    )


def test_a_timed_out_attempt_is_interrupted_and_its_retry_never_overlaps_it(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings, TIMEOUT=1.0, MAX_ATTEMPTS=3)
    path = tmp_path / "runs"
    queued = notes_its_run.enqueue(str(path), 4)
    fine = add.enqueue(1, 2)

    log = run_batch(options, "--concurrency", "2", tracebacks=True)

    result = notes_its_run.get_result(queued.id)
    assert result.status == FAILED and result.attempts == 3
    assert [error.exception_class_path for error in result.errors] == [TIMED_OUT] * 3
    runs: dict[int, dict[str, float]] = {}
    for attempt, what, when in notes(path):
        runs.setdefault(attempt, {})[what] = when
    assert sorted(runs) == [1, 2, 3]
    for earlier, later in ((1, 2), (2, 3)):
        # An attempt with no end was still running when its worker's process exited.
        assert runs[earlier].get("end", math.inf) <= runs[later]["start"], runs
    for attempt in (1, 2, 3):
        run = runs[attempt]
        # Interrupted near its timeout, long before its 4 s of work; its finally ran.
        assert run["end"] - run["start"] < 3, runs
    # Where the interrupt found the task is kept with the error.
    assert "TaskTimeLimitExceeded" in result.errors[0].traceback
    assert "ran longer than its timeout of 0:00:01" in result.errors[0].traceback
    assert "interrupted it" in log
    assert add.get_result(fine.id).status == SUCCESSFUL


def test_a_task_that_swallows_the_interrupt_makes_its_worker_exit_and_its_retry_waits(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings, TIMEOUT=1.0, MAX_ATTEMPTS=2, LEASE=2.0)
    path = tmp_path / "runs"
    queued = ignores_the_interrupt_once.enqueue(str(path), 60)
    later = add.enqueue(2, 2)
    stuck = start_worker("--grace", "1", "--worker-id", "stuck", options=options)
    other = None
    try:
        wait_for(path.exists, what="the first attempt to start")
        other = start_worker("--worker-id", "other", "--interval", "0.1", options=options)
        code, _out, err = finish(stuck, timeout=30)
        wait_for(
            lambda: ignores_the_interrupt_once.get_result(queued.id).status == SUCCESSFUL,
            timeout=30,
            what="the second attempt, on the other worker",
        )
        other.send_signal(signal.SIGTERM)
        other_code, _out, other_err = finish(other, timeout=30)
    finally:
        stop(stuck)
        if other is not None:
            stop(other)
    assert code == 4, err
    assert "its thread did not stop within 1 s of the interrupt" in err
    assert "stopped (a timed-out task did not stop)" in err
    assert other_code == 0, other_err
    result = ignores_the_interrupt_once.get_result(queued.id)
    assert result.attempts == 2 and result.worker_ids == ["stuck", "other"]
    assert result.return_value == 2
    (error,) = result.errors
    assert error.exception_class_path == TIMED_OUT
    assert "did not stop after the interrupt" in error.traceback
    lines = notes(path)
    assert any(what == "caught" for _attempt, what, _when in lines)
    second_start = next(when for attempt, what, when in lines if attempt == 2)
    assert max(when for attempt, _what, when in lines if attempt == 1) < second_start
    assert add.get_result(later.id).status == SUCCESSFUL


def test_a_worker_without_a_tasks_module_hands_it_back_and_a_newer_worker_runs_it(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings)
    newer_code = tmp_path / "newer"
    newer_code.mkdir()
    (newer_code / "jobstate_fresh_tasks.py").write_text(FRESH_MODULE)
    job = enqueue_path("jobstate_fresh_tasks.greet", "Ada")
    before = timezone.now()

    log = run_batch(options, "--worker-id", "older", tracebacks=True)

    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED and job.attempts == 0 and not job.attempt_log
    assert job.run_after is not None and job.run_after > before  # not claimed again at once
    assert log.count("this worker cannot import it") == 1
    newer = start_worker(
        "--worker-id", "newer", "--interval", "0.2", options=options, PYTHONPATH=str(newer_code)
    )
    backend = task_backends["default"]
    try:
        wait_for(
            lambda: backend.get_result(str(job.id)).status == SUCCESSFUL,
            timeout=30,
            what="the newer worker to run the task",
        )
        newer.send_signal(signal.SIGTERM)
        code, _out, err = finish(newer, timeout=30)
    finally:
        stop(newer)
    assert code == 0, err
    # This process cannot import the task either, and reads its result all the same.
    result = backend.get_result(str(job.id))
    assert result.return_value == "hello Ada"
    assert result.attempts == 1 and result.worker_ids == ["newer"]
    assert result.task.module_path == "jobstate_fresh_tasks.greet"


def test_a_task_no_worker_can_import_fails_past_the_unknown_task_timeout(settings: Any) -> None:
    options = use_options(settings, UNKNOWN_TASK_TIMEOUT=0.0, MAX_ATTEMPTS=3)
    job = enqueue_path("tests.support.task_functions.removed_long_ago")
    fine = add.enqueue(1, 1)

    run_batch(options, tracebacks=True)

    result = task_backends["default"].get_result(str(job.id))
    assert result.status == FAILED and result.attempts == 1
    (error,) = result.errors
    assert error.exception_class_path == "jobstate.exceptions.UnknownTask"
    assert "no worker could import the task 'tests.support.task_functions.removed_long_ago'" in (
        error.traceback
    )
    assert "UNKNOWN_TASK_TIMEOUT (0:00:00)" in error.traceback
    assert add.get_result(fine.id).status == SUCCESSFUL


def test_an_async_task_past_its_timeout_is_waited_for_and_fails_as_timed_out(
    settings: Any,
) -> None:
    options = use_options(settings, TIMEOUT=0.5)
    queued = async_sleeps.enqueue(2)

    log = run_batch(options, "--grace", "10", tracebacks=True)

    result = async_sleeps.get_result(queued.id)
    assert result.status == FAILED and result.attempts == 1
    (error,) = result.errors
    assert error.exception_class_path == TIMED_OUT
    assert "an async task cannot be interrupted" in log
    assert "did not stop" not in log
