"""The worker rides out store failures that retrying can cure: a claim or a report that
fails with a retryable store error is tried again, and an ended attempt whose report
failed is reported later, never dropped. A failure retrying cannot cure stops the
worker, after handing back what it had not started."""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from jobstate.exceptions import StoreError, StoreUnavailable
from jobstate.stores.database import DatabaseStateStore
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import TaskResultStatus, task_backends
from jobstate.tasks.worker import TaskWorker, WorkerConfig
from tests.support.task_functions import add
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
        return super().claim_tasks(**arguments)

    def complete_claimed_jobs(self, reports: Any) -> Any:
        self._fail("complete_claimed_jobs")
        return super().complete_claimed_jobs(reports)


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
    flaky.failures = {"claim_tasks": 2, "complete_claimed_jobs": 2}
    summary = run_worker(concurrency=2)
    assert summary.succeeded == 4 and summary.lost == 0
    for n, result in enumerate(results):
        read = add.get_result(result.id)
        assert read.status == TaskResultStatus.SUCCESSFUL and read.return_value == 2 * n
        assert read.attempts == 1
    assert "trying again" in caplog.text


def test_a_failure_retrying_cannot_cure_stops_the_worker(flaky: type[FlakyStore]) -> None:
    result = add.enqueue(1, 1)
    flaky.error = StoreError
    flaky.failures = {"claim_tasks": 1}
    with pytest.raises(StoreError, match="failed on purpose"):
        run_worker()
    assert add.get_result(result.id).status == TaskResultStatus.READY
