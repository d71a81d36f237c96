"""The worker run in-process: :class:`~jobstate.tasks.worker.Worker` on the test's own
thread, on the in-memory state store and a fake clock (the ``memory_tasks`` fixture).

The subprocess tests (``test_tasks_worker*.py``) run the same worker as
``manage.py jobstate_worker`` on a real database and wait for it on the wall clock;
these start no process and sleep for nothing. A task runs and its result is stored, a
failing task is retried up to ``MAX_ATTEMPTS`` once each backoff has passed on the
clock, then fails, ``--max-tasks`` and ``--batch`` stop the worker, and a task whose
worker lost its lease is recovered and run again."""

from __future__ import annotations

import io
import logging
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

from jobstate.core.states import JobStatus
from jobstate.exceptions import StoreUnavailable
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import TaskResultStatus, builtin_tasks, task_backends, task_finished
from jobstate.tasks.worker import TaskWorker, WorkerConfig, WorkerSummary
from jobstate.tasks.worker.execution import Attempt, ExecutionPool
from jobstate.tasks.worker.presence import WorkerPresence
from jobstate.testing import FakeClock
from tests.support.stores import MemoryTasks
from tests.support.task_functions import (
    add,
    always_fails,
    first_attempt_waits,
    raises_a_payload_error,
)
from tests.support.tasks_kit import use_options

pytestmark = pytest.mark.mysql

SUCCESSFUL, FAILED, READY = (
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
    TaskResultStatus.READY,
)

#: What the watchdog gives as the stop reason of a worker that did not stop by itself.
STUCK = "the test's watchdog"


def run_worker(*, timeout: float = 30, **config: Any) -> WorkerSummary:
    """Run a worker on this thread until it stops by itself (``batch``, ``max_tasks``).
    One still running after ``timeout`` seconds is stopped and fails the test."""
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    worker = TaskWorker(WorkerConfig(interval=0.01, schedules=False, grace=5, **config), backend)
    watchdog = threading.Timer(timeout, worker.request_stop, args=(STUCK,))
    watchdog.start()
    try:
        summary = worker.run()
    finally:
        watchdog.cancel()
    assert summary.stopped_by != STUCK, f"the worker did not stop within {timeout} s"
    return summary


def test_a_task_runs_and_its_result_is_stored(settings: Any, memory_tasks: MemoryTasks) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    queued = add.enqueue(2, 3)

    summary = run_worker(batch=True, worker_id="worker-a")

    assert (summary.started, summary.succeeded, summary.failed) == (1, 1, 0)
    assert summary.stopped_by == "--batch: no task ready"
    result = add.get_result(queued.id)
    assert result.status == SUCCESSFUL and result.return_value == 5
    assert result.worker_ids == ["worker-a"] and result.attempts == 1 and result.errors == []
    # Every instant is the fake clock's: it did not move, so they are all the same.
    assert result.enqueued_at == result.started_at == memory_tasks.clock.now()
    job = memory_tasks.store.get_job(queued.id)
    assert job is not None and job.status == JobStatus.DONE and job.claim_token is None


