"""The transactional outbox: completion with notifications, claiming, settling, backoff,
dead letters and one-time replay (both backends)."""

from __future__ import annotations

import random
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from jobstate.exceptions import (
    DuplicateNotification,
    InvalidJobState,
    InvalidNotification,
    InvalidPatch,
    InvalidPayload,
)
from jobstate.models import AuditEntry, DeliveryAttempt, DeliveryReplay, Job, Notification
from jobstate.stores.base import (
    DeliveryRequeueOutcome,
    JobStatus,
    NotificationRequest,
    NotificationState,
)
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.notification_outbox import (
    LEASE_EXPIRED_ERROR,
    DatabaseNotificationOutbox,
    backoff_delay,
    default_idempotency_key,
)
from tests.support.tasks_kit import sleep_past

pytestmark = pytest.mark.django_db

HOOK = "https://hooks.example.com/jobs"


@pytest.fixture
def outbox(store: DatabaseStateStore) -> DatabaseNotificationOutbox:
    return store.notification_outbox


def jobstate(settings: Any, **values: object) -> None:
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), **values}


def claimed_job(store: DatabaseStateStore, request_id: str = "r1") -> Job:
    store.create_job(request_id=request_id, target="llm")
    job = store.claim_next_inhub_job(["llm"], "worker-1")
    assert job is not None and job.claim_token is not None
    return job


def webhook(payload: dict[str, Any] | None = None, **extra: Any) -> NotificationRequest:
    return NotificationRequest(
        channel="webhook", destination=HOOK, payload=payload or {"ok": True}, **extra
    )


def pending_row(store: DatabaseStateStore, request_id: str = "r1", **extra: Any) -> Notification:
    job = store.complete_job_with_notifications(
        claimed_job(store, request_id), {"status": "done"}, [webhook(**extra)]
    )
    assert job is not None
    return Notification.objects.get(job=job)


def make_due(row: Notification) -> None:
    Notification.objects.filter(id=row.id).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )


# --- complete_job_with_notifications --------------------------------------------------


def test_completion_writes_transition_audit_and_outbox_rows_together(
    store: DatabaseStateStore,
) -> None:
    original = claimed_job(store)
    job = store.complete_job_with_notifications(
        original,
        {"status": "done", "result": {"answer": 42}},
        [
            webhook({"job": "r1"}),
            NotificationRequest(
                channel="email",
                destination="ops@example.com",
                payload={"subject": "done", "body": "r1 finished"},
                idempotency_key="r1-mail",
            ),
        ],
    )
    assert job is not None
    assert job.status == JobStatus.DONE and job.result == {"answer": 42}
    assert (job.claim_token, job.executor_id, job.claimed_at, job.lease_until) == (
        None,
        None,
        None,
        None,
    )
    rows = {row.channel: row for row in Notification.objects.filter(job=job)}
    assert set(rows) == {"webhook", "email"}
    assert rows["webhook"].idempotency_key == f"{job.id}:{original.claim_token}:webhook:{HOOK}"
    assert rows["webhook"].payload == {"job": "r1"}
    assert rows["email"].idempotency_key == "r1-mail"
    for row in rows.values():
        assert row.state == NotificationState.PENDING and row.attempts == 0
        assert row.next_attempt_at <= timezone.now()
    finished = AuditEntry.objects.get(job_id=job.id, event="finished")
    assert finished.detail == {"status": "done", "previous_status": "running", "notifications": 2}


def test_completion_without_notifications_still_audits(store: DatabaseStateStore) -> None:
    job = store.complete_job_with_notifications(claimed_job(store), {"status": "error"})
    assert job is not None and job.status == JobStatus.ERROR
    assert not Notification.objects.exists()
    assert AuditEntry.objects.get(event="finished").severity == "error"


def test_a_stale_original_writes_nothing(store: DatabaseStateStore) -> None:
    original = claimed_job(store)
    # Another worker finished it first.
    assert store.complete_claimed_job(original.id, original.claim_token, "error").completed
    assert store.complete_job_with_notifications(original, {"status": "done"}, [webhook()]) is None
    assert Job.objects.get(id=original.id).status == JobStatus.ERROR
    assert not Notification.objects.exists()
    assert not AuditEntry.objects.filter(event="finished").exists()


