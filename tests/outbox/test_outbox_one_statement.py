"""``complete_job_with_notifications`` on PostgreSQL is one statement, and keeps every
guarantee of the transaction it replaces: the fence on status and claim token, nothing
written when it fails, the whole transition rolled back on a key already in the outbox
(with the caller's transaction still usable), the audit entry and the outbox rows written
exactly once and as the ORM wrote them, the caller's transaction joined when there is
one. Races run on real threads, each with its own connection.

The hot statements are also prepared at Django's default settings, and not at all with
``JOBSTATE["PREPARED_STATEMENTS"] = False``."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobstate.core.states import JobStatus, NotificationRequest, NotificationState
from jobstate.exceptions import DuplicateNotification
from jobstate.models import AuditEntry, Job, Notification
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.notification_outbox import _complete_portably
from tests.support.threads import in_parallel

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

HOOK = "https://hooks.example.com/jobs"


def claimed(store: DatabaseStateStore, request_id: str, target: str = "llm") -> Job:
    store.create_job(request_id=request_id, target=target, input={"n": 1})
    job = store.claim_next_inhub_job([target], "worker-1")
    assert job is not None and job.request_id == request_id
    return job


def notes(*keys: str | None) -> list[NotificationRequest]:
    return [
        NotificationRequest("webhook", f"{HOOK}/{index}", {"n": index}, idempotency_key=key)
        for index, key in enumerate(keys)
    ]


def finished_entries(job_id: uuid.UUID) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(job_id=job_id, event="finished"))


# --- one statement, what the ORM wrote ----------------------------------------------------


def test_in_autocommit_it_is_one_statement_that_writes_what_the_orm_path_writes(
    store: DatabaseStateStore,
) -> None:
    fast, slow = claimed(store, "fast", "a"), claimed(store, "slow", "b")
    patch = {"status": "error", "result": {"partial": [1, 2]}, "error": "boom"}

    with CaptureQueriesContext(connection) as queries:
        done = store.complete_job_with_notifications(fast, patch, notes(None, "fast-key"))
    # The portable path, as every other backend runs it, for comparison.
    cleaned = {"status": JobStatus.ERROR, "result": {"partial": [1, 2]}, "error": "boom"}
    detail = {"status": "error", "previous_status": "running", "notifications": 2}
    reference = _complete_portably("default", slow, cleaned, detail, notes(None, "slow-key"))

    assert [query["sql"].split()[:3] for query in queries.captured_queries] == [
        ["WITH", "moved", "AS"]
    ]
    assert done is not None and reference is not None
    stored = Job.objects.get(id=fast.id)
    for field in Job._meta.concrete_fields:
        assert getattr(done, field.attname) == getattr(stored, field.attname), field.name
    skip = {"id", "request_id", "target", "created_at", "updated_at"}
    for field in Job._meta.concrete_fields:
        if field.name not in skip:
            assert getattr(done, field.attname) == getattr(reference, field.attname), field.name
    assert (done.status, done.claim_token, done.lease_until) == (JobStatus.ERROR, None, None)

    [entry], [expected] = finished_entries(fast.id), finished_entries(slow.id)
    for name in ("event", "stage", "severity", "title", "summary", "detail"):
        assert getattr(entry, name) == getattr(expected, name), name
    assert entry.request_id == "fast" and entry.severity == "error"
    assert entry.ts is not None and entry.ts <= timezone.now()

    rows = list(Notification.objects.filter(job_id=fast.id).order_by("destination"))
    references = list(Notification.objects.filter(job_id=slow.id).order_by("destination"))
    assert [row.idempotency_key for row in rows] == [
        f"{fast.id}:{fast.claim_token}:webhook:{HOOK}/0",
        "fast-key",
    ]
    for row, other in zip(rows, references, strict=True):
        for name in ("channel", "destination", "payload", "state", "attempts", "lease_until"):
            assert getattr(row, name) == getattr(other, name), name
        assert (row.relay_id, row.last_error, row.delivered_at) == (None, None, None)
        assert row.state == NotificationState.PENDING and row.id.version == 7
        assert row.next_attempt_at <= timezone.now() and row.created_at == row.updated_at


def test_without_notifications_it_still_writes_the_audit_entry(store: DatabaseStateStore) -> None:
    original = claimed(store, "r1")
    with CaptureQueriesContext(connection) as queries:
        done = store.complete_job_with_notifications(original, {"status": "done"})
    assert done is not None and done.status == JobStatus.DONE
    assert len(queries.captured_queries) == 1
    [entry] = finished_entries(original.id)
    assert entry.detail == {"status": "done", "previous_status": "running", "notifications": 0}
    assert not Notification.objects.exists()


# --- the fence ----------------------------------------------------------------------------


def _finished_elsewhere(store: DatabaseStateStore, job: Job) -> None:
    assert job.claim_token is not None
    assert store.complete_claimed_job(job.id, job.claim_token, "done").completed


def _requeued(store: DatabaseStateStore, job: Job) -> None:
    assert job.claim_token is not None
    assert store.complete_claimed_job(job.id, job.claim_token, "queued").completed


def _reclaimed(store: DatabaseStateStore, job: Job) -> None:
    _requeued(store, job)
    assert store.claim_next_inhub_job([job.target], "worker-2") is not None


def _reaped(store: DatabaseStateStore, job: Job) -> None:
    Job.objects.filter(id=job.id).update(lease_until=timezone.now() - timedelta(minutes=1))
    assert store.requeue_expired_lease_job(job.id, by="reaper", via="test") is not None


@pytest.mark.parametrize(
    "meanwhile",
    [_finished_elsewhere, _requeued, _reclaimed, _reaped],
    ids=["finished-elsewhere", "requeued", "reclaimed", "reaped"],
)
def test_a_stale_original_fails_the_fence_and_writes_nothing(
    store: DatabaseStateStore, meanwhile: Any
) -> None:
    original = claimed(store, "r1")
    meanwhile(store, original)
    before = Job.objects.get(id=original.id)
    entries = AuditEntry.objects.count()

    with CaptureQueriesContext(connection) as queries:
        answer = store.complete_job_with_notifications(
            original, {"status": "done"}, notes("k1", "k2")
        )

    assert answer is None
    assert len(queries.captured_queries) == 1
    after = Job.objects.get(id=original.id)
    assert (after.status, after.claim_token, after.updated_at) == (
        before.status,
        before.claim_token,
        before.updated_at,
    )
    assert AuditEntry.objects.count() == entries
    assert not Notification.objects.exists()


def test_an_unclaimed_original_is_fenced_on_its_missing_token(store: DatabaseStateStore) -> None:
    queued = store.create_job(request_id="q1", target="llm")
    done = store.complete_job_with_notifications(
        queued, {"status": "rejected", "error": "kill switch"}, notes("q1-key")
    )
    assert done is not None and done.status == JobStatus.REJECTED
    other = store.create_job(request_id="q2", target="llm")
    store.claim_next_inhub_job(["llm"], "worker-1")  # claimed after `other` was read
    assert store.complete_job_with_notifications(other, {"status": "rejected"}) is None
    assert Job.objects.get(id=other.id).status == JobStatus.RUNNING
    assert Notification.objects.count() == 1


# --- the caller's transaction and duplicate keys ---------------------------------------------


def test_inside_a_callers_transaction_it_joins_it_behind_a_savepoint(
    store: DatabaseStateStore,
) -> None:
    original = claimed(store, "r1")

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            done = store.complete_job_with_notifications(original, {"status": "done"}, notes("k"))
        assert done is not None
        raise Abandon

    kinds = [query["sql"].split()[0] for query in queries.captured_queries]
    assert kinds == ["SAVEPOINT", "WITH", "RELEASE"]
    # The caller rolled back: so did the transition, its entry and its outbox row.
    assert Job.objects.get(id=original.id).status == JobStatus.RUNNING
    assert finished_entries(original.id) == []
    assert not Notification.objects.exists()

    with transaction.atomic():
        store.append_audit(job=original, event="note", summary="the caller's own write")
        assert store.complete_job_with_notifications(original, {"status": "done"}, notes("k"))
    assert AuditEntry.objects.filter(job_id=original.id).count() == 2
    assert Notification.objects.get().idempotency_key == "k"


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "caller-transaction"])
def test_a_key_already_in_the_outbox_writes_nothing_and_the_caller_goes_on(
    store: DatabaseStateStore, in_transaction: bool
) -> None:
    first = claimed(store, "r1", "a")
    assert store.complete_job_with_notifications(first, {"status": "done"}, notes("order-7"))
    second = claimed(store, "r2", "b")

    def attempt() -> None:
        with pytest.raises(DuplicateNotification) as caught:
            store.complete_job_with_notifications(
                second, {"status": "done"}, notes("fresh", "order-7")
            )
        assert caught.value.idempotency_key == "order-7"

    if in_transaction:
        with transaction.atomic():
            store.append_audit(job=second, event="note", summary="before")
            attempt()
            # The caller's transaction is still usable: these writes commit with it.
            store.append_audit(job=second, event="note", summary="after")
            Job.objects.filter(id=second.id).update(metadata={"seen": True})
    else:
        attempt()

    after = Job.objects.get(id=second.id)
    assert (after.status, after.claim_token) == (JobStatus.RUNNING, second.claim_token)
    assert list(Notification.objects.values_list("idempotency_key", flat=True)) == ["order-7"]
    assert finished_entries(second.id) == []
    notes_written = AuditEntry.objects.filter(job_id=second.id, event="note")
    assert sorted(notes_written.values_list("summary", flat=True)) == (
        ["after", "before"] if in_transaction else []
    )
    assert after.metadata == ({"seen": True} if in_transaction else {})


# --- races on real connections ----------------------------------------------------------------


def test_a_completion_racing_a_reaper_and_a_second_completion_has_one_winner(
    store: DatabaseStateStore,
) -> None:
    winners: Counter[str] = Counter()
    for round_number in range(25):
        original = claimed(store, f"race-{round_number}", f"t{round_number}")
        Job.objects.filter(id=original.id).update(lease_until=timezone.now() - timedelta(seconds=1))

        def contend(index: int, original: Job = original) -> bool:
            if index == 2:
                refired = store.requeue_expired_lease_job(original.id, by="reaper", via="race")
                return refired is not None
            done = store.complete_job_with_notifications(
                original, {"status": "done" if index else "error"}, notes(None, None)
            )
            return done is not None

        results = in_parallel(3, contend)

        assert results.count(True) == 1, (round_number, results)
        job = Job.objects.get(id=original.id)
        entries = finished_entries(original.id)
        rows = Notification.objects.filter(job_id=original.id)
        if results[2]:
            winners["reaper"] += 1
            assert job.status == JobStatus.QUEUED and job.claim_token is None
            assert entries == [] and not rows.exists()
        else:
            winners["completion"] += 1
            assert job.status == (JobStatus.DONE if results[1] else JobStatus.ERROR)
            assert len(entries) == 1 and rows.count() == 2
            assert entries[0].detail["status"] == job.status
    assert sum(winners.values()) == 25, winners


def test_two_jobs_racing_for_one_key_leave_exactly_one_finished(
    store: DatabaseStateStore,
) -> None:
    for round_number in range(10):
        jobs = [claimed(store, f"k{round_number}-{n}", f"k{round_number}-{n}") for n in (0, 1)]
        key = f"shared-{round_number}"

        def finish(index: int, jobs: list[Job] = jobs, key: str = key) -> str:
            try:
                done = store.complete_job_with_notifications(
                    jobs[index], {"status": "done"}, notes(f"own-{key}-{index}", key)
                )
            except DuplicateNotification:
                return "duplicate"
            return "finished" if done is not None else "fenced"

        outcomes = in_parallel(2, finish)

        assert sorted(outcomes) == ["duplicate", "finished"], outcomes
        winner = jobs[outcomes.index("finished")]
        loser = jobs[outcomes.index("duplicate")]
        assert Notification.objects.get(idempotency_key=key).job_id == winner.id
        assert Notification.objects.filter(job_id=winner.id).count() == 2
        assert not Notification.objects.filter(job_id=loser.id).exists()
        stored = Job.objects.get(id=loser.id)
        assert (stored.status, stored.claim_token) == (JobStatus.RUNNING, loser.claim_token)
        assert finished_entries(loser.id) == []


# --- prepared statements at Django's defaults -----------------------------------------------


def _prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [" ".join(row[0].split()[:3]) for row in cursor.fetchall()]


def _drain(store: DatabaseStateStore, jobs: int, prefix: str) -> None:
    for n in range(jobs):
        job = claimed(store, f"{prefix}-{n}")
        assert store.complete_job_with_notifications(job, {"status": "done"}, notes(None))


@pytest.fixture
def fresh_connection() -> Any:
    """The test's connection closed first, so its psycopg statement cache starts empty."""
    connection.close()
    yield connection
    connection.close()


