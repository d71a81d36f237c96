"""What ``DatabaseStateStore`` promises beyond the contract: its SQL, its settings, its
transactions and its schema."""

from __future__ import annotations

import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connection, connections, transaction
from django.db.models.signals import post_init, pre_init
from django.test.utils import CaptureQueriesContext

from jobstate.core.conf import jobstate_settings
from jobstate.exceptions import DuplicateRequestId, ImproperlyConfiguredStore, LockHeld
from jobstate.models import (
    JOB_UNIQUE_REQUEST_ID,
    AuditEntry,
    Job,
    RuntimeLock,
    time_ordered_uuid,
)
from jobstate.stores import get_state_store
from jobstate.stores.base import JobStatus, StateStore, runtime_lock
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore

pytestmark = pytest.mark.django_db

OLD = datetime(1999, 6, 1, tzinfo=UTC)


def jobstate(settings: Any, **values: object) -> None:
    """Override some JOBSTATE settings for one test (the ``settings`` fixture restores)."""
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), **values}


# --- loading and settings --------------------------------------------------------------


def test_get_state_store_loads_the_configured_class(settings) -> None:
    assert isinstance(get_state_store(), DatabaseStateStore)
    assert get_state_store(using="default").using == "default"
    jobstate(settings, STATE_STORE="jobstate.testing.memory_state.MemoryStateStore")
    assert isinstance(get_state_store(), MemoryStateStore)


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("jobstate.stores.database.DatabaseJobRunStore", "is not a StateStore"),
        ("jobstate.stores.nowhere.Store", "Cannot import store"),
    ],
)
def test_get_state_store_refuses_what_is_not_a_state_store(settings, path, message) -> None:
    jobstate(settings, STATE_STORE=path)
    with pytest.raises(ImproperlyConfiguredStore, match=message):
        get_state_store()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("THREAD_INFLIGHT_QUOTA", 0),
        ("THREAD_INFLIGHT_QUOTA", "3"),
        ("LIST_LIMIT", None),
        ("AUDIT_PRUNE_BATCH_SIZE", True),
        ("RETENTION_BATCH_SIZE", 0),
        ("WORKER_LEASE", 600),
        ("QUEUED_TTL", timedelta(0)),
        ("METRICS_EXACT_LIMIT", 0),
        ("MAX_PAYLOAD_BYTES", "1MB"),
        ("ERROR_TEXT_LIMIT", 0),
        ("OBSERVABILITY_TOKEN", ""),
        ("OBSERVABILITY_TOKEN", 1234),
        ("ADMIN_REDACTED_KEYS", "password"),
        ("ADMIN_REDACTED_KEYS", ["password", ""]),
    ],
)
def test_bad_queue_settings_are_refused(settings, name, value) -> None:
    jobstate(settings, **{name: value})
    with pytest.raises(ImproperlyConfigured, match=name):
        getattr(jobstate_settings, name)


def test_list_limit_bounds_every_listing_by_default(settings, store) -> None:
    jobstate(settings, LIST_LIMIT=2)
    for n in range(3):
        store.create_job(request_id=f"r{n}", target="t", status=JobStatus.RUNNING)
    assert len(store.list_jobs_by_status([JobStatus.RUNNING])) == 2
    assert len(store.list_expired_leases([JobStatus.RUNNING], timedelta(0))) == 2
    assert len(store.list_jobs_by_status([JobStatus.RUNNING], limit=3)) == 3


def test_maintenance_defaults_come_from_settings(settings, store) -> None:
    jobstate(settings, QUEUED_TTL=timedelta(minutes=1), EXECUTOR_HARD_CAP=timedelta(hours=5))
    stale = store.create_job(request_id="stale", target="q")
    Job.objects.filter(id=stale.id).update(created_at=datetime(2020, 1, 1, tzinfo=UTC))
    store.create_job(request_id="young", target="q")
    assert store.expire_stale_queued() == 1
    assert Job.objects.get(id=stale.id).status == JobStatus.ERROR

    store.create_job(request_id="d", target="t")
    claimed = store.claim_next_job(["t"], "e")
    assert claimed is not None
    assert claimed.lease_until is not None and claimed.claimed_at is not None
    assert claimed.lease_until - claimed.claimed_at == jobstate_settings.EXECUTOR_LEASE
    store.update_job(claimed.id, dispatched_at=datetime.now(UTC) - timedelta(hours=4))
    assert store.requeue_stale_dispatched() == 0  # within the 5-hour cap
    jobstate(settings, EXECUTOR_HARD_CAP=timedelta(hours=3))
    assert store.requeue_stale_dispatched() == 1