def test_a_reclaimed_job_is_not_finished_with_the_old_claim(store: DatabaseStateStore) -> None:
    original = claimed_job(store)
    store.complete_claimed_job(original.id, original.claim_token, "queued")
    again = store.claim_next_inhub_job(["llm"], "worker-2")
    assert again is not None and again.status == original.status == JobStatus.RUNNING
    assert store.complete_job_with_notifications(original, {"status": "done"}, [webhook()]) is None
    assert Job.objects.get(id=original.id).claim_token == again.claim_token
    assert not Notification.objects.exists()


def test_an_unclaimed_original_matches_its_missing_token(store: DatabaseStateStore) -> None:
    queued = store.create_job(request_id="q1", target="llm")
    assert queued.claim_token is None
    job = store.complete_job_with_notifications(
        queued, {"status": "rejected", "error": "kill switch"}, [webhook()]
    )
    assert job is not None and job.status == JobStatus.REJECTED
    assert Notification.objects.filter(job=job).count() == 1

    other = store.create_job(request_id="q2", target="llm")
    store.claim_next_inhub_job(["llm"], "worker-1")  # claimed after `other` was read
    assert store.complete_job_with_notifications(other, {"status": "rejected"}) is None
    assert Job.objects.get(id=other.id).status == JobStatus.RUNNING


def test_an_original_already_terminal_is_settled(store: DatabaseStateStore) -> None:
    job = store.complete_job_with_notifications(claimed_job(store), {"status": "done"})
    assert job is not None
    assert store.complete_job_with_notifications(job, {"status": "error"}, [webhook()]) is None
    assert Job.objects.get(id=job.id).status == JobStatus.DONE
    assert not Notification.objects.exists()


@pytest.mark.parametrize(
    ("patch", "error"),
    [
        ({}, InvalidJobState),
        ({"status": "queued"}, InvalidJobState),
        ({"status": "running"}, InvalidJobState),
        ({"status": "finished"}, InvalidJobState),
        ({"status": "done", "claim_token": None}, InvalidPatch),
        ({"status": "done", "request_id": "other"}, InvalidPatch),
        ({"status": "done", "result": float("nan")}, InvalidPayload),
    ],
)
def test_a_bad_patch_raises_and_writes_nothing(
    store: DatabaseStateStore, patch: dict[str, Any], error: type[Exception]
) -> None:
    original = claimed_job(store)
    with pytest.raises(error):
        store.complete_job_with_notifications(original, patch, [webhook()])
    assert Job.objects.get(id=original.id).status == JobStatus.RUNNING
    assert not Notification.objects.exists()


@pytest.mark.parametrize(
    ("notifications", "error"),
    [
        ([NotificationRequest("sms", "+100", {})], InvalidNotification),
        ([NotificationRequest("webhook", "", {})], InvalidNotification),
        ([NotificationRequest("webhook", "x" * 2001, {})], InvalidNotification),
        (
            [NotificationRequest("webhook", HOOK, {}, idempotency_key="k" * 201)],
            InvalidNotification,
        ),
        ([NotificationRequest("webhook", HOOK, ["not", "a", "dict"])], InvalidPayload),  # type: ignore[arg-type]
        ([NotificationRequest("webhook", HOOK, {"x": float("inf")})], InvalidPayload),
        ([{"channel": "webhook"}], InvalidNotification),
        (NotificationRequest("webhook", HOOK, {}), InvalidNotification),
        ([webhook(), webhook()], DuplicateNotification),
    ],
)
def test_bad_notifications_raise_and_write_nothing(
    store: DatabaseStateStore, notifications: Any, error: type[Exception]
) -> None:
    original = claimed_job(store)
    with pytest.raises(error):
        store.complete_job_with_notifications(original, {"status": "done"}, notifications)
    assert Job.objects.get(id=original.id).status == JobStatus.RUNNING
    assert not Notification.objects.exists()
    assert not AuditEntry.objects.filter(event="finished").exists()


