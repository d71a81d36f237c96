"""The console for django.tasks tasks: a task's page (titled by its task path, its status
as Django names it, a summary, each attempt once with its worker and traceback, its
arguments once, redacted, and none of the hub's fields), the jobs list's task column and
its task and queue filters, and the requeue and cancel actions on tasks (the confirmation
naming the task by its path), read back through Django's task API."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from jobstate.core.states import NewTask
from jobstate.models import AuditEntry, Job
from jobstate.stores import get_state_store
from jobstate.tasks.compat import TaskResultStatus
from tests.support.admin_kit import JOBS, act, confirm_page, failed_task, thrice_failed_task
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

    summary = section(html, "jobstate-summary")
    assert "tests.support.task_functions.echo" in summary
    assert "emails" in summary and "1 of 3" in summary  # the claim made attempt 1
    assert ">Arguments<" in html and "&quot;hello&quot;" in html  # the args
    assert secret not in html  # kwargs and the traceback quoting them are masked
    assert html.count("••••") >= 2
    timeline = section(html, "jobstate-timeline")
    for shown in ("w-0", "w-1", "worker lost", "failed", "builtins.ValueError"):
        assert shown in timeline


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
    assert ">Arguments<" not in html and "<dt>Task</dt>" not in html


def section(html: str, element_id: str) -> str:
    """The HTML of the page's ``<fieldset id=...>``."""
    return html.split(f'id="{element_id}"', 1)[1].split("</fieldset>", 1)[0]


def labels(html: str) -> set[str]:
    """The names of the fields a job's page shows: the summary's and the sections'."""
    found = re.findall(r"<dt>([^<]+)</dt>|<label>([^<]+):</label>", html)
    return {(summary or field).strip() for summary, field in found}


HUB_LABELS = {"Source", "Thread", "Session", "Callback URL", "Executor / worker", "Dispatched at"}


def test_a_tasks_page_is_titled_by_its_task_path_with_its_status_and_short_id(
    admin_client: Client,
) -> None:
    task = thrice_failed_task()
    html = admin_client.get(f"{JOBS}{task.id}/change/").content.decode()
    short = f"{str(task.id)[:4]}…{str(task.id)[-6:]}"
    assert re.search(r"<h1>\s*tests\.support\.task_functions\.echo\s*</h1>", html)
    assert f"<title>FAILED · {short} | tests.support.task_functions.echo |" in html
    subtitle = html.split('class="jobstate-subtitle"', 1)[1].split("</h2>", 1)[0]
    assert ">FAILED<" in subtitle and short in subtitle and str(task.id) in subtitle
    headings = re.findall(r"<h[12][^>]*>.*?</h[12]>", html.split('id="content"', 1)[1], re.S)
    assert headings and not any(task.request_id in heading for heading in headings)


def test_a_successful_tasks_empty_audit_trail_says_where_its_story_is(
    admin_client: Client,
) -> None:
    # A successful attempt writes no audit entry (the hot path): a bare "No audit
    # entries." under a task that ran looked like something was lost.
    task = add.enqueue(1, 2)
    Job.objects.filter(id=task.id).update(status="done")
    html = admin_client.get(f"{JOBS}{task.id}/change/").content.decode()
    trail = section(html, "jobstate-audit-trail")
    assert "are under Attempts and events" in trail
    assert "A successful attempt writes none" in trail
    hub = get_state_store().create_job(request_id="hub-quiet", target="mail")
    AuditEntry.objects.filter(job_id=hub.id).delete()
    html = admin_client.get(f"{JOBS}{hub.id}/change/").content.decode()
    assert "<p>No audit entries.</p>" in section(html, "jobstate-audit-trail")


def test_the_jobs_list_names_a_task_by_its_result_id_and_its_status_as_django_does(
    admin_client: Client,
) -> None:
    # A newcomer enqueues a task, sees result.id and the worker's line name the same id,
    # and looks for it in the list: the task's own request id ("task-…") matched neither.
    task = add.enqueue(1, 2)
    Job.objects.filter(id=task.id).update(status="done")
    hub = get_state_store().create_job(request_id="invoice-4711", target="mail")
    page = admin_client.get(JOBS).content.decode()
    rows = re.findall(r"<tr>.*?</tr>", page, re.S)
    (row,) = [row for row in rows if str(task.id) in row]
    assert f'title="{task.id}">{str(task.id)[:8]}…{str(task.id)[-8:]}</span>' in row
    assert Job.objects.get(id=task.id).request_id not in page
    assert ">SUCCESSFUL</span>" in row and ">Done</span>" not in row
    # Any other job keeps its request id and its own status label.
    (hub_row,) = [row for row in rows if str(hub.id) in row]
    assert 'title="invoice-4711">invoice-4711</span>' in hub_row
    assert ">Queued</span>" in hub_row


