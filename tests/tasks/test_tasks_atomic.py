"""Atomic tasks (``policy(atomic=True)``), with the worker in-process on the database
store: the body's writes commit with the attempt's success report, in one transaction on
the worker's database, or not at all. A body that raises, or that the worker interrupts,
leaves none of its writes, and its retry runs anew; a report refused because the claim
was lost while the body ran (the task recovered elsewhere) rolls the writes back; a
cancelled task's writes roll back too. The worker honours what the job stored, whatever
the task declares now.

The rows the tasks write are audit entries tagged with a key of the test's own
(:mod:`tests.support.atomic_tasks`)."""

from __future__ import annotations

import logging
import threading
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import pytest
from django.db import connections
from django.db.models.functions import Now

from jobstate.admin.task_display import policy_text
from jobstate.core.states import JobStatus
from jobstate.exceptions import InvalidPatch
from jobstate.models import Job
from jobstate.stores import get_state_store
from jobstate.stores.database import DatabaseStateStore
from jobstate.tasks import policy
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import TaskResultStatus, task_backends, task_finished
from jobstate.tasks.policies import POLICY_ATTRIBUTE, TaskPolicy, policy_of
from jobstate.tasks.worker import TaskWorker, WorkerConfig, WorkerSummary
from jobstate.tasks.worker.atomic import AtomicReporter
from tests.support.atomic_tasks import (
    atomic_leaves_a_block_open,
    atomic_probe,
    atomic_returns_text,
    atomic_rolls_itself_back,
    atomic_with_callback,
    atomic_writes,
    plain_probe,
    rows,
)
from tests.support.tasks_kit import use_options, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.mysql]

SUCCESSFUL, FAILED, READY = (
    TaskResultStatus.SUCCESSFUL,
    TaskResultStatus.FAILED,
    TaskResultStatus.READY,
)


def run_worker(*, timeout: float = 30, **config: Any) -> WorkerSummary:
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    settings = {"batch": True, "interval": 0.01, "schedules": False, "grace": 5, **config}
    worker = TaskWorker(WorkerConfig(**settings), backend)
    watchdog = threading.Timer(timeout, worker.request_stop, args=("the watchdog",))
    watchdog.start()
    try:
        summary = worker.run()
    finally:
        watchdog.cancel()
    assert summary.stopped_by != "the watchdog", f"the worker did not stop within {timeout} s"
    return summary


class InBackground:
    """A worker run in a thread of its own, while the test acts on the database."""

    def __init__(self, **config: Any) -> None:
        self.summary: WorkerSummary | None = None
        self._thread = threading.Thread(target=self._run, kwargs=config, daemon=True)

    def _run(self, **config: Any) -> None:
        try:
            self.summary = run_worker(**config)
        finally:
            # The loop's own connections, which the test database's teardown must not meet.
            connections.close_all()

    def __enter__(self) -> InBackground:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(60)

    def result(self) -> WorkerSummary:
        self._thread.join(60)
        assert self.summary is not None, "the worker thread did not finish"
        return self.summary


class RefusesSuccesses(DatabaseStateStore):
    """Refuses, before writing anything, the success reports of the jobs in ``refused``,
    as a store with a lower limit of its own would."""

    refused: ClassVar[set[str]] = set()

    def complete_claimed_jobs(self, reports: Any) -> Any:
        for report in reports:
            if str(report.job_id) in self.refused and report.status == JobStatus.DONE:
                raise InvalidPatch("the result is too large for this store.", field="result")
        return super().complete_claimed_jobs(reports)


@pytest.fixture
def key() -> str:
    return f"atomic-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def finished() -> Any:
    """The ``task_finished`` signals sent during the test: (task id, status)."""
    sent: list[tuple[str, Any]] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append((task_result.id, task_result.status))

    task_finished.connect(receiver, dispatch_uid="atomic-tests")
    yield sent
    task_finished.disconnect(dispatch_uid="atomic-tests")


# --- declaring ---------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_atomic_takes_a_bool(value: Any) -> None:
    with pytest.raises(TypeError, match=r"policy\(atomic=\.\.\.\) takes True or False"):
        policy(atomic=value)