def test_a_key_already_in_the_outbox_rolls_back_the_whole_transition(
    store: DatabaseStateStore,
) -> None:
    first = claimed_job(store, "r1")
    store.complete_job_with_notifications(
        first, {"status": "done"}, [webhook(idempotency_key="order-7")]
    )
    store.create_job(request_id="r2", target="llm")
    second = store.claim_next_inhub_job(["llm"], "worker-2")
    assert second is not None
    with pytest.raises(DuplicateNotification) as caught:
        store.complete_job_with_notifications(
            second,
            {"status": "done"},
            [webhook(idempotency_key="fresh"), webhook(idempotency_key="order-7")],
        )
    assert caught.value.idempotency_key == "order-7"
    assert Job.objects.get(id=second.id).status == JobStatus.RUNNING
    assert Job.objects.get(id=second.id).claim_token == second.claim_token
    assert list(Notification.objects.values_list("idempotency_key", flat=True)) == ["order-7"]
    assert AuditEntry.objects.filter(event="finished").count() == 1


def test_a_long_destination_keeps_the_default_key_within_bounds(store: DatabaseStateStore) -> None:
    job = claimed_job(store)
    destination = "https://hooks.example.com/" + "a" * 300
    key = default_idempotency_key(job, "webhook", destination)
    assert len(key) <= 200 and key.startswith(f"{job.id}:{job.claim_token}:sha256:")
    assert key == default_idempotency_key(job, "webhook", destination)
    done = store.complete_job_with_notifications(
        job, {"status": "done"}, [NotificationRequest("webhook", destination, {})]
    )
    assert done is not None
    assert Notification.objects.get().idempotency_key == key


# --- claiming and settling ------------------------------------------------------------


def test_claim_takes_due_rows_oldest_first_and_counts_an_attempt(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox
) -> None:
    rows = [pending_row(store, f"r{n}") for n in range(3)]
    Notification.objects.filter(id=rows[1].id).update(
        next_attempt_at=timezone.now() + timedelta(hours=1)
    )
    Notification.objects.filter(id=rows[2].id).update(
        next_attempt_at=timezone.now() - timedelta(minutes=5)
    )
    claimed = outbox.claim_due(relay_id="relay-a", limit=10, lease=timedelta(minutes=1))
    assert [row.id for row in claimed] == [rows[2].id, rows[0].id]
    for row in claimed:
        assert row.state == NotificationState.DELIVERING
        assert row.relay_id == "relay-a" and row.attempts == 1
        assert row.lease_until is not None and row.lease_until > timezone.now()
    # Held rows and rows not yet due are not handed out again.
    assert outbox.claim_due(relay_id="relay-b", limit=10, lease=timedelta(minutes=1)) == []
    assert Notification.objects.get(id=rows[1].id).state == NotificationState.PENDING


def test_claim_respects_the_limit(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox
) -> None:
    for n in range(5):
        pending_row(store, f"r{n}")
    first = outbox.claim_due(relay_id="a", limit=2, lease=timedelta(minutes=1))
    second = outbox.claim_due(relay_id="b", limit=2, lease=timedelta(minutes=1))
    third = outbox.claim_due(relay_id="c", limit=2, lease=timedelta(minutes=1))
    assert (len(first), len(second), len(third)) == (2, 2, 1)
    assert len({row.id for row in first + second + third}) == 5


def test_mark_delivered_is_fenced_by_the_holding_relay(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox
) -> None:
    row = pending_row(store)
    outbox.claim_due(relay_id="relay-a", limit=1, lease=timedelta(minutes=1))
    started = timezone.now() - timedelta(seconds=3)
    assert not outbox.mark_delivered(notification_id=row.id, relay_id="relay-b")
    assert outbox.mark_delivered(notification_id=row.id, relay_id="relay-a", started_at=started)
    assert not outbox.mark_delivered(notification_id=row.id, relay_id="relay-a")
    assert outbox.mark_failed(notification_id=row.id, relay_id="relay-a", error="late") is None
    row.refresh_from_db()
    assert row.state == NotificationState.DELIVERED
    assert row.delivered_at is not None and row.lease_until is None
    attempt = DeliveryAttempt.objects.get(notification=row)
    assert (attempt.number, attempt.relay_id, attempt.succeeded) == (1, "relay-a", True)
    assert attempt.started_at == started


