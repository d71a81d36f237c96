"""Secrets stay secret: the webhook signing key never shows in the admin, the logs, the
audit ledger, the delivery history, error texts, metrics or error reports; payload
members under ``JOBSTATE['ADMIN_REDACTED_KEYS']`` are hidden on every admin page that
shows payloads, and their values are masked where a page's text quotes them.

The relay runs for real against a local HTTP receiver (it refuses to run inside a
transaction, so these tests commit).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.admin.utils import quote
from django.contrib.auth.models import Permission
from django.test import Client
from django.views.debug import ExceptionReporter

from jobstate.models import (
    ApprovalDecision,
    AuditEntry,
    DeliveryAttempt,
    Job,
    JobRun,
    Notification,
)
from jobstate.outbox.channels import (
    SIGNATURE_HEADER,
    notification_handler,
    sign_webhook,
    verify_webhook_signature,
)
from jobstate.outbox.relay import deliver_notifications
from jobstate.stores.base import NotificationRequest, Trigger
from jobstate.stores.database import DatabaseJobRunStore, DatabaseStateStore
from jobstate.testing.factories import NotificationFactory
from tests.support.receiver import Receiver

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "whsec-S3CR3T-4e1d-never-on-a-page"

#: A payload whose members under the default redacted keys (nested, in mixed case)
#: must never be shown, beside one that must.
HIDDEN = ("ak-live-4711", "pw-hunter-2", "tk-0815-xyz", "bearer-abc-123")
PAYLOAD = {
    "event": "job.done",
    "note": "kept-visible",
    "Customer": {
        "API_Key": HIDDEN[0],
        "cards": [{"PassWord": HIDDEN[1], "last4": "4242"}],
    },
    "Token": HIDDEN[2],
    "headers": {"Authorization": HIDDEN[3]},
}


@pytest.fixture
def store(store: DatabaseStateStore, settings: Any) -> DatabaseStateStore:
    """The shared store, with a signing key and one delivery attempt."""
    settings.JOBSTATE = {
        "WEBHOOK_SECRET": SECRET,
        "WEBHOOK_TIMEOUT": timedelta(seconds=5),
        "OUTBOX_MAX_ATTEMPTS": 1,
    }
    return store


@notification_handler
def quoting_handler(notification: Notification) -> None:
    """A receiver that fails quoting what it was given: the signing key and a token."""
    raise ValueError(f"refused key {SECRET} and token {notification.payload['Token']}")


def finish(
    store: DatabaseStateStore, request_id: str, *notifications: NotificationRequest, **job: Any
) -> Job:
    store.create_job(request_id=request_id, target="llm", **job)
    claimed = store.claim_next_inhub_job(["llm"], "worker-1")
    assert claimed is not None
    done = store.complete_job_with_notifications(
        claimed, {"status": "done", "result": PAYLOAD}, list(notifications)
    )
    assert done is not None
    return done


def admin_pages(client: Client) -> dict[str, str]:
    """Every admin page of jobstate: the index pages, each list, the Overview page and
    the page of every row there is."""
    urls = ["/admin/", "/admin/jobstate/", "/admin/jobstate/job/overview/"]
    rows = {
        "job": Job.objects.values_list("pk", flat=True),
        "jobrun": JobRun.objects.values_list("pk", flat=True),
        "auditentry": AuditEntry.objects.values_list("pk", flat=True),
        "notification": Notification.objects.values_list("pk", flat=True),
        "approvaldecision": ApprovalDecision.objects.values_list("pk", flat=True),
        "runtimelock": [],
        "deliveryreplay": [],
    }
    for name, pks in rows.items():
        urls.append(f"/admin/jobstate/{name}/")
        urls.extend(f"/admin/jobstate/{name}/{quote(str(pk))}/change/" for pk in pks)
    pages = {}
    for url in urls:
        response = client.get(url)
        assert response.status_code == 200, url
        pages[url] = response.content.decode()
    return pages


def stored_texts() -> list[str]:
    """Every text jobstate keeps about deliveries, jobs and the audit trail."""
    return [
        *(text or "" for text in Notification.objects.values_list("last_error", flat=True)),
        *(text or "" for text in DeliveryAttempt.objects.values_list("error", flat=True)),
        *(text or "" for text in Job.objects.values_list("error", flat=True)),
        *(json.dumps([e.title, e.summary, e.detail]) for e in AuditEntry.objects.all()),
    ]


# --- the webhook signing key ------------------------------------------------------------


def test_the_signing_key_shows_nowhere_after_deliveries_that_fail_and_succeed(
    store: DatabaseStateStore,
    receiver: Receiver,
    admin_client: Client,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # every logger
    finish(
        store,
        "r1",
        NotificationRequest("webhook", receiver.url("/fine"), PAYLOAD),
        NotificationRequest("webhook", receiver.url("/error"), PAYLOAD),
        NotificationRequest("webhook", receiver.url("/away"), PAYLOAD),
        NotificationRequest("webhook", "http://127.0.0.1:9/closed", PAYLOAD),
        NotificationRequest(
            "callable", "tests.security.test_security_secrets.quoting_handler", PAYLOAD
        ),
    )
    report = deliver_notifications(store=store)
    assert (report.delivered, report.dead) == (1, 4)
    # The key was really used: the receiver can verify what it got with it.
    delivered = receiver.posts_to("/fine")[0]
    assert verify_webhook_signature(
        SECRET, delivered["body"], delivered["headers"][SIGNATURE_HEADER]
    )

    assert SECRET not in caplog.text
    assert "dead after 1 attempts" in caplog.text  # the failures were logged
    assert all(SECRET not in text for text in stored_texts())
    for request in receiver.requests:
        assert SECRET not in json.dumps(request["headers"]) + request["body"].decode()
    for url, page in admin_pages(admin_client).items():
        assert SECRET not in page, url
    metrics = Client().get("/metrics").content.decode()
    ready = Client().get("/health/ready").content.decode()
    assert "jobstate_jobs" in metrics and SECRET not in metrics + ready


def test_the_admin_masks_the_key_wherever_a_row_quotes_it(
    store: DatabaseStateStore, admin_client: Client
) -> None:
    """Text jobstate did not write (a worker's error, a host's audit entry, a receiver's
    answer) can still hold the key; the pages mask it."""
    job = store.create_job(
        request_id="leaky",
        target="llm",
        input_preview=f"signing with {SECRET}",
        input={"hint": f"key={SECRET}"},
    )
    store.update_job(job.id, error=f"Traceback ...\nValueError: bad key {SECRET}")
    store.append_audit(
        job=job, event="custom", title=f"saw {SECRET}", summary=f"key {SECRET}", detail={}
    )
    store.append_audit(job=job, event="custom", detail={"key_used": SECRET})
    notification = NotificationFactory(
        dead=True,
        job=job,
        channel="webhook",
        destination="https://hooks.example/in",
        payload={"echo": SECRET},
        idempotency_key="leaky-1",
        attempts=1,
        last_error=f"receiver said: {SECRET}",
    )
    DeliveryAttempt.objects.create(
        notification=notification,
        number=1,
        relay_id="relay-1",
        started_at=datetime.now(UTC),
        succeeded=False,
        error=f"echoed {SECRET}",
    )
    ApprovalDecision.objects.create(decision_id="d-1", job=job, approver="ada", comment=SECRET)
    runs = DatabaseJobRunStore()
    run_id = runs.claim(
        job_key="billing.close-day",
        overlap_key="k",
        trigger=Trigger("CLI", "ops"),
        input={"key": SECRET},
        started_at=datetime.now(UTC),
    )
    assert run_id is not None
    JobRun.objects.filter(id=run_id).update(error=f"failed with {SECRET}")
    pages = admin_pages(admin_client)
    for url, page in pages.items():
        at = page.find(SECRET)
        assert at < 0, (url, page[at - 300 : at + 50])
    job_page = pages[f"/admin/jobstate/job/{job.id}/change/"]
    assert "bad key ••••" in job_page and "receiver said: ••••" in job_page
    assert "echoed ••••" in job_page and "signing with ••••" in job_page


def test_error_reports_of_a_crash_while_signing_or_verifying_hide_the_key(
    settings: Any,
) -> None:
    """A receiver's view that calls the verification wrongly crashes; the report
    Django mails to ADMINS (or a tracker records) lists the frames' variables."""
    settings.DEBUG = False
    settings.JOBSTATE = {"WEBHOOK_SECRET": SECRET}
    crashes = [
        lambda: verify_webhook_signature(SECRET, "a str, not bytes", "t=1,v1=00"),  # type: ignore[arg-type]
        lambda: sign_webhook(SECRET, "a str, not bytes"),  # type: ignore[arg-type]
        lambda: sign_webhook(SECRET.encode(), None),  # type: ignore[arg-type]
    ]
    for crash in crashes:
        with pytest.raises(TypeError) as raised:
            crash()
        reporter = ExceptionReporter(None, raised.type, raised.value, raised.tb)
        html, text = reporter.get_traceback_html(), reporter.get_traceback_text()
        frames = reporter.get_traceback_data()["frames"]
        shown = {name: value for frame in frames for name, value in frame["vars"]}
        assert "secret" in shown and SECRET not in shown["secret"]
        assert SECRET not in html and SECRET not in text


