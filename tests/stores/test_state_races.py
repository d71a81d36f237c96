"""Races against PostgreSQL with real concurrent connections (one per thread).

Each test releases its threads together through a barrier and checks the outcome in
the database afterwards, so a guarantee that only holds for one connection at a time
fails here.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobstate.exceptions import ThreadQuotaExceeded
from jobstate.models import Job, RuntimeLock
from jobstate.stores.base import CompletionOutcome, JobStatus
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.factories import RuntimeLockFactory
from tests.support.threads import WORKERS, in_parallel

pytestmark = [
    pytest.mark.concurrent,
    pytest.mark.mysql,
    pytest.mark.django_db(transaction=True),
]


def test_eight_executors_claim_every_ready_job_exactly_once() -> None:
    store = DatabaseStateStore()
    ready = {store.create_job(request_id=f"r{n}", target="exec").id for n in range(200)}
    delayed = store.create_job(
        request_id="later", target="exec", run_after=datetime.now(UTC) + timedelta(hours=1)
    )

    def executor(index: int) -> list[Any]:
        claimed = []
        while (job := store.claim_next_job(["exec"], f"executor-{index}")) is not None:
            claimed.append((job.id, job.claim_token))
        return claimed

    per_worker = in_parallel(WORKERS, executor)
    ids = [job_id for claims in per_worker for job_id, _ in claims]
    assert len(ids) == len(set(ids)) == len(ready)
    assert set(ids) == ready
    assert len({token for claims in per_worker for _, token in claims}) == len(ready)
    assert sum(1 for claims in per_worker if claims) > 1  # the work really was shared
    assert Job.objects.filter(status=JobStatus.DISPATCHED).count() == len(ready)
    assert Job.objects.get(id=delayed.id).status == JobStatus.QUEUED


def test_two_jobs_of_one_thread_never_run_at_once() -> None:
    store = DatabaseStateStore()
    threads = range(1, 7)
    order: dict[int, list[Any]] = {
        thread: [
            store.create_job(request_id=f"t{thread}-{n}", target="llm", thread_id=thread).id
            for n in range(6)
        ]
        for thread in threads
    }
    for n in range(12):
        store.create_job(request_id=f"free-{n}", target="llm")
    total = Job.objects.count()
    running: Counter[int] = Counter()
    overlaps: list[int] = []
    finished: dict[int, list[Any]] = defaultdict(list)
    done = Counter[str]()
    guard = threading.Lock()
    deadline = time.monotonic() + 30

    def worker(index: int) -> None:
        rng = random.Random(index)
        while time.monotonic() < deadline:
            job = store.claim_next_inhub_job(["llm"], f"worker-{index}")
            if job is None:
                with guard:
                    if done["jobs"] == total:
                        return
                time.sleep(0.001)
                continue
            thread = job.thread_id
            if thread is not None:
                with guard:
                    if running[thread]:
                        overlaps.append(thread)
                    running[thread] += 1
            time.sleep(rng.uniform(0, 0.004))
            if thread is not None:
                with guard:
                    running[thread] -= 1
                    finished[thread].append(job.id)
            assert job.claim_token is not None
            outcome = store.complete_claimed_job(job.id, job.claim_token, JobStatus.DONE)
            assert outcome.completed
            with guard:
                done["jobs"] += 1

    in_parallel(WORKERS, worker)
    assert overlaps == [], f"threads {sorted(set(overlaps))} ran two jobs at once"
    assert done["jobs"] == total
    assert Job.objects.filter(status=JobStatus.DONE).count() == total
    for thread in threads:
        assert finished[thread] == order[thread], f"thread {thread} ran out of order"


def test_concurrent_acquisition_of_a_lock_has_one_winner() -> None:
    store = DatabaseStateStore()
    # A free key, and a key whose holder's lease has just run out.
    RuntimeLockFactory(
        lock_key="expired", owner="gone", expires_at=datetime(2000, 1, 1, tzinfo=UTC)
    )
    for key in ("free", "expired"):
        won = in_parallel(
            WORKERS, lambda i, key=key: store.acquire_runtime_lock(key, f"o{i}", timedelta(hours=1))
        )
        assert won.count(True) == 1, f"{won.count(True)} owners took {key!r}"
        winner = f"o{won.index(True)}"
        assert RuntimeLock.objects.get(lock_key=key).owner == winner


def test_concurrent_enqueues_of_one_request_create_one_job() -> None:
    store = DatabaseStateStore()
    outcomes = in_parallel(
        WORKERS, lambda i: store.enqueue(request_id="once", target="t", input={"n": 1})
    )
    assert len({job.id for job, _ in outcomes}) == 1
    assert [created for _, created in outcomes].count(True) == 1
    assert Job.objects.filter(request_id="once").count() == 1


def test_the_thread_quota_is_exact_under_concurrent_enqueues(settings) -> None:
    settings.JOBSTATE = {**settings.JOBSTATE, "THREAD_INFLIGHT_QUOTA": 3}
    store = DatabaseStateStore()

    def enqueue(index: int) -> str:
        try:
            store.enqueue(request_id=f"q{index}", target="t", thread_id=42)
        except ThreadQuotaExceeded:
            return "refused"
        return "created"

    results = in_parallel(WORKERS, enqueue)
    assert results.count("created") == 3
    assert results.count("refused") == WORKERS - 3
    assert store.count_inflight_by_thread(42) == 3


def test_a_late_report_and_a_requeue_never_both_land() -> None:
    store = DatabaseStateStore()
    claims = []
    for n in range(20):
        store.create_job(request_id=f"race-{n}", target="exec")
        job = store.claim_next_job(["exec"], "slow-executor")
        assert job is not None and job.claim_token is not None
        claims.append(job)
    Job.objects.update(lease_until=datetime(2000, 1, 1, tzinfo=UTC))

    def actor(index: int) -> Any:
        if index == 0:
            return store.requeue_stale_dispatched(timedelta(hours=1), timedelta(hours=2))
        return [
            store.complete_claimed_job(job.id, job.claim_token, JobStatus.DONE).outcome
            for job in claims
        ]

    requeued, reports = in_parallel(2, actor)
    completed = reports.count(CompletionOutcome.COMPLETED)
    assert completed + requeued == len(claims)
    assert reports.count(CompletionOutcome.STALE_CLAIM) == requeued
    assert Job.objects.filter(status=JobStatus.DONE).count() == completed
    assert Job.objects.filter(status=JobStatus.QUEUED, claim_token=None).count() == requeued


def test_concurrent_sweeps_count_each_requeued_job_once() -> None:
    store = DatabaseStateStore()
    for n in range(60):
        store.create_job(request_id=f"s{n}", target="exec")
        assert store.claim_next_job(["exec"], "dead-executor") is not None
    Job.objects.update(lease_until=datetime(2000, 1, 1, tzinfo=UTC))
    moved = in_parallel(
        4, lambda i: store.requeue_stale_dispatched(timedelta(hours=1), timedelta(hours=2))
    )
    assert sum(moved) == 60
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == 60


def test_a_head_that_comes_due_mid_claim_never_runs_beside_its_successor() -> None:
    # Each thread has a delayed head and a ready job behind it. Until the head is due the
    # job behind it may run; from then on the head goes first. Claims in flight exactly
    # when the heads come due see the thread from two sides of that instant; without
    # per-thread serialisation both jobs of a thread end up running.
    store = DatabaseStateStore()
    due = datetime.now(UTC) + timedelta(milliseconds=400)
    Job.objects.bulk_create(
        Job(request_id=f"{kind}{thread}", target="x", thread_id=thread, run_after=run_after)
        for thread in range(300)
        for kind, run_after in (("head", due), ("next", None))
    )

    def worker(index: int) -> None:
        time.sleep(max(0.0, (due - datetime.now(UTC)).total_seconds() - 0.04))
        stop = time.monotonic() + 0.3
        while time.monotonic() < stop:
            store.claim_next_inhub_job(["x"], f"worker-{index}")

    in_parallel(WORKERS, worker)
    running = Counter(
        Job.objects.filter(status=JobStatus.RUNNING).values_list("thread_id", flat=True)
    )
    assert running, "no job was claimed"
    assert max(running.values()) == 1, [t for t, n in running.items() if n > 1]
