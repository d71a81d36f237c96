"""The state store's task methods on the database store (PostgreSQL and SQLite) and
the in-memory store: claim order, queues and delays, what a claim writes, lease renewal
in one statement, the recovery of lost attempts, and what the other sweeps leave alone.
On PostgreSQL: concurrent claims never hand a task out twice, and the claim is read from
its index in claim order."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobstate import maintenance
from jobstate.core.attempt_log import AttemptOutcome, read_attempt_log
from jobstate.core.states import JobStatus, NewTask
from jobstate.exceptions import InvalidJobState, UnsupportedStoreOperation
from jobstate.models import AuditEntry, Job
from jobstate.stores.base import StateStore
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.backends.postgresql import task_claim
from jobstate.testing.memory_state import MemoryStateStore
from tests.support.plans import plans_without_table_scans

pytestmark = pytest.mark.mysql

TARGET = "tasks:default"
LEASE = timedelta(minutes=1)
LONG_AGO = timezone.now() - timedelta(days=1)


@pytest.fixture
def store(any_store: StateStore) -> StateStore:
    """Every test here runs on the database store and on the in-memory one."""
    return any_store


def new_task(
    path: str = "tests.support.task_functions.add",
    *,
    queue: str = "default",
    priority: int = 0,
    run_after: Any = None,
    max_attempts: int = 3,
    target: str = TARGET,
) -> NewTask:
    return NewTask(
        target=target,
        task_path=path,
        queue_name=queue,
        priority=priority,
        args=[1, 2],
        kwargs={},
        max_attempts=max_attempts,
        run_after=run_after,
    )


def claim(
    store: StateStore, queues: list[str] | None = None, limit: int = 10, **kw: Any
) -> list[Job]:
    return store.claim_tasks(
        target=kw.get("target", TARGET),
        queues=["default"] if queues is None else queues,
        worker_id=kw.get("worker_id", "w-1"),
        lease=kw.get("lease", LEASE),
        limit=limit,
    )


def expire(store: StateStore, job: Job) -> None:
    store.update_job(job.id, lease_until=LONG_AGO)


def test_tasks_are_claimed_by_priority_then_due_time_then_enqueue_order(store: StateStore) -> None:
    now = timezone.now()
    low = store.enqueue_task(new_task(priority=-5))
    first = store.enqueue_task(new_task())
    second = store.enqueue_task(new_task())
    # Enqueued last, but due an hour ago (a retry or a deferred task that came due).
    overdue = store.enqueue_task(new_task(run_after=now - timedelta(hours=1)))
    urgent = store.enqueue_task(new_task(priority=50))
    store.enqueue_task(new_task(run_after=now + timedelta(hours=1)))  # not due yet

    order = [job.id for job in claim(store)]
    assert order == [urgent.id, overdue.id, first.id, second.id, low.id]


def test_a_claim_takes_only_its_target_and_queues(store: StateStore) -> None:
    default = store.enqueue_task(new_task())
    emails = store.enqueue_task(new_task(queue="emails"))
    other_backend = store.enqueue_task(new_task(target="tasks:other"))
    hub = store.create_job(request_id="hub", target=TARGET)  # a job that is no task

    assert claim(store, []) == []
    assert [job.id for job in claim(store, ["emails", "reports"])] == [emails.id]
    assert [job.id for job in claim(store, ["default"])] == [default.id]
    anywhere = store.claim_tasks(
        target="tasks:other", queues=None, worker_id="w", lease=LEASE, limit=5
    )
    assert [job.id for job in anywhere] == [other_backend.id]
    assert store.get_job(hub.id).status == JobStatus.QUEUED  # type: ignore[union-attr]


def test_a_claim_starts_an_attempt(store: StateStore) -> None:
    later = timezone.now() - timedelta(seconds=1)
    queued = [store.enqueue_task(new_task(run_after=later)) for _ in range(3)]
    claimed = claim(store, limit=2, worker_id="worker-7")
    assert len(claimed) == 2
    for job in claimed:
        assert job.status == JobStatus.RUNNING and job.executor_id == "worker-7"
        assert job.attempts == 1 and job.claimed_at is not None and job.dispatched_at is None
        assert job.lease_until is not None and job.lease_until > timezone.now()
        assert job.run_after == later  # kept: the task's run_after, as enqueued
    assert len({job.claim_token for job in claimed}) == 2
    assert [job.id for job in claim(store)] == [queued[2].id]
    assert claim(store) == []


def test_claim_arguments_are_checked_before_anything_is_written(store: StateStore) -> None:
    store.enqueue_task(new_task())
    bad: list[dict[str, Any]] = [
        {"target": "default"},
        {"queues": "default"},
        {"worker_id": ""},
        {"lease": timedelta(0)},
        {"limit": 0},
    ]
    for override in bad:
        arguments = {
            "target": TARGET,
            "queues": ["default"],
            "worker_id": "w",
            "lease": LEASE,
            "limit": 1,
        }
        with pytest.raises(InvalidJobState):
            store.claim_tasks(**{**arguments, **override})
    assert [job.status for job in store.list_jobs_by_status(["queued"])] == ["queued"]


def test_one_renewal_renews_every_current_claim_and_names_them(store: StateStore) -> None:
    for _ in range(3):
        store.enqueue_task(new_task())
    held = claim(store, lease=timedelta(seconds=5))
    lost = held[0]
    store.complete_claimed_job(lost.id, lost.claim_token, "queued")  # recovered meanwhile
    pairs = [(job.id, job.claim_token) for job in held]
    renewed = store.extend_claim_leases(pairs, timedelta(hours=1))
    assert sorted(renewed) == sorted(job.id for job in held[1:])
    for job in held[1:]:
        lease_until = store.get_job(job.id).lease_until  # type: ignore[union-attr]
        assert lease_until is not None and lease_until > timezone.now() + timedelta(minutes=50)
    with pytest.raises(InvalidJobState, match="twice"):
        store.extend_claim_leases([pairs[1], pairs[1]], LEASE)
    with pytest.raises(InvalidJobState):
        store.extend_claim_leases(pairs, timedelta(0))
    assert store.extend_claim_leases([], LEASE) == []


@pytest.mark.django_db
def test_a_worker_renews_all_its_leases_in_one_statement() -> None:
    """One statement; on MariaDB and MySQL a locking read (passing over rows another
    transaction holds) and the ``UPDATE``."""
    store = DatabaseStateStore()
    for _ in range(5):
        store.enqueue_task(new_task())
    pairs = [(job.id, job.claim_token) for job in claim(store)]
    with CaptureQueriesContext(connection) as captured:
        assert len(store.extend_claim_leases(pairs, LEASE)) == 5
    statements = [
        query["sql"]
        for query in captured.captured_queries
        if not query["sql"].startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))
    ]
    ops = database_ops("default")
    assert len(statements) == (2 if ops.locks_rows and not ops.hot_statements else 1)


def test_a_lost_attempt_is_recorded_and_the_task_retried_until_none_is_left(
    store: StateStore,
) -> None:
    task = store.enqueue_task(new_task(max_attempts=2))
    (first,) = claim(store, worker_id="died-1")
    expire(store, first)
    assert store.count_expired_tasks().requeued == 1
    recovery = store.recover_expired_tasks()
    assert (recovery.requeued, recovery.failed) == (1, 0)
    job = store.get_job(task.id)
    assert job is not None and job.status == JobStatus.QUEUED and job.attempts == 1
    assert job.claim_token is None and job.executor_id is None
    (lost,) = read_attempt_log(job.attempt_log)
    assert (lost.worker_id, lost.outcome) == ("died-1", AttemptOutcome.WORKER_LOST)
    assert lost.exception_class_path == "jobstate.exceptions.WorkerLost"
    assert "stopped renewing its lease" in (job.error or "")

    (second,) = claim(store, worker_id="died-2")
    assert second.attempts == 2
    expire(store, second)
    assert store.count_expired_tasks().failed == 1
    recovery = store.recover_expired_tasks()
    assert (recovery.requeued, recovery.failed) == (0, 1)
    job = store.get_job(task.id)
    assert job is not None and job.status == JobStatus.ERROR
    assert [a.worker_id for a in read_attempt_log(job.attempt_log)] == ["died-1", "died-2"]
    entries = store.list_audit(job=task)
    assert [(e.event, e.severity) for e in entries] == [
        ("recovered", "warning"),
        ("recovered", "error"),
    ]
    assert store.recover_expired_tasks().total == 0


def test_a_live_claim_and_a_finished_one_are_not_recovered(store: StateStore) -> None:
    store.enqueue_task(new_task())
    store.enqueue_task(new_task())
    live, finished = claim(store)
    store.complete_claimed_job(finished.id, finished.claim_token, "done", result=3)
    expire(store, finished)  # a terminal job's stale lease means nothing
    assert store.recover_expired_tasks().total == 0
    assert store.get_job(live.id).status == JobStatus.RUNNING  # type: ignore[union-attr]


def test_a_refire_starts_the_task_over(store: StateStore) -> None:
    task = store.enqueue_task(new_task(max_attempts=1))
    (held,) = claim(store)
    expire(store, held)
    store.recover_expired_tasks()
    assert store.get_job(task.id).status == JobStatus.ERROR  # type: ignore[union-attr]
    again = store.requeue_job(task.id, from_statuses=["error"], by="ops", via="test")
    assert again is not None and again.status == JobStatus.QUEUED
    assert (again.attempts, again.attempt_log, again.error) == (0, [], None)
    rerun = [e for e in store.list_audit(job=task) if e.event == "rerun"]
    assert rerun[0].detail["previous_attempts"] == 1


def test_enqueue_task_checks_what_it_stores(store: StateStore) -> None:
    for bad, error in [
        (new_task(target="default"), InvalidJobState),
        (new_task(path=""), InvalidJobState),
        (new_task(queue="q" * 101), Exception),
        (new_task(max_attempts=0), Exception),
    ]:
        with pytest.raises(error):
            store.enqueue_task(bad)
    assert store.list_jobs_by_status(["queued"]) == []


def test_a_store_without_tasks_refuses_them() -> None:
    class NoTasks(MemoryStateStore):
        supports_tasks = False

    with pytest.raises(UnsupportedStoreOperation, match="supports_tasks"):
        NoTasks().enqueue_task(new_task())
    with pytest.raises(UnsupportedStoreOperation, match="claim_tasks"):
        claim(NoTasks())


@pytest.mark.django_db
def test_the_queue_ttl_and_the_worker_lease_sweep_leave_tasks_alone(settings: Any) -> None:
    store = DatabaseStateStore()
    waiting = store.enqueue_task(new_task())
    store.enqueue_task(new_task())
    (held,) = claim(store, limit=1)
    Job.objects.filter(id__in=[waiting.id, held.id]).update(created_at=LONG_AGO)
    expire(store, held)
    report = maintenance.run_reaping_sweeps()
    counts = report.as_dict()
    assert (counts["queued"], counts["leases"]) == (0, 0)
    assert (counts["tasks"], counts["tasks_requeued"]) == (1, 1)
    assert store.expire_stale_queued(timedelta(seconds=1)) == 0
    assert Job.objects.get(id=held.id).attempt_log[0]["outcome"] == "worker lost"
    assert AuditEntry.objects.filter(job_id=held.id, event="recovered").count() == 1


# --- PostgreSQL: concurrency and plans ------------------------------------------------


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_hand_each_task_out_once() -> None:
    store = DatabaseStateStore()
    total = 300
    for n in range(total):
        store.enqueue_task(new_task(queue=("default", "emails")[n % 2], priority=n % 3))
    claimed: list[uuid.UUID] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def worker(name: str) -> None:
        try:
            start.wait()
            while True:
                jobs = claim(store, ["default", "emails"], limit=7, worker_id=name)
                if not jobs:
                    return
                with lock:
                    claimed.extend(job.id for job in jobs)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(f"w-{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(claimed) == total and len(set(claimed)) == total
    assert Job.objects.filter(status=JobStatus.RUNNING, attempts=1).count() == total


class RowHolder:
    """A transaction on a connection of its own that holds a job's row locked (as a task
    that ran ``select_for_update()`` on its own job would) until :meth:`release`."""

    def __init__(self, pk: uuid.UUID) -> None:
        self._locked, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._hold, args=(pk,), daemon=True)

    def _hold(self, pk: uuid.UUID) -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(id=pk)
                self._locked.set()
                self._release.wait(20)
        finally:
            connections.close_all()

    def __enter__(self) -> RowHolder:
        self._thread.start()
        assert self._locked.wait(10), "the row was not locked"
        return self

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join(10)


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_a_renewal_and_a_recovery_pass_over_a_row_another_transaction_holds() -> None:
    """Both waited for the lock: a task that locked its own job's row held up its
    worker's lease renewal for every task, and every worker's recovery sweep once its
    lease had run out, until it let go."""
    store = DatabaseStateStore()
    for _ in range(2):
        store.enqueue_task(new_task())
    locked, free = claim(store)
    expire(store, locked)
    pairs = [(job.id, job.claim_token) for job in (locked, free)]
    with RowHolder(locked.id):
        started = time.monotonic()
        assert store.extend_claim_leases(pairs, timedelta(hours=1)) == [free.id]
        expire(store, free)
        recovery = store.recover_expired_tasks()
        assert time.monotonic() - started < 5
    assert (recovery.requeued, recovery.failed) == (1, 0)  # the free one, expired since
    assert store.get_job(locked.id).status == JobStatus.RUNNING  # type: ignore[union-attr]
    # Once let go, the claim is renewed again (or recovered, its lease having run out).
    assert store.extend_claim_leases(pairs[:1], LEASE) == [locked.id]


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("queues", [["default"], ["default", "emails"], None])
def test_the_claim_reads_its_index_in_claim_order(queues: list[str] | None) -> None:
    store = DatabaseStateStore()
    for n in range(200):
        store.enqueue_task(new_task(queue=("default", "emails")[n % 2], priority=n % 5))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")
    sql, params = task_claim(connection, TARGET, queues, "w", LEASE, 8, uuid.uuid4())
    (plan,) = plans_without_table_scans(connection, [connection.ops.compose_sql(sql, params)])
    assert "jobstate_job_task_claim_idx" in plan, plan
    # Each queue's part of the index is read in claim order: the tasks of a queue are
    # never sorted. With several queues only the few rows picked (at most LIMIT per
    # queue) are merged by a sort.
    assert "Sort Key: c" not in plan, plan
    if queues == ["default"]:
        assert "Sort" not in plan, plan