# --- payload members under redacted keys ---------------------------------------------------


@notification_handler
def echoing_handler(notification: Notification) -> None:
    """A receiver that fails quoting the payload's token back."""
    raise ValueError(f"token {notification.payload['Token']} is not valid here")


def test_redacted_members_are_hidden_on_every_page_that_shows_payloads(
    store: DatabaseStateStore, admin_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    job = finish(
        store,
        "order-7",
        NotificationRequest(
            "callable", "tests.security.test_security_secrets.echoing_handler", PAYLOAD
        ),
        input=PAYLOAD,
        metadata={"route": "ops", "nested": PAYLOAD},
    )
    store.update_job(job.id, report=PAYLOAD, usage={"calls": [PAYLOAD]})
    # The host's audit entries: one left to the default summary, one quoting a value.
    store.append_audit(job=job, event="tool_result", detail=PAYLOAD)
    store.append_audit(job=job, event="tool_result", summary=f"used {HIDDEN[2]}", detail=PAYLOAD)
    runs = DatabaseJobRunStore()
    run_id = runs.claim(
        job_key="billing.close-day",
        overlap_key="k",
        trigger=Trigger("CLI", "ops"),
        input=PAYLOAD,
        started_at=datetime.now(UTC),
    )
    assert run_id is not None
    assert runs.complete(
        run_id=run_id,
        status="SUCCEEDED",
        finished_at=datetime.now(UTC),
        duration_ms=10,
        summary={"ok": True, "echo": PAYLOAD},
    )
    # The relay's failure quotes the token into the attempt, the row and the audit.
    assert deliver_notifications(store=store).dead == 1
    assert any(HIDDEN[2] in text for text in stored_texts())

    pages = admin_pages(admin_client)
    for url, page in pages.items():
        for value in HIDDEN:
            assert value not in page, (url, value)
    job_page = pages[f"/admin/jobstate/job/{job.id}/change/"]
    assert "kept-visible" in job_page and "4242" in job_page
    assert "&quot;Token&quot;: &quot;••••&quot;" in job_page
    assert "&quot;API_Key&quot;: &quot;••••&quot;" in job_page
    assert "&quot;PassWord&quot;: &quot;••••&quot;" in job_page
    assert "token •••• is not valid here" in job_page  # the attempt's error
    audit_list = pages["/admin/jobstate/auditentry/"]
    assert "Token: ••••" in audit_list and "used ••••" in audit_list


def test_a_redacted_value_never_shows_through_the_summary_built_from_it(
    store: DatabaseStateStore, admin_client: Client
) -> None:
    """The default summary joins ``key: value`` pairs with " · "; a value holding that
    separator must not leave its tail on the page. (A job's page shows the entry's data
    as ``key: value`` lines instead of that summary, redacted the same way.)"""
    job = store.create_job(request_id="r1", target="mail")
    entry = store.append_audit(
        job=job, event="tool_result", detail={"token": "abc · def-tail-9", "code": 503}
    )
    assert entry.summary == "token: abc · def-tail-9 · code: 503"
    for url in (
        "/admin/jobstate/auditentry/",
        f"/admin/jobstate/auditentry/{entry.id}/change/",
        f"/admin/jobstate/job/{job.id}/change/",
    ):
        page = admin_client.get(url).content.decode()
        assert "def-tail-9" not in page and "abc · " not in page, url
        if "/job/" in url:
            assert "<dt>token</dt><dd>••••</dd>" in page and "<dt>code</dt><dd>503</dd>" in page
        else:
            assert "token: •••• · code: 503" in page, url


def test_a_redacted_value_cut_by_the_summary_limit_does_not_show_its_head(
    store: DatabaseStateStore, admin_client: Client
) -> None:
    job = store.create_job(request_id="r1", target="mail")
    entry = store.append_audit(
        job=job, event="tool_result", detail={"filler": "x" * 470, "token": "tok-abcdefgh-long"}
    )
    assert entry.summary.endswith(" · token: tok-abcdefgh")  # cut at 500 characters
    page = admin_client.get(f"/admin/jobstate/auditentry/{entry.id}/change/").content.decode()
    assert "tok-abcd" not in page and "token: ••••" in page


def test_short_values_are_hidden_in_json_but_left_in_text(
    store: DatabaseStateStore, admin_client: Client
) -> None:
    """A one- to three-character value is not searched for in text (it would garble
    it); the member itself is still hidden."""
    job = store.create_job(request_id="r1", target="mail", input={"pin": "ok", "token": "ok"})
    store.update_job(job.id, error="all ok")
    page = admin_client.get(f"/admin/jobstate/job/{job.id}/change/").content.decode()
    assert "&quot;token&quot;: &quot;••••&quot;" in page
    assert "&quot;pin&quot;: &quot;ok&quot;" in page and "all ok" in page


@pytest.mark.parametrize(
    ("path", "lookup"),
    [
        ("job", "input__Token__startswith=tk-0815"),
        ("job", "claim_token__isnull=false"),
        ("job", "error__regex=."),
        ("auditentry", "detail__Token__startswith=tk"),
        ("notification", "payload__Token__startswith=tk-0815"),
    ],
)
def test_a_list_takes_no_lookup_but_its_own_filters(
    django_user_model: Any, path: str, lookup: str
) -> None:
    """Django's admin takes any lookup on a field in a list's URL: a user who may only
    view would spell out a redacted value a character at a time from the counts."""
    store = DatabaseStateStore()
    job = store.create_job(request_id="secret-job", target="t", input=PAYLOAD, error="boom")
    store.append_audit(job=job, event="note", detail=PAYLOAD)
    Notification.objects.create(
        job=job, channel="webhook", destination="https://example.com/", payload=PAYLOAD
    )
    viewer = django_user_model.objects.create_user("viewer", is_staff=True)
    for codename in ("view_job", "view_auditentry", "view_notification"):
        viewer.user_permissions.add(Permission.objects.get(codename=codename))
    client = Client()
    client.force_login(viewer)
    response = client.get(f"/admin/jobstate/{path}/?{lookup}", follow=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == f"/admin/jobstate/{path}/?e=1"
    said = [str(message) for message in response.context["messages"]]
    name = lookup.split("=", 1)[0]
    assert any(f"The list has no filter “{name}”" in message for message in said), said
