"""Cancel, retry now and discard with real ``jobstate_worker`` processes: a running task
an operator cancels is interrupted within the worker's interval and never finishes, its
attempt logged as cancelled; a task waiting out an hour's backoff runs at once after
"retry now"; a discarded one never runs again."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from jobstate.core.attempt_log import AttemptOutcome, read_attempt_log
from jobstate.core.states import JobStatus
from jobstate.models import AuditEntry, Job
from jobstate.stores import get_state_store
from jobstate.tasks.compat import TaskResultStatus
from tests.support.admin_kit import JOBS, act, confirm_page, shown_messages
from tests.support.task_functions import async_sleeps, fails_before, notes_its_run
from tests.support.tasks_kit import finish, start_worker, stop, use_options, wait_for

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True), pytest.mark.slow]

CANCELLED = "jobstate.exceptions.TaskCancelled"


def lines(path: Path) -> list[str]:
    return [line.rsplit(" ", 1)[0] for line in path.read_text().splitlines()]


def test_a_running_task_cancelled_through_the_store_stops_and_is_never_retried(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings, MAX_ATTEMPTS=3)
    path = tmp_path / "runs"
    queued = notes_its_run.enqueue(str(path), 60)
    worker = start_worker("--interval", "0.2", "--worker-id", "w-cancel", options=options)
    try:
        wait_for(path.exists, what="the attempt to start")
        asked = time.monotonic()
        cancelled = get_state_store().cancel_job(queued.id, by="ops", reason="wrong customer")
        assert cancelled is not None and cancelled.status == JobStatus.REJECTED
        wait_for(lambda: lines(path) == ["1 start", "1 end"], timeout=10, what="the interrupt")
        stopped_after = time.monotonic() - asked
        time.sleep(1)  # a retry, were there one, would start now
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    assert code == 0, err
    # Seen on the worker's next turn (0.2 s), far before the task's 60 s of work.
    assert stopped_after < 3, stopped_after
    assert lines(path) == ["1 start", "1 end"]
    assert "was cancelled: interrupted it (TaskCancelled raised in its thread)" in err
    assert "1 started, 0 succeeded, 0 retrying, 0 failed, 1 cancelled, 0 lost" in err
    job = Job.objects.get(pk=queued.id)
    assert job.status == JobStatus.REJECTED and job.attempts == 1
    assert job.error == f"{CANCELLED}: cancelled by ops: wrong customer"
    (attempt,) = read_attempt_log(job.attempt_log)
    assert attempt.outcome is AttemptOutcome.CANCELLED and attempt.worker_id == "w-cancel"
    result = notes_its_run.get_result(queued.id)
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in result.errors] == [CANCELLED]
    entry = AuditEntry.objects.get(job_id=queued.id, event="cancelled")
    assert entry.detail["by"] == "ops" and entry.detail["holder"] == "w-cancel"


def test_a_running_task_cancelled_from_the_admin_stops(
    settings: Any, tmp_path: Path, admin_client: Client
) -> None:
    options = use_options(settings, MAX_ATTEMPTS=3)
    path = tmp_path / "runs"
    queued = notes_its_run.enqueue(str(path), 60)
    worker = start_worker("--interval", "0.2", "--worker-id", "w-admin", options=options)
    try:
        wait_for(path.exists, what="the attempt to start")
        page = confirm_page(admin_client, JOBS, "cancel_jobs", [queued.id])
        assert "Yes, cancel" in page.content.decode()
        done = act(admin_client, JOBS, "cancel_jobs", [queued.id], confirm=True)
        assert "Cancelled 1 job." in shown_messages(done)
        wait_for(lambda: lines(path) == ["1 start", "1 end"], timeout=10, what="the interrupt")
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    assert code == 0, err
    job = Job.objects.get(pk=queued.id)
    assert job.status == JobStatus.REJECTED and job.error == f"{CANCELLED}: cancelled by admin"
    (attempt,) = read_attempt_log(job.attempt_log)
    assert attempt.outcome is AttemptOutcome.CANCELLED and attempt.worker_id == "w-admin"
    assert AuditEntry.objects.get(job_id=queued.id, event="cancelled").detail["by"] == "admin"


def test_a_cancelled_task_that_cannot_be_interrupted_makes_its_worker_exit(
    settings: Any,
) -> None:
    options = use_options(settings, MAX_ATTEMPTS=1)
    # Its coroutine runs on in an event loop's thread, which the process waits for.
    queued = async_sleeps.enqueue(4)
    worker = start_worker("--interval", "0.2", "--grace", "1", options=options)
    try:
        wait_for(
            lambda: Job.objects.filter(pk=queued.id, status=JobStatus.RUNNING).exists(),
            what="the attempt to start",
        )
        assert get_state_store().cancel_job(queued.id, by="ops") is not None
        code, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    # As a timed-out task that will not stop: the process ends so that its thread does.
    assert code == 4, err
    assert "stopped (a cancelled task did not stop)" in err
    assert Job.objects.get(pk=queued.id).status == JobStatus.REJECTED


def waiting_for_retry(job_id: Any) -> bool:
    return Job.objects.filter(pk=job_id, status=JobStatus.QUEUED, attempts=1).exists()


def test_retry_now_runs_a_task_waiting_out_its_backoff_at_once(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2, RETRY_BACKOFF=3600.0)
    queued = fails_before.enqueue(2)
    worker = start_worker("--interval", "0.2", options=options)
    try:
        wait_for(lambda: waiting_for_retry(queued.id), what="the first attempt to fail")
        time.sleep(0.5)
        assert Job.objects.get(pk=queued.id).attempts == 1, "the backoff must hold it"
        assert get_state_store().retry_job_now(queued.id, by="ops") is not None
        wait_for(
            lambda: fails_before.get_result(queued.id).status == TaskResultStatus.SUCCESSFUL,
            timeout=10,
            what="the retry to run",
        )
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    assert code == 0, err
    assert fails_before.get_result(queued.id).return_value == 2
    assert AuditEntry.objects.filter(job_id=queued.id, event="retry_now").count() == 1


def test_a_discarded_task_is_given_up_and_never_runs_again(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=3, RETRY_BACKOFF=2.0)
    queued = fails_before.enqueue(2)
    worker = start_worker("--interval", "0.2", options=options)
    try:
        wait_for(lambda: waiting_for_retry(queued.id), what="the first attempt to fail")
        discarded = get_state_store().discard_job(queued.id, by="ops")
        assert discarded is not None
        time.sleep(3)  # past the backoff: a retry would have run by now
        worker.send_signal(signal.SIGTERM)
        code, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    assert code == 0, err
    job = Job.objects.get(pk=queued.id)
    assert job.status == JobStatus.ERROR and job.attempts == 1
    assert job.error == "discarded by ops"
    assert fails_before.get_result(queued.id).status == TaskResultStatus.FAILED
