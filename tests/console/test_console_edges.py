"""Edges an operator meets: a filter value too long for any job (refused, nothing
written), long values repeated in messages only in part, a filter value no list offers
named rather than ignored (and the whole list shown), and a bulk confirmation sent again
after its operation ran."""

from __future__ import annotations

import html
import re
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib import admin
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobstate.models import AuditEntry, BulkOperation, Job
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import shown_messages

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

JOBS = "/admin/jobstate/job/"
BULK = "/admin/jobstate/job/bulk/"
LONG = "x" * 10_000


@pytest.fixture
def jobs() -> None:
    store = DatabaseStateStore()
    store.create_job(request_id="first", target="billing", input={"a": 1})
    store.create_job(request_id="second", target="reports", input={"a": 2})


@pytest.mark.parametrize("parameter", ["target", "task", "queue", "source"])
def test_a_bulk_confirmation_refuses_a_text_filter_longer_than_its_column(
    admin_client: Client, jobs: None, parameter: str
) -> None:
    query = urlencode({parameter: LONG})
    for action in ("requeue", "reject", "delete"):
        page = admin_client.get(f"{BULK}{action}/?{query}", follow=True)
        assert page.redirect_chain[-1][0].startswith(JOBS), page.redirect_chain
        said = " ".join(shown_messages(page))
        assert "Nothing was started" in said and "at most" in said, said
        assert len(said) < 400, len(said)
        posted = admin_client.post(f"{BULK}{action}/", {"_filter": query}, follow=True)
        said = " ".join(shown_messages(posted))
        assert "Nothing was started" in said and "at most" in said, said
    assert not BulkOperation.objects.exists()
    assert not AuditEntry.objects.exists()


def test_a_filter_value_as_long_as_its_column_still_filters(
    admin_client: Client, jobs: None
) -> None:
    page = admin_client.get(f"{BULK}requeue/?{urlencode({'target': 'x' * 200})}")
    assert page.status_code == 200
    assert "0 matching jobs now" in page.content.decode()


@pytest.mark.parametrize(
    "url",
    [
        f"{JOBS}?delayed={LONG}",
        f"{JOBS}?lease={LONG}",
        f"{JOBS}?target={LONG}",
        f"{BULK}requeue/?delayed={LONG}",
        f"/admin/jobstate/auditentry/?bulk={'9' * 19}{LONG}",
        f"/admin/jobstate/schedule/find/?key={LONG}",
        f"/admin/jobstate/worker/find/?id={'x' * 200}",
    ],
)
def test_a_message_repeats_a_long_value_shortened(
    admin_client: Client, jobs: None, url: str
) -> None:
    response = admin_client.get(url, follow=True)
    assert response.status_code == 200
    said = shown_messages(response)
    assert said
    for message in said:
        assert "x" * 81 not in message and "9" * 81 not in message, message[:300]
        assert "…" in message, message


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("/admin/jobstate/worker/?state=zzz", "zzz"),
        ("/admin/jobstate/schedule/?state=zzz", "zzz"),
        ("/admin/jobstate/jobrun/?heartbeat=zzz", "zzz"),
        ("/admin/jobstate/runtimelock/?state=zzz", "zzz"),
        ("/admin/jobstate/auditentry/?bulk=0", "bulk operation"),
        ("/admin/jobstate/auditentry/?bulk=12345", "bulk operation"),
        (f"{JOBS}?p=abc", "page"),
        ("/admin/jobstate/worker/?p=abc", "page"),
        ("/admin/jobstate/auditentry/?p=1.5", "page"),
        # A field's own choices: Django filtered by any value, showing an empty list.
        (f"{JOBS}?status__exact=zzz", "zzz"),
        ("/admin/jobstate/auditentry/?severity__exact=loud", "loud"),
        ("/admin/jobstate/notification/?state__exact=gone", "gone"),
        ("/admin/jobstate/bulkoperation/?action__exact=explode", "explode"),
        ("/admin/jobstate/jobrun/?status__exact=zzz", "zzz"),
        # The field itself, as links give it: Django filtered by it, "0 jobs" without a word.
        (f"{JOBS}?status=zzz", "Unknown status filter 'zzz'"),
        ("/admin/jobstate/jobrun/?status=zzz", "Unknown status filter 'zzz'"),
        ("/admin/jobstate/notification/?state=gone", "gone"),
        ("/admin/jobstate/worker/?kind=zzz", "zzz"),
    ],
)
def test_a_filter_value_or_page_no_list_offers_is_named_and_the_whole_list_shown(
    admin_client: Client, jobs: None, url: str, says: str
) -> None:
    AuditEntry.objects.create(event="rerun", request_id="first")
    _whole_list_shown(admin_client.get(url, follow=True), says)


