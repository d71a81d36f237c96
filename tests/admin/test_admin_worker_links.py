"""Workers and their links: a worker's name wherever a job shows it opens the worker's
own page; remote executors appear on the Workers page from their claims, the relay loop
from its own registration; a worker's page lists the jobs it holds and finished, with
counts, in a bounded number of queries."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from django.conf import settings as django_settings
from django.db import connection, connections
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobstate.core.states import WorkerKind, WorkerRegistration
from jobstate.models import Job, Worker
from jobstate.stores.contracts.claimer_presence import claimer_fields
from jobstate.stores.database import DatabaseStateStore, fleet_rows
from tests.support.admin_kit import JOBS
from tests.support.processes import database_url
from tests.support.task_functions import add, always_fails
from tests.support.tasks_kit import finish, run_batch, stop, use_options, wait_for
from tests.support.threads import in_parallel

#: The console's pages and their queries run on MariaDB/MySQL too (scripts/test's MariaDB step).
pytestmark = pytest.mark.mysql

WORKERS = "/admin/jobstate/worker/"
FIND = "/admin/jobstate/worker/find/"
LEASE = timedelta(seconds=30)


def find_url(worker_id: str) -> str:
    return f"{FIND}?{urlencode({'id': worker_id})}"


def register(store: DatabaseStateStore, worker_id: str, kind: str = WorkerKind.TASKS) -> Worker:
    store.register_worker(
        WorkerRegistration(worker_id=worker_id, kind=kind, host="app-1", pid=4242, lease=LEASE)
    )
    return Worker.objects.get(worker_id=worker_id)


def page_of(worker: Worker) -> str:
    return f"{WORKERS}{worker.pk}/change/"


def section(html: str, element_id: str) -> str:
    return html.split(f'id="{element_id}"', 1)[1].split("</fieldset>", 1)[0]


@pytest.mark.django_db
def test_a_workers_name_on_the_jobs_list_and_the_job_page_opens_its_page(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    worker = register(store, "w-links")
    job = store.create_job(request_id="held", target="llm")
    assert store.claim_next_inhub_job(["llm"], "w-links", lease=LEASE) is not None

    listed = admin_client.get(JOBS).content.decode()
    assert f'href="{find_url("w-links")}"' in listed.replace("&amp;", "&")
    shown = admin_client.get(f"{JOBS}{job.pk}/change/").content.decode()
    timeline = section(shown, "jobstate-timeline")
    assert f'href="{find_url("w-links")}"' in timeline
    # The page's summary names the worker holding the job, linked.
    summary = shown.split('class="jobstate-summary"', 1)[1].split("</dl>", 1)[0]
    assert f'href="{find_url("w-links")}"' in summary.replace("&amp;", "&")

    followed = admin_client.get(find_url("w-links"))
    assert followed.status_code == 302 and followed["Location"] == page_of(worker)


@pytest.mark.django_db
def test_an_unregistered_worker_id_leads_to_the_jobs_that_name_it(admin_client: Client) -> None:
    followed = admin_client.get(find_url("gone w-9"), follow=True)
    landed = urlsplit(followed.redirect_chain[-1][0])
    assert landed.path == JOBS and parse_qs(landed.query) == {"q": ['worker:"gone w-9"']}
    assert followed.status_code == 200
    messages = [str(message) for message in followed.context["messages"]]
    assert any("No registered worker is called gone w-9" in message for message in messages)


@pytest.mark.django_db
@pytest.mark.parametrize("worker_id", ["w" * 201, "[" * 20_000], ids=["over-the-column", "huge"])
def test_a_worker_id_longer_than_any_worker_has_opens_the_workers_page(
    admin_client: Client, worker_id: str
) -> None:
    followed = admin_client.get(find_url(worker_id), follow=True)
    assert followed.status_code == 200
    assert followed.redirect_chain[-1][0] == WORKERS
    messages = [str(message) for message in followed.context["messages"]]
    assert any("No worker id is longer than 200 characters" in message for message in messages)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("url", "listed", "said"),
    [
        (f"{FIND}?id=%00", WORKERS, "The worker id cannot be used: it holds a NUL character"),
        (f"{FIND}?id=", WORKERS, "The link names no worker"),
        (
            "/admin/jobstate/schedule/find/?key=w%00",
            "/admin/jobstate/schedule/",
            "The schedule key cannot be used: it holds a NUL character",
        ),
        ("/admin/jobstate/schedule/find/", "/admin/jobstate/schedule/", "The link names no"),
    ],
    ids=["worker-nul", "worker-none", "schedule-nul", "schedule-none"],
)
def test_a_find_link_no_row_can_match_opens_the_list_saying_why(
    admin_client: Client, url: str, listed: str, said: str
) -> None:
    """A NUL was a server error on PostgreSQL, which refuses it in a query's text."""
    followed = admin_client.get(url, follow=True)
    assert followed.status_code == 200
    assert followed.redirect_chain[-1][0] == listed
    messages = [str(message) for message in followed.context["messages"]]
    assert any(said in message for message in messages), messages


@pytest.mark.django_db
def test_the_find_page_needs_the_view_permission(django_user_model: Any) -> None:
    nobody = django_user_model.objects.create_user("nobody", is_staff=True)
    client = Client()
    client.force_login(nobody)
    assert client.get(find_url("w-1")).status_code == 403


