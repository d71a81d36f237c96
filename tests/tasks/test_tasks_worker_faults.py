"""The worker rides out store failures that retrying can cure: a claim or a report that
fails with a retryable store error is tried again, and an ended attempt whose report
failed is reported later, never dropped; a report written before its connection was lost
is recognised as written when it is sent again, and the tasks a lost reply had claimed
are given back at once, their attempts uncounted. A failure retrying cannot cure stops
the worker, after handing back what it had not started."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

import pytest
from django.db import transaction

from jobstate.exceptions import StoreError, StoreUnavailable
from jobstate.models import Job
from jobstate.stores.database import DatabaseStateStore
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import TaskResultStatus, task_backends
from jobstate.tasks.worker import TaskWorker, WorkerConfig
from tests.support.task_functions import add, always_fails
from tests.support.tasks_kit import use_options

pytestmark = pytest.mark.django_db(transaction=True)


class FlakyStore(DatabaseStateStore):
    """Fails the first calls of some methods, as a database restart would."""

    failures: ClassVar[dict[str, int]] = {}
    error: ClassVar[type[StoreError]] = StoreUnavailable

    def _fail(self, operation: str) -> None:
        left = FlakyStore.failures.get(operation, 0)
        if left:
            FlakyStore.failures[operation] = left - 1
            raise FlakyStore.error(f"{operation} failed on purpose")

    def claim_tasks(self, **arguments: Any) -> Any:
        self._fail("claim_tasks")
        claimed = super().claim_tasks(**arguments)
        self._fail("claim_tasks reply")  # claimed (autocommit), and the reply is lost
        return claimed

    def complete_claimed_jobs(self, reports: Any) -> Any:
        self._fail("complete_claimed_jobs")
        results = super().complete_claimed_jobs(reports)
        # Committed (with the worker's audit entry, when it writes one), and then the
        # reply is lost with the connection.
        transaction.on_commit(lambda: self._fail("complete_claimed_jobs reply"), using=self.using)
        return results

    def complete_and_claim_tasks(self, reports: Any, **arguments: Any) -> Any:
        self._fail("complete_and_claim_tasks")
        answer = super().complete_and_claim_tasks(reports, **arguments)
        # The reports written and the next tasks claimed, and then the reply is lost.
        transaction.on_commit(
            lambda: self._fail("complete_and_claim_tasks reply"), using=self.using
        )
        return answer


@pytest.fixture
def flaky(settings: Any) -> type[FlakyStore]:
    use_options(settings)
    settings.JOBSTATE = {
        **getattr(settings, "JOBSTATE", {}),
        "STATE_STORE": "tests.tasks.test_tasks_worker_faults.FlakyStore",
    }
    FlakyStore.failures = {}
    FlakyStore.error = StoreUnavailable
    return FlakyStore


def run_worker(**config: Any) -> Any:
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    return TaskWorker(WorkerConfig(batch=True, interval=0.01, **config), backend).run()


def test_failed_claims_and_reports_are_retried_and_no_attempt_is_dropped(
    flaky: type[FlakyStore], caplog: pytest.LogCaptureFixture
) -> None:
    results = [add.enqueue(n, n) for n in range(4)]
    flaky.failures = {"claim_tasks": 2, "complete_and_claim_tasks": 2}
    summary = run_worker(concurrency=2)
    assert summary.succeeded == 4 and summary.lost == 0
    for n, result in enumerate(results):
        read = add.get_result(result.id)
        assert read.status == TaskResultStatus.SUCCESSFUL and read.return_value == 2 * n
        assert read.attempts == 1
    assert "trying again" in caplog.text


@pytest.mark.parametrize("task", [add, always_fails], ids=["success", "failure"])
def test_a_report_whose_reply_was_lost_is_settled_not_taken_for_a_lost_claim(
    flaky: type[FlakyStore], caplog: pytest.LogCaptureFixture, task: Any
) -> None:
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    result = task.enqueue(1, 2) if task is add else task.enqueue("no")
    # A success is reported with the worker's next claim; a failure on its own.
    reported_by = "complete_and_claim_tasks" if task is add else "complete_claimed_jobs"
    flaky.failures = {f"{reported_by} reply": 1}
    summary = run_worker()
    assert summary.lost == 0
    assert (summary.succeeded, summary.failed) == ((1, 0) if task is add else (0, 1))
    read = task.get_result(result.id)
    assert read.attempts == 1
    assert read.status == (TaskResultStatus.SUCCESSFUL if task is add else TaskResultStatus.FAILED)
    assert "its claim was lost" not in caplog.text
    assert "the task's row shows the report written" in caplog.text


@pytest.mark.parametrize(
    "lost", ["complete_and_claim_tasks reply", "claim_tasks reply"], ids=["round", "claim"]
)
def test_the_tasks_a_lost_reply_had_claimed_are_given_back_uncounted_and_run_once(
    flaky: type[FlakyStore], caplog: pytest.LogCaptureFixture, lost: str
) -> None:
    caplog.set_level(logging.INFO, logger="jobstate.worker")
    # The default of one attempt: a task whose uncounted claim was counted would fail.
    first, second = add.enqueue(1, 1), add.enqueue(2, 2)
    # "round": the first task's report and the claim of the second are written, and the
    # reply is lost. "claim": the claim of both is written, and the reply is lost.
    flaky.failures = {lost: 1}
    summary = run_worker(worker_id="lost-reply")
    assert (summary.succeeded, summary.lost, summary.failed) == (2, 0, 0)
    assert "was lost with its connection" in caplog.text
    for result, total in ((first, 2), (second, 4)):
        read = add.get_result(result.id)
        assert (read.status, read.return_value, read.attempts) == (
            TaskResultStatus.SUCCESSFUL,
            total,
            1,
        )
    assert not Job.objects.filter(status="running").exists()


def test_a_failure_retrying_cannot_cure_stops_the_worker(flaky: type[FlakyStore]) -> None:
    result = add.enqueue(1, 1)
    flaky.error = StoreError
    flaky.failures = {"claim_tasks": 1}
    with pytest.raises(StoreError, match="failed on purpose"):
        run_worker()
    assert add.get_result(result.id).status == TaskResultStatus.READY
