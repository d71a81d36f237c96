"""A task's own policy (``jobstate.tasks.policy``): declared under ``@task``, checked when
declared, stored with each job and honoured by the worker from what was stored.

The worker runs in-process on the in-memory store and a fake clock (as in
``test_tasks_worker_in_process.py``): what ``retry_on`` and ``discard_on`` let retry,
the per-task timeout and backoff, and a job enqueued under an older declaration keeping
its policy after the code changed."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from typing import Any

import pytest

from jobstate.core.states import JobStatus
from jobstate.tasks import policy
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import TaskResultStatus, task_backends
from jobstate.tasks.policies import POLICY_ATTRIBUTE, TaskPolicy, policy_of
from jobstate.tasks.worker import TaskWorker, WorkerConfig, WorkerSummary
from tests.support import policy_tasks
from tests.support.policy_tasks import (
    no_timeout,
    picky,
    sleeps_past_its_timeout,
    slow_retry,
)
from tests.support.stores import MemoryTasks
from tests.support.tasks_kit import use_options

pytestmark = pytest.mark.mysql

SUCCESSFUL, FAILED, READY = (
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
    TaskResultStatus.READY,
)


def run_worker(*, timeout: float = 30, **config: Any) -> WorkerSummary:
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    worker = TaskWorker(WorkerConfig(interval=0.01, schedules=False, grace=5, **config), backend)
    watchdog = threading.Timer(timeout, worker.request_stop, args=("the watchdog",))
    watchdog.start()
    try:
        summary = worker.run()
    finally:
        watchdog.cancel()
    assert summary.stopped_by != "the watchdog", f"the worker did not stop within {timeout} s"
    return summary


def drain(memory_tasks: MemoryTasks, result_id: str) -> Any:
    """Run workers (moving the clock past each retry's backoff) until the task ends."""
    for _ in range(10):
        run_worker(batch=True)
        result = task_backends["default"].get_result(result_id)
        if result.status in (SUCCESSFUL, FAILED):
            return result
        memory_tasks.clock.advance(timedelta(hours=2))
    raise AssertionError("the task never finished")


# --- declaring -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "error", "says"),
    [
        ({"max_attempts": 0}, ValueError, "max_attempts"),
        ({"max_attempts": True}, TypeError, "max_attempts"),
        ({"max_attempts": "3"}, TypeError, "max_attempts"),
        ({"timeout": 5}, TypeError, "timeout"),
        ({"timeout": timedelta(0)}, ValueError, "timeout"),
        ({"retry_backoff": timedelta(seconds=-1)}, ValueError, "retry_backoff"),
        ({"retry_on": (ValueError, "KeyError")}, TypeError, "retry_on"),
        ({"retry_on": "ValueError"}, TypeError, "retry_on"),
        ({"discard_on": (int,)}, TypeError, "discard_on"),
        ({"unique": "yes"}, TypeError, "unique"),
        ({"unique_states": ("READY",)}, ValueError, "needs unique"),
        ({"unique": True, "unique_states": ("DONE",)}, ValueError, "'DONE' is none of them"),
        ({"unique": True, "unique_states": ("READY",)}, ValueError, "must include READY and"),
        ({"unique": True, "unique_states": "READY"}, TypeError, "unique_states"),
        ({"unique": True, "unique_states": ()}, ValueError, "unique_states"),
        ({"unique": True, "unique_for": timedelta(milliseconds=5)}, ValueError, "unique_for"),
        ({"unique_for": timedelta(hours=1)}, ValueError, "needs unique"),
        ({"concurrency_key": ""}, ValueError, "concurrency_key=...\\) is empty"),
        ({"concurrency_key": 7}, TypeError, "concurrency_key"),
    ],
)
def test_a_bad_declaration_fails_when_declared(
    arguments: dict[str, Any], error: type[Exception], says: str
) -> None:
    with pytest.raises(error, match=says):
        policy(**arguments)


def test_policy_goes_under_or_over_task_but_only_once() -> None:
    assert policy_of(policy_tasks.slow_retry) == TaskPolicy(
        max_attempts=2, retry_backoff=timedelta(minutes=10)
    )
    assert policy_of(policy_tasks.policy_over_task) == TaskPolicy(max_attempts=3)
    with pytest.raises(TypeError, match="already has a @policy"):
        policy(max_attempts=4)(policy_tasks.policy_over_task)
    with pytest.raises(TypeError, match="decorates a task's function"):
        policy()(42)  # type: ignore[type-var]


# --- stored with the job ----------------------------------------------------------------