def test_a_failing_task_retries_up_to_max_attempts_then_fails(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    use_options(settings, MAX_ATTEMPTS=3, RETRY_BACKOFF=60.0)
    clock: FakeClock = memory_tasks.clock
    queued = always_fails.enqueue("no luck")

    for attempt in (1, 2):
        summary = run_worker(batch=True, worker_id="worker-b")
        assert (summary.started, summary.retrying, summary.failed) == (1, 1, 0)
        result = always_fails.get_result(queued.id)
        assert result.status == READY and result.attempts == attempt
        # The retry is not due before its backoff (60 s doubling, ±10 %) has passed on
        # the store's clock: a worker now finds nothing ready.
        assert run_worker(batch=True, worker_id="worker-b").started == 0
        clock.advance(timedelta(seconds=60 * 2 ** (attempt - 1) * 1.1 + 1))

    summary = run_worker(batch=True, worker_id="worker-b")
    assert (summary.started, summary.retrying, summary.failed) == (1, 0, 1)
    result = always_fails.get_result(queued.id)
    assert result.status == FAILED and result.attempts == 3
    assert result.worker_ids == ["worker-b"] * 3
    assert [e.exception_class_path for e in result.errors] == [
        "tests.support.task_functions.Boom"
    ] * 3
    assert all("no luck" in error.traceback for error in result.errors)
    job = memory_tasks.store.get_job(queued.id)
    assert job is not None and job.status == JobStatus.ERROR
    assert job.error == "tests.support.task_functions.Boom: no luck"
    # Nothing is left to run, however far the clock moves.
    clock.advance(timedelta(days=1))
    assert run_worker(batch=True).started == 0


def test_max_tasks_stops_the_worker_and_batch_stops_it_once_nothing_is_ready(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    use_options(settings)
    queued = [add.enqueue(n, n) for n in range(3)]

    summary = run_worker(max_tasks=2, worker_id="worker-c")

    assert (summary.started, summary.succeeded) == (2, 2)
    assert summary.stopped_by == "--max-tasks 2 reached"
    statuses = [add.get_result(result.id).status for result in queued]
    assert statuses == [SUCCESSFUL, SUCCESSFUL, READY]  # claimed in enqueue order

    summary = run_worker(batch=True, concurrency=2, worker_id="worker-d")

    assert (summary.started, summary.succeeded) == (1, 1)
    assert summary.stopped_by == "--batch: no task ready"
    assert [add.get_result(result.id).return_value for result in queued] == [0, 2, 4]
    assert add.get_result(queued[2].id).worker_ids == ["worker-d"]


def test_batch_runs_the_tasks_a_task_finished_receiver_enqueues_before_it_stops(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    """A receiver that enqueues a follow-up task (a chain) runs on the announcer's
    thread, after the worker's round: ``--batch`` found nothing ready and stopped
    before the receiver had run, leaving the follow-up queued, a queue it was to
    drain."""
    use_options(settings)
    first = add.enqueue(1, 2)
    follow_ups: list[str] = []

    def chains(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if task_result.id == first.id:
            time.sleep(0.2)  # a webhook first, say
            follow_ups.append(add.enqueue(3, 4).id)

    task_finished.connect(chains)
    try:
        summary = run_worker(batch=True)
    finally:
        task_finished.disconnect(chains)
    assert (summary.started, summary.succeeded) == (2, 2)
    (follow_up,) = follow_ups
    assert add.get_result(follow_up).return_value == 7


def test_a_task_whose_worker_lost_its_lease_is_recovered_and_run_again(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    use_options(settings, MAX_ATTEMPTS=2, LEASE=30.0)
    store, clock = memory_tasks.store, memory_tasks.clock
    queued = add.enqueue(1, 2)
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    # A worker claimed the task, then died: it never renews the lease nor reports.
    (claimed,) = store.claim_tasks(
        target=backend.target,
        queues=["default"],
        worker_id="worker-dead",
        lease=timedelta(seconds=30),
        limit=1,
    )
    assert str(claimed.id) == queued.id

    # While the lease holds on the store's clock, the task is the dead worker's.
    assert run_worker(batch=True, worker_id="worker-e").started == 0
    assert add.get_result(queued.id).status == TaskResultStatus.RUNNING

    clock.advance(timedelta(seconds=31))
    summary = run_worker(batch=True, worker_id="worker-e")

    assert (summary.started, summary.succeeded) == (1, 1)
    result = add.get_result(queued.id)
    assert result.status == SUCCESSFUL and result.return_value == 3
    assert result.attempts == 2 and result.worker_ids == ["worker-dead", "worker-e"]
    (lost,) = result.errors
    assert lost.exception_class_path == "jobstate.exceptions.WorkerLost"


def test_a_task_claimed_but_never_started_is_handed_back_and_not_counted_as_started(
    settings: Any, memory_tasks: MemoryTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop line counted a task no thread had started as started ("1 started, ...,
    1 handed back") when the stop came between its claim and its thread."""
    use_options(settings, MAX_ATTEMPTS=3)
    queued = add.enqueue(2, 3)
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    worker = TaskWorker(
        WorkerConfig(interval=0.01, schedules=False, grace=5, worker_id="worker-a"), backend
    )

    def stopped_before_a_thread_took_it(pool: ExecutionPool, attempt: Attempt) -> None:
        worker.request_stop("SIGTERM")

    monkeypatch.setattr(ExecutionPool, "submit", stopped_before_a_thread_took_it)
    summary = worker.run()

    assert (summary.started, summary.handed_back, summary.stopped_by) == (0, 1, "SIGTERM")
    job = memory_tasks.store.get_job(queued.id)
    assert job is not None and job.status == JobStatus.QUEUED and job.attempts == 0


def test_a_worker_that_cannot_register_waits_between_tries_whatever_woke_it(
    settings: Any, memory_tasks: MemoryTasks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started before its database was up, a worker retried its registration thousands
    of times a second, each logged as "trying again in 30.0 s": the LISTEN thread,
    failing to connect too, had set the wake-up, and nothing cleared it (found by an
    outside pass: 32,687 lines in 20 s)."""
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    worker = TaskWorker(
        WorkerConfig(interval=0.05, schedules=False, grace=1, worker_id="worker-a"), backend
    )
    tries: list[float] = []

    def unreachable(presence: WorkerPresence) -> None:
        tries.append(time.monotonic())
        raise StoreUnavailable("register_worker failed: the database is unavailable")

    monkeypatch.setattr(WorkerPresence, "register", unreachable)
    worker._wake.set()  # as the LISTEN thread does when it cannot connect
    stopper = threading.Timer(1.0, worker.request_stop, args=("SIGTERM",))
    stopper.start()
    try:
        summary = worker.run()
    finally:
        stopper.cancel()

    assert summary.started == 0
    # 0.05 s, then twice as long each time: a handful of tries in a second.
    assert 3 <= len(tries) <= 8, len(tries)


def test_an_exception_whose_traceback_cannot_be_formatted_fails_only_its_task(
    settings: Any, memory_tasks: MemoryTasks, capsys: pytest.CaptureFixture[str]
) -> None:
    """A task raising an API client's error whose ``__getattr__`` raises KeyError stopped
    the worker with status 1: Django's log of the failed task formats its traceback, and
    that raised out of the log handler, then out of the worker's own log of it. Found by
    an outside pass."""
    use_options(settings, MAX_ATTEMPTS=1)
    failing = raises_a_payload_error.enqueue()
    after = add.enqueue(1, 2)
    handler = logging.StreamHandler(io.StringIO())
    # Where Django's receiver logs a task's end (the backport's name on Django 5.2).
    tasks_logger = logging.getLogger("django.tasks" if builtin_tasks else "django_tasks")
    tasks_logger.addHandler(handler)
    try:
        summary = run_worker(batch=True, worker_id="worker-a")
    finally:
        tasks_logger.removeHandler(handler)

    assert (summary.started, summary.failed, summary.succeeded) == (2, 1, 1)
    assert raises_a_payload_error.get_result(failing.id).status == FAILED
    assert add.get_result(after.id).return_value == 3
    if sys.version_info < (3, 13):  # 3.13's traceback module passes over such __notes__
        assert "but logging or announcing it raised builtins.KeyError" in capsys.readouterr().err


def test_a_task_claimed_again_while_its_lost_attempt_still_runs_keeps_both_tracked(
    settings: Any, memory_tasks: MemoryTasks, tmp_path: Any
) -> None:
    """A worker frozen past its lease claimed its own recovered task again while the
    first attempt's thread still ran; the worker kept one attempt per job, so settling
    one forgot the other: the worker stopped (or stopped renewing the live attempt's
    lease) while a thread of its own still ran the task. Found by an outside pass."""
    use_options(settings, MAX_ATTEMPTS=3, LEASE=30.0)
    store, clock = memory_tasks.store, memory_tasks.clock
    queued = first_attempt_waits.enqueue(str(tmp_path))
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    worker = TaskWorker(
        WorkerConfig(
            interval=0.01, schedules=False, grace=5, batch=True, worker_id="w-1", concurrency=2
        ),
        backend,
    )
    summaries: list[WorkerSummary] = []
    thread = threading.Thread(target=lambda: summaries.append(worker.run()), daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not (tmp_path / "started").exists():
            assert time.monotonic() < deadline, "the first attempt did not start"
            time.sleep(0.01)
        # The worker's lease runs out as if it had been frozen; a sweep recovers the task.
        clock.advance(timedelta(seconds=31))
        assert store.recover_expired_tasks().requeued == 1
        while first_attempt_waits.get_result(queued.id).status != SUCCESSFUL:
            assert time.monotonic() < deadline, "the second attempt did not succeed"
            time.sleep(0.01)
        # The first attempt's thread still runs: the worker still holds it.
        time.sleep(0.2)
        assert thread.is_alive(), "the worker stopped while a task of its own still ran"
    finally:
        (tmp_path / "go").touch()
        thread.join(10)
    (summary,) = summaries
    assert (summary.started, summary.succeeded, summary.lost) == (2, 1, 1)
    result = first_attempt_waits.get_result(queued.id)
    assert result.return_value == 2 and result.attempts == 2


def run_past_a_block(
    entered: threading.Event,
    release: threading.Event,
    last_id: str,
    what: str,
    meanwhile: Callable[[], None] = lambda: None,
) -> WorkerSummary:
    """Run a ``--batch`` worker of one thread on its own thread; once the host's code
    (``what``) blocks on ``release`` (``entered`` set), the task ``last_id`` must still
    succeed, within 5 s, and ``meanwhile`` is called, before ``release`` is set. The
    worker's summary."""
    summaries: list[WorkerSummary] = []
    thread = threading.Thread(
        target=lambda: summaries.append(run_worker(batch=True, concurrency=1)), daemon=True
    )
    try:
        thread.start()
        assert entered.wait(10), f"{what} was not reached"
        deadline = time.monotonic() + 5
        while add.get_result(last_id).status != SUCCESSFUL:
            assert time.monotonic() < deadline, f"the worker waited for the blocked {what}"
            time.sleep(0.01)
        meanwhile()
    finally:
        release.set()
        thread.join(15)
    (summary,) = summaries
    return summary


def test_a_slow_task_finished_receiver_does_not_hold_up_the_worker(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    """A ``task_finished`` receiver that takes long (a webhook, a slow log handler) ran
    on the worker's control loop: until it returned, the worker claimed nothing and
    renewed no lease, so a healthy task still running elsewhere in the worker was
    recovered and run twice. Found by an outside pass. Now the next task runs while the
    receiver still blocks, and every receiver call is made before the worker stops."""
    use_options(settings, MAX_ATTEMPTS=3)
    first, second = add.enqueue(1, 2), add.enqueue(3, 4)
    entered, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def slow_receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        if task_result.id == first.id:
            entered.set()
            release.wait(10)
        finished.append(task_result.id)

    def nothing_announced_yet() -> None:
        assert finished == []

    task_finished.connect(slow_receiver)
    try:
        summary = run_past_a_block(
            entered, release, second.id, "task_finished", nothing_announced_yet
        )
    finally:
        task_finished.disconnect(slow_receiver)
    assert (summary.started, summary.succeeded) == (2, 2)
    assert finished == [first.id, second.id]


def test_a_log_handler_that_blocks_does_not_hold_up_the_worker(
    settings: Any, memory_tasks: MemoryTasks
) -> None:
    """A handler of the worker's log that blocks (a stalled network handler) blocked
    the control loop at its next line of its own (its start line, a cancel, a recovery,
    the stop): nothing was claimed and no lease renewed meanwhile, and a healthy task
    ran twice. Found by an outside pass. The loop's lines are handled on the
    announcer's thread, in order, so the next tasks run while the handler blocks."""
    use_options(settings, MAX_ATTEMPTS=3)
    first, second = add.enqueue(1, 2), add.enqueue(3, 4)
    entered, release = threading.Event(), threading.Event()
    lines: list[str] = []

    class Stalled(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if " started: " in record.getMessage():
                entered.set()
                release.wait(10)
            lines.append(record.getMessage())

    handler = Stalled()
    worker_log = logging.getLogger("jobstate.worker")
    worker_log.addHandler(handler)
    level = worker_log.level
    worker_log.setLevel(logging.INFO)
    try:
        summary = run_past_a_block(entered, release, second.id, "the start line")
    finally:
        worker_log.removeHandler(handler)
        worker_log.setLevel(level)
    assert add.get_result(first.id).status == SUCCESSFUL
    assert (summary.started, summary.succeeded, summary.unannounced) == (2, 2, 0)
    # Every line was handled, in the order the worker logged them.
    assert " started: " in lines[0] and " stopped (" in lines[-1]
    assert sum("attempt 1/3 successful" in line for line in lines) == 2