def test_lease_extension_defaults_to_the_lease_of_the_claim_kind(store) -> None:
    store.create_job(request_id="a", target="t")
    store.create_job(request_id="b", target="u")
    running = store.claim_next_inhub_job(["t"], "w", timedelta(seconds=5))
    dispatched = store.claim_next_job(["u"], "e", timedelta(seconds=5))
    assert running is not None and dispatched is not None
    for job, lease in (
        (running, jobstate_settings.WORKER_LEASE),
        (dispatched, jobstate_settings.EXECUTOR_LEASE),
    ):
        assert job.claim_token is not None
        assert store.extend_claim_lease(job.id, job.claim_token)
        renewed = Job.objects.get(id=job.id)
        assert renewed.lease_until is not None
        assert renewed.lease_until - renewed.updated_at == lease


# --- writes are narrow and transactional ------------------------------------------------


def test_a_patch_writes_only_its_own_columns(store) -> None:
    job = store.create_job(request_id="narrow", target="t")
    with CaptureQueriesContext(connection) as queries:
        store.update_job(job.id, result={"ok": True})
    (update,) = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert '"result"' in update and '"updated_at"' in update
    for column in ("input", "metadata", "status", "target", "claim_token"):
        assert f'"{column}" =' not in update


def test_a_duplicate_leaves_the_hosts_transaction_usable(store) -> None:
    store.create_job(request_id="dup", input={"n": 1})
    with transaction.atomic():
        with pytest.raises(DuplicateRequestId) as caught:
            store.create_job(request_id="dup", input={"n": 2})
        # The store rolled back only its savepoint: the host can go on writing.
        store.create_job(request_id="after-dup")
    assert caught.value.request_id == "dup"
    assert isinstance(caught.value.__cause__, DatabaseError)
    assert set(Job.objects.values_list("request_id", flat=True)) == {"dup", "after-dup"}


def test_the_request_id_constraint_is_named_for_the_store_to_match() -> None:
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, Job._meta.db_table)
    assert constraints[JOB_UNIQUE_REQUEST_ID]["unique"]
    assert constraints[JOB_UNIQUE_REQUEST_ID]["columns"] == ["request_id"]
    for index in (
        "jobstate_job_claim_idx",
        "jobstate_job_thread_idx",
        "jobstate_job_lease_idx",
        "jobstate_job_executor_idx",
        "jobstate_job_created_idx",
        "jobstate_job_metrics_idx",
    ):
        assert index in constraints, index


def test_a_claim_rolled_back_with_the_hosts_transaction_leaves_the_job_queued(store) -> None:
    job = store.create_job(request_id="rb", target="t")

    class Abort(Exception):
        pass

    with pytest.raises(Abort), transaction.atomic():
        assert store.claim_next_inhub_job(["t"], "w") is not None
        raise Abort
    assert Job.objects.get(id=job.id).status == JobStatus.QUEUED


def test_jobs_queued_in_one_burst_run_in_queue_order_within_a_thread(store) -> None:
    # Many jobs share a database timestamp here; the time-ordered ids keep them in order.
    jobs = [store.create_job(request_id=f"fifo-{n}", target="t", thread_id=7) for n in range(30)]
    seen = []
    for _ in jobs:
        claimed = store.claim_next_inhub_job(["t"], "w")
        assert claimed is not None and claimed.claim_token is not None
        seen.append(claimed.id)
        store.complete_claimed_job(claimed.id, claimed.claim_token, JobStatus.DONE)
    assert seen == [job.id for job in jobs]


def test_time_ordered_ids_increase_within_a_millisecond() -> None:
    ids = [time_ordered_uuid() for _ in range(5000)]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert {value.version for value in ids} == {7}


# --- audit ------------------------------------------------------------------------------


def test_prune_deletes_in_bounded_batches(store) -> None:
    for n in range(5):
        store.append_audit(request_id=f"old-{n}", event="received", at=OLD)
    store.append_audit(request_id="new", event="received")
    with CaptureQueriesContext(connection) as queries:
        deleted = store.prune_audit_older_than(datetime(2000, 1, 1, tzinfo=UTC), batch_size=2)
    statements = [q["sql"] for q in queries.captured_queries]
    assert deleted == 5
    # 2 + 2 + 1 (the five share one timestamp, so the batches resume within a tie): each
    # batch its own delete and transaction, each pick bounded by the batch size.
    assert len([sql for sql in statements if "DELETE" in sql]) == 3
    assert len([sql for sql in statements if "LIMIT 2" in sql]) == 3
    assert list(AuditEntry.objects.values_list("request_id", flat=True)) == ["new"]


def test_audit_entries_outlive_their_job(store) -> None:
    job = store.create_job(request_id="gone")
    store.append_audit(job=str(job.id), event="received")
    Job.objects.filter(id=job.id).delete()
    (entry,) = store.list_audit(job=job.id)
    assert entry.job_id == job.id
    assert entry.request_id == ""  # only a Job instance supplies its request_id


# --- locks ------------------------------------------------------------------------------


