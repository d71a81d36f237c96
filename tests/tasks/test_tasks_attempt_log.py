"""The attempt log can never outgrow what a store accepts, whatever a task raises and
however often: each attempt's message and traceback are capped, a long log keeps the
first and the latest attempts and counts the ones it left out, exception text is made
storable, and the attempt count stays exact. Reports and the recovery of lost attempts
(on the database stores and the in-memory store) never fail on size, and a report or
recovery a store refuses settles that task alone as failed. Also: ``task_finished`` is
sent while the task's exception is being handled, so Django's own log of the task
carries its traceback, and ``enqueue`` refuses cyclic or too deeply nested arguments
with ``InvalidPayload``."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, ClassVar

import pytest
from django.core.management import call_command
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobstate.core.attempt_log import (
    KEPT_FIRST,
    KEPT_LATEST,
    AttemptOutcome,
    LeftOut,
    TaskAttempt,
    attempt_history,
    error_summary,
    exception_message,
    numbered_attempts,
    settle_attempt,
    storable_class_path,
)
from jobstate.core.jsonvalues import json_size
from jobstate.core.states import JobStatus
from jobstate.exceptions import InvalidPatch, InvalidPayload, TaskTimedOut
from jobstate.models import Job
from jobstate.stores.base import StateStore
from jobstate.stores.contracts.validation import JOB_REPORT_FIELDS, clean_job_fields
from jobstate.stores.database import DatabaseStateStore
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import TaskResultStatus, task_backends
from jobstate.tasks.results import LEFT_OUT_WORKER_ID
from jobstate.tasks.worker import TaskWorker, WorkerConfig
from jobstate.tasks.worker.execution import failure
from tests.support.attempts import NOW, claim, enqueue, failed_attempt, raised, report_failures
from tests.support.hostile_tasks import MISBEHAVIOURS, hostile
from tests.support.task_functions import add, always_fails, echo, started_then_sleeps
from tests.support.tasks_kit import use_options

pytestmark = pytest.mark.mysql

KEPT = KEPT_FIRST + KEPT_LATEST


def settle_many(
    messages: list[str], count: int, *, limit: int, max_attempts: int = 1000
) -> list[Any]:
    """The log after ``count`` failed attempts with the ``messages`` in turn, checking
    that each report would be accepted by the store."""
    log: list[Any] = []
    for number in range(1, count + 1):
        settlement = settle_attempt(
            attempt_log=log,
            attempts=number,
            max_attempts=max_attempts,
            attempt=failed_attempt(messages[number % len(messages)], worker=f"w-{number}"),
            limit=limit,
        )
        assert json_size(settlement.patch["attempt_log"]) <= limit
        clean_job_fields(settlement.patch, allowed=JOB_REPORT_FIELDS, action="report")
        log = settlement.patch["attempt_log"]
    return log


_characters = st.characters(codec=None, categories=None)
_pieces = st.text(_characters, min_size=1, max_size=6)
messages = st.one_of(
    st.text(_characters, max_size=60),
    st.builds(lambda piece, times: piece * times, _pieces, st.integers(0, 12_000)),
)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    messages=st.lists(messages, min_size=1, max_size=5),
    count=st.integers(1, 90),
    limit=st.sampled_from([3_000, 20_000, 200_000, 1024 * 1024]),
)
def test_any_messages_and_attempt_count_give_a_storable_log_with_an_exact_count(
    messages: list[str], count: int, limit: int
) -> None:
    log = settle_many(messages, count, limit=limit)
    history = attempt_history(log)
    assert sum(item.count if isinstance(item, LeftOut) else 1 for item in history) == count
    kept = [number for number, _attempt in numbered_attempts(log)]
    # The latest attempt is always kept, and the first while the limit leaves room.
    assert kept and kept[-1] == count
    if count <= KEPT and limit >= 20_000:
        assert kept == list(range(1, count + 1))
    if limit >= 20_000:
        assert kept[0] == 1
        assert len(kept) == min(count, KEPT)


def test_a_thousand_attempts_of_long_messages_stay_within_the_limit() -> None:
    log = settle_many(["x" * 30_000 + "\udcff\x00"], 1000, limit=60_000)
    assert [type(item) for item in attempt_history(log)] == [
        TaskAttempt,
        LeftOut,
        *[TaskAttempt] * KEPT_LATEST,
    ]
    (gap,) = [item for item in attempt_history(log) if isinstance(item, LeftOut)]
    assert (gap.first, gap.last, gap.count) == (2, 1000 - KEPT_LATEST, 1000 - KEPT)
    latest = attempt_history(log)[-1]
    assert isinstance(latest, TaskAttempt) and latest.worker_id == "w-1000"
    # Capped, the start and the end (where the exception is) kept, text made storable.
    assert "shortened" in latest.traceback and latest.traceback.endswith("\ufffd\ufffd\n")
    assert len(latest.message) < 2_000 and "\x00" not in latest.message


@pytest.mark.parametrize(
    ("exc", "message"),
    [
        (ValueError("bad\x00value"), "bad\ufffdvalue"),
        (ValueError("lone \ud800 and a pair \ud83d\ude00"), "lone \ufffd and a pair \U0001f600"),
        (MISBEHAVIOURS["str-raises"](), "StrRaises"),
        (MISBEHAVIOURS["str-not-text"](), "StrNotText"),
        (MISBEHAVIOURS["str-subclass"](), "a message of a str subclass"),
        (MISBEHAVIOURS["repr-raises"](), "ValueError"),
    ],
)
def test_exception_text_is_made_storable_and_the_class_path_kept_exact(
    exc: BaseException, message: str
) -> None:
    record = failure("w-1", NOW, raised(exc))
    assert record.message == message
    assert record.exception_class_path == f"{type(exc).__module__}.{type(exc).__qualname__}"
    entry = record.as_json()
    clean_job_fields(
        {"attempt_log": [entry], "error": error_summary(record)},
        allowed=JOB_REPORT_FIELDS,
        action="report",
    )
    assert entry["traceback"].startswith("Traceback (most recent call last):")


def test_a_class_path_no_store_can_keep_falls_back_to_a_base_class() -> None:
    for module in ("bad\x00module", "bad\ud800module", "m" * 400):
        unnamed = type("Unnamed", (KeyError,), {"__module__": module})
        assert storable_class_path(unnamed) == "builtins.KeyError"
        assert exception_message(raised(unnamed("key"))) == "'key'"


# --- the stores -----------------------------------------------------------------------


@pytest.fixture
def store(any_store: StateStore, settings: Any) -> StateStore:
    """Both stores, with a payload limit the long logs here stay under."""
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "MAX_PAYLOAD_BYTES": 100_000}
    return any_store


def test_reports_and_the_recovery_of_a_lost_attempt_never_fail_on_size(
    store: StateStore,
) -> None:
    task = enqueue(store, max_attempts=100)
    report_failures(store, task.id, 62)
    lost = claim(store, "died")
    store.update_job(lost.id, lease_until=timezone.now() - timedelta(days=1))
    assert store.recover_expired_tasks().requeued == 1
    job = store.get_job(task.id)
    assert job is not None and job.status == JobStatus.QUEUED and job.attempts == 63
    assert json_size(job.attempt_log) <= 100_000
    history = attempt_history(job.attempt_log)
    assert sum(item.count if isinstance(item, LeftOut) else 1 for item in history) == 63
    latest = history[-1]
    assert isinstance(latest, TaskAttempt) and latest.outcome is AttemptOutcome.WORKER_LOST


class RefusingStore(DatabaseStateStore):
    """Refuses, before writing anything, every report and recovery of the jobs named in
    ``refused``, as a store with a lower limit of its own would."""

    refused: ClassVar[set[Any]] = set()
    #: Refuse any attempt log of those jobs, the one naming the refusal too.
    refuse_logs: ClassVar[bool] = False

    def complete_claimed_jobs(self, reports: Any) -> Any:
        self._refuse([report.job_id for report in reports], reports)
        return super().complete_claimed_jobs(reports)

    def _complete_claimed(self, job_id: Any, token: Any, status: Any, patch: Any) -> Any:
        self._refuse([job_id], [patch])
        return super()._complete_claimed(job_id, token, status, patch)

    def _refuse(self, job_ids: list[Any], reports: Any) -> None:
        for job_id, report in zip(job_ids, reports, strict=True):
            patch = getattr(report, "patch", report)
            named = "Refused" in str(patch) and not (
                RefusingStore.refuse_logs and "attempt_log" in patch
            )
            if str(job_id) in RefusingStore.refused and not named:
                raise InvalidPatch("attempt_log is too large for this store.", field="attempt_log")


@pytest.fixture
def refusing(settings: Any) -> type[RefusingStore]:
    settings.JOBSTATE = {
        **getattr(settings, "JOBSTATE", {}),
        "STATE_STORE": "tests.tasks.test_tasks_attempt_log.RefusingStore",
    }
    RefusingStore.refused = set()
    RefusingStore.refuse_logs = False
    return RefusingStore


def run_worker(**config: Any) -> Any:
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    return TaskWorker(WorkerConfig(batch=True, interval=0.01, **config), backend).run()


@pytest.mark.django_db(transaction=True)
def test_a_refused_report_fails_that_task_alone_and_the_worker_goes_on(
    settings: Any, refusing: type[RefusingStore]
) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    refused = always_fails.enqueue("boom")
    others = [add.enqueue(n, n) for n in range(3)]
    refusing.refused = {refused.id}
    summary = run_worker(concurrency=4)
    assert summary.failed == 1 and summary.succeeded == 3
    result = always_fails.get_result(refused.id)
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    (error,) = result.errors
    assert error.exception_class_path == "jobstate.exceptions.TaskReportRefused"
    assert "refused the report of this attempt (failed, tests.support.task_functions.Boom)" in (
        error.traceback
    )
    assert "attempt_log is too large" in error.traceback
    for n, other in enumerate(others):
        assert add.get_result(other.id).return_value == 2 * n


@pytest.mark.django_db(transaction=True)
def test_a_task_whose_log_is_refused_even_then_fails_with_the_error_alone(
    settings: Any, refusing: type[RefusingStore]
) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    refused, other = always_fails.enqueue("boom"), add.enqueue(1, 1)
    refusing.refused, refusing.refuse_logs = {refused.id}, True
    summary = run_worker()
    assert summary.failed == 1 and summary.succeeded == 1
    job = Job.objects.get(id=refused.id)
    assert job.status == JobStatus.ERROR and job.attempts == 1 and job.attempt_log == []
    assert (job.error or "").startswith("jobstate.exceptions.TaskReportRefused: the store")
    assert add.get_result(other.id).return_value == 2


@pytest.mark.django_db(transaction=True)
def test_a_refused_recovery_fails_that_task_alone_and_the_sweep_goes_on(
    refusing: type[RefusingStore],
) -> None:
    store = refusing()
    refused, other = enqueue(store, 3), enqueue(store, 3)
    for job in (claim(store, "died-1"), claim(store, "died-2")):
        store.update_job(job.id, lease_until=timezone.now() - timedelta(days=1))
    refusing.refused = {str(refused.id)}
    call_command("reap_stale", stdout=None)
    refused_job, other_job = store.get_job(refused.id), store.get_job(other.id)
    assert refused_job is not None and refused_job.status == JobStatus.ERROR
    assert (refused_job.error or "").startswith("jobstate.exceptions.TaskReportRefused:")
    assert "refused the recovery" in (refused_job.error or "")
    assert other_job is not None and other_job.status == JobStatus.QUEUED


# --- task_finished and enqueue ------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_djangos_log_of_a_failed_task_carries_its_exception(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    use_options(settings)
    result = hostile.enqueue("nul", 0)
    with caplog.at_level(logging.INFO):
        run_worker()
    assert hostile.get_result(result.id).status == TaskResultStatus.FAILED
    (record,) = [r for r in caplog.records if "state=FAILED" in r.getMessage()]
    assert record.name in ("django.tasks", "django_tasks")
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.exc_info[0] is ValueError and str(record.exc_info[1]) == "bad\x00value"
    logged = caplog.text[caplog.text.index("state=FAILED") :]
    assert "in hostile" in logged and "ValueError: bad" in logged
    assert "reports.py" not in logged


@pytest.mark.django_db(transaction=True)
def test_djangos_log_of_a_task_that_timed_out_names_the_timeout(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # The worker, not the task, raised what failed this last attempt: the log still says
    # why (an error tracker gets the exception), never "NoneType: None".
    use_options(settings, TIMEOUT=0.2)
    result = started_then_sleeps.enqueue(0.6)
    with caplog.at_level(logging.INFO):
        run_worker()
    assert started_then_sleeps.get_result(result.id).status == TaskResultStatus.FAILED
    (record,) = [r for r in caplog.records if "state=FAILED" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    assert record.exc_info[0] is TaskTimedOut
    assert "ran longer than its timeout of 0:00:00.200000" in str(record.exc_info[1])
    assert "NoneType: None" not in caplog.text


@pytest.mark.django_db
def test_enqueue_refuses_cyclic_or_too_deep_arguments_with_invalid_payload(
    settings: Any,
) -> None:
    use_options(settings)
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    deep: list[Any] = []
    for _ in range(1_000):
        deep = [deep]
    for args in ([cyclic], [deep]):
        with pytest.raises(InvalidPayload, match="cycle or are nested too deeply"):
            echo.enqueue(*args)
    with pytest.raises(InvalidPayload):
        echo.enqueue(key={"a": cyclic})
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_a_long_log_says_in_the_result_which_attempts_it_left_out(settings: Any) -> None:
    use_options(settings)
    store = DatabaseStateStore()
    task = enqueue(store, max_attempts=100)
    report_failures(store, task.id, 30)
    result = always_fails.get_result(str(task.id))
    assert result.attempts == 30 and result.status == TaskResultStatus.READY
    assert result.worker_ids[0] == "w-0" and result.worker_ids[-1] == "w-29"
    assert result.worker_ids.count(LEFT_OUT_WORKER_ID) == 30 - KEPT
    left_out = [e for e in result.errors if e.exception_class_path.endswith("AttemptsLeftOut")]
    assert len(left_out) == 1 and len(result.errors) == KEPT + 1
    assert f"attempts 2-{30 - KEPT_LATEST} ({30 - KEPT} in all) were left out" in (
        left_out[0].traceback
    )
    assert left_out[0].exception_class.__name__ == "AttemptsLeftOut"