def _whole_list_shown(response: Any, says: str) -> Any:
    """``response``, asserted to be the whole list with one message that ``says`` why."""
    assert response.status_code == 200
    [message] = shown_messages(response)
    assert says in message and "The whole list is shown" in message, message
    assert response.request["QUERY_STRING"] == "e=1"
    return response


#: Every console list with a search box.
SEARCHED_LISTS = [
    JOBS,
    "/admin/jobstate/worker/",
    "/admin/jobstate/schedule/",
    "/admin/jobstate/runtimelock/",
    "/admin/jobstate/jobrun/",
    "/admin/jobstate/notification/",
    "/admin/jobstate/auditentry/",
    "/admin/jobstate/approvaldecision/",
    "/admin/jobstate/deliveryreplay/",
]


@pytest.mark.parametrize("url", SEARCHED_LISTS)
def test_a_search_longer_than_any_list_reads_is_refused_naming_the_limit(
    admin_client: Client, jobs: None, url: str
) -> None:
    """The workers and schedules lists answered a pasted page of text with "0 workers"
    and no word; the locks and schedules lists compared it with every row. The jobs
    list said it with its whole search help (eight lines on a phone), which is for a
    search it cannot read, not for one too long."""
    with CaptureQueriesContext(connection) as queries:
        response = admin_client.get(url, {"q": LONG})
    assert response.status_code == 200
    assert shown_messages(response) == ["A search is at most 500 characters."]
    ran = [query["sql"][:200] for query in queries.captured_queries if "x" * 501 in query["sql"]]
    assert ran == []


@pytest.mark.parametrize("action", ["requeue", "reject", "delete"])
def test_a_bulk_page_refusing_a_search_leaves_one_message(
    admin_client: Client, action: str
) -> None:
    """The bulk page said "Nothing was started: …" and the list it sent the operator
    back to refused the same search again below it. It goes back to the list with the
    filter it was given and without the search: the list would refuse it again."""
    query = {"q": "x" * 501, "target": "billing"}
    response = admin_client.get(f"{JOBS}bulk/{action}/", query, follow=True)
    assert shown_messages(response) == ["Nothing was started: A search is at most 500 characters."]
    assert response.redirect_chain[-1][0] == f"{JOBS}?target=billing"
    posted = admin_client.post(f"{JOBS}bulk/{action}/", {"_filter": urlencode(query)}, follow=True)
    assert shown_messages(posted) == ["Nothing was started: A search is at most 500 characters."]
    # A search the operator can correct goes back with them, and the list says once
    # what it cannot read in it.
    response = admin_client.get(f"{JOBS}bulk/{action}/", {"q": "input:customer"}, follow=True)
    assert response.redirect_chain[-1][0] == f"{JOBS}?q=input%3Acustomer"
    started, reason = shown_messages(response)
    assert started == "Nothing was started."
    assert reason.startswith("Search not understood: input: takes key=value"), reason
    # Straight on the list, a search it cannot read still gets the help.
    [message] = shown_messages(admin_client.get(JOBS, {"q": "input:customer"}))
    assert message.startswith("Search not understood: input: takes key=value"), message


