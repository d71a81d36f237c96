"""The Workers and Queues pages and the throughput chart: what they show, the pause and
resume confirmation pages, their permission and audit entries, and what the pages cost
in queries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from jobstate.admin.dashboard import CHART_HOURS, finished_per_hour
from jobstate.core.states import NewTask, WorkerKind, WorkerRegistration, task_target
from jobstate.models import AuditEntry, Job, QueuePause, Worker
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import logged_in, operator, shown_messages

#: The console's pages and their queries run on MariaDB/MySQL too (scripts/test's MariaDB step).
pytestmark = pytest.mark.mysql

WORKERS = "/admin/jobstate/worker/"
QUEUES = "/admin/jobstate/queuepause/"
PAUSE = "/admin/jobstate/queuepause/pause/"
RESUME = "/admin/jobstate/queuepause/resume/"
OVERVIEW = "/admin/jobstate/job/overview/"
LEASE = timedelta(seconds=30)


def register(store: DatabaseStateStore, worker_id: str, **fields: Any) -> None:
    store.register_worker(
        WorkerRegistration(
            worker_id=worker_id,
            kind=fields.pop("kind", WorkerKind.TASKS),
            host=fields.pop("host", "app-1"),
            pid=fields.pop("pid", 4242),
            lease=fields.pop("lease", LEASE),
            backend=fields.pop("backend", "default"),
            queues=fields.pop("queues", ("default",)),
            concurrency=fields.pop("concurrency", 4),
        )
    )


def task(store: DatabaseStateStore, queue: str, **fields: Any) -> Job:
    return store.enqueue_task(
        NewTask(
            target=task_target("default"),
            task_path=fields.pop("task_path", "tests.support.task_functions.add"),
            queue_name=queue,
            priority=0,
            args=[1, 2],
            kwargs={},
            max_attempts=1,
            **fields,
        )
    )


def row_of(page: str, marker: str) -> str:
    start = page.index(marker)
    return page[start : page.index("</tr>", start)]


# --- urls -------------------------------------------------------------------------------


def test_the_pages_have_stable_url_names(db: None) -> None:
    assert reverse("admin:jobstate_worker_changelist") == WORKERS
    assert reverse("admin:jobstate_queuepause_changelist") == QUEUES
    assert reverse("admin:jobstate_queue_pause") == PAUSE
    assert reverse("admin:jobstate_queue_resume") == RESUME


# --- workers ------------------------------------------------------------------------------


def test_the_workers_page_shows_live_lost_and_stopped_workers_and_their_jobs(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    register(store, "app-1:100:live", queues=("default", "mail"))
    register(store, "app-2:200:lost", host="app-2", pid=200)
    register(store, "app-3:300:gone", host="app-3", pid=300)
    register(store, "relay:app-1:9", kind=WorkerKind.RELAY, backend="", queues=None)
    store.stop_worker(worker_id="app-3:300:gone", reason="SIGTERM")
    Worker.objects.filter(worker_id="app-2:200:lost").update(
        heartbeat_at=datetime.now(UTC) - timedelta(minutes=5)
    )
    for _ in range(7):
        task(store, "default")
    claimed = store.claim_tasks(
        target=task_target("default"), queues=None, worker_id="app-1:100:live", lease=LEASE, limit=7
    )
    assert len(claimed) == 7

    page = admin_client.get(WORKERS).content.decode()

    live = row_of(page, "app-1:100:live")
    assert "live" in live and "app-1" in live
    # Each queue its own element (whole on a phone's "All columns"), comma-separated.
    queues = '<span class="jobstate-queue-name">{}</span>'
    assert f"{queues.format('default')}, {queues.format('mail')}" in live, live
    # The first five held jobs are linked, the other two counted.
    assert live.count("/admin/jobstate/job/") == 5
    assert "and 2 more" in live
    assert ">lost<" in row_of(page, "app-2:200:lost")
    gone = row_of(page, "app-3:300:gone")
    assert ">stopped<" in gone and "SIGTERM" in gone
    relay = row_of(page, "relay:app-1:9")
    assert "notification relay" in relay and ">live<" in relay
    # The live refresh is offered, hidden until its script runs.
    assert 'id="jobstate-live"' in page and "jobstate/live.js" in page


def test_the_workers_page_names_each_running_job_by_its_id(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """Two running jobs of one task read the same, "tests.support.task_functions.add"
    twice, under "Running now": which was which could not be told."""
    register(store, "app-1:100:live")
    jobs = [task(store, "default") for _ in range(2)]
    store.claim_tasks(
        target=task_target("default"), queues=None, worker_id="app-1:100:live", lease=LEASE, limit=2
    )

    cell = row_of(admin_client.get(WORKERS).content.decode(), "app-1:100:live")
    cell = cell[cell.index('class="field-running_now"') :]
    for job in jobs:
        whole, shown = str(job.pk), f"{str(job.pk)[:4]}…{str(job.pk)[-6:]}"
        assert shown in cell, (shown, cell)
        # The id is in the link to the job's page, the whole id in its tooltip.
        link = cell[cell.index(f'href="/admin/jobstate/job/{whole}/change/"') :]
        assert shown in link[: link.index("</a>")], link
        assert whole in link[: link.index(">")], link


def test_the_workers_page_cuts_a_running_tasks_path_at_its_start(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """A long task path was cut at its end to fit "Running now" ("project.billing.re…"),
    hiding the part that says what the task is. Its leading packages give way instead;
    the whole path is in the tooltip."""
    path = "project.billing.reports.build_report"
    register(store, "app-1:100:live")
    job = task(store, "default", task_path=path)
    store.claim_tasks(
        target=task_target("default"), queues=None, worker_id="app-1:100:live", lease=LEASE, limit=1
    )

    cell = row_of(admin_client.get(WORKERS).content.decode(), "app-1:100:live")
    link = cell[cell.index(f'href="/admin/jobstate/job/{job.pk}/change/"') :]
    link = link[: link.index("</a>")]
    assert path in link[: link.index(">")], link
    name = link.split('class="jobstate-job-name">', 1)[1].split("</span>", 1)[0]
    assert name == "…reports.build_report", link


def test_a_workers_own_page_names_each_job_by_its_id(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """A worker's own page named the jobs it holds and finished by their task alone:
    two of one task read the same, "tests.support.task_functions.add" twice."""
    register(store, "app-1:100:live")
    Worker.objects.filter(worker_id="app-1:100:live").update(
        started_at=datetime.now(UTC) - timedelta(minutes=10)
    )
    held = [task(store, "default") for _ in range(2)]
    store.claim_tasks(
        target=task_target("default"), queues=None, worker_id="app-1:100:live", lease=LEASE, limit=2
    )
    finished = [task(store, "other") for _ in range(2)]
    Job.objects.filter(pk__in=[job.pk for job in finished]).update(
        status="done",
        attempt_log=[{"worker_id": "app-1:100:live"}],
        updated_at=datetime.now(UTC) - timedelta(minutes=1),
    )
    worker = Worker.objects.get(worker_id="app-1:100:live")

    page = admin_client.get(f"{WORKERS}{worker.pk}/change/").content.decode()
    for section, jobs in (("jobstate-worker-current", held), ("jobstate-worker-recent", finished)):
        part = page.split(f'id="{section}"', 1)[1].split("</fieldset>", 1)[0]
        for job in jobs:
            whole, shown = str(job.pk), f"{str(job.pk)[:4]}…{str(job.pk)[-6:]}"
            # The short id in the link to the job's page, the whole id in its tooltip,
            # the task's whole path beside it.
            link = part[part.index(f'href="/admin/jobstate/job/{whole}/change/"') :]
            link = link[: link.index("</a>")]
            assert shown in link and "tests.support.task_functions.add" in link, (section, link)
            assert whole in link[: link.index(">")], (section, link)


def test_a_workers_page_shows_a_backend_and_a_concurrency_only_for_a_task_worker(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    # A backend alias is a task worker's: a relay or an executor has none, and a
    # "Backend: -" row on its page suggested something was missing. An executor's
    # "Concurrency: 1" (its row's default) sat beside the five jobs it held.
    register(store, "app-1:100:tasks", backend="emails")
    register(store, "relay:app-1:9", kind=WorkerKind.RELAY, backend="", queues=None)
    register(store, "executor-7", kind=WorkerKind.EXECUTOR, backend="", queues=None)
    for worker_id, shown in (
        ("app-1:100:tasks", True),
        ("relay:app-1:9", False),
        ("executor-7", False),
    ):
        pk = Worker.objects.get(worker_id=worker_id).pk
        page = admin_client.get(f"{WORKERS}{pk}/change/").content.decode()
        assert "field-worker_id" in page
        assert ("field-backend" in page) is shown, worker_id
        assert ("emails" in page) is shown, worker_id
        assert ("field-concurrency" in page) is shown, worker_id
    listed = admin_client.get(WORKERS).content.decode()
    assert "concurrency 4" in row_of(listed, "app-1:100:tasks")
    for worker_id in ("relay:app-1:9", "executor-7"):
        assert "concurrency" not in row_of(listed, worker_id), worker_id


def test_the_workers_page_filters_by_state(admin_client: Client, store: DatabaseStateStore) -> None:
    register(store, "w-live")
    register(store, "w-lost")
    Worker.objects.filter(worker_id="w-lost").update(
        heartbeat_at=datetime.now(UTC) - timedelta(minutes=5)
    )
    page = admin_client.get(WORKERS, {"state": "lost"}).content.decode()
    assert "w-lost" in page and "w-live" not in page


def test_the_workers_page_costs_the_same_queries_for_one_or_many_workers(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    register(store, "only")
    with CaptureQueriesContext(connection) as one:
        assert admin_client.get(WORKERS).status_code == 200
    for n in range(20):
        register(store, f"more-{n}")
        task(store, "default")
        store.claim_tasks(
            target=task_target("default"), queues=None, worker_id=f"more-{n}", lease=LEASE, limit=1
        )
    with CaptureQueriesContext(connection) as many:
        assert admin_client.get(WORKERS).status_code == 200
    assert len(many) == len(one)
    assert len(many) <= 20


def test_a_worker_registered_again_starts_afresh(store: DatabaseStateStore) -> None:
    register(store, "again")
    store.stop_worker(worker_id="again", reason="SIGTERM")
    assert not store.beat_worker(worker_id="again")
    register(store, "again", pid=9)
    worker = Worker.objects.get(worker_id="again")
    assert worker.stopped_at is None and worker.pid == 9
    assert store.beat_worker(worker_id="again")


# --- queues -------------------------------------------------------------------------------


def test_the_queues_page_counts_each_queue(admin_client: Client, store: DatabaseStateStore) -> None:
    for _ in range(3):
        task(store, "mail")
    task(store, "mail", run_after=datetime.now(UTC) + timedelta(hours=1))
    task(store, "reports")
    store.claim_tasks(
        target=task_target("default"), queues=["reports"], worker_id="w", lease=LEASE, limit=1
    )
    store.create_job(request_id="hub-1", target="billing")
    done = store.create_job(request_id="hub-2", target="billing")
    store.update_job(done.id, status="done")
    store.pause_queue(target="billing", by="olga")

    page = admin_client.get(QUEUES).content.decode()

    mail = row_of(page, 'data-queue="mail"')
    assert '<td class="jobstate-number jobstate-ready">3</td>' in mail
    assert '<td class="jobstate-number jobstate-delayed jobstate-phone-hidden">1</td>' in mail
    reports = row_of(page, 'data-queue="reports"')
    assert '<td class="jobstate-number jobstate-running">1</td>' in reports
    billing = row_of(page, 'data-target="billing"')
    assert "paused" in billing and "olga" in billing
    assert '<td class="jobstate-number jobstate-finished jobstate-phone-hidden">1</td>' in billing
    assert "Resume…" in billing


def test_pausing_goes_through_a_confirmation_page_and_is_audited(
    db: None, django_user_model: Any, store: DatabaseStateStore
) -> None:
    client = logged_in(operator(django_user_model, "olga", "view_queuepause", "pause_queue"))
    task(store, "mail")
    query = {"target": task_target("default"), "queue": "mail"}

    confirm = client.get(PAUSE, query)
    assert confirm.status_code == 200
    assert b"Yes, pause" in confirm.content
    assert not QueuePause.objects.exists(), "the confirmation page changes nothing"

    response = client.post(PAUSE, {**query, "post": "yes"}, follow=True)
    assert "Paused tasks:default / mail." in shown_messages(response)
    assert QueuePause.objects.get().paused_by == "olga"
    entry = AuditEntry.objects.get(event="queue_paused")
    assert entry.detail == {
        "target": "tasks:default",
        "queue": "mail",
        "by": "olga",
        "via": "console",
    }

    again = client.post(PAUSE, {**query, "post": "yes"}, follow=True)
    assert "Queue tasks:default / mail was already paused; nothing was changed." in shown_messages(
        again
    )
    assert AuditEntry.objects.filter(event="queue_paused").count() == 1

    resumed = client.post(RESUME, {**query, "post": "yes"}, follow=True)
    assert "Resumed tasks:default / mail." in shown_messages(resumed)
    assert not QueuePause.objects.exists()
    assert AuditEntry.objects.get(event="queue_resumed").detail["by"] == "olga"


def test_a_queue_name_keeps_its_case_in_the_messages_shown(admin_client: Client) -> None:
    # The admin's page template capitalises the first letter of every message; a message
    # that began with the queue's name showed "Demo.inhub / (no queue)" for demo.inhub.
    query = {"target": "demo.inhub", "queue": ""}
    shown = []
    for view in (PAUSE, PAUSE, RESUME, RESUME):
        page = admin_client.post(view, {**query, "post": "yes"}, follow=True)
        messages = page.content.decode().split('<ul class="messagelist">')[1].split("</ul>")[0]
        shown.append(" ".join(messages.split()))
    for message in shown:
        assert "demo.inhub / (no queue)" in message
        assert "Demo.inhub" not in message
    assert "already paused; nothing was changed" in shown[1]
    assert "not paused; nothing was changed" in shown[3]


def test_a_bad_queue_is_refused_and_changes_nothing(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    for given in ({"target": "", "post": "yes"}, {"post": "yes"}):
        response = admin_client.post(PAUSE, given, follow=True)
        # In the operator's words, not the store's argument check ("got None").
        assert "Nothing was changed: no queue was named." in shown_messages(response)[0]
        assert "got" not in shown_messages(response)[0]
    response = admin_client.post(PAUSE, {"target": "x" * 300, "post": "yes"}, follow=True)
    assert any("Nothing was changed" in message for message in shown_messages(response))
    assert not QueuePause.objects.exists()
    assert not AuditEntry.objects.exists()


def test_the_confirmation_page_of_a_queue_without_jobs_says_so(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    store.create_job(request_id="known", target="demo.inhub")
    known = admin_client.get(PAUSE, {"target": "demo.inhub"}).content.decode()
    assert 'id="jobstate-unknown-queue"' not in known
    typo = admin_client.get(PAUSE, {"target": "demo.inhbu"}).content.decode()
    assert "No job of this queue is in the database now. Check the name" in typo
    assert 'id="jobstate-confirm-form"' in typo  # a queue may be paused before its jobs


def test_the_confirmation_page_of_a_paused_queue_offers_nothing_to_confirm(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    store.pause_queue(target="billing", by="olga")
    page = admin_client.get(PAUSE, {"target": "billing", "queue": ""}).content.decode()
    assert "paused already" in page and "Yes, pause" not in page


def test_the_queues_page_takes_no_post(admin_client: Client) -> None:
    assert admin_client.post(QUEUES, {"target": "billing"}).status_code == 405
    assert not QueuePause.objects.exists()


def test_the_queues_page_costs_a_fixed_number_of_queries(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    with CaptureQueriesContext(connection) as few:
        assert admin_client.get(QUEUES).status_code == 200
    for n in range(10):
        task(store, f"queue-{n}")
        store.pause_queue(target=task_target("default"), queue=f"queue-{n}", by="olga")
    with CaptureQueriesContext(connection) as many:
        assert admin_client.get(QUEUES).status_code == 200
    assert len(many) == len(few) <= 20


# --- the throughput chart -------------------------------------------------------------


def test_the_throughput_chart_buckets_24_hours_by_hour(store: DatabaseStateStore) -> None:
    now = datetime(2026, 12, 1, 12, 30, tzinfo=UTC)
    for hours_ago, status in [
        (0, "done"),
        (0, "error"),
        (5, "done"),
        (23, "rejected"),
        (30, "done"),
    ]:
        job = store.create_job(request_id=f"h-{hours_ago}-{status}", target="mail", status=status)
        Job.objects.filter(id=job.id).update(updated_at=now - timedelta(hours=hours_ago))
    chart = finished_per_hour(now)
    assert chart.total == 4, "the job finished 30 hours ago is outside the window"
    assert len(chart.ticks) == CHART_HOURS // 4
    by_hour = dict(chart.rows)
    assert by_hour["12:00"] == {"done": 1, "error": 1, "rejected": 0}
    assert by_hour["07:00"] == {"done": 1, "error": 0, "rejected": 0}
    assert by_hour["13:00"] == {"done": 0, "error": 0, "rejected": 1}
    assert chart.peak == 2


def test_the_overview_page_draws_both_charts_and_offers_the_live_refresh(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    store.create_job(request_id="finished", target="mail", status="done")
    page = admin_client.get(OVERVIEW).content.decode()
    assert 'id="jobstate-finished-chart"' in page
    assert 'id="jobstate-throughput-chart"' in page
    assert "1 in 24 hours" in page
    assert "data-jobstate-live" in page and "jobstate/live.js" in page


def test_the_live_script_is_a_static_file_of_the_app() -> None:
    from django.contrib.staticfiles import finders

    found = finders.find("jobstate/live.js")
    assert found, "jobstate/static/jobstate/live.js is served by staticfiles"
    text = Path(str(found)).read_text(encoding="utf-8")
    assert "visibilitychange" in text and "document.hidden" in text


@pytest.mark.parametrize("value", [5, timedelta(0), timedelta(days=-1), "1 day"])
def test_a_worker_retention_that_is_not_a_positive_duration_is_refused(
    settings: Any, value: Any
) -> None:
    from django.core.exceptions import ImproperlyConfigured

    from jobstate.core.conf import jobstate_settings

    settings.JOBSTATE = {"WORKER_RETENTION": value}
    with pytest.raises(ImproperlyConfigured, match="WORKER_RETENTION"):
        _ = jobstate_settings.WORKER_RETENTION
