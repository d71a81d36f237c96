"""The job actions an operator expects (cancel, retry now, discard) on the job page and
the jobs list: buttons only where the job's state allows, a permission each, a
confirmation page, an audit entry naming the operator, and the admin's own log entry on
/admin/'s "Recent actions" for every console action."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.test import Client

from jobstate.core.states import JobStatus
from jobstate.models import AuditEntry, BulkOperation, Job
from jobstate.stores.base import StateStore
from tests.support.admin_kit import (
    JOBS,
    act,
    confirm_page,
    failed_job,
    logged_in,
    operator,
    running_job,
    shown_messages,
    task_job,
)

pytestmark = pytest.mark.mysql

#: Every button the job page can show.
BUTTONS = ("Requeue…", "Cancel…", "Reject…", "Retry now…", "Discard…", "Approve and requeue…")


def buttons(client: Client, job: Job) -> set[str]:
    page = client.get(f"{JOBS}{job.pk}/change/").content.decode()
    return {label for label in BUTTONS if f">{label}</button>" in page}


def test_the_job_page_offers_only_what_the_jobs_state_allows(
    admin_client: Client, store: StateStore
) -> None:
    broken = failed_job(store, "broken")
    done = store.create_job(request_id="done", target="mail", status="done")
    queued = store.create_job(request_id="queued", target="mail")
    running = running_job(store, "running", expired=False)
    expired = running_job(store, "expired", expired=True)
    waiting = task_job(store, failed_once=True)
    fresh_task = task_job(store, failed_once=False)
    # A done job has nothing to approve and nothing to cancel.
    assert buttons(admin_client, done) == {"Requeue…"}
    assert buttons(admin_client, queued) == {"Reject…"}
    assert buttons(admin_client, running) == {"Cancel…"}
    assert buttons(admin_client, expired) == {"Requeue…", "Cancel…"}
    assert buttons(admin_client, broken) == {"Requeue…", "Approve and requeue…"}
    # A task is retried or discarded, never "approved and requeued" nor "rejected".
    assert buttons(admin_client, waiting) == {"Retry now…", "Discard…"}
    assert buttons(admin_client, fresh_task) == {"Discard…"}


def test_cancel_needs_its_permission(django_user_model: Any, store: StateStore) -> None:
    running = running_job(store, "running", expired=False)
    viewer = logged_in(operator(django_user_model, "vera", "view_job", "requeue_job"))
    assert buttons(viewer, running) == set()
    refused = act(viewer, JOBS, "cancel_jobs", [running.pk], confirm=True)
    assert any("You may not run the action" in message for message in shown_messages(refused))
    assert Job.objects.get(pk=running.pk).status == JobStatus.RUNNING
    assert not AuditEntry.objects.filter(job_id=running.pk, event="cancelled").exists()
    assert not LogEntry.objects.exists()


def test_cancel_confirms_audits_and_shows_in_recent_actions(
    django_user_model: Any, store: StateStore
) -> None:
    running = running_job(store, "nightly-report", expired=False)
    client = logged_in(operator(django_user_model, "carla", "view_job", "cancel_job"))
    job_url = f"{JOBS}{running.pk}/change/"
    assert buttons(client, running) == {"Cancel…"}
    page = confirm_page(client, JOBS, "cancel_jobs", [running.pk], _return_to=job_url)
    html = page.content.decode()
    assert "Yes, cancel" in html and "nightly-report" in html
    assert Job.objects.get(pk=running.pk).status == JobStatus.RUNNING  # not before confirming
    done = act(
        client,
        JOBS,
        "cancel_jobs",
        [running.pk],
        confirm=True,
        _return_to=job_url,
        reason="stuck on a bad input",
    )
    assert done.redirect_chain[-1][0] == job_url
    assert "Cancelled 1 job." in shown_messages(done)
    job = Job.objects.get(pk=running.pk)
    assert job.status == JobStatus.REJECTED and job.claim_token is None
    assert job.error == "cancelled by carla: stuck on a bad input"
    entry = AuditEntry.objects.get(job_id=running.pk, event="cancelled")
    assert entry.detail["by"] == "carla" and entry.detail["prev_status"] == "running"
    (logged,) = LogEntry.objects.all()
    assert logged.user.get_username() == "carla" and logged.action_flag == CHANGE
    assert logged.object_id == str(running.pk)
    assert logged.get_change_message() == "Cancel jobs: stuck on a bad input"
    index = client.get("/admin/").content.decode()
    recent = index.split('id="recent-actions-module"')[1]
    assert "nightly-report" in recent
    # Once done, nothing is left to cancel.
    assert buttons(client, job) == set()


def test_retry_now_and_discard_through_the_list(django_user_model: Any, store: StateStore) -> None:
    waiting = task_job(store, failed_once=True)
    other = task_job(store, failed_once=True)
    plain = store.create_job(request_id="plain", target="mail")
    client = logged_in(
        operator(django_user_model, "dora", "view_job", "retry_job_now", "discard_job")
    )
    page = confirm_page(client, JOBS, "retry_now_jobs", [waiting.pk, plain.pk]).content.decode()
    assert "Yes, retry now" in page and "not a task waiting for its retry" in page
    moved = act(client, JOBS, "retry_now_jobs", [waiting.pk, plain.pk], confirm=True)
    assert "Brought forward the retry of 1 task." in shown_messages(moved)
    assert Job.objects.get(pk=waiting.pk).run_after is None
    assert AuditEntry.objects.get(job_id=waiting.pk, event="retry_now").detail["by"] == "dora"

    gone = act(client, JOBS, "discard_jobs", [other.pk], confirm=True)
    assert "Discarded 1 task." in shown_messages(gone)
    discarded = Job.objects.get(pk=other.pk)
    assert discarded.status == JobStatus.ERROR and discarded.error == "discarded by dora"
    assert AuditEntry.objects.filter(job_id=other.pk, event="discarded").count() == 1
    assert sorted(entry.object_id for entry in LogEntry.objects.all()) == sorted(
        [str(waiting.pk), str(other.pk)]
    )


def test_every_confirmed_console_action_is_in_the_admin_log(
    admin_client: Client, store: StateStore
) -> None:
    broken = failed_job(store, "broken")
    queued = store.create_job(request_id="queued", target="mail")
    act(admin_client, JOBS, "requeue_jobs", [broken.pk, queued.pk], confirm=True)
    # The queued job was skipped: only the requeued one is logged.
    (entry,) = LogEntry.objects.all()
    assert entry.object_id == str(broken.pk) and entry.get_change_message() == "Requeue jobs"


def test_a_bulk_action_with_a_bad_search_stays_on_the_filtered_list(
    admin_client: Client, store: StateStore
) -> None:
    query = "status__exact=queued&q=input%3Aa%3DNaN"
    response = admin_client.get(f"{JOBS}bulk/requeue/?{query}", follow=True)
    assert response.redirect_chain[-1][0] == f"{JOBS}?{query}"
    started, reason = shown_messages(response)
    assert started == "Nothing was started."
    assert "input: NaN is not a JSON value" in reason
    assert response.context["cl"].query == "input:a=NaN"


def test_a_bulk_action_with_a_search_too_long_to_send_back_opens_the_list_without_it(
    admin_client: Client, store: StateStore
) -> None:
    # Longer than any redirect Django allows (16,384 characters): the list cannot be
    # given the search back, so it opens as filtered, without it, with the reason.
    query = "status__exact=queued&q=" + "A" * 100_000
    response = admin_client.get(f"{JOBS}bulk/requeue/?{query}", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == f"{JOBS}?status__exact=queued"
    assert shown_messages(response) == ["Nothing was started: A search is at most 500 characters."]
    assert not BulkOperation.objects.exists()


def test_pausing_and_resuming_a_queue_and_starting_a_bulk_operation_are_in_the_admin_log(
    admin_client: Client, store: StateStore
) -> None:
    query = {"target": "tasks:default", "queue": "mail"}
    admin_client.post("/admin/jobstate/queuepause/pause/", {**query, "post": "yes"})
    admin_client.post("/admin/jobstate/queuepause/resume/", {**query, "post": "yes"})
    paused, resumed = LogEntry.objects.order_by("id")
    assert (paused.action_flag, paused.get_change_message()) == (CHANGE, "Paused the queue")
    # Resuming removes the pause row: a deletion, as the history of that row shows it.
    assert (resumed.action_flag, resumed.object_id) == (DELETION, paused.object_id)

    failed_job(store, "broken")
    admin_client.post(
        f"{JOBS}bulk/requeue/?status__exact=error", {"_filter": "status__exact=error"}
    )
    started = LogEntry.objects.order_by("id").last()
    assert started is not None and started.content_type.model == "bulkoperation"
    assert started.get_change_message() == "Requeue all matching jobs: status = error"
