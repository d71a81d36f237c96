"""A right-to-left override (U+202E) in a name reversed the console's own text after it
where the page's stylesheet does not reach: the messages above the content, the queue
pause confirmation's sentence, the page's title. Each name is isolated there (U+2068 …
U+2069), so the sentence around it reads as written. Found by an outside pass."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import act, shown_messages

pytestmark = [pytest.mark.django_db]

OVERRIDE = "\u202e"
FSI, PDI = "\u2068", "\u2069"
JOBS = "/admin/jobstate/job/"


def test_a_skipped_job_s_name_is_isolated_in_the_message(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    job = store.create_job(request_id=f"{OVERRIDE}abc.exe", target="mail")
    plain = store.create_job(request_id="plain-1", target="mail")
    response = act(admin_client, JOBS, "discard_jobs", [job.id, plain.id], confirm=True)
    [message] = shown_messages(response)
    assert f"; {FSI}{OVERRIDE}abc.exe{PDI} (not a task)." in message


def test_the_job_page_title_isolates_the_request_id(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    job = store.create_job(request_id=f"{OVERRIDE}abc.exe", target="mail")
    page = admin_client.get(f"{JOBS}{job.id}/change/")
    assert page.context["title"] == f"{FSI}{OVERRIDE}abc.exe{PDI}"


def test_the_queue_pause_confirmation_and_message_isolate_the_queue(
    admin_client: Client, settings: Any
) -> None:
    url = "/admin/jobstate/queuepause/pause/"
    query = {"target": "tasks:default", "queue": f"q{OVERRIDE}evil"}
    page = admin_client.get(url, query).content.decode()
    assert f"Pause tasks:default / {FSI}q{OVERRIDE}evil{PDI}: once you confirm" in page
    response = admin_client.post(url, {**query, "post": "yes"}, follow=True)
    assert f"Paused tasks:default / {FSI}q{OVERRIDE}evil{PDI}." in shown_messages(response)


def test_an_override_in_an_audit_value_reverses_none_of_the_pairs_after_it(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """A reject reason ending the pair with an override reversed the rest of the audit
    summary ("reason: :yb devorppa … · prev_status" read backwards) in the audit
    list."""
    job = store.create_job(request_id="to-cancel", target="mail")
    assert store.cancel_job(job.id, by="admin", reason=f"{OVERRIDE}approved by: lead")
    listed = admin_client.get("/admin/jobstate/auditentry/").content.decode()
    assert f"{FSI}reason: {OVERRIDE}approved by: lead{PDI} · prev_status: queued" in listed
