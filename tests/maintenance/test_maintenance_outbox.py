"""The outbox sweeps: notifications whose relay lease ended are handed back (pending, or
dead after the last attempt) with their lost attempt recorded as a relay's claim records
it, and delivered notifications past their retention are deleted with their history.
Both are bounded, idempotent and exact under concurrent sweepers."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connections
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from jobstate import maintenance
from jobstate.exceptions import InvalidJobState
from jobstate.maintenance import SweepResult
from jobstate.models import AuditEntry, DeliveryAttempt, DeliveryReplay, Notification
from jobstate.outbox.relay import deliver_notifications
from jobstate.stores.base import JobStatus, NotificationRequest, NotificationState
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.notification_outbox import LEASE_EXPIRED_ERROR
from jobstate.testing.factories import JobFactory, NotificationFactory

CLAIMED_AT = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
LEASE_ENDED = CLAIMED_AT + timedelta(minutes=2)


def jobstate(settings: Any, **values: object) -> None:
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), **values}


# --- seeding ------------------------------------------------------------------------------


def seed_lost(count: int, *, fresh: bool = False, attempts: int = 1) -> list[Notification]:
    """Rows a relay claimed: with ``fresh`` its lease still runs, else it ended."""
    lease = timezone.now() + timedelta(hours=1) if fresh else LEASE_ENDED
    return NotificationFactory.bulk_create_batch(
        count,
        delivering=True,
        attempts=attempts,
        relay_id="relay-gone",
        lease_until=lease,
        updated_at=CLAIMED_AT,
    )


def seed_delivered(count: int, *, fresh: bool = False) -> list[Notification]:
    rows = NotificationFactory.bulk_create_batch(
        count, delivered=True, attempts=1, delivered_at=CLAIMED_AT
    )
    ids = [row.id for row in rows]
    for row in rows:
        DeliveryAttempt.objects.create(
            notification=row, number=1, relay_id="r", started_at=CLAIMED_AT, succeeded=True
        )
    if not fresh:
        Notification.objects.filter(id__in=ids).update(updated_at=Now() - timedelta(days=30))
    return rows


@dataclass(frozen=True)
class Case:
    sweep: Callable[..., SweepResult]
    seed: Callable[..., Any]
    left: Callable[[], QuerySet[Notification]]
    """The candidates still waiting for the sweep."""
    untouched: Callable[[], QuerySet[Notification]]
    """Where the fresh rows must still be, unchanged in state."""


CASES = {
    "outbox": Case(
        maintenance.rearm_outbox_leases,
        seed_lost,
        lambda: Notification.objects.filter(
            state=NotificationState.DELIVERING, lease_until__lt=Now()
        ),
        lambda: Notification.objects.filter(state=NotificationState.DELIVERING),
    ),
    "notifications": Case(
        maintenance.prune_delivered_notifications,
        seed_delivered,
        lambda: Notification.objects.filter(
            state=NotificationState.DELIVERED, updated_at__lt=Now() - timedelta(days=7)
        ),
        lambda: Notification.objects.filter(state=NotificationState.DELIVERED),
    ),
}


# --- both sweeps: bounded, idempotent, dry run --------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("name", CASES)
def test_an_outbox_sweep_moves_everything_in_batches_then_nothing(name: str) -> None:
    case = CASES[name]
    case.seed(25)
    case.seed(2, fresh=True)
    progress: list[int] = []

    result = case.sweep(batch_size=10, on_batch=lambda sweep, n: progress.append(n))

    assert (result.sweep, result.count, result.batches, result.complete) == (name, 25, 3, True)
    assert progress == [10, 20, 25]
    assert not case.left().exists()
    assert case.untouched().count() == 2
    again = case.sweep(batch_size=10)
    assert (again.count, again.batches, again.complete) == (0, 1, True)
    assert case.untouched().count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("name", CASES)
def test_an_outbox_sweep_honours_its_time_budget_limit_and_dry_run(name: str) -> None:
    case = CASES[name]
    case.seed(12)
    dry = case.sweep(dry_run=True)
    assert (dry.count, dry.dry_run, dry.batches) == (12, True, 0)
    assert case.sweep(dry_run=True, limit=5).count == 5
    assert case.left().count() == 12
    stopped = case.sweep(batch_size=4, time_budget=timedelta(microseconds=1))
    assert (stopped.count, stopped.batches, stopped.complete) == (4, 1, False)
    capped = case.sweep(batch_size=3, limit=5)
    assert (capped.count, capped.batches, capped.complete) == (5, 2, False)
    assert case.left().count() == 3


@pytest.mark.django_db
@pytest.mark.parametrize(
    "call",
    [
        lambda: maintenance.rearm_outbox_leases(batch_size=0),
        lambda: maintenance.rearm_outbox_leases(limit=-1),
        lambda: maintenance.prune_delivered_notifications(older_than=timedelta(0)),
        lambda: maintenance.prune_delivered_notifications(time_budget=timedelta(0)),
        lambda: maintenance.run_retention_sweeps(older_than=timedelta(days=-1)),
    ],
)
def test_bad_arguments_raise_before_anything_is_written(call: Callable[[], Any]) -> None:
    seed_lost(1)
    seed_delivered(1)
    with pytest.raises(InvalidJobState):
        call()
    assert Notification.objects.filter(state=NotificationState.DELIVERING).count() == 1
    assert Notification.objects.filter(state=NotificationState.DELIVERED).count() == 1
    assert DeliveryAttempt.objects.count() == 1


# --- what the re-arm writes ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_lost_row_goes_back_to_pending_with_its_lost_attempt_recorded() -> None:
    [row] = seed_lost(1, attempts=2)
    [held] = seed_lost(1, fresh=True)
    due_before = Notification.objects.get(id=row.id).next_attempt_at

    result = maintenance.rearm_outbox_leases()

    assert (result.count, result.detail) == (1, {"rearmed": 1, "dead": 0})
    row.refresh_from_db()
    assert row.state == NotificationState.PENDING
    assert (row.attempts, row.lease_until, row.last_error) == (2, None, LEASE_EXPIRED_ERROR)
    assert row.next_attempt_at == due_before  # due at once, in its old place in line
    lost = DeliveryAttempt.objects.get(notification=row)
    assert (lost.number, lost.relay_id, lost.succeeded, lost.error) == (
        2,
        "relay-gone",
        False,
        LEASE_EXPIRED_ERROR,
    )
    assert (lost.started_at, lost.finished_at) == (CLAIMED_AT, LEASE_ENDED)
    assert Notification.objects.get(id=held.id).state == NotificationState.DELIVERING
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_a_row_whose_lost_attempt_was_its_last_is_dead_lettered(settings: Any) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=3)
    store = DatabaseStateStore()
    job = store.create_job(request_id="notify", target="t")
    [last] = seed_lost(1, attempts=3)
    [other] = seed_lost(1, attempts=2)
    Notification.objects.filter(id=last.id).update(job=job)

    dry = maintenance.rearm_outbox_leases(dry_run=True)
    assert (dry.count, dry.detail) == (2, {"rearmed": 1, "dead": 1})
    result = maintenance.rearm_outbox_leases()

    assert (result.count, result.detail) == (2, {"rearmed": 1, "dead": 1})
    last.refresh_from_db()
    assert (last.state, last.lease_until, last.last_error) == (
        NotificationState.DEAD,
        None,
        LEASE_EXPIRED_ERROR,
    )
    assert Notification.objects.get(id=other.id).state == NotificationState.PENDING
    entry = AuditEntry.objects.get(event="delivery_error")
    assert (entry.job_id, entry.severity) == (job.id, "error")
    assert entry.detail["notification_id"] == str(last.id)
    assert (entry.detail["attempts"], entry.detail["error"]) == (3, LEASE_EXPIRED_ERROR)
    assert store.notification_outbox.dead_letters() == [last]


@pytest.mark.django_db
def test_the_sweep_and_a_relays_claim_record_a_lost_attempt_alike(settings: Any) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=2)
    swept = seed_lost(2, attempts=1) + seed_lost(1, attempts=2)
    claimed = seed_lost(2, attempts=1) + seed_lost(1, attempts=2)
    claimed_ids = {row.id for row in claimed}
    # Same history, but a later lease end, so the sweep below (oldest lease first) takes
    # exactly the first group.
    later = {"lease_until": LEASE_ENDED + timedelta(seconds=1)}
    Notification.objects.filter(id__in=claimed_ids).update(**later)
    outbox = DatabaseStateStore().notification_outbox

    maintenance.rearm_outbox_leases(limit=3)
    taken = outbox.claim_due(relay_id="relay-new", limit=10, lease=timedelta(minutes=1))

    def history(rows: list[Notification]) -> list[tuple[Any, ...]]:
        return sorted(
            DeliveryAttempt.objects.filter(notification__in=rows).values_list(
                "number", "relay_id", "started_at", "succeeded", "error"
            )
        )

    assert history(swept) == history(claimed)
    assert len(history(swept)) == 3

    def states(rows: list[Notification]) -> list[str]:
        return sorted(
            Notification.objects.filter(id__in=[r.id for r in rows]).values_list("state", flat=True)
        )

    assert states(swept) == ["dead", "delivering", "delivering"] == states(claimed)
    # The claim took the rows the sweep re-armed as well as those it took over itself.
    assert {row.relay_id for row in taken} == {"relay-new"} and len(taken) == 4
    assert AuditEntry.objects.filter(event="delivery_error").count() == 2


@pytest.mark.django_db(transaction=True)
def test_the_relay_that_lost_a_row_cannot_settle_it_and_the_next_pass_delivers_it(
    settings: Any,
) -> None:
    jobstate(settings, CHANNELS={"memory": f"{__name__}.MemoryChannel"})
    MemoryChannel.sent.clear()
    store = DatabaseStateStore()
    store.create_job(request_id="r1", target="t")
    job = store.claim_next_inhub_job(["t"], "worker-1")
    assert job is not None
    store.complete_job_with_notifications(
        job, {"status": JobStatus.DONE}, [NotificationRequest("memory", "inbox", {"n": 1})]
    )
    outbox = store.notification_outbox
    [row] = outbox.claim_due(relay_id="crashed", limit=1, lease=timedelta(milliseconds=50))
    time.sleep(0.1)

    assert maintenance.rearm_outbox_leases().detail == {"rearmed": 1, "dead": 0}
    assert not outbox.mark_delivered(notification_id=row.id, relay_id="crashed")
    report = deliver_notifications(relay_id="relay-2", store=store)

    assert (report.claimed, report.delivered) == (1, 1)
    assert MemoryChannel.sent == [{"n": 1}]
    attempts = DeliveryAttempt.objects.filter(notification_id=row.id).order_by("number")
    assert list(attempts.values_list("number", "relay_id", "succeeded")) == [
        (1, "crashed", False),
        (2, "relay-2", True),
    ]


class MemoryChannel:
    sent: list[Any] = []

    def send(self, notification: Notification) -> None:
        self.sent.append(notification.payload)


# --- what the retention sweep deletes -----------------------------------------------------


@pytest.mark.django_db
def test_pruning_deletes_old_delivered_rows_with_their_attempts_and_nothing_else(
    settings: Any,
) -> None:
    old = seed_delivered(3)
    recent = seed_delivered(1, fresh=True)
    Notification.objects.filter(id=recent[0].id).update(updated_at=Now() - timedelta(days=2))
    ancient = timedelta(days=400)
    dead = NotificationFactory(dead=True, attempts=8)
    pending = NotificationFactory(state=NotificationState.PENDING)
    [delivering] = seed_lost(1, fresh=True)
    Notification.objects.filter(id__in=[dead.id, pending.id, delivering.id]).update(
        updated_at=Now() - ancient, created_at=Now() - ancient
    )
    DeliveryAttempt.objects.create(
        notification=dead, number=8, relay_id="r", started_at=CLAIMED_AT, succeeded=False
    )
    DeliveryReplay.objects.create(dlq_key="dlq-1", notification_id=old[0].id, requested_by="ops")

    result = maintenance.prune_delivered_notifications()

    assert result.count == 3
    assert not Notification.objects.filter(id__in=[row.id for row in old]).exists()
    assert not DeliveryAttempt.objects.filter(notification_id__in=[r.id for r in old]).exists()
    assert set(Notification.objects.values_list("id", flat=True)) == {
        recent[0].id,
        dead.id,
        pending.id,
        delivering.id,
    }
    assert DeliveryAttempt.objects.count() == 2  # the recent delivery and the dead letter's
    # The replay marker outlives its notification: that key can never replay again.
    assert DeliveryReplay.objects.filter(dlq_key="dlq-1").exists()
    # Even the shortest retention never touches a dead letter.
    assert maintenance.prune_delivered_notifications(older_than=timedelta(days=1)).count == 1
    assert Notification.objects.get(id=dead.id).state == NotificationState.DEAD


@pytest.mark.django_db
def test_the_retention_defaults_to_its_setting(settings: Any) -> None:
    seed_delivered(2)  # delivered 30 days ago
    jobstate(settings, DELIVERED_NOTIFICATION_RETENTION=timedelta(days=60))
    assert maintenance.prune_delivered_notifications().count == 0
    jobstate(settings, DELIVERED_NOTIFICATION_RETENTION=timedelta(days=20))
    assert maintenance.prune_delivered_notifications(dry_run=True).count == 2
    assert maintenance.prune_delivered_notifications().count == 2


# --- in the runners -----------------------------------------------------------------------


@pytest.mark.django_db
def test_the_runners_include_the_outbox_sweeps() -> None:
    seed_lost(2)
    seed_delivered(3)
    reaped = maintenance.run_reaping_sweeps(sweeps=["outbox"])
    assert reaped.as_dict() == {
        "outbox": 2,
        "outbox_rearmed": 2,
        "outbox_dead": 0,
        "dry_run": False,
        "complete": True,
    }
    assert "outbox" in maintenance.run_reaping_sweeps().counts
    pruned = maintenance.run_retention_sweeps(older_than=timedelta(days=10))
    assert pruned["notifications"].count == 3
    assert list(maintenance.RETENTION_SWEEPS)[-2:] == ["notifications", "workers"]
    assert not Notification.objects.filter(state=NotificationState.DELIVERED).exists()


# --- concurrent sweepers on PostgreSQL ----------------------------------------------------


def _race(sweep: Callable[[], SweepResult]) -> list[SweepResult]:
    barrier = threading.Barrier(2)
    results: list[SweepResult] = []
    errors: list[BaseException] = []

    def sweeper() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(sweep())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    return results


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", CASES)
def test_two_sweepers_at_once_move_each_row_exactly_once(name: str) -> None:
    case = CASES[name]
    case.seed(300)
    case.seed(3, fresh=True)
    results = _race(lambda: case.sweep(batch_size=10))
    assert sum(result.count for result in results) == 300
    assert not case.left().exists()
    assert case.untouched().count() == 3


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_two_sweepers_record_each_lost_attempt_and_dead_letter_once(settings: Any) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=2)
    job = JobFactory(done=True, request_id="many")
    rows = seed_lost(200, attempts=1) + seed_lost(100, attempts=2)
    Notification.objects.filter(id__in=[row.id for row in rows]).update(job=job)

    results = _race(lambda: maintenance.rearm_outbox_leases(batch_size=7))

    assert sum(r.detail["rearmed"] for r in results) == 200
    assert sum(r.detail["dead"] for r in results) == 100
    assert DeliveryAttempt.objects.count() == 300
    assert DeliveryAttempt.objects.values("notification_id").distinct().count() == 300
    assert AuditEntry.objects.filter(event="delivery_error").count() == 100
    assert Notification.objects.filter(state=NotificationState.PENDING).count() == 200


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_a_sweeper_and_relays_claiming_at_once_record_each_lost_attempt_once() -> None:
    seed_lost(200, attempts=1)
    outbox = DatabaseStateStore().notification_outbox
    claimed: list[int] = []

    def sweep_or_claim() -> None:
        if threading.current_thread().name == "sweeper":
            maintenance.rearm_outbox_leases(batch_size=7)
            return
        while rows := outbox.claim_due(relay_id="relay-new", limit=9, lease=timedelta(hours=1)):
            claimed.append(len(rows))

    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=10)
            sweep_or_claim()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, name=name) for name in ("sweeper", "relay")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors

    lost = DeliveryAttempt.objects.filter(error=LEASE_EXPIRED_ERROR)
    assert lost.count() == 200
    assert lost.values("notification_id").distinct().count() == 200
    assert set(lost.values_list("number", "relay_id").distinct()) == {(1, "relay-gone")}
    # Every row is either waiting for the next pass or held by the relay, none twice.
    held = Notification.objects.filter(state=NotificationState.DELIVERING, relay_id="relay-new")
    waiting = Notification.objects.filter(state=NotificationState.PENDING, attempts=1)
    assert held.count() + waiting.count() == 200
    assert held.filter(attempts=2).count() == held.count() == sum(claimed)
