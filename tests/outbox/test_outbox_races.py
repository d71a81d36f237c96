"""Outbox races and crashes against PostgreSQL with real concurrent connections (one per
thread) and a real process that dies mid-way.

Each check reads the outcome back from the database, so a guarantee that only holds for
one connection at a time, or only while the process stays alive, fails here.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction

from jobstate.models import AuditEntry, DeliveryAttempt, DeliveryReplay, Job, Notification
from jobstate.outbox.channels import notification_handler
from jobstate.outbox.relay import deliver_notifications
from jobstate.stores.base import (
    DeliveryRequeueOutcome,
    JobStatus,
    NotificationRequest,
    NotificationState,
)
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.notification_outbox import LEASE_EXPIRED_ERROR
from tests.support.processes import database_url
from tests.support.tasks_kit import sleep_past
from tests.support.threads import in_parallel

pytestmark = [
    pytest.mark.concurrent,
    pytest.mark.mysql,
    pytest.mark.django_db(transaction=True, available_apps=["jobstate"]),
]

ROOT = Path(__file__).resolve().parents[2]
HANDLER = "tests.outbox.test_outbox_races.record_delivery"

guard = threading.Lock()
active: Counter[str] = Counter()
overlaps: list[str] = []
deliveries: Counter[str] = Counter()
delivered_by: dict[str, set[str]] = {}
hold = threading.Event()
holding = threading.Event()


@notification_handler
def record_delivery(notification: Notification) -> None:
    """Counts deliveries per row and notes any row being delivered twice at once."""
    key = notification.idempotency_key
    with guard:
        if active[key]:
            overlaps.append(key)
        active[key] += 1
    time.sleep(random.uniform(0, 0.003))
    with guard:
        active[key] -= 1
        deliveries[key] += 1
        delivered_by.setdefault(key, set()).add(threading.current_thread().name)


@notification_handler
def blocking_delivery(notification: Notification) -> None:
    """Waits until the test lets it go, so the test can act while a send is in progress."""
    holding.set()
    assert hold.wait(timeout=10), "the test never released the send"


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    for counter in (active, deliveries):
        counter.clear()
    overlaps.clear()
    delivered_by.clear()
    hold.clear()
    holding.clear()
    yield


def finish(store: DatabaseStateStore, request_id: str, destination: str = HANDLER) -> Job:
    store.create_job(request_id=request_id, target=f"t-{request_id}")
    job = store.claim_next_inhub_job([f"t-{request_id}"], "worker")
    assert job is not None
    done = store.complete_job_with_notifications(
        job,
        {"status": "done"},
        [NotificationRequest("callable", destination, {"job": request_id})],
    )
    assert done is not None
    return done


@pytest.mark.slow
def test_a_crash_between_commit_and_send_loses_no_notification() -> None:
    """A real process commits two completions and dies: one before any relay ran, one
    right after a relay claimed its row. Both are delivered afterwards, once each."""
    url = database_url()
    script = textwrap.dedent(
        f"""
        import os
        from datetime import timedelta
        import django
        django.setup()
        from jobstate.stores.base import NotificationRequest
        from jobstate.stores.database import DatabaseStateStore

        store = DatabaseStateStore()
        for request_id in ("claimed-then-crashed", "committed-then-crashed"):
            store.create_job(request_id=request_id, target="crash")
            job = store.claim_next_inhub_job(["crash"], "doomed-worker")
            store.complete_job_with_notifications(
                job,
                {{"status": "done"}},
                [NotificationRequest("callable", {HANDLER!r}, {{"job": request_id}})],
            )
            if request_id == "claimed-then-crashed":
                store.notification_outbox.claim_due(
                    relay_id="doomed-relay", limit=1, lease=timedelta(seconds=2)
                )
        os._exit(9)  # no cleanup, no relay: the process is simply gone
        """
    )
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "project.settings"}
    child = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, timeout=60
    )
    assert child.returncode == 9, child.stderr.decode()
    assert Job.objects.filter(status=JobStatus.DONE).count() == 2
    states = dict(Notification.objects.values_list("payload__job", "state"))
    assert states == {
        "claimed-then-crashed": NotificationState.DELIVERING,
        "committed-then-crashed": NotificationState.PENDING,
    }

    first = deliver_notifications(relay_id="after-restart")
    assert (first.claimed, first.delivered) == (1, 1)  # the other row is still leased
    leased = Notification.objects.get(payload__job="claimed-then-crashed")
    assert leased.state == NotificationState.DELIVERING and leased.lease_until is not None
    sleep_past(leased.lease_until)
    second = deliver_notifications(relay_id="after-lease")
    assert (second.claimed, second.delivered) == (1, 1)
    assert set(Notification.objects.values_list("state", flat=True)) == {
        NotificationState.DELIVERED
    }
    assert sorted(deliveries.values()) == [1, 1]
    lost = DeliveryAttempt.objects.get(succeeded=False)
    assert (lost.relay_id, lost.error) == ("doomed-relay", LEASE_EXPIRED_ERROR)


def test_relays_never_deliver_the_same_row_at_once() -> None:
    store = DatabaseStateStore()
    for n in range(60):
        finish(store, f"r{n}")
    keys = set(Notification.objects.values_list("idempotency_key", flat=True))

    def relay(index: int) -> int:
        threading.current_thread().name = f"relay-{index}"
        passes = 0
        # A relay stops once nothing is left to deliver, not at its first empty pass: on
        # MariaDB a claim can pass over rows that another relay's claim is still
        # scanning, and a relay that gave up then would leave the rest to one relay.
        while Notification.objects.exclude(state=NotificationState.DELIVERED).exists():
            report = deliver_notifications(relay_id=f"relay-{index}-{passes}", limit=4)
            passes += 1
            if report.claimed == 0:
                time.sleep(0.005)
        return passes

    in_parallel(4, relay)
    assert overlaps == []
    assert set(deliveries) == keys and set(deliveries.values()) == {1}
    assert Notification.objects.exclude(state=NotificationState.DELIVERED).count() == 0
    assert DeliveryAttempt.objects.filter(succeeded=True).count() == 60
    # The work really was shared between relays.
    assert len({name for names in delivered_by.values() for name in names}) > 1


def test_a_send_in_progress_holds_no_lock_or_transaction() -> None:
    store = DatabaseStateStore()
    job = finish(store, "r1", destination="tests.outbox.test_outbox_races.blocking_delivery")
    row = Notification.objects.get()
    reports: list[Any] = []

    def run_relay() -> None:
        try:
            reports.append(deliver_notifications(relay_id="slow-relay"))
        finally:
            connections.close_all()

    thread = threading.Thread(target=run_relay)
    thread.start()
    try:
        assert holding.wait(timeout=10)
        # While the channel is sending, another connection can lock and write the outbox
        # row and the job at once: the relay holds no row lock and no open transaction.
        with transaction.atomic():
            locked = Notification.objects.select_for_update(nowait=True).get(id=row.id)
            assert locked.state == NotificationState.DELIVERING
            Job.objects.select_for_update(nowait=True).get(id=job.id)
            Job.objects.filter(id=job.id).update(metadata={"seen": True})
    except OperationalError as exc:
        pytest.fail(f"the relay held a lock while sending: {exc}")
    finally:
        hold.set()
        thread.join(timeout=10)
    assert reports and reports[0].delivered == 1


def test_concurrent_completions_of_one_claim_write_once() -> None:
    store = DatabaseStateStore()
    store.create_job(request_id="r1", target="llm")
    original = store.claim_next_inhub_job(["llm"], "worker")
    assert original is not None

    def complete(index: int) -> bool:
        status = "done" if index % 2 else "error"
        job = store.complete_job_with_notifications(
            original,
            {"status": status},
            [NotificationRequest("callable", HANDLER, {"by": index})],
        )
        return job is not None

    results = in_parallel(8, complete)
    assert results.count(True) == 1
    assert Notification.objects.count() == 1
    assert AuditEntry.objects.filter(event="finished").count() == 1
    assert Job.objects.get(id=original.id).status in {JobStatus.DONE, JobStatus.ERROR}


def dead_letter(store: DatabaseStateStore, request_id: str) -> Notification:
    finish(store, request_id)
    row = Notification.objects.get(job__request_id=request_id)
    Notification.objects.filter(id=row.id).update(
        state=NotificationState.DEAD, attempts=8, last_error="HTTP 500"
    )
    return row


def test_concurrent_replays_of_one_dead_letter_requeue_it_once() -> None:
    store = DatabaseStateStore()
    row = dead_letter(store, "r1")
    outcomes = in_parallel(
        8,
        lambda index: store.requeue_delivery_job_once(
            notification_id=row.id, dlq_key="dlq-r1", requested_by=f"operator-{index}"
        ),
    )
    assert Counter(outcomes) == {
        DeliveryRequeueOutcome.REQUEUED: 1,
        DeliveryRequeueOutcome.ALREADY_REQUEUED: 7,
    }
    row.refresh_from_db()
    assert row.state == NotificationState.PENDING and row.attempts == 0
    assert DeliveryReplay.objects.count() == 1
    assert AuditEntry.objects.filter(event="dlq_resend_ok").count() == 1
    assert Notification.objects.count() == 1


def test_concurrent_replays_under_different_keys_requeue_once() -> None:
    store = DatabaseStateStore()
    row = dead_letter(store, "r1")
    outcomes = in_parallel(
        8,
        lambda index: store.requeue_delivery_job_once(
            notification_id=row.id, dlq_key=f"dlq-{index}", requested_by="operator"
        ),
    )
    assert Counter(outcomes) == {
        DeliveryRequeueOutcome.REQUEUED: 1,
        DeliveryRequeueOutcome.NOT_DEAD: 7,
    }
    assert DeliveryReplay.objects.count() == 1


def test_one_key_replays_only_one_of_several_dead_letters() -> None:
    store = DatabaseStateStore()
    rows = [dead_letter(store, f"r{n}") for n in range(8)]
    outcomes = in_parallel(
        8,
        lambda index: store.requeue_delivery_job_once(
            notification_id=rows[index].id, dlq_key="shared-key", requested_by="operator"
        ),
    )
    # The key was used for the winner's row: every other row hears of the conflict,
    # not that it was replayed already.
    assert Counter(outcomes) == {
        DeliveryRequeueOutcome.REQUEUED: 1,
        DeliveryRequeueOutcome.KEY_CONFLICT: 7,
    }
    assert Notification.objects.filter(state=NotificationState.PENDING).count() == 1
    assert Notification.objects.filter(state=NotificationState.DEAD).count() == 7
    marker = DeliveryReplay.objects.get()
    assert Notification.objects.get(id=marker.notification_id).state == NotificationState.PENDING
