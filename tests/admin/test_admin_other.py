"""The runs, runtime locks, notifications and ledger admins: read-only history, the
reap, force-release and replay actions with their permissions and audit entries."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobstate.models import (
    ApprovalDecision,
    AuditEntry,
    DeliveryAttempt,
    DeliveryReplay,
    JobRun,
    Notification,
    RuntimeLock,
)
from jobstate.stores.base import JobRunStatus, NotificationState
from jobstate.stores.database import DatabaseJobRunStore, DatabaseStateStore
from jobstate.testing.factories import RuntimeLockFactory
from tests.support.admin_kit import act, dead_letter, logged_in, operator, run, shown_messages

RUNS = "/admin/jobstate/jobrun/"
LOCKS = "/admin/jobstate/runtimelock/"
NOTIFICATIONS = "/admin/jobstate/notification/"
AUDIT = "/admin/jobstate/auditentry/"


def finished_run(runs: DatabaseJobRunStore, key: str) -> str:
    run_id = run(runs, key, stale=False)
    assert runs.complete(
        run_id=run_id, status="SUCCEEDED", finished_at=datetime.now(UTC), duration_ms=1500
    )
    return run_id


# --- runs ------------------------------------------------------------------------------


def test_runs_changelist_shows_status_heartbeat_age_duration_and_trigger(
    admin_client: Client, runs: DatabaseJobRunStore
) -> None:
    run(runs, "stale-key", stale=True)
    run(runs, "fresh-key", stale=False)
    finished_run(runs, "done-key")
    page = admin_client.get(RUNS).content.decode()
    assert ">Running<" in page and ">Succeeded<" in page
    assert "stale" in page  # the dead run's heartbeat is flagged
    # A finished run's duration; the trigger with who triggered it under it.
    assert '<td class="field-heartbeat_or_duration">1.5 s</td>' in page
    assert 'CLI<span class="jobstate-sub"><span class="jobstate-one-line" title="ops">ops<' in page


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("heartbeat=stale", {"stale-key"}),
        ("heartbeat=fresh", {"fresh-key"}),
        ("status__exact=SUCCEEDED", {"done-key"}),
        ("trigger=CLI", {"stale-key", "fresh-key", "done-key"}),
        ("trigger=SCHEDULER", set()),
        ("q=fresh-key", {"fresh-key"}),
    ],
)
def test_runs_filters_and_search(
    admin_client: Client, runs: DatabaseJobRunStore, query: str, expected: set[str]
) -> None:
    run(runs, "stale-key", stale=True)
    run(runs, "fresh-key", stale=False)
    finished_run(runs, "done-key")
    response = admin_client.get(f"{RUNS}?{query}")
    assert {r.overlap_key for r in response.context["cl"].result_list} == expected


def test_reap_action_times_out_stale_runs_frees_their_keys_and_audits(
    django_user_model: Any, runs: DatabaseJobRunStore
) -> None:
    stale = run(runs, "stale-key", stale=True)
    fresh = run(runs, "fresh-key", stale=False)
    done = finished_run(runs, "done-key")
    client = logged_in(operator(django_user_model, "rhea", "view_jobrun", "reap_runs"))
    confirmation = act(client, RUNS, "reap_stale_runs", [stale, fresh, done]).content.decode()
    assert "1 job run will change" in confirmation and "2 job runs will be skipped" in confirmation
    assert "heartbeat is fresh" in confirmation and "already Succeeded" in confirmation
    assert 'value="Yes, reap"' in confirmation
    assert JobRun.objects.get(id=stale).status == JobRunStatus.RUNNING  # not yet

    response = act(client, RUNS, "reap_stale_runs", [stale, fresh, done], confirm=True)
    assert "Reaped 1 run." in shown_messages(response)
    assert JobRun.objects.get(id=stale).status == JobRunStatus.TIMED_OUT
    assert JobRun.objects.get(id=fresh).status == JobRunStatus.RUNNING
    # The key is free again: the next run of it starts.
    assert run(runs, "stale-key", stale=False) is not None
    entry = AuditEntry.objects.get(event="run_reaped")
    assert entry.detail["by"] == "rhea" and entry.detail["run_id"] == stale
    assert entry.severity == "warning" and "reaped by rhea" in entry.summary


def test_a_run_that_heartbeats_before_confirming_is_not_reaped(
    admin_client: Client, runs: DatabaseJobRunStore
) -> None:
    stale = run(runs, "stale-key", stale=True)
    act(admin_client, RUNS, "reap_stale_runs", [stale])
    assert runs.heartbeat(run_id=stale)
    response = act(admin_client, RUNS, "reap_stale_runs", [stale], confirm=True)
    assert any("heartbeat is fresh" in m for m in shown_messages(response))
    assert JobRun.objects.get(id=stale).status == JobRunStatus.RUNNING
    assert not AuditEntry.objects.filter(event="run_reaped").exists()


def test_reaping_needs_its_permission(django_user_model: Any, runs: DatabaseJobRunStore) -> None:
    stale = run(runs, "stale-key", stale=True)
    viewer = logged_in(operator(django_user_model, "vera", "view_jobrun"))
    assert 'name="action"' not in viewer.get(RUNS).content.decode()
    act(viewer, RUNS, "reap_stale_runs", [stale], confirm=True)
    assert JobRun.objects.get(id=stale).status == JobRunStatus.RUNNING


def test_run_page_is_read_only_with_pretty_json(
    admin_client: Client, runs: DatabaseJobRunStore
) -> None:
    run_id = run(runs, "k", stale=False)
    page = admin_client.get(f"{RUNS}{run_id}/change/").content.decode()
    assert '<pre class="jobstate-json">' in page and "&quot;day&quot;" in page
    assert 'name="_save"' not in page
    assert admin_client.post(f"{RUNS}{run_id}/change/", {"status": "FAILED"}).status_code == 403
    assert admin_client.get(f"{RUNS}add/").status_code == 403


# --- runtime locks ---------------------------------------------------------------------


def test_locks_list_owner_expiry_and_state(admin_client: Client, store: DatabaseStateStore) -> None:
    store.acquire_runtime_lock("serial:1", "worker-1", timedelta(minutes=5))
    RuntimeLockFactory(
        lock_key="summary:9", owner="worker-2", expires_at=datetime.now(UTC) - timedelta(minutes=1)
    )
    page = admin_client.get(LOCKS).content.decode()
    assert "worker-1" in page and "held, ends in" in page and "expired" in page
    held = admin_client.get(f"{LOCKS}?state=held").context["cl"].result_list
    assert [lock.lock_key for lock in held] == ["serial:1"]


def test_force_release_deletes_the_lock_and_audits_owner_and_operator(
    django_user_model: Any, store: DatabaseStateStore
) -> None:
    store.acquire_runtime_lock("serial:1", "worker-1", timedelta(minutes=5))
    client = logged_in(
        operator(django_user_model, "lars", "view_runtimelock", "force_release_lock")
    )
    confirmation = act(client, LOCKS, "force_release_locks", ["serial:1"]).content.decode()
    assert "held by worker-1" in confirmation and 'value="Yes, force-release"' in confirmation
    assert RuntimeLock.objects.filter(lock_key="serial:1").exists()

    token = hashlib.sha256(b"worker-1").hexdigest()
    response = act(
        client,
        LOCKS,
        "force_release_locks",
        ["serial:1"],
        confirm=True,
        **{"_jobstate_seen:serial:1": token},
    )
    assert "Released 1 lock." in shown_messages(response)
    assert not RuntimeLock.objects.exists()
    assert store.acquire_runtime_lock("serial:1", "worker-9", timedelta(minutes=5))
    entry = AuditEntry.objects.get(event="lock_force_released")
    assert entry.detail["owner"] == "worker-1" and entry.detail["by"] == "lars"
    assert entry.job_id is None and entry.severity == "warning"


def test_a_lock_released_meanwhile_is_skipped(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    store.acquire_runtime_lock("serial:1", "worker-1", timedelta(minutes=5))
    act(admin_client, LOCKS, "force_release_locks", ["serial:1"])
    store.release_runtime_lock("serial:1", "worker-1")
    response = act(admin_client, LOCKS, "force_release_locks", ["serial:1"], confirm=True)
    assert any("serial:1" in m for m in shown_messages(response))
    assert not AuditEntry.objects.filter(event="lock_force_released").exists()


def test_a_lock_another_owner_took_before_the_confirmation_is_left_alone(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """The confirmation named the dead owner; a live one that took the lock meanwhile
    was released instead ("Released 1 lock.", its audit entry naming the live owner),
    to carry on unprotected: found by an outside pass."""
    store.acquire_runtime_lock("serial:1", "host-A:pid-1", timedelta(minutes=5))
    page = act(admin_client, LOCKS, "force_release_locks", ["serial:1"]).content.decode()
    assert "held by host-A:pid-1" in page
    token = hashlib.sha256(b"host-A:pid-1").hexdigest()
    assert f'name="_jobstate_seen:serial:1" value="{token}"' in page
    store.release_runtime_lock("serial:1", "host-A:pid-1")
    store.acquire_runtime_lock("serial:1", "host-B:pid-2", timedelta(minutes=5))

    response = act(
        admin_client,
        LOCKS,
        "force_release_locks",
        ["serial:1"],
        confirm=True,
        **{"_jobstate_seen:serial:1": token},
    )

    [message] = shown_messages(response)
    assert (
        "Skipped 1 runtime lock: serial:1 (changed since the confirmation: held by host-B"
        in message
    )
    assert RuntimeLock.objects.get(lock_key="serial:1").owner == "host-B:pid-2"
    assert not AuditEntry.objects.filter(event="lock_force_released").exists()


def test_a_confirmation_that_does_not_say_which_owner_releases_nothing(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """A form of a page from before the owner was sent back, or a hand-made request,
    released whoever held the lock by then."""
    store.acquire_runtime_lock("serial:1", "worker-1", timedelta(minutes=5))
    response = act(admin_client, LOCKS, "force_release_locks", ["serial:1"], confirm=True)
    [message] = shown_messages(response)
    assert "serial:1 (not confirmed on this page; try again)" in message
    assert RuntimeLock.objects.filter(lock_key="serial:1", owner="worker-1").exists()


def test_force_release_needs_its_permission(
    django_user_model: Any, store: DatabaseStateStore
) -> None:
    store.acquire_runtime_lock("serial:1", "worker-1", timedelta(minutes=5))
    viewer = logged_in(operator(django_user_model, "vera", "view_runtimelock"))
    assert 'name="action"' not in viewer.get(LOCKS).content.decode()
    act(viewer, LOCKS, "force_release_locks", ["serial:1"], confirm=True)
    assert RuntimeLock.objects.filter(lock_key="serial:1", owner="worker-1").exists()


# --- notifications ---------------------------------------------------------------------


def test_notifications_list_state_channel_and_job(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    job = store.create_job(request_id="order-7", target="mail")
    dead_letter(job)
    dead_letter(None, key="k2", channel="email", destination="ops@example.com", state="pending")
    page = admin_client.get(NOTIFICATIONS).content.decode()
    assert ">Dead letter<" in page and ">Pending<" in page and ">order-7</a>" in page
    dead = admin_client.get(f"{NOTIFICATIONS}?state__exact=dead").context["cl"].result_list
    assert [n.idempotency_key for n in dead] == ["k1"]
    email = admin_client.get(f"{NOTIFICATIONS}?channel=email").context["cl"].result_list
    assert [n.idempotency_key for n in email] == ["k2"]


def test_notifications_list_loads_jobs_in_the_same_query(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            admin_client.get(NOTIFICATIONS)
        return len(captured)

    dead_letter(store.create_job(request_id="r0", target="mail"), key="k0")
    one = queries()
    for n in range(1, 20):
        dead_letter(store.create_job(request_id=f"r{n}", target="mail"), key=f"k{n}")
    assert queries() == one


def test_notification_page_shows_redacted_payload_and_attempts(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    row = dead_letter(store.create_job(request_id="order-7", target="mail"))
    DeliveryAttempt.objects.create(
        notification=row,
        number=1,
        relay_id="relay-1",
        started_at=datetime.now(UTC),
        succeeded=False,
        error="HTTP 503 from receiver",
    )
    page = admin_client.get(f"{NOTIFICATIONS}{row.id}/change/").content.decode()
    assert "s-hidden" not in page and "••••" in page and "&quot;order&quot;: 7" in page
    assert "HTTP 503 from receiver" in page and "relay-1" in page
    assert 'name="_save"' not in page
    # The attempt's start as every instant of the console (seconds and zone), not
    # Django's "Dec. 6, 2026, 9:52 p.m.".
    attempts = page.split('id="delivery_attempts-group"')[1].split("</table>")[0]
    assert '<time class="jobstate-moment"' in attempts and " UTC</time>" in attempts
    assert "p.m." not in attempts and "a.m." not in attempts


def test_only_a_pending_notification_s_page_names_its_next_attempt(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """A dead letter is tried no more: its page gave a "Next attempt at" all the same
    (the time its last retry had been due)."""
    job = store.create_job(request_id="order-7", target="mail")
    due = datetime(2026, 12, 7, 18, 45, 37, tzinfo=UTC)
    dead = dead_letter(job, next_attempt_at=due)
    pending = dead_letter(job, key="k2", state="pending", next_attempt_at=due)
    dead_page = admin_client.get(f"{NOTIFICATIONS}{dead.id}/change/").content.decode()
    pending_page = admin_client.get(f"{NOTIFICATIONS}{pending.id}/change/").content.decode()
    assert "Next attempt at" not in dead_page and "18:45:37" not in dead_page
    assert "Next attempt at" in pending_page and "18:45:37" in pending_page


def failed_attempts(row: Notification, attempts: list[tuple[int, str]]) -> datetime:
    """``row``'s failed delivery attempts, numbered and erring as given, ten seconds
    apart in that order; when the first started."""
    start = datetime(2026, 12, 7, 18, 45, 24, tzinfo=UTC)
    for n, (number, error) in enumerate(attempts):
        DeliveryAttempt.objects.create(
            notification=row,
            number=number,
            relay_id="relay-1",
            started_at=start + timedelta(seconds=10 * n),
            succeeded=False,
            error=error,
        )
    return start


def test_a_replayed_notification_s_attempts_read_in_the_order_they_ran(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """A replay starts the attempts' numbers again: sorted by number, its page
    interleaved the two rounds (1, 1, 2, 2). They are listed as they ran."""
    row = dead_letter(store.create_job(request_id="order-7", target="mail"))
    failed_attempts(row, [(1, "first-1"), (2, "first-2"), (1, "again-1")])
    page = admin_client.get(f"{NOTIFICATIONS}{row.id}/change/").content.decode()
    attempts = page.split('id="delivery_attempts-group"')[1].split("</table>")[0]
    shown = re.findall(r"(first-1|first-2|again-1)", attempts)
    assert shown == ["first-1", "first-2", "again-1"], shown


def test_a_replayed_notification_s_attempt_count_agrees_with_its_attempts_listed(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    """A replay sets the count of attempts back to 0 and keeps the attempts it made:
    the notification's page and its job's said "3 attempts" over six listed."""
    job = store.create_job(request_id="order-8", target="mail")
    row = dead_letter(job, attempts=3)
    start = failed_attempts(row, [(number, "HTTP 503") for number in [1, 2, 3, 1, 2, 3]])
    said = "3 since its last replay, 6 in all"
    page = admin_client.get(f"{NOTIFICATIONS}{row.id}/change/").content.decode()
    assert said in page
    job_page = admin_client.get(f"/admin/jobstate/job/{job.pk}/change/").content.decode()
    caption = job_page.split('id="jobstate-notifications"')[1].split("</caption>")[0]
    assert said in caption, caption
    # One never replayed says its count alone.
    once = dead_letter(job, key="k2", attempts=1)
    DeliveryAttempt.objects.create(
        notification=once, number=1, relay_id="relay-1", started_at=start, succeeded=False
    )
    page = admin_client.get(f"{NOTIFICATIONS}{once.id}/change/").content.decode()
    assert "in all" not in page
    assert re.search(r"Attempts:</label>\s*<div class=\"readonly\">1</div>", page), page


def test_replay_sends_a_dead_letter_back_once_and_audits_the_operator(
    django_user_model: Any, store: DatabaseStateStore
) -> None:
    job = store.create_job(request_id="order-7", target="mail")
    dead = dead_letter(job)
    delivered = dead_letter(job, key="k2", state="delivered")
    client = logged_in(
        operator(django_user_model, "dora", "view_notification", "replay_notification")
    )
    confirmation = act(client, NOTIFICATIONS, "replay_dead_letters", [dead.id, delivered.id])
    page = confirmation.content.decode()
    assert "1 notification will change" in page and "Delivered, not dead" in page
    assert 'value="Yes, replay"' in page

    response = act(client, NOTIFICATIONS, "replay_dead_letters", [dead.id], confirm=True)
    assert "Replayed 1 dead letter." in shown_messages(response)
    replayed = Notification.objects.get(id=dead.id)
    assert replayed.state == NotificationState.PENDING and replayed.attempts == 0
    marker = DeliveryReplay.objects.get()
    assert (marker.dlq_key, marker.requested_by) == (f"dlq:{dead.id}:1", "dora")
    entry = AuditEntry.objects.get(event="dlq_resend_ok")
    assert entry.job_id == job.id and entry.detail["requested_by"] == "dora"

    again = act(client, NOTIFICATIONS, "replay_dead_letters", [dead.id], confirm=True)
    assert any("Pending, not dead" in m for m in shown_messages(again))
    assert DeliveryReplay.objects.count() == 1

    # It dies again: a new dead letter, replayable once more.
    Notification.objects.filter(id=dead.id).update(state=NotificationState.DEAD, attempts=8)
    act(client, NOTIFICATIONS, "replay_dead_letters", [dead.id], confirm=True)
    assert sorted(DeliveryReplay.objects.values_list("dlq_key", flat=True)) == [
        f"dlq:{dead.id}:1",
        f"dlq:{dead.id}:2",
    ]


def test_two_dead_letters_to_one_destination_are_told_apart_on_the_confirmation(
    django_user_model: Any, store: DatabaseStateStore
) -> None:
    """Two dead letters of one channel and destination read the same on the replay
    confirmation: each row names its notification's id too."""
    job = store.create_job(request_id="order-7", target="mail")
    first, second = dead_letter(job), dead_letter(job, key="k2")
    client = logged_in(
        operator(django_user_model, "dora", "view_notification", "replay_notification")
    )
    page = act(client, NOTIFICATIONS, "replay_dead_letters", [first.id, second.id])
    # What the operator reads of each row: its link's text, not the link.
    labels = re.findall(r'<tr><td><a href="[^"]*">([^<]*)</a></td>', page.content.decode())
    assert len(labels) == 2 and labels[0] != labels[1], labels