def test_the_declared_policy_is_stored_with_each_job(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    use_options(settings, MAX_ATTEMPTS=1, TIMEOUT=30.0)
    job = memory_tasks.store.get_job(picky.enqueue("KeyError").id)
    assert job is not None and job.max_attempts == 4
    assert job.policy == {
        "discard_on": ["builtins.ValueError"],
        "retry_on": ["builtins.ConnectionError"],
    }
    job = memory_tasks.store.get_job(no_timeout.enqueue(0).id)
    # No timeout, stated: the backend's TIMEOUT does not apply to it.
    assert job is not None and job.policy == {"timeout": None} and job.max_attempts == 1


# --- honoured by the worker -------------------------------------------------------------


def test_retry_on_retries_what_it_names_and_fails_the_rest_at_once(
    settings: Any, memory_tasks: MemoryTasks, caplog: pytest.LogCaptureFixture
) -> None:
    use_options(settings)
    retried = drain(memory_tasks, picky.enqueue("Transient").id)
    assert (retried.status, retried.attempts, retried.return_value) == (SUCCESSFUL, 4, 4)

    caplog.set_level(logging.INFO, logger="jobstate.worker")
    failed = drain(memory_tasks, picky.enqueue("KeyError").id)
    assert (failed.status, failed.attempts) == (FAILED, 1)
    assert failed.errors[0].exception_class_path == "builtins.KeyError"
    # The log says why attempt 1 of 4 was the last, not that none was left.
    assert "attempt 1/4 failed" in caplog.text
    assert "not retried: the task's retry_on does not name it" in caplog.text
    assert "no attempt left" not in caplog.text


def test_discard_on_fails_at_once_even_with_attempts_left(
    settings: Any, memory_tasks: MemoryTasks, caplog: pytest.LogCaptureFixture
) -> None:
    use_options(settings)
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    result = drain(memory_tasks, picky.enqueue("ValueError").id)
    assert (result.status, result.attempts) == (FAILED, 1)
    job = memory_tasks.store.get_job(result.id)
    assert job is not None and job.status == JobStatus.ERROR
    assert "not retried: the task's discard_on names it" in caplog.text


def test_a_task_timeout_overrides_the_backend_timeout(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    # The backend allows 60 s; the task declares 0.3 s and is stopped there.
    use_options(settings, TIMEOUT=60.0)
    result = drain(memory_tasks, sleeps_past_its_timeout.enqueue(3).id)
    assert (result.status, result.attempts) == (FAILED, 1)
    assert result.errors[0].exception_class_path == "jobstate.exceptions.TaskTimedOut"
    assert "timeout of 0:00:00.300000" in result.errors[0].traceback

    # The backend allows 0.2 s; the task declares no timeout and runs its 0.5 s.
    use_options(settings, TIMEOUT=0.2)
    result = drain(memory_tasks, no_timeout.enqueue(0.5).id)
    assert (result.status, result.return_value) == (SUCCESSFUL, 0.5)


def test_a_task_backoff_overrides_the_backend_backoff(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    use_options(settings, RETRY_BACKOFF=1.0)
    queued = slow_retry.enqueue()
    summary = run_worker(batch=True)
    assert summary.retrying == 1
    job = memory_tasks.store.get_job(queued.id)
    assert job is not None and job.run_after is not None
    wait = job.run_after - memory_tasks.clock.now()
    # Ten minutes, ±10 % — not the backend's one second.
    assert timedelta(minutes=9) <= wait <= timedelta(minutes=11)
    assert run_worker(batch=True).started == 0


def test_a_job_keeps_the_policy_it_was_enqueued_with_after_the_code_changes(
    settings: Any, memory_tasks: MemoryTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_options(settings)
    queued = picky.enqueue("Transient")
    # A newer deploy: the task now retries nothing and allows a single attempt.
    monkeypatch.setattr(
        picky.func, POLICY_ATTRIBUTE, TaskPolicy(max_attempts=1, retry_on=("builtins.KeyError",))
    )
    result = drain(memory_tasks, queued.id)
    # Four attempts, Transient retried: the policy stored when it was enqueued.
    assert (result.status, result.attempts) == (SUCCESSFUL, 4)
    # New jobs get the new declaration.
    failed = drain(memory_tasks, picky.enqueue("Transient").id)
    assert (failed.status, failed.attempts) == (FAILED, 1)


def test_policy_tasks_module_declares_what_the_tests_use() -> None:
    # The module's tasks keep their policy however they are reached.
    assert policy_of(policy_tasks.picky.using(priority=5)) == policy_of(policy_tasks.picky)
