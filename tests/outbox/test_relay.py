"""The relay and its channels against real receivers: a local HTTP server for webhooks,
Django's locmem mail backend and marked Python handlers (both backends).

The relay refuses to run inside a transaction, so these tests commit for real.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.core import mail
from django.db import connection, transaction
from django.utils import timezone

from jobstate.exceptions import TransactionNotAllowed
from jobstate.models import AuditEntry, DeliveryAttempt, Notification
from jobstate.outbox.channels import (
    ATTEMPT_HEADER,
    IDEMPOTENCY_HEADER,
    NOTIFICATION_HEADER,
    SIGNATURE_HEADER,
    WebhookChannel,
    notification_handler,
    sign_webhook,
    verify_webhook_signature,
    webhook_body,
)
from jobstate.outbox.relay import DeliveryReport, default_relay_id, deliver_notifications
from jobstate.stores.base import NotificationRequest, NotificationState
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.notification_outbox import LEASE_EXPIRED_ERROR
from tests.support.receiver import Receiver
from tests.support.tasks_kit import sleep_past

pytestmark = pytest.mark.django_db(transaction=True, available_apps=["jobstate"])

SECRET = "whsec-7f3a9c-never-show-me"


# --- a real webhook receiver ------------------------------------------------------------


@pytest.fixture
def store(store: DatabaseStateStore, settings: Any) -> DatabaseStateStore:
    """The shared store, with a signing key and a short webhook timeout."""
    jobstate(settings, WEBHOOK_SECRET=SECRET, WEBHOOK_TIMEOUT=timedelta(seconds=2))
    return store


def jobstate(settings: Any, **values: object) -> None:
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), **values}


def finish(
    store: DatabaseStateStore, *notifications: NotificationRequest, request_id: str = "r1"
) -> Any:
    store.create_job(request_id=request_id, target="llm")
    job = store.claim_next_inhub_job(["llm"], "worker-1")
    assert job is not None
    done = store.complete_job_with_notifications(job, {"status": "done"}, notifications)
    assert done is not None
    return done


def hook(url: str, payload: dict[str, Any] | None = None) -> NotificationRequest:
    return NotificationRequest("webhook", url, payload or {"event": "job.done", "n": 1})


def relay(store: DatabaseStateStore, **options: Any) -> DeliveryReport:
    return deliver_notifications(store=store, **options)


def make_due() -> None:
    Notification.objects.update(next_attempt_at=timezone.now() - timedelta(seconds=1))


# --- handlers the callable channel may call ---------------------------------------------

handled: list[tuple[str, str, bool]] = []


@notification_handler
def record_delivery(notification: Notification) -> None:
    handled.append(
        (notification.idempotency_key, notification.payload["text"], connection.in_atomic_block)
    )


#: How long :func:`slow_delivery` takes to send.
SLOW_SEND = 0.4


@notification_handler
def slow_delivery(notification: Notification) -> None:
    time.sleep(SLOW_SEND)
    handled.append((notification.idempotency_key, "slow", connection.in_atomic_block))


@notification_handler
def failing_delivery(notification: Notification) -> None:
    raise ValueError(f"receiver rejected it; key was {SECRET}")


def unmarked_delivery(notification: Notification) -> None:
    handled.append((notification.idempotency_key, "unmarked", False))


class BrokenChannel:
    def send(self, notification: Notification) -> None:
        raise RuntimeError("bug in a channel")


class LeakyChannel:
    def send(self, notification: Notification) -> None:
        raise RuntimeError(f"bug quoting {SECRET}")


@pytest.fixture(autouse=True)
def _clear_handled() -> Iterator[None]:
    handled.clear()
    yield
    handled.clear()


# --- crash safety ---------------------------------------------------------------------


def test_a_committed_completion_is_delivered_by_a_later_relay(
    store: DatabaseStateStore, receiver: Receiver
) -> None:
    # The process that finished the job "crashed" before any relay ran: the row waits.
    job = finish(store, hook(receiver.url("/hook"), {"event": "job.done", "job": "r1"}))
    assert receiver.requests == []
    report = relay(store, relay_id="relay-after-restart")
    assert report == DeliveryReport(relay_id="relay-after-restart", claimed=1, delivered=1)
    row = Notification.objects.get(job_id=job.id)
    assert row.state == NotificationState.DELIVERED and row.delivered_at is not None
    [request] = receiver.requests
    assert request["method"] == "POST"
    assert request["body"] == webhook_body(row.payload)
    assert json.loads(request["body"]) == {"event": "job.done", "job": "r1"}
    assert request["headers"]["Content-Type"] == "application/json"
    assert request["headers"][IDEMPOTENCY_HEADER] == row.idempotency_key
    assert request["headers"][NOTIFICATION_HEADER] == str(row.id)
    assert request["headers"][ATTEMPT_HEADER] == "1"
    assert verify_webhook_signature(SECRET, request["body"], request["headers"][SIGNATURE_HEADER])
    assert not verify_webhook_signature(
        "another-secret", request["body"], request["headers"][SIGNATURE_HEADER]
    )
    attempt = DeliveryAttempt.objects.get(notification=row)
    assert attempt.succeeded and attempt.relay_id == "relay-after-restart"
    assert attempt.started_at <= attempt.finished_at
    # Nothing is due any more: a second pass sends nothing.
    assert relay(store).claimed == 0
    assert len(receiver.requests) == 1


def test_a_relay_that_dies_after_claiming_loses_nothing(
    store: DatabaseStateStore, receiver: Receiver
) -> None:
    finish(store, hook(receiver.url("/hook")))
    # A lease a loaded machine cannot outrun between the claim and the next relay.
    held = store.notification_outbox.claim_due(
        relay_id="crashed", limit=10, lease=timedelta(seconds=2)
    )
    assert len(held) == 1
    assert relay(store).claimed == 0  # still leased to the dead relay
    [lease_until] = Notification.objects.values_list("lease_until", flat=True)
    sleep_past(lease_until)
    report = relay(store, relay_id="survivor")
    assert (report.claimed, report.delivered) == (1, 1)
    [request] = receiver.requests
    assert request["headers"][ATTEMPT_HEADER] == "2"
    history = list(DeliveryAttempt.objects.order_by("number"))
    assert [(a.number, a.relay_id, a.succeeded, a.error) for a in history] == [
        (1, "crashed", False, LEASE_EXPIRED_ERROR),
        (2, "survivor", True, None),
    ]


# --- webhook channel --------------------------------------------------------------------


@pytest.mark.parametrize("stamp", ["\u00b2", "9" * 5000, "-5", " 7", "\uff11\uff12"])
def test_a_malformed_timestamp_is_not_valid_and_never_an_error(stamp: str) -> None:
    """ "²" passed str.isdigit() and failed int(), as did 5,000 digits: one crafted header
    made a receiver written like the docs' example answer 500."""
    assert verify_webhook_signature(SECRET, b"{}", f"t={stamp},v1=abc") is False