@pytest.mark.parametrize(
    ("status", "shown"),
    [("queued", "READY"), ("running", "RUNNING"), ("done", "SUCCESSFUL"), ("error", "FAILED")],
)
def test_a_tasks_status_is_named_as_django_names_it(
    admin_client: Client, status: str, shown: str
) -> None:
    task = add.enqueue(1, 2)
    Job.objects.filter(id=task.id).update(status=status)
    html = admin_client.get(f"{JOBS}{task.id}/change/").content.decode()
    summary = section(html, "jobstate-summary")
    assert f">{shown}</span>" in summary
    label = {"queued": "Queued", "running": "Running", "done": "Done", "error": "Error"}[status]
    assert f">{label}</span>" not in html


def test_a_tasks_page_leaves_out_the_hubs_fields_and_a_hub_jobs_page_keeps_them(
    admin_client: Client,
) -> None:
    store = get_state_store()
    hub = store.create_job(
        request_id="hub-1",
        target="llm",
        source="CLI",
        thread_id=77,
        session_id="s-9",
        callback_url="https://hooks.example/done",
    )
    claimed = store.claim_next_job(["llm"], "executor-5")
    assert claimed is not None and claimed.id == hub.id and claimed.dispatched_at is not None
    hub_page = admin_client.get(f"{JOBS}{hub.id}/change/").content.decode()
    assert labels(hub_page) >= HUB_LABELS, labels(hub_page)
    for value in ("CLI", "77", "s-9", "https://hooks.example/done", "executor-5"):
        assert value in hub_page

    task = thrice_failed_task()
    Job.objects.filter(id=task.id).update(
        source="CLI", thread_id=77, session_id="s-9", callback_url="https://hooks.example/x"
    )
    task_page = admin_client.get(f"{JOBS}{task.id}/change/").content.decode()
    assert not HUB_LABELS & labels(task_page), labels(task_page)
    assert "s-9" not in task_page and "hooks.example" not in task_page
    # Empty fields are left out too: a finished task has no claim, lease or result.
    assert not {"Claim token", "Lease until", "Claimed at", "Result", "Report"} & labels(task_page)


def test_a_tasks_page_shows_each_attempt_and_its_traceback_once_and_its_arguments_once(
    admin_client: Client, django_assert_max_num_queries: Any
) -> None:
    task = thrice_failed_task()
    with django_assert_max_num_queries(19):
        html = admin_client.get(f"{JOBS}{task.id}/change/").content.decode()
    timeline = section(html, "jobstate-timeline")
    for n in (1, 2, 3):
        assert html.count(f"line {100 + n}, in send_invoice") == 1, n
        assert timeline.count(f"Attempt {n} on") == 1
        assert f'href="/admin/jobstate/worker/find/?id=w-{n}"' in timeline  # the worker, linked
    assert timeline.count('<details class="jobstate-traceback">') == 3
    assert timeline.count("ran 2.3 s") == 3
    assert html.count("&quot;invoice-4711&quot;") == 1  # args
    assert html.count("&quot;customer&quot;") == 1  # kwargs
    # The summary and the timeline come before every other section.
    assert html.index('id="jobstate-summary"') < html.index('id="jobstate-timeline"')
    assert html.index('id="jobstate-timeline"') < html.index(">Arguments<")


def test_a_confirmation_page_names_a_task_by_its_task_path(admin_client: Client) -> None:
    task = thrice_failed_task()
    page = confirm_page(admin_client, JOBS, "requeue_jobs", [task.id]).content.decode()
    eligible = page.split('id="jobstate-eligible"', 1)[1].split("</table>", 1)[0]
    assert f"tests.support.task_functions.echo ({str(task.id)[:4]}…{str(task.id)[-6:]})" in (
        eligible
    )
    assert task.request_id not in eligible


def test_an_audit_entrys_data_reads_as_key_value_lines(admin_client: Client) -> None:
    store = get_state_store()
    job = store.create_job(request_id="audited", target="mail")
    store.append_audit(
        job=job, event="note", detail={"by": "ada", "why": "checking", "ids": [1, 2]}
    )
    trail = section(
        admin_client.get(f"{JOBS}{job.id}/change/").content.decode(), "jobstate-audit-trail"
    )
    assert "<dt>by</dt><dd>ada</dd>" in trail and "<dt>ids</dt><dd>[1, 2]</dd>" in trail
    assert "by: ada" not in trail  # the default summary says the same: not repeated


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
    # Offered by the task filter, breakable after its dots only: the sidebar broke
    # "send_welco/me_email" in the middle of a word.
    assert "tests.<wbr>support.<wbr>task_functions.<wbr>echo</a>" in page
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
