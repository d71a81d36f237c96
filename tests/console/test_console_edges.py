"""Edges an operator meets: a filter value too long for any job (refused, nothing
written), long values repeated in messages only in part, a filter value no list offers
named rather than ignored (and the whole list shown), and a bulk confirmation sent again
after its operation ran."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from django.test import Client

from jobstate.models import AuditEntry, BulkOperation
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
    ],
)
def test_a_filter_value_or_page_no_list_offers_is_named_and_the_whole_list_shown(
    admin_client: Client, jobs: None, url: str, says: str
) -> None:
    AuditEntry.objects.create(event="rerun", request_id="first")
    response = admin_client.get(url, follow=True)
    assert response.status_code == 200
    [message] = shown_messages(response)
    assert says in message and "The whole list is shown" in message, message
    assert response.request["QUERY_STRING"] == "e=1"


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
    ],
)
def test_the_values_a_list_offers_say_nothing(admin_client: Client, url: str) -> None:
    response = admin_client.get(url, follow=True)
    assert response.status_code == 200
    assert shown_messages(response) == []
    assert not response.redirect_chain