@pytest.mark.parametrize("digest", ["\u00e9", "\ud800", "abc\u00ff"])
def test_a_signature_with_a_character_outside_ascii_is_not_valid_and_never_an_error(
    digest: str,
) -> None:
    """hmac.compare_digest refuses a str with a non-ASCII character (TypeError): a
    header with one and a current timestamp made the docs' receiver answer 500."""
    header = f"t={int(time.time())},v1={digest}"
    assert verify_webhook_signature(SECRET, b"{}", header) is False


def test_signature_verification_rejects_tampering_age_and_garbage() -> None:
    body = webhook_body({"a": 1})
    header = sign_webhook(SECRET, body, timestamp=1_700_000_000)
    assert header.startswith("t=1700000000,v1=")
    assert verify_webhook_signature(SECRET, body, header, now=1_700_000_100)
    assert verify_webhook_signature(SECRET.encode(), body, header, now=1_700_000_000)
    assert not verify_webhook_signature(SECRET, webhook_body({"a": 2}), header, now=1_700_000_000)
    assert not verify_webhook_signature("wrong", body, header, now=1_700_000_000)
    too_late = 1_700_000_000 + 301
    assert not verify_webhook_signature(SECRET, body, header, now=too_late)
    assert verify_webhook_signature(SECRET, body, header, timedelta(minutes=10), now=too_late)
    for garbage in [None, "", "v1=abc", "t=1700000000", "t=soon,v1=abc", header + ",t=1"]:
        assert not verify_webhook_signature(SECRET, body, garbage, now=1_700_000_000)
    # During a key rotation the sender may list several signatures; one match is enough.
    rotated = sign_webhook("old-secret", body, timestamp=1_700_000_000) + ",v1=" + "0" * 64
    assert verify_webhook_signature("old-secret", body, rotated, now=1_700_000_000)
    with pytest.raises(TypeError):
        verify_webhook_signature(SECRET, "text body", header)  # type: ignore[arg-type]