def test_failures_back_off_exponentially_then_dead_letter(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox, settings: Any
) -> None:
    jobstate(
        settings,
        OUTBOX_MAX_ATTEMPTS=3,
        OUTBOX_BACKOFF_BASE=timedelta(seconds=100),
        OUTBOX_BACKOFF_MAX=timedelta(seconds=150),
    )
    row = pending_row(store)
    expected_ceilings = [100, 150]  # 100 * 2**0, then min(150, 100 * 2**1)
    for number, ceiling in enumerate(expected_ceilings, start=1):
        before = timezone.now()
        [claimed] = outbox.claim_due(
            relay_id=f"relay-{number}", limit=1, lease=timedelta(minutes=1)
        )
        state = outbox.mark_failed(
            notification_id=row.id, relay_id=f"relay-{number}", error=f"HTTP 503 #{number}"
        )
        after = timezone.now()
        assert state == NotificationState.PENDING
        claimed.refresh_from_db()
        assert claimed.attempts == number and claimed.last_error == f"HTTP 503 #{number}"
        assert claimed.lease_until is None
        wait = claimed.next_attempt_at
        slack = timedelta(seconds=2)
        assert before + timedelta(seconds=ceiling / 2) - slack <= wait
        assert wait <= after + timedelta(seconds=ceiling) + slack
        # Not due before its backoff ends.
        assert outbox.claim_due(relay_id="eager", limit=1, lease=timedelta(minutes=1)) == []
        make_due(row)
    outbox.claim_due(relay_id="relay-3", limit=1, lease=timedelta(minutes=1))
    state = outbox.mark_failed(notification_id=row.id, relay_id="relay-3", error="HTTP 410")
    assert state == NotificationState.DEAD
    row.refresh_from_db()
    assert row.state == NotificationState.DEAD and row.attempts == 3
    make_due(row)
    assert outbox.claim_due(relay_id="late", limit=1, lease=timedelta(minutes=1)) == []
    assert outbox.dead_letters() == [row]
    attempts = list(DeliveryAttempt.objects.filter(notification=row).order_by("number"))
    assert [(a.number, a.relay_id, a.succeeded) for a in attempts] == [
        (1, "relay-1", False),
        (2, "relay-2", False),
        (3, "relay-3", False),
    ]
    audit = AuditEntry.objects.get(event="delivery_error")
    assert audit.job_id == row.job_id and audit.severity == "error"
    assert audit.detail["notification_id"] == str(row.id)
    assert audit.detail["attempts"] == 3 and audit.detail["error"] == "HTTP 410"


def test_error_text_is_cleaned_and_bounded(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox, settings: Any
) -> None:
    jobstate(settings, ERROR_TEXT_LIMIT=50)
    row = pending_row(store)
    outbox.claim_due(relay_id="a", limit=1, lease=timedelta(minutes=1))
    outbox.mark_failed(notification_id=row.id, relay_id="a", error="bad\x00byte " + "x" * 100)
    row.refresh_from_db()
    assert row.last_error is not None
    assert len(row.last_error) == 50 and "\x00" not in row.last_error
    assert row.last_error.startswith("bad\ufffdbyte")


def test_an_expired_lease_makes_the_row_due_again(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox
) -> None:
    row = pending_row(store)
    # A lease a loaded machine cannot outrun between two claims; then its end is waited for.
    [held] = outbox.claim_due(relay_id="crashed", limit=1, lease=timedelta(seconds=2))
    assert outbox.claim_due(relay_id="other", limit=1, lease=timedelta(minutes=1)) == []
    assert held.lease_until is not None
    sleep_past(held.lease_until)
    [again] = outbox.claim_due(relay_id="other", limit=1, lease=timedelta(minutes=1))
    assert again.id == row.id and again.attempts == 2 and again.relay_id == "other"
    assert again.last_error == LEASE_EXPIRED_ERROR
    lost = DeliveryAttempt.objects.get(notification=row)
    assert (lost.number, lost.relay_id, lost.succeeded) == (1, "crashed", False)
    assert lost.error == LEASE_EXPIRED_ERROR
    assert lost.started_at == held.updated_at and lost.finished_at == held.lease_until
    # The relay that lost the row can no longer settle it.
    assert not outbox.mark_delivered(notification_id=row.id, relay_id="crashed")
    assert outbox.mark_failed(notification_id=row.id, relay_id="crashed", error="x") is None
    assert outbox.mark_delivered(notification_id=row.id, relay_id="other")