def test_replay_needs_its_permission(django_user_model: Any, db: None) -> None:
    dead = dead_letter()
    viewer = logged_in(operator(django_user_model, "vera", "view_notification"))
    assert 'name="action"' not in viewer.get(NOTIFICATIONS).content.decode()
    act(viewer, NOTIFICATIONS, "replay_dead_letters", [dead.id], confirm=True)
    assert Notification.objects.get(id=dead.id).state == NotificationState.DEAD
    assert not DeliveryReplay.objects.exists()


# --- the audit ledger and the permanent markers ---------------------------------------


def test_audit_ledger_filters_by_stage_severity_and_event(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    job = store.create_job(request_id="order-7", target="mail")
    store.append_audit(job=job, event="received")
    store.append_audit(job=job, event="delivery_error", detail={"token": "t-1", "code": 503})
    store.append_audit(event="custom_probe", summary="a host's own event")

    def events(query: str) -> list[str]:
        response = admin_client.get(f"{AUDIT}?{query}")
        assert response.status_code == 200
        return [entry.event for entry in response.context["cl"].result_list]

    assert events("") == ["custom_probe", "delivery_error", "received"]  # newest first
    assert events("stage__exact=delivery") == ["delivery_error"]
    assert events("severity__exact=error") == ["delivery_error"]
    assert events("event=received") == ["received"]
    assert events("event=custom_probe") == ["custom_probe"]  # not a listed choice
    assert events(f"q={job.id}") == ["delivery_error", "received"]
    assert events("q=order-7") == ["delivery_error", "received"]
    page = admin_client.get(AUDIT).content.decode()
    assert "?event=delivery_error" in page and ">Error<" in page


def test_audit_entries_are_read_only_and_redacted(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    entry = store.append_audit(event="delivery_error", detail={"token": "t-1", "code": 503})
    page = admin_client.get(f"{AUDIT}{entry.id}/change/").content.decode()
    assert "t-1" not in page and "&quot;code&quot;: 503" in page
    assert "token: ••••" in page and "code: 503" in page  # the summary built from detail
    assert admin_client.get(f"{AUDIT}add/").status_code == 403
    assert admin_client.post(f"{AUDIT}{entry.id}/change/", {"event": "x"}).status_code == 403
    assert admin_client.post(f"{AUDIT}{entry.id}/delete/", {"post": "yes"}).status_code == 403
    assert AuditEntry.objects.get(id=entry.id).event == "delivery_error"


def test_audit_changelist_uses_few_queries(
    admin_client: Client, store: DatabaseStateStore, django_assert_max_num_queries: Any
) -> None:
    job = store.create_job(request_id="order-7", target="mail")
    for n in range(70):
        store.append_audit(job=job, event="tool_result", summary=f"step {n}")
    with django_assert_max_num_queries(5):
        assert admin_client.get(AUDIT).status_code == 200
    with django_assert_max_num_queries(5):
        assert admin_client.get(f"{AUDIT}?stage__exact=tool&event=tool_result").status_code == 200


def test_decisions_and_replays_are_listed_read_only(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    job = store.create_job(request_id="order-7", target="mail")
    ApprovalDecision.objects.create(decision_id="d-1", job=job, approver="ada", comment="ok")
    dead = dead_letter(job)
    DeliveryReplay.objects.create(dlq_key="dlq:x:1", notification=dead, requested_by="dora")
    decisions = admin_client.get("/admin/jobstate/approvaldecision/?q=ada")
    assert [d.decision_id for d in decisions.context["cl"].result_list] == ["d-1"]
    assert f'/admin/jobstate/job/{job.id}/change/"' in decisions.content.decode()
    replays = admin_client.get("/admin/jobstate/deliveryreplay/").content.decode()
    assert "dlq:x:1" in replays and "dora" in replays
    for url in ("/admin/jobstate/approvaldecision/", "/admin/jobstate/deliveryreplay/"):
        assert admin_client.get(f"{url}add/").status_code == 403
        assert 'name="action"' not in admin_client.get(url).content.decode()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        (LOCKS, "No runtime locks are held. A lock appears while application code holds"),
        ("/admin/jobstate/approvaldecision/", "A decision is recorded when an operator approves"),
        (RUNS, "A run is recorded each time an operations job starts"),
        (NOTIFICATIONS, "A notification is written with its job"),
        ("/admin/jobstate/job/", "A job appears here when the application enqueues one"),
    ],
)
def test_an_empty_list_says_what_would_appear_and_how(
    admin_client: Client, db: None, url: str, says: str
) -> None:
    page = admin_client.get(url).content.decode()
    assert 'id="jobstate-empty"' in page and says in page
    assert "match this search or these filters" not in page


def test_an_empty_search_says_nothing_matches(admin_client: Client, db: None) -> None:
    RuntimeLockFactory(lock_key="nightly-import")
    page = admin_client.get(LOCKS, {"q": "no-such-lock"}).content.decode()
    assert "No runtime locks match this search or these filters." in page
    # The list is not empty, only the search's result: the empty list's text would say
    # there are none.
    assert "No runtime locks are held" not in page
    assert 'id="jobstate-empty"' not in admin_client.get(LOCKS).content.decode()