@pytest.mark.parametrize("search", ["x" * 501, "input:customer"])
def test_a_jobs_list_refusing_its_search_offers_no_bulk_action(
    admin_client: Client, jobs: None, search: str
) -> None:
    """The list refused the search and listed nothing, yet its bulk links (Requeue…,
    Reject…, Delete…) carried it on to a bulk page that would act without it, on jobs
    the operator never asked for. They are left out until the list reads its search."""
    response = admin_client.get(JOBS, {"q": search, "target": "billing"})
    assert len(shown_messages(response)) == 1
    page = response.content.decode()
    assert "jobstate-bulk-link" not in page
    assert 'id="jobstate-overview-tool"' in page
    # A search the list reads keeps them, with the search.
    page = admin_client.get(JOBS, {"q": "first", "target": "billing"}).content.decode()
    assert 'id="jobstate-bulk-requeue"' in page
    assert f'href="{BULK}requeue/?q=first&amp;target=billing"' in page


@pytest.mark.parametrize(
    ("query", "says"),
    [
        (f"nonsense=1&q={'x' * 501}", "The jobs list has no filter “nonsense”."),
        (f"status__exact=zzz&q={'x' * 501}", "'zzz'"),
        (f"target={LONG}", "target must be at most"),
    ],
)
def test_a_bulk_page_refusing_a_filter_leaves_one_message_over_the_whole_list(
    admin_client: Client, query: str, says: str
) -> None:
    """A bad filter and a search too long said "Nothing was started: the jobs list has
    no filter …" and, under it, the list's "The list has no filter …": one problem
    twice. The list shows a filter it cannot apply as the whole list, which the bulk
    page now opens itself, its message the only one."""
    for action in ("requeue", "reject", "delete"):
        response = admin_client.get(f"{BULK}{action}/?{query}", follow=True)
        assert response.redirect_chain[-1][0] == f"{JOBS}?e=1"
        [message] = shown_messages(response)
        assert message.startswith("Nothing was started: ") and says in message, message
        posted = admin_client.post(f"{BULK}{action}/", {"_filter": query}, follow=True)
        [message] = shown_messages(posted)
        assert message.startswith("Nothing was started: ") and says in message, message
    assert not BulkOperation.objects.exists()


@pytest.mark.parametrize("url", SEARCHED_LISTS)
def test_a_search_as_long_as_the_limit_runs(admin_client: Client, url: str) -> None:
    response = admin_client.get(url, {"q": "x" * 500})
    assert response.status_code == 200
    assert shown_messages(response) == []


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (f"{JOBS}?p=99999", "p=99999. That page contains no results."),
        (f"{JOBS}?p=0", "p=0. That page number is less than 1."),
        ("/admin/jobstate/auditentry/?p=3", "p=3. That page contains no results."),
        # The same given again with Django's e=1 (forged), which was its "Database
        # error" page.
        (f"{JOBS}?p=99999&e=1", "p=99999. That page contains no results."),
        (f"{JOBS}?status=zzz&e=1", "Unknown status filter 'zzz'"),
        ("/admin/jobstate/auditentry/?p=3&e=1", "p=3. That page contains no results."),
    ],
)
def test_a_page_past_the_list_s_end_is_named_and_the_whole_list_shown(
    admin_client: Client, jobs: None, monkeypatch: pytest.MonkeyPatch, url: str, says: str
) -> None:
    """As Django's admin does, the whole list; and the message says why the page was
    left, not only that it was."""
    for model in (Job, AuditEntry):
        monkeypatch.setattr(admin.site._registry[model], "list_per_page", 1)
    AuditEntry.objects.create(event="rerun", request_id="first")
    AuditEntry.objects.create(event="rerun", request_id="second")
    response = _whole_list_shown(admin_client.get(url, follow=True), says)
    assert len(response.context["cl"].result_list) == 1


@pytest.mark.parametrize(
    "url",
    [
        "/admin/jobstate/worker/?state=live",
        "/admin/jobstate/worker/?state=",
        "/admin/jobstate/schedule/?state=paused",
        "/admin/jobstate/jobrun/?heartbeat=stale",
        "/admin/jobstate/runtimelock/?state=held",
        f"{JOBS}?p=1",
        f"{JOBS}?p=",
        f"{JOBS}?status__exact=error",
        "/admin/jobstate/auditentry/?severity__exact=error",
        "/admin/jobstate/bulkoperation/?state__exact=running",
        f"{JOBS}?status=error",
        "/admin/jobstate/jobrun/?status=RUNNING",
    ],
)
def test_the_values_a_list_offers_say_nothing(admin_client: Client, url: str) -> None:
    response = admin_client.get(url, follow=True)
    assert response.status_code == 200
    assert shown_messages(response) == []
    assert not response.redirect_chain