@pytest.mark.django_db
def test_a_remote_executor_appears_on_the_workers_page_from_its_claims(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    job = store.create_job(request_id="remote-1", target="remote")
    claimed = store.claim_next_job(["remote"], "exec-1", lease=timedelta(minutes=4))
    assert claimed is not None and claimed.id == job.id
    row = Worker.objects.get(worker_id="exec-1")
    assert row.kind == WorkerKind.EXECUTOR and row.pid == os.getpid()
    assert row.lease == timedelta(minutes=4)

    listed = admin_client.get(WORKERS).content.decode()
    assert "exec-1" in listed and "claiming executor" in listed
    page = admin_client.get(page_of(row)).content.decode()
    held = section(page, "jobstate-worker-current")
    assert f"/admin/jobstate/job/{job.pk}/change/" in held and "Dispatched" in held


@pytest.mark.django_db
def test_an_executor_said_stopped_shows_stopped_until_it_claims_again(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """What ends an executor's work says so (its claims cannot); started again under the
    same id, its next claim shows it live, not a beat later."""
    for number in range(2):
        store.create_job(request_id=f"remote-{number}", target="remote")

    def listed(state: str) -> str:
        return admin_client.get(WORKERS, {"state": state}).content.decode()

    assert store.claim_next_job(["remote"], "exec-back") is not None
    assert store.stop_worker(worker_id="exec-back", reason="executor exited")
    assert "exec-back" in listed("stopped") and "exec-back" not in listed("live")
    assert "executor exited" in listed("stopped")

    assert store.claim_next_job(["remote"], "exec-back") is not None
    assert "exec-back" in listed("live") and "exec-back" not in listed("stopped")


@pytest.mark.django_db
def test_an_executor_beats_once_per_beat_not_once_per_claim(store: DatabaseStateStore) -> None:
    for number in range(3):
        store.create_job(request_id=f"remote-{number}", target="remote")
    assert store.claim_next_job(["remote"], "exec-2") is not None
    with CaptureQueriesContext(connection) as queries:
        assert store.claim_next_job(["remote"], "exec-2") is not None
        assert store.extend_executor_leases("exec-2") == 2
        assert store.claim_next_job(["remote"], "exec-2") is not None
    assert not [q["sql"] for q in queries.captured_queries if "jobstate_worker" in q["sql"]]
    assert Worker.objects.filter(worker_id="exec-2").count() == 1


@pytest.mark.concurrent
@pytest.mark.django_db(transaction=True)
def test_executors_first_seen_by_many_processes_at_once_get_one_row() -> None:
    """Each thread is a process's first write of the same executor's row: one inserts,
    the others meet the unique key and beat that row, none fails."""

    for attempt in range(5):
        name = f"exec-race-{attempt}"

        def first_write(_index: int, name: str = name) -> None:
            try:
                fleet_rows.register_worker("default", claimer_fields(name, LEASE))
            finally:
                connections.close_all()

        in_parallel(8, first_write)
        assert Worker.objects.filter(worker_id=name).count() == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_relay_loop_shows_on_the_workers_page(admin_client: Client) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            str(Path(django_settings.BASE_DIR) / "manage.py"),
            "deliver_notifications",
            "--loop",
            "--interval",
            "0.2",
            "--relay-id",
            "relay-console",
        ],
        cwd=django_settings.BASE_DIR,
        env={**os.environ, "DATABASE_URL": database_url(), "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        row = wait_for(
            lambda: Worker.objects.filter(worker_id="relay-console").first(), what="the relay"
        )
        listed = admin_client.get(f"{WORKERS}?kind=relay").content.decode()
        assert "relay-console" in listed and "notification relay" in listed and ">live<" in listed
        page = admin_client.get(page_of(row)).content.decode()
        assert "it runs no jobs" in page
        process.send_signal(signal.SIGTERM)
        code, _out, err = finish(process)
    finally:
        stop(process)
    assert code == 0, err


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_workers_page_lists_what_it_finished_with_counts(
    admin_client: Client, settings: Any, django_assert_max_num_queries: Any
) -> None:
    options = use_options(settings)
    done = add.enqueue(2, 3)
    failed = always_fails.enqueue("no luck")
    run_batch(options, "--worker-id", "w-page", "--queue-name", "default", tracebacks=True)
    assert Job.objects.get(id=done.id).status == "done"
    assert Job.objects.get(id=failed.id).status == "error"
    worker = Worker.objects.get(worker_id="w-page")

    # The page of rows, the session and user, then three of its own: held, recent, counts.
    with django_assert_max_num_queries(8):
        page = admin_client.get(page_of(worker)).content.decode()
    recent = section(page, "jobstate-worker-recent")
    assert f"/admin/jobstate/job/{done.id}/change/" in recent
    assert f"/admin/jobstate/job/{failed.id}/change/" in recent
    assert "1 done, 1 failed" in recent
    # Its tasks' states as their own pages name them.
    assert ">FAILED</span>" in recent and ">SUCCESSFUL</span>" in recent
    assert ">Error</span>" not in recent and ">Done</span>" not in recent
    assert "No job right now." in section(page, "jobstate-worker-current")
    # A job's timeline links the worker of each attempt.
    job_page = admin_client.get(f"{JOBS}{failed.id}/change/").content.decode()
    attempts = section(job_page, "jobstate-timeline")
    assert f'href="{find_url("w-page")}"' in attempts