def test_lock_expiry_follows_the_database_clock(store) -> None:
    assert store.acquire_runtime_lock("k", "a", timedelta(hours=1))
    lock = RuntimeLock.objects.get(lock_key="k")
    assert lock.owner == "a"
    RuntimeLock.objects.filter(lock_key="k").update(expires_at=datetime(2000, 1, 1, tzinfo=UTC))
    assert store.acquire_runtime_lock("k", "b", timedelta(hours=1))
    assert RuntimeLock.objects.get(lock_key="k").owner == "b"
    store.release_runtime_lock("k", "b")
    assert not RuntimeLock.objects.exists()


def test_a_nested_block_of_the_same_owner_leaves_the_lock_to_the_outer_one(
    any_store: StateStore,
) -> None:
    held = any_store
    with runtime_lock(held, "nightly", "alice", timedelta(minutes=5)):
        with runtime_lock(held, "nightly", "alice", timedelta(minutes=5)):
            pass
        # Still inside alice's outer block: the key is not free for bob.
        assert not held.acquire_runtime_lock("nightly", "bob", timedelta(minutes=5))
        with pytest.raises(LockHeld), runtime_lock(held, "nightly", "bob", timedelta(minutes=5)):
            pass
    assert held.acquire_runtime_lock("nightly", "bob", timedelta(minutes=5))


# --- PostgreSQL: SKIP LOCKED -------------------------------------------------------------


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_a_claim_passes_over_a_row_another_transaction_holds(store) -> None:
    first = store.create_job(request_id="held", target="t")
    second = store.create_job(request_id="free", target="t")
    locked, release = threading.Event(), threading.Event()

    def hold_first_row() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(id=first.id)
                locked.set()
                release.wait(timeout=10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_first_row)
    holder.start()
    try:
        assert locked.wait(timeout=10)
        claimed = store.claim_next_inhub_job(["t"], "w")
    finally:
        release.set()
        holder.join()
    assert claimed is not None and claimed.id == second.id
    assert Job.objects.get(id=first.id).status == JobStatus.QUEUED


@pytest.mark.postgres
@pytest.mark.parametrize("use_tz", [True, False])
def test_claimed_and_completed_jobs_read_back_as_the_orm_reads_them(
    store, settings, use_tz
) -> None:
    """The one-statement claim and report build their ``Job`` from the rows they
    return, with their own cursor; every field must come back as a queryset loads it:
    same values, same types, same time zone (aware UTC with ``USE_TZ``, naive
    without)."""
    settings.USE_TZ = use_tz
    store.create_job(request_id="r", target="t", input={"n": 1}, metadata={"m": [1, 2]})
    claimed = store.claim_next_inhub_job(["t"], "w")
    assert claimed is not None and claimed.claim_token is not None
    as_stored = Job.objects.get(id=claimed.id)
    completed = store.complete_claimed_job(
        claimed.id, claimed.claim_token, "done", result={"ok": True}
    ).job
    assert completed is not None
    for loaded, expected in ((claimed, as_stored), (completed, Job.objects.get(id=claimed.id))):
        for field in Job._meta.concrete_fields:
            got, want = getattr(loaded, field.attname), getattr(expected, field.attname)
            assert (got, type(got)) == (want, type(want)), field.name
            if isinstance(want, datetime):
                assert got.tzinfo is want.tzinfo, field.name
        # Built without Model.__init__ when nothing listens: the same instance state.
        assert list(vars(loaded)) == list(vars(expected))
        assert (loaded._state.adding, loaded._state.db) == (False, expected._state.db)
    assert (claimed.claimed_at.tzinfo is not None) is use_tz


@pytest.mark.postgres
def test_init_receivers_see_the_jobs_a_claim_builds(store) -> None:
    """The one-statement claim builds its jobs without ``Model.__init__`` only while no
    ``pre_init`` / ``post_init`` receiver listens for ``Job``."""
    seen: list[tuple[str, Any]] = []

    def pre(sender: Any, args: Any, kwargs: Any, **_: Any) -> None:
        seen.append(("pre", args[0]))

    def post(sender: Any, instance: Any, **_: Any) -> None:
        seen.append(("post", instance.id))

    store.create_job(request_id="r", target="t")
    pre_init.connect(pre, sender=Job)
    post_init.connect(post, sender=Job)
    try:
        claimed = store.claim_next_inhub_job(["t"], "w")
    finally:
        pre_init.disconnect(pre, sender=Job)
        post_init.disconnect(post, sender=Job)
    assert claimed is not None
    assert seen == [("pre", claimed.id), ("post", claimed.id)]


def test_malformed_job_ids_never_reach_the_database(store) -> None:
    with CaptureQueriesContext(connection) as queries, pytest.raises(ValueError):
        store.update_job("12345", error="x")
    assert queries.captured_queries == []
    assert store.get_job(uuid.uuid4()) is None
