"""The batch claim and batch report on PostgreSQL: real concurrent connections (one per
thread) released together, and the number of statements each hot path costs."""

from __future__ import annotations

import threading
import uuid
from collections import Counter, defaultdict
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobstate.models import Job
from jobstate.stores.base import ClaimReport, CompletionOutcome, JobStatus
from jobstate.stores.database import DatabaseStateStore
from tests.support.threads import WORKERS, in_parallel

pytestmark = pytest.mark.postgres


def drain_in_batches(store: DatabaseStateStore, worker: str, limit: int) -> list[uuid.UUID]:
    """Claim and complete batches until the queue answers an empty batch."""
    done: list[uuid.UUID] = []
    while True:
        jobs = store.claim_next_inhub_jobs(["batch"], worker, limit=limit)
        if not jobs:
            return done
        results = store.complete_claimed_jobs(
            [ClaimReport(job.id, job.claim_token or uuid.uuid4(), JobStatus.DONE) for job in jobs]
        )
        assert all(result.completed for result in results), "a fresh claim's report bounced"
        done.extend(job.id for job in jobs)


@pytest.mark.django_db(transaction=True)
def test_eight_batch_workers_drain_every_job_exactly_once() -> None:
    store = DatabaseStateStore()
    queued = {store.create_job(request_id=f"b{n}", target="batch").id for n in range(600)}

    drained = in_parallel(WORKERS, lambda i: drain_in_batches(store, f"w{i}", limit=25))

    counts = Counter(job_id for batch in drained for job_id in batch)
    assert set(counts) == queued, "some jobs were never claimed"
    assert max(counts.values()) == 1, "a job was claimed by two batches"
    assert Job.objects.filter(status=JobStatus.DONE).count() == 600
    assert sum(1 for batch in drained if batch) > 1, "only one worker ever got work"


@pytest.mark.django_db(transaction=True)
def test_batch_workers_keep_each_thread_in_order_and_one_at_a_time() -> None:
    store = DatabaseStateStore()
    threads = range(1, 7)
    for position in range(5):
        for thread in threads:
            store.create_job(request_id=f"t{thread}-{position}", target="batch", thread_id=thread)
        store.create_job(request_id=f"loose-{position}", target="batch")
    order: dict[int, list[str]] = defaultdict(list)
    overlaps: list[int] = []
    lock = threading.Lock()

    def work(index: int) -> int:
        claimed = 0
        while True:
            jobs = store.claim_next_inhub_jobs(["batch"], f"w{index}", limit=4)
            if not jobs:
                if not Job.objects.filter(status=JobStatus.QUEUED).exists():
                    return claimed
                continue
            with lock:
                for job in jobs:
                    if job.thread_id is None:
                        continue
                    order[job.thread_id].append(job.request_id)
                    running = Job.objects.filter(
                        thread_id=job.thread_id, status=JobStatus.RUNNING
                    ).count()
                    if running > 1:
                        overlaps.append(job.thread_id)
            store.complete_claimed_jobs(
                [ClaimReport(job.id, job.claim_token or uuid.uuid4(), "done") for job in jobs]
            )
            claimed += len(jobs)

    claimed = in_parallel(WORKERS, work)

    assert sum(claimed) == 35 == Job.objects.filter(status=JobStatus.DONE).count()
    assert not overlaps, f"threads {overlaps} had two jobs running at once"
    for thread in threads:
        assert order[thread] == [f"t{thread}-{position}" for position in range(5)]


@pytest.mark.django_db(transaction=True)
def test_batch_reports_racing_a_requeue_land_only_while_their_claim_is_current() -> None:
    store = DatabaseStateStore()
    for n in range(200):
        store.create_job(request_id=f"r{n}", target="batch")
    jobs = store.claim_next_inhub_jobs(["batch"], "worker", limit=200)
    assert len(jobs) == 200

    def work(index: int) -> Any:
        if index == 0:
            # An operator hands every job back while the worker reports.
            return Job.objects.filter(status=JobStatus.RUNNING).update(
                status=JobStatus.QUEUED, claim_token=None, executor_id=None
            )
        return store.complete_claimed_jobs(
            [ClaimReport(job.id, job.claim_token or uuid.uuid4(), "done") for job in jobs]
        )

    requeued, outcomes = in_parallel(2, work)

    completed = {
        result.job.id
        for result in outcomes
        if result.outcome is CompletionOutcome.COMPLETED and result.job
    }
    stale = [r for r in outcomes if r.outcome is CompletionOutcome.STALE_CLAIM]
    assert len(completed) + len(stale) == 200
    assert requeued + len(completed) == 200, "a row was both requeued and completed"
    assert Job.objects.filter(status=JobStatus.DONE).count() == len(completed)
    assert Job.objects.filter(status=JobStatus.QUEUED).count() == requeued


@pytest.mark.django_db
def test_the_hot_paths_cost_one_statement_each() -> None:
    store = DatabaseStateStore()
    for n in range(60):
        store.create_job(request_id=f"q{n}", target="batch", input={"n": n})
    # A claimer's first claim also writes its Workers page row; later claims within its
    # beat write nothing else.
    assert store.claim_next_inhub_job(["elsewhere"], "worker") is None
    with CaptureQueriesContext(connection) as claim:
        job = store.claim_next_inhub_job(["batch"], "worker")
    assert job is not None and job.input == {"n": 0} and job.status == JobStatus.RUNNING
    with CaptureQueriesContext(connection) as report:
        result = store.complete_claimed_job(job.id, job.claim_token or "", "done", result={"a": 1})
    assert result.completed and result.job and result.job.result == {"a": 1}
    with CaptureQueriesContext(connection) as batch_claim:
        jobs = store.claim_next_inhub_jobs(["batch"], "worker", limit=50)
    assert [j.input for j in jobs] == [{"n": n} for n in range(1, 51)]
    with CaptureQueriesContext(connection) as batch_report:
        results = store.complete_claimed_jobs(
            [ClaimReport(j.id, j.claim_token or "", "done", {"result": {"n": 1}}) for j in jobs]
        )
    assert all(r.completed and r.job and r.job.result == {"n": 1} for r in results)
    assert [len(c.captured_queries) for c in (claim, report, batch_claim, batch_report)] == [
        1,
        1,
        1,
        1,
    ]


@pytest.mark.django_db
def test_a_batch_with_mixed_patches_applies_each_report_and_keeps_the_order() -> None:
    store = DatabaseStateStore()
    for n in range(4):
        store.create_job(request_id=f"m{n}", target="batch")
    jobs = store.claim_next_inhub_jobs(["batch"], "worker", limit=4)
    reports = [
        ClaimReport(jobs[0].id, jobs[0].claim_token or "", "done", {"result": {"ok": True}}),
        ClaimReport(jobs[1].id, jobs[1].claim_token or "", "error", {"error": "boom"}),
        ClaimReport(jobs[2].id, jobs[2].claim_token or "", "queued", {"attempts": 2}),
        ClaimReport(jobs[3].id, jobs[3].claim_token or "", "done"),
    ]
    results = store.complete_claimed_jobs(reports)
    stored = [result.job for result in results]
    assert [job.id if job else None for job in stored] == [job.id for job in jobs]
    assert stored[0] and stored[0].result == {"ok": True}
    assert stored[1] and stored[1].status == JobStatus.ERROR and stored[1].error == "boom"
    assert stored[2] and stored[2].status == JobStatus.QUEUED and stored[2].attempts == 2
    assert stored[3] and stored[3].status == JobStatus.DONE
    assert Job.objects.get(id=jobs[2].id).claim_token is None
