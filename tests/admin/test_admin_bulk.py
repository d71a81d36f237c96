"""Bulk actions over a filter of the jobs list: the confirmation page (count and filter),
the progress page and its steps, permissions, audit entries, and the batches themselves
(keyset order, cutoff, resuming, counts) on SQLite and PostgreSQL."""

from __future__ import annotations

import io
import json
from typing import Any
from urllib.parse import urlencode

import pytest

from jobstate.console.bulk import advance_bulk_operation, start_bulk_operation
from jobstate.console.job_search import SearchError
from jobstate.exceptions import InvalidJobState
from jobstate.models import AuditEntry, BulkOperation, BulkState, Job
from jobstate.stores.base import JobStatus
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore
from tests.support.admin_kit import failed_job, logged_in, operator, running_job, shown_messages

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

BULK = "/admin/jobstate/job/bulk/"


def progress_url(pk: int) -> str:
    return f"/admin/jobstate/job/bulk-operation/{pk}/"


def failed_jobs(store: DatabaseStateStore, count: int, target: str = "mail") -> list[Job]:
    return [failed_job(store, f"{target}-{n}", target=target) for n in range(count)]


def test_the_confirmation_page_shows_the_count_and_the_filter(django_user_model: Any) -> None:
    store = DatabaseStateStore()
    failed_jobs(store, 3)
    failed_jobs(store, 2, target="sms")
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))
    query = urlencode({"target": "mail", "status__exact": "error"})
    page = client.get(f"{BULK}requeue/?{query}")
    assert page.status_code == 200
    text = page.content.decode()
    assert "3 matching jobs now" in text
    assert "target = mail" in text and "status = error" in text
    # The list's link carries the list's filter.
    listing = client.get(f"/admin/jobstate/job/?{query}").content.decode()
    assert f'href="{BULK}requeue/?' in listing
    assert "Reject (cancel) all matching" not in listing  # not this user's permission


def test_a_bulk_requeue_runs_to_the_end_and_audits_every_job(django_user_model: Any) -> None:
    store = DatabaseStateStore()
    mail = failed_jobs(store, 5)
    other = failed_jobs(store, 2, target="sms")
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))
    query = urlencode({"target": "mail"})
    response = client.post(f"{BULK}requeue/", {"_filter": query})
    assert response.status_code == 302
    operation = BulkOperation.objects.get()
    assert response["Location"] == progress_url(operation.pk)
    assert operation.total == 5 and operation.operator == "ops"
    page = client.get(progress_url(operation.pk)).content.decode()
    assert 'id="jobstate-bulk-continue"' in page
    # The cutoff as every instant of the console: with seconds and its zone.
    cutoff = page.split('id="jobstate-bulk-cutoff">')[1].split("</td>")[0]
    assert '<time class="jobstate-moment"' in cutoff and " UTC</time>" in cutoff, cutoff
    step = client.post(progress_url(operation.pk), {"step": "1"}, HTTP_ACCEPT="application/json")
    progress = json.loads(step.content)
    assert progress == {
        "id": operation.pk,
        "state": "done",
        "total": 5,
        "done": 5,
        "skipped": 0,
        "percent": 100,
    }
    assert {job.status for job in Job.objects.filter(pk__in=[j.pk for j in mail])} == {"queued"}
    assert {job.status for job in Job.objects.filter(pk__in=[j.pk for j in other])} == {"error"}
    reruns = AuditEntry.objects.filter(event="rerun", detail__via=f"bulk:{operation.pk}")
    assert sorted(str(entry.job_id) for entry in reruns) == sorted(str(j.pk) for j in mail)
    assert {entry.detail["by"] for entry in reruns} == {"ops"}
    finished = AuditEntry.objects.get(event="bulk_finished")
    assert finished.detail["done"] == 5 and finished.detail["by"] == "ops"
    assert AuditEntry.objects.filter(event="bulk_started").count() == 1


def test_without_javascript_the_continue_button_steps_and_redirects(
    django_user_model: Any,
) -> None:
    store = DatabaseStateStore()
    failed_jobs(store, 3)
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))
    client.post(f"{BULK}requeue/", {"_filter": ""})
    operation = BulkOperation.objects.get()
    response = client.post(progress_url(operation.pk), {"step": "Continue"}, follow=True)
    assert response.redirect_chain == [(progress_url(operation.pk), 302)]
    assert 'id="jobstate-bulk-state">done' in response.content.decode()