def test_a_redirect_to_another_host_is_refused(
    store: DatabaseStateStore, receiver: Receiver
) -> None:
    receiver.routes["/moved"] = ("redirect", 307, receiver.url("/hook", host="localhost"))
    finish(store, hook(receiver.url("/moved")))
    report = relay(store)
    assert (report.delivered, report.retrying) == (0, 1)
    assert receiver.posts_to("/hook") == []
    row = Notification.objects.get()
    assert row.state == NotificationState.PENDING
    assert row.last_error is not None and "another host" in row.last_error
    assert "localhost" in row.last_error and "/hook" not in row.last_error


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
def test_a_redirect_on_the_same_host_keeps_the_signed_post(
    store: DatabaseStateStore, receiver: Receiver, code: int
) -> None:
    receiver.routes["/old"] = ("redirect", code, "/new")
    finish(store, hook(receiver.url("/old"), {"k": "v"}))
    assert relay(store).delivered == 1
    [moved] = receiver.posts_to("/new")
    assert moved["method"] == "POST" and moved["body"] == webhook_body({"k": "v"})
    assert verify_webhook_signature(SECRET, moved["body"], moved["headers"][SIGNATURE_HEADER])
    assert moved["headers"][IDEMPOTENCY_HEADER] == Notification.objects.get().idempotency_key


def test_a_redirect_loop_fails_the_attempt(store: DatabaseStateStore, receiver: Receiver) -> None:
    receiver.routes["/loop"] = ("redirect", 307, "/loop")
    finish(store, hook(receiver.url("/loop")))
    assert relay(store).retrying == 1
    assert len(receiver.posts_to("/loop")) <= 5
    assert "HTTP 307" in (Notification.objects.get().last_error or "")


def test_a_timeout_is_a_failed_attempt(
    store: DatabaseStateStore, receiver: Receiver, settings: Any
) -> None:
    jobstate(settings, WEBHOOK_TIMEOUT=timedelta(milliseconds=100))
    receiver.routes["/slow"] = ("sleep", 0.6)
    finish(store, hook(receiver.url("/slow")))
    started = time.monotonic()
    report = relay(store)
    assert time.monotonic() - started < 0.5
    assert (report.delivered, report.retrying) == (0, 1)
    row = Notification.objects.get()
    assert row.state == NotificationState.PENDING and row.next_attempt_at > timezone.now()
    attempt = DeliveryAttempt.objects.get()
    assert not attempt.succeeded
    assert attempt.error == "127.0.0.1 did not answer within 0.1s."


@pytest.mark.parametrize(("status", "text"), [(500, "HTTP 500"), (404, "HTTP 404"), (410, "410")])
def test_an_error_status_is_a_failed_attempt(
    store: DatabaseStateStore, receiver: Receiver, status: int, text: str
) -> None:
    receiver.routes["/hook"] = status
    finish(store, hook(receiver.url("/hook")))
    assert relay(store).retrying == 1
    assert text in (Notification.objects.get().last_error or "")


def test_an_unreachable_receiver_and_a_bad_url_fail_the_attempt(store: DatabaseStateStore) -> None:
    finish(store, hook("http://127.0.0.1:9/nothing-listens"), hook("ftp://example.com/x"))
    report = relay(store)
    assert report.retrying == 2
    errors = sorted(row.last_error or "" for row in Notification.objects.all())
    assert errors[0].startswith("could not reach 127.0.0.1")
    assert errors[1] == "the destination is not an http(s) URL with a host."


def test_webhooks_are_not_sent_unsigned(
    store: DatabaseStateStore, receiver: Receiver, settings: Any
) -> None:
    jobstate(settings, WEBHOOK_SECRET=None)
    finish(store, hook(receiver.url("/hook")))
    assert relay(store).retrying == 1
    assert receiver.requests == []
    assert "WEBHOOK_SECRET" in (Notification.objects.get().last_error or "")


