"""Tasks that fail on every attempt, claimed and reported as a worker would, for the
tests of the attempt log."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from jobstate.core.attempt_log import TaskAttempt, settle_attempt
from jobstate.core.states import ClaimReport, NewTask
from jobstate.models import Job
from jobstate.stores.base import StateStore
from jobstate.tasks.worker.execution import failure

TARGET = "tasks:default"


def enqueue(store: StateStore, max_attempts: int) -> Job:
    return store.enqueue_task(
        NewTask(
            target=TARGET,
            task_path="tests.support.task_functions.always_fails",
            queue_name="default",
            priority=0,
            args=["boom"],
            kwargs={},
            max_attempts=max_attempts,
        )
    )


def claim(store: StateStore, worker_id: str) -> Job:
    (job,) = store.claim_tasks(
        target=TARGET, queues=["default"], worker_id=worker_id, lease=timedelta(minutes=1), limit=1
    )
    return job


def report_failures(store: StateStore, job_id: Any, count: int) -> None:
    """What a worker reports for ``count`` attempts that fail with 30 kB messages."""
    for number in range(count):
        job = claim(store, f"w-{number}")
        settlement = settle_attempt(
            attempt_log=job.attempt_log,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            attempt=failed_attempt("x" * 30_000, worker=f"w-{number}"),
        )
        (result,) = store.complete_claimed_jobs(
            [ClaimReport(job.id, job.claim_token or "", settlement.status, settlement.patch)]
        )
        assert result.completed
        assert job_id == job.id


NOW = timezone.now()


def raised(exc: BaseException) -> BaseException:
    """``exc`` with the traceback of having been raised."""
    try:
        raise exc
    except BaseException as caught:
        return caught


def failed_attempt(message: str, *, worker: str = "w-1") -> TaskAttempt:
    return failure(worker, NOW, raised(ValueError(message)))
