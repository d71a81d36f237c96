"""``manage.py jobstate_worker`` as a real process, seen through Django's task API:
faithful results, retries with one error per attempt, backoff, priority order, queue
isolation, ``run_after``, ``--max-tasks``, concurrency, values that cannot be stored,
and bad options (timeouts and tasks that cannot be found:
``test_tasks_worker_timeouts``)."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.utils import timezone

from jobstate.core.states import JobStatus
from jobstate.models import AuditEntry, Job
from jobstate.tasks.compat import TaskResultStatus
from tests.support.task_functions import (
    add,
    always_fails,
    async_add,
    echo,
    fails_before,
    fails_with_a_long_message,
    nested,
    returns_a_deep_list,
    returns_a_list_31_deep,
    returns_a_list_32_deep,
    returns_a_set,
    returns_bytes,
    started_then_sleeps,
)
from tests.support.tasks_kit import finish, run_batch, start_worker, stop, use_options

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True), pytest.mark.slow]

READY, RUNNING = TaskResultStatus.READY, TaskResultStatus.RUNNING
SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED


def test_a_worker_runs_tasks_and_their_results_are_faithful(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=3)
    summed = add.enqueue(2, 3)
    echoed = echo.enqueue("a", k=(1, 2))
    awaited = async_add.enqueue(1, 1)
    second_try = fails_before.enqueue(2)
    before = timezone.now()

    log = run_batch(options, "--worker-id", "worker-a", "--concurrency", "2")

    done = {r.id: r for r in (add.get_result(summed.id), echo.get_result(echoed.id))}
    assert done[summed.id].return_value == 5
    assert done[echoed.id].return_value == {"args": ["a"], "kwargs": {"k": [1, 2]}}
    assert async_add.get_result(awaited.id).return_value == 2
    for result in done.values():
        assert result.status == SUCCESSFUL and result.worker_ids == ["worker-a"]
        assert result.attempts == 1 and result.errors == []
        assert result.started_at is not None and result.started_at >= before - timedelta(seconds=5)
        assert result.last_attempted_at == result.started_at
        assert result.finished_at is not None and result.finished_at >= result.started_at

    retried = fails_before.get_result(second_try.id)
    assert retried.status == SUCCESSFUL and retried.return_value == 2
    assert retried.worker_ids == ["worker-a", "worker-a"] and retried.attempts == 2
    (error,) = retried.errors
    assert error.exception_class_path == "tests.support.task_functions.Boom"
    assert "attempt 1 fails" in error.traceback and error.exception_class.__name__ == "Boom"
    assert retried.last_attempted_at is not None and retried.started_at is not None
    assert retried.last_attempted_at > retried.started_at

    assert "jobstate_worker worker-a started: backend 'default', queues default" in log
    assert "concurrency 2" in log
    # A --batch worker ends once nothing is ready: it only polls, and says why where
    # another worker would LISTEN (PostgreSQL).
    assert "wake-up by polling every 1 s" in log
    said = "polling every 1 s (--batch: it stops once nothing is ready" in log
    assert said == (connection.vendor == "postgresql"), log
    assert log.count("Task tests.support.task_functions.") == 5  # one line per attempt
    assert f"Task tests.support.task_functions.add {summed.id} attempt 1/3 successful in" in log
    assert "attempt 1/3 failed (tests.support.task_functions.Boom: attempt 1 fails)" in log


def test_a_failing_task_is_retried_with_one_error_per_attempt(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=3)
    queued = always_fails.enqueue("no luck")
    run_batch(options, "--worker-id", "worker-b")

    result = always_fails.get_result(queued.id)
    assert result.status == FAILED and result.attempts == 3
    assert result.worker_ids == ["worker-b"] * 3
    assert [e.exception_class_path for e in result.errors] == [
        "tests.support.task_functions.Boom"
    ] * 3
    assert all("no luck" in error.traceback for error in result.errors)
    with pytest.raises(ValueError, match="failed"):
        _ = result.return_value
    job = Job.objects.get(id=queued.id)
    assert (
        job.status == JobStatus.ERROR and job.error == "tests.support.task_functions.Boom: no luck"
    )
    events = list(
        AuditEntry.objects.filter(job_id=queued.id).order_by("id").values_list("event", "severity")
    )
    assert events == [
        ("retry_scheduled", "warning"),
        ("retry_scheduled", "warning"),
        ("finished", "error"),
    ]


def test_a_retry_waits_for_its_backoff_and_batch_does_not_wait_for_it(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2, RETRY_BACKOFF=30.0)
    queued = always_fails.enqueue("later")
    started = time.monotonic()
    log = run_batch(options)
    assert time.monotonic() - started < 20
    result = always_fails.get_result(queued.id)
    assert result.status == READY and result.attempts == 1 and len(result.errors) == 1
    job = Job.objects.get(id=queued.id)
    assert job.run_after is not None
    delay = (job.run_after - job.updated_at).total_seconds()
    assert 26 <= delay <= 34  # 30 s, ±10 % jitter
    assert "retry in" in log


def test_tasks_run_by_priority_then_in_enqueue_order(settings: Any) -> None:
    options = use_options(settings)
    priorities = [0, 10, -5, 10, 0, 3]
    ids = [started_then_sleeps.using(priority=p).enqueue(0).id for p in priorities]
    run_batch(options, "--concurrency", "1")
    results = [started_then_sleeps.get_result(result_id) for result_id in ids]
    order = sorted(range(len(ids)), key=lambda n: results[n].return_value["started"])
    assert order == [1, 3, 5, 0, 4, 2]


def test_a_worker_runs_only_its_queues(settings: Any) -> None:
    options = use_options(settings)
    default = add.enqueue(1, 1)
    emails = add.using(queue_name="emails").enqueue(2, 2)
    reports = add.using(queue_name="reports").enqueue(3, 3)

    run_batch(options, "--queue-name", "emails,reports")
    assert add.get_result(default.id).status == READY
    assert add.get_result(emails.id).status == SUCCESSFUL
    assert add.get_result(reports.id).status == SUCCESSFUL
    run_batch(options, "--queue-name", "*")
    assert add.get_result(default.id).return_value == 2


def test_a_deferred_task_waits_for_run_after(settings: Any) -> None:
    options = use_options(settings)
    run_after = timezone.now() + timedelta(seconds=5)
    deferred = add.using(run_after=run_after).enqueue(1, 2)
    now = add.enqueue(3, 4)
    run_batch(options)
    batch_ended = timezone.now()
    assert add.get_result(now.id).status == SUCCESSFUL
    early = add.get_result(deferred.id)
    if batch_ended < run_after:
        assert early.status == READY  # --batch does not wait for it
    else:
        # A loaded machine started the worker late: it may have run the task, but never
        # before its run_after.
        assert early.status == READY or early.started_at >= run_after
    time.sleep(max((run_after - timezone.now()).total_seconds(), 0) + 0.2)
    run_batch(options)
    result = add.get_result(deferred.id)
    assert result.status == SUCCESSFUL and result.started_at is not None
    assert result.started_at >= run_after


def test_max_tasks_starts_that_many_and_leaves_the_rest_ready(settings: Any) -> None:
    options = use_options(settings)
    ids = [add.enqueue(n, n).id for n in range(5)]
    worker = start_worker("--concurrency", "4", "--max-tasks", "2", options=options)
    try:
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 0, err
    assert "--max-tasks 2 reached" in err
    results = [add.get_result(result_id) for result_id in ids]
    assert [r.status for r in results].count(SUCCESSFUL) == 2
    waiting = [r for r in results if r.status != SUCCESSFUL]
    assert len(waiting) == 3
    for result in waiting:
        assert result.status == READY and result.worker_ids == [] and result.attempts == 0
    assert Job.objects.filter(status=JobStatus.QUEUED, attempts=0, executor_id=None).count() == 3


def test_one_worker_runs_eight_tasks_at_once(settings: Any) -> None:
    options = use_options(settings)
    ids = [started_then_sleeps.enqueue(1).id for _ in range(8)]
    run_batch(options, "--concurrency", "8")
    results = [started_then_sleeps.get_result(i) for i in ids]
    starts = [result.return_value["started"] for result in results]
    assert max(starts) - min(starts) <= 1.0
    # Eight 1-second tasks side by side, by the tasks' own instants (the process's start
    # is not theirs: a loaded machine takes seconds to start one); one after the other
    # they would span 8 s.
    span = max(r.finished_at for r in results) - min(r.started_at for r in results)
    assert span < timedelta(seconds=5), span


@pytest.mark.parametrize(
    ("returning", "reason"),
    [
        (returns_a_set, "a value of type 'set' that cannot be stored: it is not JSON"),
        (returns_a_deep_list, "a value of type 'list' that cannot be stored: it is nested"),
        # Within Python's limits, but deeper than MariaDB's JSON check lets a column
        # hold: the worker's report failed inside the database and the worker stopped.
        (
            returns_a_list_32_deep,
            "a value of type 'list' that cannot be stored: the task's return value is "
            "nested more than 31 levels deep",
        ),
    ],
    ids=["set", "deep-list", "32-levels"],
)
def test_a_return_value_that_is_not_json_fails_the_attempt(
    settings: Any, returning: Any, reason: str
) -> None:
    options = use_options(settings)
    queued = returning.enqueue()
    run_batch(options)
    result = returning.get_result(queued.id)
    assert result.status == FAILED
    (error,) = result.errors
    assert error.exception_class_path == "jobstate.exceptions.TaskReturnValueNotJSON"
    assert f"the task returned {reason}" in error.traceback


def test_bytes_returned_are_kept_as_text_when_they_are_utf_8(settings: Any) -> None:
    # As Django's own backends normalise a return value: UTF-8 bytes come back as text,
    # other bytes fail the attempt with the reason.
    options = use_options(settings)
    text = returns_bytes.enqueue("café ✓", "utf-8")
    latin = returns_bytes.enqueue("café", "latin-1")
    run_batch(options)
    kept = returns_bytes.get_result(text.id)
    assert kept.status == SUCCESSFUL and kept.return_value == "café ✓"
    refused = returns_bytes.get_result(latin.id)
    assert refused.status == FAILED
    (error,) = refused.errors
    assert error.exception_class_path == "jobstate.exceptions.TaskReturnValueNotJSON"
    assert "the task returned a value of type 'bytes' that cannot be stored" in error.traceback


def test_a_return_value_31_levels_deep_is_kept(settings: Any) -> None:
    options = use_options(settings)
    queued = returns_a_list_31_deep.enqueue()
    run_batch(options)
    result = returns_a_list_31_deep.get_result(queued.id)
    assert result.status == SUCCESSFUL and result.return_value == nested(31)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "nowhere"], "nowhere"),
        (["--queue-name", "emails,nope"], "'nope', not in TASKS['default']['QUEUES']"),
        (["--worker-id", " "], "--worker-id"),
        (["--reload"], "--reload and --batch cannot be used together"),
    ],
)
def test_bad_options_exit_2_and_claim_nothing(settings: Any, args: list[str], message: str) -> None:
    use_options(settings)
    queued = add.enqueue(1, 1)
    with pytest.raises(CommandError, match=re.escape(message)) as raised:
        call_command("jobstate_worker", "--batch", *args)
    assert raised.value.returncode == 2
    assert add.get_result(queued.id).status == READY


def test_a_backend_that_is_not_jobstates_is_refused(settings: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "immediate": {
            "BACKEND": settings.TASKS["default"]["BACKEND"].replace(
                "jobstate.tasks.JobStateBackend",
                "django.tasks.backends.immediate.ImmediateBackend",
            )
        },
    }
    from jobstate.tasks.compat import builtin_tasks

    if not builtin_tasks:
        settings.TASKS["immediate"]["BACKEND"] = "django_tasks.backends.immediate.ImmediateBackend"
    with pytest.raises(CommandError, match="runs only jobstate's tasks") as raised:
        call_command("jobstate_worker", "--backend", "immediate", "--batch")
    assert raised.value.returncode == 2


def test_a_state_store_without_tasks_is_refused(settings: Any) -> None:
    use_options(settings)
    settings.JOBSTATE = {
        **getattr(settings, "JOBSTATE", {}),
        "STATE_STORE": "tests.support.stores.NoTasksStore",
    }
    with pytest.raises(CommandError, match="does not support tasks") as raised:
        call_command("jobstate_worker", "--batch")
    assert raised.value.returncode == 2


def test_a_bad_jobstate_setting_stops_the_process_with_the_usage_status(settings: Any) -> None:
    """Status 2 is the worker's for invalid options or settings; a ``JOBSTATE`` value the
    system check refuses exited 1, the status of a database failure."""
    options = use_options(settings)
    worker = start_worker("--batch", options=options, JOBSTATE_TEST_MAX_PAYLOAD_BYTES="0")
    try:
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 2, err
    assert "jobstate.E001" in err and "MAX_PAYLOAD_BYTES" in err, err
    assert "Traceback" not in err, err


def test_a_payload_limit_too_small_for_the_workers_own_records_stops_it_at_start(
    settings: Any,
) -> None:
    """With ``MAX_PAYLOAD_BYTES`` at 100, the first failing task made the worker exit 1
    with its row left running: not even the record of a refused report fits. Found by an
    outside pass. The check refuses such a limit before the worker claims anything, and
    at the least it allows, a task failing with the longest error settles as failed."""
    options = use_options(settings)
    queued = fails_with_a_long_message.enqueue(5_000)
    small = start_worker("--batch", options=options, JOBSTATE_TEST_MAX_PAYLOAD_BYTES="100")
    try:
        code, _out, err = finish(small)
    finally:
        stop(small)
    assert code == 2, err
    assert "jobstate.E005" in err and "at least 4096" in err, err
    assert fails_with_a_long_message.get_result(queued.id).status == TaskResultStatus.READY
    least = start_worker("--batch", options=options, JOBSTATE_TEST_MAX_PAYLOAD_BYTES="4096")
    try:
        code, _out, err = finish(least)
    finally:
        stop(least)
    assert code == 0, err
    result = fails_with_a_long_message.get_result(queued.id)
    assert result.status == TaskResultStatus.FAILED and len(result.errors) == 1


def test_invalid_numbers_are_refused_by_the_process(settings: Any) -> None:
    options = use_options(settings)
    for args in (["--concurrency", "0"], ["--grace", "-1"], ["--max-tasks", "x"]):
        worker = start_worker("--batch", *args, options=options)
        try:
            code, _out, err = finish(worker)
        finally:
            stop(worker)
        assert code == 2 and "error:" in err, err