def test_the_hot_statements_are_prepared_at_djangos_defaults(
    store: DatabaseStateStore, fresh_connection: Any
) -> None:
    assert "prepare_threshold" not in connection.settings_dict["OPTIONS"]
    _drain(store, 7, "warm")

    prepared = _prepared_statements()
    assert "WITH moved AS" in prepared  # the outbox completion
    assert "WITH picked AS" in prepared  # the claim
    # Only the hot statements: the host's connection keeps Django's setting.
    assert len(prepared) == 2
    assert connection.connection.prepare_threshold is None


def test_with_the_setting_off_nothing_is_prepared(
    store: DatabaseStateStore, fresh_connection: Any, settings: Any
) -> None:
    settings.JOBSTATE = {"PREPARED_STATEMENTS": False}
    _drain(store, 7, "cold")
    assert _prepared_statements() == []


def test_a_rollback_or_a_failed_prepared_statement_leaves_the_connection_working(
    store: DatabaseStateStore, fresh_connection: Any
) -> None:
    _drain(store, 7, "warm")
    assert "WITH moved AS" in _prepared_statements()

    class Abandon(Exception):
        pass

    # A rolled-back transaction makes psycopg forget (and deallocate) what it prepared.
    with pytest.raises(Abandon), transaction.atomic():
        _drain(store, 1, "rolled-back")
        raise Abandon
    assert _prepared_statements() == []
    first = claimed(store, "after-rollback")
    assert store.complete_job_with_notifications(first, {"status": "done"}, notes("taken"))

    _drain(store, 7, "again")
    second = claimed(store, "duplicate")
    with pytest.raises(DuplicateNotification):
        store.complete_job_with_notifications(second, {"status": "done"}, notes("taken"))
    assert connection.connection.prepare_threshold is None
    assert store.complete_job_with_notifications(second, {"status": "done"}, notes("free"))
    assert "WITH moved AS" in _prepared_statements()


def test_concurrent_workers_at_djangos_defaults_finish_every_job_once(
    store: DatabaseStateStore,
) -> None:
    for n in range(120):
        store.create_job(request_id=f"w{n}", target="pool")
    finished: list[uuid.UUID] = []
    guard = threading.Lock()

    def work(index: int) -> int:
        count = 0
        while (job := store.claim_next_inhub_job(["pool"], f"worker-{index}")) is not None:
            done = store.complete_job_with_notifications(job, {"status": "done"}, notes(None))
            assert done is not None
            with guard:
                finished.append(done.id)
            count += 1
        return count

    counts = in_parallel(4, work)

    assert sum(counts) == 120 and len(set(finished)) == 120
    assert Job.objects.filter(status=JobStatus.DONE).count() == 120
    assert AuditEntry.objects.filter(event="finished").count() == 120
    assert Notification.objects.count() == 120