def test_an_async_task_cannot_be_atomic() -> None:
    async def body() -> None: ...

    with pytest.raises(TypeError, match=r"atomic=True.*async task.*outside the attempt's"):
        policy(atomic=True)(body)


def test_atomic_is_stored_with_the_job_and_shown_in_its_policy_line(settings: Any) -> None:
    use_options(settings)
    assert policy_of(atomic_writes) == TaskPolicy(atomic=True)
    assert TaskPolicy().stored() is None
    job = Job.objects.get(id=atomic_writes.enqueue("stored").id)
    assert job.policy == {"atomic": True}
    assert policy_text(job) == "atomic"


# --- running -----------------------------------------------------------------------------


def test_a_success_commits_the_body_writes_with_its_report(
    settings: Any, key: str, finished: list[tuple[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    use_options(settings)
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    queued = atomic_writes.enqueue(key)
    probe = atomic_probe.enqueue()
    summary = run_worker()
    assert (summary.succeeded, summary.failed, summary.lost) == (2, 0, 0)
    result = atomic_writes.get_result(queued.id)
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 1, 1)
    assert rows(key) == ["attempt 1 row 0", "attempt 1 row 1"]
    # The body ran inside a transaction.
    assert atomic_probe.get_result(probe.id).return_value is True
    # Settled in its transaction, and announced once, as successful; no second report.
    assert sorted(finished) == sorted([(queued.id, SUCCESSFUL), (probe.id, SUCCESSFUL)])
    assert caplog.text.count(f"{queued.id} attempt 1/1 successful") == 1
    assert "claim was lost" not in caplog.text


def test_a_body_that_raises_leaves_none_of_its_writes_and_is_retried(
    settings: Any, key: str, finished: list[tuple[str, Any]]
) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    queued = atomic_writes.enqueue(key, fail_before=3)
    summary = run_worker()
    assert (summary.retrying, summary.succeeded) == (2, 1)
    result = atomic_writes.get_result(queued.id)
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 3, 3)
    assert [error.exception_class_path for error in result.errors] == [
        "tests.support.task_functions.Boom"
    ] * 2
    # The first two attempts wrote and raised: nothing of theirs committed.
    assert rows(key) == ["attempt 3 row 0", "attempt 3 row 1"]
    assert finished == [(queued.id, SUCCESSFUL)]


def test_a_body_that_fails_for_good_leaves_nothing(
    settings: Any, key: str, finished: list[tuple[str, Any]]
) -> None:
    use_options(settings, MAX_ATTEMPTS=1)
    queued = atomic_writes.enqueue(key, fail_before=2)
    assert run_worker().failed == 1
    assert atomic_writes.get_result(queued.id).status == FAILED
    assert rows(key) == []
    assert finished == [(queued.id, FAILED)]


def test_a_body_interrupted_past_its_timeout_leaves_nothing_and_is_retried(
    settings: Any, key: str, tmp_path: Path
) -> None:
    # A beat (a quarter of the lease) well after the timeout: on SQLite the body holds
    # the write lock, which the worker's lease renewal would wait for.
    use_options(settings, MAX_ATTEMPTS=2, TIMEOUT=0.3, LEASE=8.0)
    queued = atomic_writes.enqueue(key, hold=str(tmp_path), hold_seconds=20)
    summary = run_worker()
    assert (summary.retrying, summary.succeeded) == (1, 1)
    result = atomic_writes.get_result(queued.id)
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 2, 2)
    assert result.errors[0].exception_class_path == "jobstate.exceptions.TaskTimedOut"
    assert rows(key) == ["attempt 2 row 0", "attempt 2 row 1"]


@pytest.mark.concurrent
def test_a_report_refused_because_the_task_was_recovered_rolls_the_body_back(
    settings: Any, key: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # A lease long enough that the worker renews nothing while the test recovers the
    # task behind its back.
    use_options(settings, MAX_ATTEMPTS=2, LEASE=30.0)
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    queued = atomic_writes.enqueue(key, hold=str(tmp_path))
    with InBackground(worker_id="slow") as worker:
        wait_for((tmp_path / "started").exists, what="the body to write and wait")
        # Its lease runs out and a sweep recovers it, while its body still runs.
        Job.objects.filter(id=queued.id).update(lease_until=Now() - timedelta(minutes=1))
        recovery = get_state_store().recover_expired_tasks()
        assert recovery.requeued == 1
        (tmp_path / "go").touch()
        summary = worker.result()
    # The first attempt's report was refused: its writes rolled back; the second ran.
    assert rows(key) == ["attempt 2 row 0", "attempt 2 row 1"]
    assert (summary.lost, summary.succeeded) == (1, 1)
    result = atomic_writes.get_result(queued.id)
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 2, 2)
    assert "attempt 1 successful after" in caplog.text
    assert "but its claim was lost" in caplog.text
    assert "what its body wrote was rolled back" in caplog.text