def test_a_row_whose_last_attempt_was_lost_is_dead_lettered(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox, settings: Any
) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=1)
    row = pending_row(store)
    outbox.claim_due(relay_id="crashed", limit=1, lease=timedelta(milliseconds=50))
    time.sleep(0.1)
    assert outbox.claim_due(relay_id="other", limit=5, lease=timedelta(minutes=1)) == []
    row.refresh_from_db()
    assert row.state == NotificationState.DEAD and row.last_error == LEASE_EXPIRED_ERROR
    assert row.attempts == 1
    assert AuditEntry.objects.get(event="delivery_error").detail["error"] == LEASE_EXPIRED_ERROR


@pytest.mark.parametrize(
    "arguments",
    [
        {"relay_id": "", "limit": 1, "lease": timedelta(minutes=1)},
        {"relay_id": "a", "limit": 0, "lease": timedelta(minutes=1)},
        {"relay_id": "a", "limit": 1, "lease": timedelta(0)},
        {"relay_id": "a", "limit": 1, "lease": 60},
    ],
)
def test_claim_refuses_bad_arguments(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox, arguments: dict[str, Any]
) -> None:
    row = pending_row(store)
    with pytest.raises(InvalidJobState):
        outbox.claim_due(**arguments)
    assert Notification.objects.get(id=row.id).state == NotificationState.PENDING


def test_dead_letters_are_newest_first_and_limited(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox, settings: Any
) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=1)
    rows = [pending_row(store, f"r{n}") for n in range(3)]
    for _ in rows:
        [claimed] = outbox.claim_due(relay_id="a", limit=1, lease=timedelta(minutes=1))
        outbox.mark_failed(notification_id=claimed.id, relay_id="a", error="gone")
    assert [row.id for row in outbox.dead_letters(limit=2)] == [rows[2].id, rows[1].id]


def test_backoff_doubles_up_to_the_cap_with_equal_jitter() -> None:
    base, cap = timedelta(seconds=10), timedelta(seconds=60)

    class Fixed(random.Random):
        def __init__(self, value: float) -> None:
            super().__init__()
            self.value = value

        def random(self) -> float:
            return self.value

    low, high = Fixed(0.0), Fixed(0.999999)
    for attempts, ceiling in [(1, 10), (2, 20), (3, 40), (4, 60), (50, 60), (10_000, 60)]:
        assert backoff_delay(attempts, base=base, cap=cap, rng=low) == timedelta(
            seconds=ceiling / 2
        )
        assert backoff_delay(attempts, base=base, cap=cap, rng=high) <= timedelta(seconds=ceiling)
        assert backoff_delay(attempts, base=base, cap=cap, rng=high) > timedelta(
            seconds=ceiling * 0.99
        )
    spread = {backoff_delay(3, base=base, cap=cap, rng=random.Random(n)) for n in range(20)}
    assert len(spread) > 1
    with pytest.raises(InvalidJobState):
        backoff_delay(0)


# --- requeue_delivery_job_once --------------------------------------------------------


def dead_row(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox, request_id: str = "r1"
) -> Any:
    row = pending_row(store, request_id)
    for number in range(1, 9):
        claimed = outbox.claim_due(relay_id=f"a{number}", limit=1, lease=timedelta(minutes=1))
        assert [c.id for c in claimed] == [row.id]
        state = outbox.mark_failed(notification_id=row.id, relay_id=f"a{number}", error="HTTP 500")
        if state == NotificationState.DEAD:
            row.refresh_from_db()
            return row
        make_due(row)
    raise AssertionError("the row never died")


