"""The console for django.tasks tasks: a task's page (its task, queue, priority, redacted
arguments and every attempt with its worker and traceback), the jobs list's task column
and its task and queue filters, and the requeue and cancel actions on tasks, read back
through Django's task API."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from jobstate.core.states import NewTask
from jobstate.models import Job
from jobstate.stores import get_state_store
from jobstate.tasks.compat import TaskResultStatus
from tests.support.admin_kit import JOBS, act, failed_task
from tests.support.task_functions import add, echo
from tests.support.tasks_kit import use_options

pytestmark = pytest.mark.django_db


def test_a_tasks_page_shows_its_task_arguments_and_attempts_redacted(
    admin_client: Client, settings: Any
) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    secret = "hunter2-very-secret"
    task = failed_task(secret)
    html = admin_client.get(f"{JOBS}{task.id}/change/").content.decode()

    assert ">Task<" in html and "tests.support.task_functions.echo" in html
    assert "emails" in html and "1 of 3" in html  # the claim made attempt 1
    assert "&quot;hello&quot;" in html  # the args
    assert secret not in html  # kwargs and the traceback quoting them are masked
    assert html.count("••••") >= 2
    assert 'id="jobstate-task-attempts"' in html
    for shown in ("w-0", "w-1", "worker lost", "failed", "builtins.ValueError"):
        assert shown in html


def test_a_tasks_page_shows_a_task_this_process_cannot_import(admin_client: Client) -> None:
    store = get_state_store()
    enqueued = store.enqueue_task(
        NewTask(
            target="tasks:default",
            task_path="elsewhere.billing.tasks.close_day",
            queue_name="default",
            priority=0,
            args=[7],
            kwargs={},
            max_attempts=1,
        )
    )
    (claimed,) = store.claim_tasks(
        target="tasks:default", queues=["default"], worker_id="w-9", lease=timedelta(1), limit=1
    )
    assert claimed.claim_token is not None
    log = [
        {
            "worker_id": "w-9",
            "started_at": claimed.claimed_at.isoformat() if claimed.claimed_at else None,
            "finished_at": timezone.now().isoformat(),
            "outcome": "successful",
        }
    ]
    store.complete_claimed_job(
        claimed.id, claimed.claim_token, "done", result={"closed": "day-seven"}, attempt_log=log
    )
    response = admin_client.get(f"{JOBS}{enqueued.id}/change/")
    html = response.content.decode()
    assert response.status_code == 200
    for shown in ("elsewhere.billing.tasks.close_day", "day-seven", "w-9", "successful"):
        assert shown in html
    listing = admin_client.get(JOBS).content.decode()
    assert "close_day" in listing


def test_a_job_that_is_no_task_has_no_task_section(admin_client: Client) -> None:
    job = get_state_store().create_job(request_id="plain", target="t")
    html = admin_client.get(f"{JOBS}{job.id}/change/").content.decode()
    assert ">Task<" not in html and "jobstate-task-attempts" not in html


def test_the_jobs_list_shows_tasks_and_filters_them_by_task_and_queue(
    admin_client: Client,
) -> None:
    echoed = echo.using(queue_name="emails").enqueue(1)
    added = add.enqueue(1, 2)
    plain = get_state_store().create_job(request_id="plain-job", target="t")

    page = admin_client.get(JOBS).content.decode()
    # The task's name, its queue on the quieter line under it.
    assert '>echo</span><span class="jobstate-sub">emails<' in page
    assert '>add</span><span class="jobstate-sub">default<' in page
    assert "tests.support.task_functions.echo" in page  # offered by the task filter
    by_task = admin_client.get(f"{JOBS}?task=tests.support.task_functions.add")
    assert {job.id for job in by_task.context["cl"].result_list} == {_id(added)}
    by_queue = admin_client.get(f"{JOBS}?queue=emails")
    assert {job.id for job in by_queue.context["cl"].result_list} == {_id(echoed)}
    everything = admin_client.get(JOBS)
    assert plain.id in {job.id for job in everything.context["cl"].result_list}


def test_requeue_starts_a_failed_task_over(admin_client: Client, settings: Any) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    task = failed_task("s3cret")
    assert echo.get_result(task.id).status == TaskResultStatus.FAILED

    response = act(admin_client, JOBS, "requeue_jobs", [task.id], confirm=True)
    assert "Requeued 1 job." in response.content.decode()

    result = echo.get_result(task.id)
    assert result.status == TaskResultStatus.READY
    assert (result.attempts, result.errors, result.worker_ids) == (0, [], [])
    job = Job.objects.get(id=task.id)
    assert (job.attempts, job.attempt_log, job.error) == (0, [], None)


def test_cancel_makes_a_queued_task_failed(admin_client: Client) -> None:
    task = add.enqueue(2, 2)
    act(admin_client, JOBS, "reject_jobs", [task.id], confirm=True, reason="not needed")
    result = add.get_result(task.id)
    assert result.status == TaskResultStatus.FAILED
    assert Job.objects.get(id=task.id).error == "not needed"


def _id(result: Any) -> Any:
    return Job.objects.get(id=result.id).id