def test_reject_takes_the_reason_and_delete_only_finished_jobs(django_user_model: Any) -> None:
    store = DatabaseStateStore()
    done = failed_jobs(store, 2)
    queued = [store.create_job(request_id=f"q{n}", target="mail") for n in range(3)]
    client = logged_in(
        operator(django_user_model, "ops", "view_job", "reject_job", "delete_finished_job")
    )
    client.post(f"{BULK}reject/", {"_filter": "target=mail", "reason": "wrong template"})
    reject = BulkOperation.objects.get(action="reject")
    assert reject.total == 3
    advance_bulk_operation(reject.pk)
    assert set(Job.objects.filter(target="mail").values_list("status", flat=True)) == {
        "rejected",
        "error",
    }
    assert Job.objects.get(pk=queued[0].pk).error == "wrong template"
    client.post(f"{BULK}delete/", {"_filter": "target=mail"})
    delete = BulkOperation.objects.get(action="delete")
    assert delete.total == 5  # the rejected ones are finished now too
    advance_bulk_operation(delete.pk)
    assert not Job.objects.filter(target="mail").exists()
    deleted = AuditEntry.objects.filter(event="deleted")
    assert {entry.job_id for entry in deleted} == {j.pk for j in queued + done}
    assert {entry.detail["by"] for entry in deleted} == {"ops"}


def test_delete_never_touches_a_job_in_flight(django_user_model: Any) -> None:
    store = DatabaseStateStore()
    finished = failed_jobs(store, 1)[0]
    queued = store.create_job(request_id="waiting", target="mail")
    operation = start_bulk_operation(action="delete", filters={}, search="", operator="ops")
    assert operation.total == 1
    advance_bulk_operation(operation.pk)
    assert Job.objects.filter(pk=queued.pk).exists()
    assert not Job.objects.filter(pk=finished.pk).exists()


@pytest.mark.parametrize(
    ("action", "codename"),
    [("requeue", "requeue_job"), ("reject", "reject_job"), ("delete", "delete_finished_job")],
)
def test_each_bulk_action_needs_its_own_permission(
    django_user_model: Any, action: str, codename: str
) -> None:
    store = DatabaseStateStore()
    failed_jobs(store, 1)
    store.create_job(request_id="q", target="mail")
    others = {"requeue_job", "reject_job", "delete_finished_job", "approve_job"} - {codename}
    client = logged_in(operator(django_user_model, "nearly", "view_job", *sorted(others)))
    assert client.get(f"{BULK}{action}/").status_code == 403
    assert client.post(f"{BULK}{action}/", {"_filter": ""}).status_code == 403
    assert not BulkOperation.objects.exists()
    # An operation someone else started cannot be stepped or stopped either.
    operation = start_bulk_operation(action=action, filters={}, search="", operator="boss")
    for data in ({"step": "1"}, {"stop": "1"}):
        assert client.post(progress_url(operation.pk), data).status_code == 403
    operation.refresh_from_db()
    assert operation.state == BulkState.RUNNING and operation.processed == 0
    # Viewing its progress needs only the view permission.
    assert client.get(progress_url(operation.pk)).status_code == 200


def test_a_malformed_filter_is_refused_with_a_message(django_user_model: Any) -> None:
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))
    response = client.get(f"{BULK}requeue/?q=input:customer", follow=True)
    assert any("input: takes key=value" in message for message in shown_messages(response))
    response = client.get(f"{BULK}requeue/?nonsense=1", follow=True)
    assert any("no filter “nonsense”" in message for message in shown_messages(response))
    assert not BulkOperation.objects.exists()
    with pytest.raises(SearchError):
        start_bulk_operation(
            action="requeue", filters={"status__exact": "x"}, search="", operator="o"
        )


def test_a_bulk_action_that_does_not_exist_is_not_found(django_user_model: Any) -> None:
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))
    for action in ("bogus", "delete_selected", "%3Cscript%3E"):
        assert client.get(f"{BULK}{action}/").status_code == 404
        assert client.post(f"{BULK}{action}/", {"_filter": ""}).status_code == 404
    assert not BulkOperation.objects.exists()


def test_an_operation_address_that_names_no_operation_is_not_found(
    django_user_model: Any,
) -> None:
    # "abc" and "-1" fell through to the admin's own fallback, which looked them up as a
    # job's id and redirected to the index with "Job with ID “bulk-operation/abc”".
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))
    for rest in ("abc/", "-1/", "99999/", "1/extra/"):
        response = client.get(f"/admin/jobstate/job/bulk-operation/{rest}")
        assert response.status_code == 404, rest


def test_a_confirmation_sent_twice_opens_the_running_operation(django_user_model: Any) -> None:
    store = DatabaseStateStore()
    failed_jobs(store, 3)
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))
    first = client.post(f"{BULK}requeue/", {"_filter": "target=mail"})
    again = client.post(f"{BULK}requeue/", {"_filter": "target=mail"}, follow=True)
    (operation,) = BulkOperation.objects.all()
    assert first["Location"] == progress_url(operation.pk)
    assert again.redirect_chain[-1][0] == progress_url(operation.pk)
    assert any("already running" in message for message in shown_messages(again))
    # Another filter is another operation.
    client.post(f"{BULK}requeue/", {"_filter": "target=other"})
    assert BulkOperation.objects.count() == 2