def test_failed_webhooks_dead_letter_after_the_last_attempt(
    store: DatabaseStateStore, receiver: Receiver, settings: Any
) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=2)
    receiver.routes["/hook"] = 503
    job = finish(store, hook(receiver.url("/hook")))
    assert relay(store).retrying == 1
    make_due()
    report = relay(store)
    assert (report.claimed, report.dead) == (1, 1)
    row = Notification.objects.get()
    assert row.state == NotificationState.DEAD and row.attempts == 2
    assert len(receiver.requests) == 2
    assert [r["headers"][ATTEMPT_HEADER] for r in receiver.requests] == ["1", "2"]
    # Every attempt carried the same idempotency key.
    assert {r["headers"][IDEMPOTENCY_HEADER] for r in receiver.requests} == {row.idempotency_key}
    audit = AuditEntry.objects.get(event="delivery_error")
    assert audit.job_id == job.id and "HTTP 503" in audit.detail["error"]
    make_due()
    assert relay(store).claimed == 0


def test_the_signing_secret_never_leaks(
    store: DatabaseStateStore, receiver: Receiver, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=1, WEBHOOK_TIMEOUT=timedelta(milliseconds=100))
    receiver.routes.update(
        {
            "/error": 500,
            "/slow": ("sleep", 0.4),
            "/away": ("redirect", 302, receiver.url("/x", host="localhost")),
        }
    )
    finish(
        store,
        hook(receiver.url("/error")),
        hook(receiver.url("/slow")),
        hook(receiver.url("/away")),
        hook(receiver.url("/fine")),
        NotificationRequest("callable", "tests.outbox.test_relay.failing_delivery", {}),
    )
    caplog.set_level(logging.DEBUG, logger="jobstate")
    report = relay(store)
    assert (report.delivered, report.dead) == (1, 4)
    assert SECRET not in repr(WebhookChannel())
    # The handler's own message quoted the secret; the relay masked it.
    assert "[redacted]" in (Notification.objects.get(channel="callable").last_error or "")
    stored = [
        *Notification.objects.values_list("last_error", flat=True),
        *DeliveryAttempt.objects.values_list("error", flat=True),
        *(json.dumps([a.title, a.summary, a.detail]) for a in AuditEntry.objects.all()),
    ]
    assert all(SECRET not in (text or "") for text in stored)
    assert SECRET not in caplog.text
    assert "dead after 1 attempts" in caplog.text
    for request in receiver.requests:
        assert SECRET not in json.dumps(request["headers"])


# --- e-mail and callable channels -------------------------------------------------------


def test_the_email_channel_sends_one_stable_message(
    store: DatabaseStateStore, settings: Any
) -> None:
    settings.DEFAULT_FROM_EMAIL = "jobs@example.com"
    finish(
        store,
        NotificationRequest(
            "email",
            "ops@example.com, oncall@example.com",
            {"subject": "Job r1 done", "body": "It finished.", "html_body": "<p>It finished.</p>"},
        ),
    )
    assert relay(store).delivered == 1
    [message] = mail.outbox
    row = Notification.objects.get()
    assert message.subject == "Job r1 done" and message.body == "It finished."
    assert message.to == ["ops@example.com", "oncall@example.com"]
    assert message.from_email == "jobs@example.com"
    assert message.alternatives[0][0] == "<p>It finished.</p>"  # type: ignore[attr-defined]
    headers = message.message()
    assert headers["X-Jobstate-Idempotency-Key"] == row.idempotency_key
    message_id = headers["Message-ID"]
    assert message_id.startswith("<") and ".jobstate@" in message_id
    # A resend of the same notification is the same message to mail servers.
    Notification.objects.update(state=NotificationState.PENDING)
    make_due()
    relay(store)
    assert mail.outbox[1].message()["Message-ID"] == message_id


def test_an_email_without_subject_or_body_fails(store: DatabaseStateStore) -> None:
    finish(store, NotificationRequest("email", "ops@example.com", {"text": "hi"}))
    assert relay(store).retrying == 1
    assert mail.outbox == []
    assert "'subject' and 'body'" in (Notification.objects.get().last_error or "")


def test_the_callable_channel_calls_marked_handlers_outside_a_transaction(
    store: DatabaseStateStore,
) -> None:
    finish(
        store,
        NotificationRequest(
            "callable", "tests.outbox.test_relay.record_delivery", {"text": "hello"}
        ),
    )
    assert relay(store).delivered == 1
    row = Notification.objects.get()
    # in_atomic_block is False: no transaction was open while the handler ran.
    assert handled == [(row.idempotency_key, "hello", False)]


