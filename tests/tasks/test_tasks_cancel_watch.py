"""What the worker asks the store about cancels: only the attempts still running, so a
worker whose tasks end before its next turn spends no statement on them; a cancel that
lands after an attempt's thread ended is told by the row that refuses its report."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from jobstate.core.attempt_log import AttemptOutcome, read_attempt_log
from jobstate.core.states import JobStatus
from jobstate.models import Job
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import task_backends
from jobstate.tasks.policies import StoredPolicy
from jobstate.tasks.worker import TaskWorker, WorkerConfig
from jobstate.tasks.worker.cancellation import CancelWatch
from jobstate.tasks.worker.execution import Attempt
from tests.support.stores import MemoryTasks
from tests.support.task_functions import cancelled_as_it_returns
from tests.support.tasks_kit import use_options

pytestmark = pytest.mark.mysql


class AskedStore:
    """Records which claims ``lost_claims`` was asked about; every one is still held."""

    def __init__(self) -> None:
        self.asked: list[list[Any]] = []

    def lost_claims(self, claims: Sequence[tuple[Any, Any]]) -> dict[Any, JobStatus]:
        self.asked.append([job_id for job_id, _token in claims])
        return {}


def attempt(*, started: bool, ended: bool = False) -> Attempt:
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    job = Job(id=uuid.uuid4(), claim_token=uuid.uuid4().hex, task_path="tests.noop")
    held = Attempt(
        job=job,
        alias="default",
        worker_id="worker-a",
        sender=JobStateBackend,
        policy=StoredPolicy.of(None, backend.task_options),
    )
    if started:
        assert held._move((held._state,), type(held._state).RUNNING)
    if ended:
        held._end()
    return held


@pytest.mark.backend  # the task backend's options read the database settings
def test_the_cancel_watch_asks_only_about_attempts_that_have_not_ended() -> None:
    store = AskedStore()
    watch = CancelWatch(store, every=0)  # type: ignore[arg-type]
    waiting, running = attempt(started=False), attempt(started=True)
    ended = attempt(started=True, ended=True)

    watch.check([waiting, running, ended])
    watch.check([ended])

    # The ended attempt is left to its report; nothing at all is asked about it alone.
    assert store.asked == [[waiting.job.id, running.job.id]]


@pytest.mark.usefixtures("memory_tasks")
def test_a_cancel_after_the_task_returned_is_logged_and_counted_as_a_cancel(
    settings: Any, memory_tasks: MemoryTasks, caplog: pytest.LogCaptureFixture
) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    queued = cancelled_as_it_returns.enqueue()
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    worker = TaskWorker(
        WorkerConfig(interval=0.01, schedules=False, grace=5, batch=True, worker_id="w"),
        backend,
    )

    with caplog.at_level(logging.INFO, logger="jobstate.worker"):
        summary = worker.run()

    assert (summary.started, summary.cancelled, summary.succeeded, summary.lost) == (1, 1, 0, 0)
    assert "stopped after" in caplog.text and "it was cancelled" in caplog.text
    assert "its claim was lost" not in caplog.text
    # The stop line adds up: the one task started ended cancelled.
    assert "1 started, 0 succeeded, 0 retrying, 0 failed, 1 cancelled, 0 lost" in caplog.text
    job = memory_tasks.store.get_job(queued.id)
    assert job is not None and job.status == JobStatus.REJECTED
    (logged,) = read_attempt_log(job.attempt_log)
    assert logged.outcome is AttemptOutcome.CANCELLED