@pytest.mark.concurrent
def test_a_task_cancelled_while_its_body_runs_leaves_nothing(
    settings: Any, key: str, tmp_path: Path, finished: list[tuple[str, Any]]
) -> None:
    use_options(settings, MAX_ATTEMPTS=2)
    queued = atomic_writes.enqueue(key, hold=str(tmp_path), hold_seconds=20)
    with InBackground() as worker:
        wait_for((tmp_path / "started").exists, what="the body to write and wait")
        assert get_state_store().cancel_job(queued.id, by="test") is not None
        summary = worker.result()
    assert summary.cancelled == 1 and summary.succeeded == 0
    assert Job.objects.get(id=queued.id).status == JobStatus.REJECTED
    assert rows(key) == []
    assert finished == []


@pytest.mark.concurrent
def test_a_cancel_between_the_body_and_its_report_is_counted_as_a_cancel(
    settings: Any,
    key: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The cancel watch asks only about running attempts: a cancel that commits once the
    body has returned is read from the row that refuses the report."""
    use_options(settings, MAX_ATTEMPTS=2)
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    queued = atomic_writes.enqueue(key)
    report_inside = AtomicReporter._report_inside

    def cancelled_first(reporter: AtomicReporter, outcome: Any) -> Any:
        # The operator's cancel, on a connection of its own, as the body returns.
        canceller = threading.Thread(
            target=lambda: (
                get_state_store().cancel_job(queued.id, by="ops"),
                connections.close_all(),
            )
        )
        canceller.start()
        canceller.join(30)
        return report_inside(reporter, outcome)

    monkeypatch.setattr(AtomicReporter, "_report_inside", cancelled_first)
    summary = run_worker()

    assert (summary.cancelled, summary.lost, summary.succeeded) == (1, 0, 0)
    assert Job.objects.get(id=queued.id).status == JobStatus.REJECTED
    assert rows(key) == []
    assert "it was cancelled" in caplog.text and "claim was lost" not in caplog.text


def test_on_commit_callbacks_of_the_body_run_only_for_the_committed_success(
    settings: Any, key: str, tmp_path: Path
) -> None:
    use_options(settings, MAX_ATTEMPTS=2)
    marker = tmp_path / "callbacks"
    queued = atomic_with_callback.enqueue(key, str(marker), fail_before=2)
    assert run_worker().succeeded == 1
    assert atomic_with_callback.get_result(queued.id).attempts == 2
    assert rows(key) == ["attempt 2 row 0"]
    # The failed attempt's callback never ran: a mail sent from one goes out once.
    assert marker.read_text() == "2\n"


def test_an_on_commit_callback_that_raises_leaves_the_success_recorded(
    settings: Any,
    key: str,
    tmp_path: Path,
    finished: list[tuple[str, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    use_options(settings)
    marker = tmp_path / "callbacks"
    queued = atomic_with_callback.enqueue(key, str(marker), raises=True)
    summary = run_worker()
    assert (summary.succeeded, summary.failed, summary.lost) == (1, 0, 0)
    result = atomic_with_callback.get_result(queued.id)
    assert (result.status, result.return_value) == (SUCCESSFUL, 1)
    assert rows(key) == ["attempt 1 row 0"] and marker.read_text() == "1\n"
    assert finished == [(queued.id, SUCCESSFUL)]
    assert "an on_commit callback of its body raised" in caplog.text


def test_a_body_that_marks_its_transaction_for_rollback_fails(settings: Any, key: str) -> None:
    use_options(settings)
    queued = atomic_rolls_itself_back.enqueue(key)
    assert run_worker().failed == 1
    result = atomic_rolls_itself_back.get_result(queued.id)
    assert result.status == FAILED
    assert result.errors[0].exception_class_path == (
        "django.db.transaction.TransactionManagementError"
    )
    assert rows(key) == []


def test_a_body_that_leaves_a_block_open_fails_and_leaves_nothing(
    settings: Any, key: str, finished: list[tuple[str, Any]], caplog: pytest.LogCaptureFixture
) -> None:
    """The body entered ``transaction.atomic()`` and returned inside it. Leaving the
    worker's block then only released the body's savepoint: nothing was committed, and
    closing the connection afterwards rolled the success report back with the body's
    writes. The worker still logged the attempt successful and sent ``task_finished``
    as SUCCESSFUL, while the row stayed RUNNING until its lease ran out; then the
    task was recovered as lost with its worker (``WorkerLost``) and its body run again."""
    use_options(settings, MAX_ATTEMPTS=2)
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    queued = atomic_leaves_a_block_open.enqueue(key)
    after = atomic_writes.enqueue(f"{key}-after")
    summary = run_worker(concurrency=1)
    assert (summary.failed, summary.retrying, summary.succeeded) == (1, 1, 1)
    result = atomic_leaves_a_block_open.get_result(queued.id)
    assert (result.status, result.attempts) == (FAILED, 2)
    for error in result.errors:
        assert error.exception_class_path == "django.db.transaction.TransactionManagementError"
        assert "left a transaction.atomic() block open" in error.traceback
    assert rows(key) == []
    assert f"{queued.id} attempt 1/2 successful" not in caplog.text
    # The thread's next task starts outside any block, and commits.
    assert atomic_writes.get_result(after.id).status == SUCCESSFUL
    assert rows(f"{key}-after") == ["attempt 1 row 0", "attempt 1 row 1"]
    assert sorted(finished) == sorted([(queued.id, FAILED), (after.id, SUCCESSFUL)])


def test_a_return_value_that_cannot_be_stored_fails_and_leaves_nothing(
    settings: Any, key: str
) -> None:
    use_options(settings)
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "MAX_PAYLOAD_BYTES": 4096}
    queued = atomic_returns_text.enqueue(key, 10_000)
    assert run_worker().failed == 1
    result = atomic_returns_text.get_result(queued.id)
    assert result.status == FAILED
    assert result.errors[0].exception_class_path == "jobstate.exceptions.TaskReturnValueNotJSON"
    assert rows(key) == []


def test_a_success_report_the_store_refuses_fails_for_good_and_leaves_nothing(
    settings: Any, key: str
) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    settings.JOBSTATE = {
        **getattr(settings, "JOBSTATE", {}),
        "STATE_STORE": "tests.tasks.test_tasks_atomic.RefusesSuccesses",
    }
    queued = atomic_writes.enqueue(key)
    RefusesSuccesses.refused = {queued.id}
    try:
        summary = run_worker()
    finally:
        RefusesSuccesses.refused = set()
    assert (summary.failed, summary.retrying) == (1, 0)
    result = atomic_writes.get_result(queued.id)
    assert (result.status, result.attempts) == (FAILED, 1)
    assert result.errors[0].exception_class_path == "jobstate.exceptions.TaskReportRefused"
    assert "the result is too large for this store" in result.errors[0].traceback
    assert rows(key) == []


# --- what was stored applies --------------------------------------------------------------


def test_the_worker_honours_the_atomic_flag_the_job_was_enqueued_with(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_options(settings)
    atomic = atomic_probe.enqueue()
    plain = plain_probe.enqueue()
    # A newer deploy turns the flag around on both.
    monkeypatch.setattr(atomic_probe.func, POLICY_ATTRIBUTE, TaskPolicy())
    monkeypatch.setattr(plain_probe.func, POLICY_ATTRIBUTE, TaskPolicy(atomic=True), raising=False)
    assert run_worker().succeeded == 2
    assert atomic_probe.get_result(atomic.id).return_value is True
    assert plain_probe.get_result(plain.id).return_value is False
    # Jobs enqueued now get the new declarations.
    assert Job.objects.get(id=plain_probe.enqueue().id).policy == {"atomic": True}
    assert Job.objects.get(id=atomic_probe.enqueue().id).policy is None