def hidden_fields(page: str) -> dict[str, str]:
    """The hidden fields of a confirmation page's form, as its submit posts them."""
    found = re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page)
    return {html.unescape(name): html.unescape(value) for name, value in found}


def store_jobs() -> list[Job]:
    return list(Job.objects.filter(target="mail"))


def run_bulk(client: Client, operation: Any) -> None:
    url = f"/admin/jobstate/job/bulk-operation/{operation.pk}/"
    while BulkOperation.objects.get(pk=operation.pk).state == "running":
        client.post(url, {"step": "1"})


def test_a_bulk_confirmation_sent_again_after_its_operation_ran_starts_nothing(
    admin_client: Client,
) -> None:
    store = DatabaseStateStore()
    for n in range(3):
        job = store.create_job(request_id=f"mail-{n}", target="mail")
        store.reject_queued_job(job.id, by="someone", reason="")
    form = hidden_fields(admin_client.get(f"{BULK}requeue/?target=mail").content.decode())
    assert "_filter" in form
    first = admin_client.post(f"{BULK}requeue/", form)
    (operation,) = BulkOperation.objects.all()
    assert first["Location"] == f"/admin/jobstate/job/bulk-operation/{operation.pk}/"
    run_bulk(admin_client, operation)
    # The back button and the same form again.
    again = admin_client.post(f"{BULK}requeue/", form, follow=True)
    assert BulkOperation.objects.count() == 1
    said = shown_messages(again)
    assert len(said) == 1, said
    assert "already ran" in said[0] and "already running" not in said[0], said
    assert f'href="/admin/jobstate/job/bulk-operation/{operation.pk}/"' in said[0], said
    # A page opened afresh starts a new operation over the same filter.
    for job in store_jobs():
        store.reject_queued_job(job.id, by="someone", reason="")
    form = hidden_fields(admin_client.get(f"{BULK}requeue/?target=mail").content.decode())
    fresh = admin_client.post(f"{BULK}requeue/", form)
    assert BulkOperation.objects.count() == 2
    assert (
        fresh["Location"]
        == f"/admin/jobstate/job/bulk-operation/{BulkOperation.objects.latest('pk').pk}/"
    )


def test_an_audit_event_wraps_between_its_words_not_inside_one(admin_client: Client) -> None:
    """At 1366 px the audit list broke "retry_scheduled" as "retry_sched/uled". Found
    by an outside pass."""
    AuditEntry.objects.create(event="retry_scheduled", request_id="first")
    listed = admin_client.get("/admin/jobstate/auditentry/").content.decode()
    assert "retry_<wbr>scheduled" in listed


#: Every console list (each a ScaledAdmin's changelist).
EVERY_LIST = [
    "job",
    "jobrun",
    "auditentry",
    "notification",
    "runtimelock",
    "worker",
    "schedule",
    "approvaldecision",
    "deliveryreplay",
    "bulkoperation",
]


@pytest.mark.parametrize("model", EVERY_LIST)
@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("p=abc&e=1", "p=abc. That page number is not an integer."),
        ("nonsense=1&e=1", "The list has no filter “nonsense”"),
    ],
)
def test_a_forged_error_flag_shows_the_whole_list_with_the_reason(
    admin_client: Client, jobs: None, model: str, query: str, says: str
) -> None:
    """``?e=1`` is the flag Django's admin adds when it sends a list's refused
    parameters back to the whole list; given again with parameters the list cannot
    apply, it answered "Database error: something's wrong with your database
    installation", which sends an operator after a database that is fine."""
    _whole_list_shown(admin_client.get(f"/admin/jobstate/{model}/?{query}", follow=True), says)