def test_a_filter_given_twice_is_refused_by_the_list_and_by_the_bulk_pages(
    django_user_model: Any,
) -> None:
    """The list matched any of the values, the bulk page the last: a bulk delete of
    ``status=done&status=error`` from a list of both would have deleted one."""
    store = DatabaseStateStore()
    failed_jobs(store, 2)
    client = logged_in(operator(django_user_model, "ops", "view_job", "delete_finished_job"))
    query = "status__exact=done&status__exact=error"
    listed = client.get(f"/admin/jobstate/job/?{query}", follow=True)
    assert listed.redirect_chain[-1][0] == "/admin/jobstate/job/?e=1"
    said = shown_messages(listed)
    assert any("“status__exact” is given more than once" in message for message in said), said
    bulk = client.get(f"{BULK}delete/?{query}", follow=True)
    said = shown_messages(bulk)
    assert any("“status__exact” is given more than once" in message for message in said), said
    client.post(f"{BULK}delete/", {"_filter": query})
    assert not BulkOperation.objects.exists()
    assert Job.objects.count() == 2
    # The search box is no filter, and is named as what it is.
    said = shown_messages(client.get("/admin/jobstate/job/?q=a&q=b", follow=True))
    assert any("The search is given more than once" in message for message in said), said


def test_batches_follow_the_list_order_and_jobs_created_later_are_left_out() -> None:
    store = DatabaseStateStore()
    jobs = failed_jobs(store, 7)
    operation = start_bulk_operation(action="requeue", filters={}, search="", operator="ops")
    late = failed_job(store, "late", target="mail")
    advance_bulk_operation(operation.pk, batch_size=3, seconds=0)
    operation.refresh_from_db()
    # One batch: the three newest jobs, newest first, the cursor on the third.
    newest = sorted(jobs, key=lambda job: (job.created_at, job.id), reverse=True)[:3]
    assert operation.done == 3 and operation.cursor_id == newest[-1].pk
    assert set(Job.objects.filter(status="queued").values_list("pk", flat=True)) == {
        job.pk for job in newest
    }
    # Resumed (by another caller, as after a restart): the rest, once each.
    advance_bulk_operation(operation.pk, batch_size=3)
    operation.refresh_from_db()
    assert operation.state == BulkState.DONE and operation.done == 7 and operation.skipped == 0
    assert Job.objects.get(pk=late.pk).status == JobStatus.ERROR
    per_job = AuditEntry.objects.filter(event="rerun", detail__via=f"bulk:{operation.pk}")
    assert per_job.count() == 7 and len({entry.job_id for entry in per_job}) == 7


def test_a_stopped_operation_does_no_more(django_user_model: Any) -> None:
    store = DatabaseStateStore()
    failed_jobs(store, 4)
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))
    client.post(f"{BULK}requeue/", {"_filter": ""})
    operation = BulkOperation.objects.get()
    client.post(progress_url(operation.pk), {"stop": "1"})
    operation.refresh_from_db()
    assert operation.state == BulkState.CANCELLED
    advance_bulk_operation(operation.pk)
    assert Job.objects.filter(status="error").count() == 4
    assert AuditEntry.objects.get(event="bulk_cancelled").detail["by"] == "ops"


def test_a_bulk_operation_over_a_search_uses_the_search(django_user_model: Any) -> None:
    store = DatabaseStateStore()
    for n in range(4):
        job = store.create_job(request_id=f"c{n}", target="mail", input={"customer": n % 2})
        claimed = store.claim_next_inhub_job(["mail"], "w")
        assert claimed is not None and claimed.pk == job.pk
        store.complete_claimed_job(claimed.pk, claimed.claim_token, "error", error="boom")
    operation = start_bulk_operation(
        action="requeue", filters={}, search="input:customer=1", operator="ops"
    )
    assert operation.total == 2
    advance_bulk_operation(operation.pk)
    requeued = Job.objects.filter(status="queued")
    assert sorted(job.input["customer"] for job in requeued) == [1, 1]


@pytest.mark.parametrize("store_class", [DatabaseStateStore, MemoryStateStore])
def test_delete_finished_job_deletes_only_finished_jobs_and_audits(store_class: Any) -> None:
    store = store_class()
    finished = failed_job(store, "gone")
    waiting = store.create_job(request_id="waiting", target="mail")
    assert store.delete_finished_job(waiting.pk, by="ops", via="test") is None
    assert store.get_job(waiting.pk) is not None
    deleted = store.delete_finished_job(finished.pk, by="ops", via="test")
    assert deleted is not None and deleted.status == JobStatus.ERROR
    assert store.get_job(finished.pk) is None and store.find_by_request_id("gone") is None
    [entry] = [e for e in store.list_audit(request_id="gone") if e.event == "deleted"]
    assert entry.detail == {"by": "ops", "via": "test", "prev_status": "error"}
    assert store.delete_finished_job(finished.pk, by="ops", via="test") is None
    with pytest.raises(InvalidJobState):
        store.delete_finished_job(finished.pk, by="", via="test")