@pytest.mark.parametrize(
    ("destination", "error"),
    [
        ("tests.outbox.test_relay.unmarked_delivery", "is not marked with @jobstate"),
        ("tests.outbox.test_relay.no_such_function", "cannot import"),
        ("tests.outbox.test_relay.failing_delivery", "raised ValueError: receiver rejected it"),
    ],
)
def test_the_callable_channel_fails_what_it_cannot_call(
    store: DatabaseStateStore, destination: str, error: str
) -> None:
    finish(store, NotificationRequest("callable", destination, {"text": "x"}))
    assert relay(store).retrying == 1
    assert handled == []
    assert error in (Notification.objects.get().last_error or "")


# --- the relay itself -------------------------------------------------------------------


def test_the_relay_refuses_to_run_inside_a_transaction(store: DatabaseStateStore) -> None:
    finish(
        store,
        NotificationRequest("callable", "tests.outbox.test_relay.record_delivery", {"text": "x"}),
    )
    with transaction.atomic(), pytest.raises(TransactionNotAllowed):
        relay(store)
    assert Notification.objects.get().state == NotificationState.PENDING
    assert handled == []


def test_a_broken_channel_does_not_strand_the_batch(
    store: DatabaseStateStore, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    jobstate(
        settings,
        CHANNELS={
            "broken": "tests.outbox.test_relay.BrokenChannel",
            "missing": "tests.outbox.test_relay.NoSuchChannel",
            "callable": "jobstate.outbox.channels.CallableChannel",
        },
    )
    finish(
        store,
        NotificationRequest("broken", "anywhere", {}),
        NotificationRequest("missing", "anywhere", {}),
        NotificationRequest("callable", "tests.outbox.test_relay.record_delivery", {"text": "x"}),
    )
    report = relay(store)
    assert (report.claimed, report.delivered, report.retrying) == (3, 1, 2)
    errors = dict(Notification.objects.values_list("channel", "last_error"))
    assert errors["broken"] == "RuntimeError: bug in a channel"
    assert errors["missing"] is not None and "cannot import channel 'missing'" in errors["missing"]
    assert "Traceback" in caplog.text and "bug in a channel" in caplog.text
    # A channel removed from the settings fails its rows the same way.
    jobstate(settings, CHANNELS={"callable": "jobstate.outbox.channels.CallableChannel"})
    make_due()
    relay(store)
    errors = dict(Notification.objects.values_list("channel", "last_error"))
    assert errors["broken"] == "no channel named 'broken' in JOBSTATE['CHANNELS']."


@pytest.mark.slow
def test_a_pass_stops_sending_when_half_the_lease_is_spent(store: DatabaseStateStore) -> None:
    for n in range(3):
        finish(
            store,
            NotificationRequest("callable", "tests.outbox.test_relay.slow_delivery", {}),
            request_id=f"r{n}",
        )
    # Half of the lease is 1.9 sends: the first send starts another, the second does not
    # (its sleeps alone pass half the lease), with 0.9 of a send to spare for a machine
    # so busy that the first send's own work takes that long.
    report = relay(store, lease=timedelta(seconds=3.8 * SLOW_SEND))
    assert (report.claimed, report.delivered, report.unsent) == (3, 2, 1)
    assert len(handled) == 2
    left = Notification.objects.get(state=NotificationState.DELIVERING)
    assert left.lease_until is not None
    sleep_past(left.lease_until)
    later = relay(store, lease=timedelta(seconds=5))
    assert (later.claimed, later.delivered) == (1, 1)
    left.refresh_from_db()
    assert left.state == NotificationState.DELIVERED and left.attempts == 2


def test_relay_arguments_are_checked(store: DatabaseStateStore) -> None:
    finish(
        store,
        NotificationRequest("callable", "tests.outbox.test_relay.record_delivery", {"text": "x"}),
    )
    for bad in [{"limit": 0}, {"lease": timedelta(0)}, {"relay_id": ""}]:
        with pytest.raises(ValueError):
            relay(store, **bad)
    assert Notification.objects.get().state == NotificationState.PENDING
    assert default_relay_id() != default_relay_id()
    assert len(default_relay_id()) <= 200


def test_a_crashing_channel_that_quotes_the_key_is_logged_masked(
    store: DatabaseStateStore, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    jobstate(settings, CHANNELS={"leaky": "tests.outbox.test_relay.LeakyChannel"})
    finish(store, NotificationRequest("leaky", "anywhere", {}))
    caplog.set_level(logging.DEBUG)

    assert relay(store).retrying == 1

    assert "Traceback" in caplog.text and "bug quoting [redacted]" in caplog.text
    assert SECRET not in caplog.text
    assert SECRET not in (Notification.objects.get().last_error or "")
