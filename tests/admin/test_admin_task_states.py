"""A task's state reads one way on every page an operator sees it: as Django's
``TaskResultStatus`` names it (READY, RUNNING, SUCCESSFUL, FAILED), on the worker's
page and the requeue confirmation as on the list and the job page. The status filter
and the Overview's cards count tasks and other jobs with one value: they name both."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client, RequestFactory

from jobstate.admin.job_actions import requeue_spec
from jobstate.core.states import WorkerKind, WorkerRegistration
from jobstate.models import Job, Worker
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import JOBS, confirm_page, task_job, thrice_failed_task

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

OVERVIEW = f"{JOBS}overview/"


def table(html: str, element_id: str) -> str:
    return html.split(f'id="{element_id}"', 1)[1].split("</table>", 1)[0]


def fieldset(html: str, element_id: str) -> str:
    return html.split(f'id="{element_id}"', 1)[1].split("</fieldset>", 1)[0]


def running_task(store: DatabaseStateStore, worker_id: str) -> Job:
    """A task claimed by ``worker_id``, its lease a day from now."""
    task_job(store, failed_once=False)
    (claimed,) = store.claim_tasks(
        target="tasks:default",
        queues=None,
        worker_id=worker_id,
        lease=timedelta(days=1),
        limit=1,
    )
    return Job.objects.get(id=claimed.id)


def test_a_workers_page_names_its_tasks_states_as_the_job_page_does(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    store.register_worker(
        WorkerRegistration(
            worker_id="w-3", kind=WorkerKind.TASKS, host="app-1", pid=1, lease=timedelta(30)
        )
    )
    worker = Worker.objects.get(worker_id="w-3")
    thrice_failed_task()  # its last attempt ran on w-3
    running_task(store, "w-3")
    page = admin_client.get(f"/admin/jobstate/worker/{worker.pk}/change/").content.decode()
    current = fieldset(page, "jobstate-worker-current")
    recent = fieldset(page, "jobstate-worker-recent")
    assert ">RUNNING</span>" in current and ">Running</span>" not in current
    assert ">FAILED</span>" in recent and ">Error</span>" not in recent


def test_a_requeue_confirmation_names_a_tasks_state_as_the_job_page_does(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    failed = thrice_failed_task()
    running = running_task(store, "w-9")
    page = confirm_page(admin_client, JOBS, "requeue_jobs", [failed.id, running.id])
    html = page.content.decode()
    eligible = table(html, "jobstate-eligible")
    skipped = table(html, "jobstate-skipped")
    assert "<td>FAILED · tasks:default</td>" in eligible
    assert "<td>RUNNING · tasks:default · ends " in skipped
    assert "RUNNING and its lease has not expired" in skipped
    assert "Error" not in eligible and "Running" not in skipped


def test_a_requeue_that_finds_a_task_changed_names_its_state_now_as_the_job_page_does(
    store: DatabaseStateStore,
) -> None:
    # Seen running on the confirmation; finished (SUCCESSFUL) before the requeue ran.
    seen = running_task(store, "w-9")
    Job.objects.filter(id=seen.id).update(status="done")
    request = RequestFactory().post(JOBS)
    assert requeue_spec("ada").perform(request, seen, {}) == "now SUCCESSFUL"


def test_the_status_filter_names_both_words_where_a_task_reads_another(
    admin_client: Client,
) -> None:
    sidebar = admin_client.get(JOBS).content.decode().split('id="changelist-filter"', 1)[1]
    offered = dict(re.findall(r'href="\?status__exact=(\w+)"[^>]*>([^<]+)</a>', sidebar))
    assert offered == {
        "queued": "Queued (READY)",
        "running": "Running",
        "dispatched": "Dispatched (RUNNING)",
        "done": "Done (SUCCESSFUL)",
        "error": "Error (FAILED)",
        "rejected": "Rejected (FAILED)",
    }


def test_the_overviews_status_cards_name_both_words_as_the_filter_does(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    thrice_failed_task()
    page = admin_client.get(OVERVIEW).content.decode()
    labels = re.findall(r'jobstate-card-label">([^<]*)</div>', page)
    assert "Error (FAILED)" in labels and "Error" not in labels
    finished = re.search(
        r'jobstate-card-label">Finished in the last 15 min</div>'
        r'<div class="jobstate-card-value">([^<]*)<',
        page,
    )
    assert finished and "Error (FAILED) 1" in finished.group(1).split(" · ")