def test_a_dead_letter_is_requeued_once_per_key(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox, settings: Any
) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=2)
    row = dead_row(store, outbox)
    outcome = store.requeue_delivery_job_once(
        notification_id=row.id, dlq_key="dlq-1", requested_by="alice"
    )
    assert outcome == DeliveryRequeueOutcome.REQUEUED
    requeued = Notification.objects.get(id=row.id)
    assert Notification.objects.count() == 1  # the original row, not a copy
    assert requeued.state == NotificationState.PENDING and requeued.attempts == 0
    assert requeued.idempotency_key == row.idempotency_key
    assert requeued.last_error == "HTTP 500"  # history is kept
    assert requeued.next_attempt_at <= timezone.now()
    marker = DeliveryReplay.objects.get(dlq_key="dlq-1")
    assert (marker.notification_id, marker.requested_by) == (row.id, "alice")
    audit = AuditEntry.objects.get(event="dlq_resend_ok")
    assert audit.job_id == row.job_id and "alice" in audit.summary
    assert audit.detail["requested_by"] == "alice" and audit.detail["dlq_key"] == "dlq-1"

    # The same key again: refused with its own answer, nothing changes.
    again = store.requeue_delivery_job_once(
        notification_id=row.id, dlq_key="dlq-1", requested_by="bob"
    )
    assert again == DeliveryRequeueOutcome.ALREADY_REQUEUED
    # Still refused after the row died again; a new key replays it.
    [claimed] = outbox.claim_due(relay_id="b1", limit=1, lease=timedelta(minutes=1))
    outbox.mark_failed(notification_id=claimed.id, relay_id="b1", error="HTTP 500")
    make_due(row)
    outbox.claim_due(relay_id="b2", limit=1, lease=timedelta(minutes=1))
    assert outbox.mark_failed(notification_id=row.id, relay_id="b2", error="HTTP 500") == "dead"
    assert (
        store.requeue_delivery_job_once(notification_id=row.id, dlq_key="dlq-1", requested_by="c")
        == DeliveryRequeueOutcome.ALREADY_REQUEUED
    )
    assert Notification.objects.get(id=row.id).state == NotificationState.DEAD
    assert (
        store.requeue_delivery_job_once(notification_id=row.id, dlq_key="dlq-2", requested_by="c")
        == DeliveryRequeueOutcome.REQUEUED
    )
    assert AuditEntry.objects.filter(event="dlq_resend_ok").count() == 2


def test_a_dead_letter_key_used_for_another_row_is_a_conflict(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox, settings: Any
) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=2)
    first = dead_row(store, outbox, "r1")
    second = dead_row(store, outbox, "r2")
    assert (
        store.requeue_delivery_job_once(notification_id=first.id, dlq_key="k", requested_by="a")
        == DeliveryRequeueOutcome.REQUEUED
    )
    # The key names the first row's replay: the second row is not replayed under it.
    outcome = store.requeue_delivery_job_once(
        notification_id=second.id, dlq_key="k", requested_by="b"
    )
    assert outcome == DeliveryRequeueOutcome.KEY_CONFLICT
    assert Notification.objects.get(id=second.id).state == NotificationState.DEAD
    assert list(DeliveryReplay.objects.values_list("dlq_key", "notification_id")) == [
        ("k", first.id)
    ]
    assert AuditEntry.objects.filter(event="dlq_resend_ok").count() == 1


def test_only_dead_letters_are_requeued(
    store: DatabaseStateStore, outbox: DatabaseNotificationOutbox
) -> None:
    row = pending_row(store)
    outcome = store.requeue_delivery_job_once(notification_id=row.id, dlq_key="k", requested_by="a")
    assert outcome == DeliveryRequeueOutcome.NOT_DEAD
    outbox.claim_due(relay_id="a", limit=1, lease=timedelta(minutes=1))
    outbox.mark_delivered(notification_id=row.id, relay_id="a")
    outcome = store.requeue_delivery_job_once(notification_id=row.id, dlq_key="k", requested_by="a")
    assert outcome == DeliveryRequeueOutcome.NOT_DEAD
    assert Notification.objects.get(id=row.id).state == NotificationState.DELIVERED
    assert not DeliveryReplay.objects.exists()
    missing = store.requeue_delivery_job_once(
        notification_id=uuid.uuid4(), dlq_key="k", requested_by="a"
    )
    assert missing == DeliveryRequeueOutcome.NOT_FOUND


@pytest.mark.parametrize(
    "arguments",
    [
        {"notification_id": "not-a-uuid", "dlq_key": "k", "requested_by": "a"},
        {"notification_id": uuid.uuid4(), "dlq_key": "", "requested_by": "a"},
        {"notification_id": uuid.uuid4(), "dlq_key": "k", "requested_by": " "},
        {"notification_id": uuid.uuid4(), "dlq_key": "k" * 201, "requested_by": "a"},
    ],
)
def test_requeue_refuses_bad_arguments(
    store: DatabaseStateStore, arguments: dict[str, Any]
) -> None:
    with pytest.raises(InvalidJobState):
        store.requeue_delivery_job_once(**arguments)
    assert not DeliveryReplay.objects.exists()