@pytest.mark.parametrize("store_class", [DatabaseStateStore, MemoryStateStore])
def test_the_batch_transitions_keep_the_single_transitions_checks(store_class: Any) -> None:
    """The database store's set-based batches and the base's one-at-a-time default
    (the in-memory store) answer alike."""
    store = store_class()
    failed = failed_job(store, "failed")
    done = failed_job(store, "done-later")
    store.update_job(done.pk, status="done", metadata={"no_delivery": True, "k": 1})
    expired = running_job(store, "expired", expired=True)
    held = running_job(store, "held", expired=False)
    queued = store.create_job(request_id="queued", target="mail")
    requeued = store.requeue_jobs(
        [
            (failed.pk, "error"),
            (done.pk, "error"),  # seen as error, done now: left alone
            (expired.pk, "running"),
            (held.pk, "running"),  # its lease still runs
            (queued.pk, "queued"),
        ],
        by="ops",
        via="bulk:test",
    )
    assert sorted(requeued) == sorted([failed.pk, expired.pk])
    assert store.get_job(done.pk).status == "done"  # type: ignore[union-attr]
    again = store.get_job(expired.pk)
    assert again is not None and again.status == "queued" and again.claim_token is None
    entries = [e for e in store.list_audit(request_id="expired") if e.event == "rerun"]
    assert [e.detail for e in entries] == [
        {"by": "ops", "via": "bulk:test", "prev_status": "running"}
    ]
    assert store.requeue_jobs([(done.pk, "done")], by="ops", via="v") == [done.pk]
    assert store.get_job(done.pk).metadata == {"k": 1}  # type: ignore[union-attr]
    rejected = store.reject_queued_jobs(
        [queued.pk, held.pk, failed.pk], by="ops", reason="r", via="bulk:test"
    )
    assert sorted(rejected) == sorted([queued.pk, failed.pk])  # both were queued
    assert store.get_job(queued.pk).error == "r"  # type: ignore[union-attr]
    (entry,) = [e for e in store.list_audit(request_id=queued.request_id) if e.event == "rejected"]
    assert entry.detail == {"by": "ops", "reason": "r", "prev_status": "queued", "via": "bulk:test"}
    deleted = store.delete_finished_jobs([queued.pk, held.pk], by="ops", via="v")
    assert deleted == [queued.pk]
    assert store.get_job(held.pk) is not None
    with pytest.raises(InvalidJobState):
        store.requeue_jobs([(failed.pk, "nonsense")], by="ops", via="v")


def test_the_command_finishes_an_operation_and_refuses_an_unknown_one() -> None:
    from django.core.management import CommandError, call_command

    store = DatabaseStateStore()
    failed_jobs(store, 3)
    operation = start_bulk_operation(action="requeue", filters={}, search="", operator="ops")
    out = io.StringIO()
    call_command("run_bulk_operation", str(operation.pk), "--batch-size", "2", stdout=out)
    assert f"Bulk operation {operation.pk} (requeue) done: 3 done, 0 skipped" in out.getvalue()
    with pytest.raises(CommandError, match="No bulk operation 999") as raised:
        call_command("run_bulk_operation", "999")
    assert raised.value.returncode == 2


@pytest.mark.parametrize(
    ("action", "codename", "status"),
    [
        ("requeue", "requeue_job", "error"),
        ("reject", "reject_job", "queued"),
        ("delete", "delete_finished_job", "error"),
    ],
)
def test_the_audit_link_of_every_bulk_action_lists_the_entries_it_wrote(
    django_user_model: Any, action: str, codename: str, status: str
) -> None:
    store = DatabaseStateStore()
    if status == "queued":
        for n in range(3):
            store.create_job(request_id=f"q{n}", target="mail")
    else:
        failed_jobs(store, 3)
    client = logged_in(operator(django_user_model, "ops", "view_job", "view_auditentry", codename))
    client.post(f"{BULK}{action}/", {"_filter": "target=mail"})
    operation = BulkOperation.objects.get()
    advance_bulk_operation(operation.pk)
    page = client.get(progress_url(operation.pk)).content.decode()
    link = f'href="/admin/jobstate/auditentry/?bulk={operation.pk}"'
    assert link in page
    # What the operator sees behind the link: one entry per job the operation changed.
    audit = client.get(f"/admin/jobstate/auditentry/?bulk={operation.pk}")
    assert audit.status_code == 200
    assert audit.context["cl"].result_count == 3
    assert "3 audit entries" in audit.content.decode()
