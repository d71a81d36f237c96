"""The batch claim and batch report on PostgreSQL, MariaDB and MySQL: real concurrent
connections (one per thread) released together, and the number of statements each hot
path costs on each.

PostgreSQL claims and reports with one ``UPDATE ... RETURNING`` each. MariaDB and MySQL
have no ``UPDATE ... RETURNING``, so a claim there is one locking read of its candidates,
one ``UPDATE ... WHERE id IN``, and the transaction's ``COMMIT`` (its ``START
TRANSACTION`` travels with the first statement); a batch must cost the same round trips
whatever its size. There they are counted in the driver, where Django's ``atomic`` would
add its autocommit switches.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter, defaultdict
from datetime import timedelta
from typing import Any

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.test.utils import CaptureQueriesContext

from jobstate.exceptions import StoreError
from jobstate.models import Job
from jobstate.stores.base import ClaimReport, CompletionOutcome, JobStatus
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.backends import database_ops
from tests.support.round_trips import round_trips
from tests.support.threads import WORKERS, in_parallel


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


# --- every server database: real concurrent connections ------------------------------


@pytest.mark.mysql
@pytest.mark.concurrent
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


@pytest.mark.mysql
@pytest.mark.concurrent
@pytest.mark.django_db(transaction=True)
def test_batch_claims_give_each_claim_its_own_token_and_the_database_lease() -> None:
    store = DatabaseStateStore()
    for n in range(120):
        store.create_job(request_id=f"b{n}", target="batch")

    def claim(index: int) -> list[Job]:
        return store.claim_next_inhub_jobs(["batch"], f"w{index}", timedelta(minutes=3), limit=20)

    batches = in_parallel(WORKERS, claim)

    claimed = [job for batch in batches for job in batch]
    assert len(claimed) == len({job.id for job in claimed}) == 120
    assert len({job.claim_token for job in claimed}) == 120, "two claims shared a token"
    stored = {job.id: job for job in Job.objects.all()}
    for job in claimed:
        row = stored[job.id]
        assert row.status == JobStatus.RUNNING and row.claim_token == job.claim_token
        assert (job.executor_id, job.claimed_at, job.lease_until) == (
            row.executor_id,
            row.claimed_at,
            row.lease_until,
        ), "the claimed job handed back is not the row as written"
        assert row.lease_until == row.claimed_at + timedelta(minutes=3)


@pytest.mark.mysql
@pytest.mark.concurrent
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


@pytest.mark.mysql
@pytest.mark.concurrent
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


@pytest.mark.mysql
@pytest.mark.concurrent
@pytest.mark.django_db(transaction=True)
def test_a_batch_passes_over_a_held_thread_and_still_fills_up() -> None:
    store = DatabaseStateStore()
    held = store.create_job(request_id="held-head", target="batch", thread_id=41)
    loose = [store.create_job(request_id=f"loose-{n}", target="batch").id for n in range(3)]
    behind = store.create_job(request_id="held-next", target="batch", thread_id=41)
    locked, release = threading.Event(), threading.Event()
    # The thread was gated before (its gate row committed), the usual case of a claim
    # meeting an enqueue or another claim of the same thread.
    with transaction.atomic():
        database_ops("default").lock_thread(41)

    def hold_the_thread() -> None:
        # An enqueue with a quota (or another claimer) holds thread 41's gate meanwhile.
        try:
            with transaction.atomic():
                database_ops("default").lock_thread(41)
                locked.set()
                release.wait(timeout=30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_the_thread)
    holder.start()
    try:
        assert locked.wait(timeout=30)
        jobs = store.claim_next_inhub_jobs(["batch"], "worker", limit=3)
    finally:
        release.set()
        holder.join(timeout=30)
    assert [job.id for job in jobs] == loose
    assert Job.objects.get(id=held.id).status == JobStatus.QUEUED
    assert Job.objects.get(id=behind.id).status == JobStatus.QUEUED
    # Once the gate is free the thread's head goes, and only the head.
    again = store.claim_next_inhub_jobs(["batch"], "worker", limit=3)
    assert [job.id for job in again] == [held.id]


@pytest.mark.mysql
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


# --- what each hot path costs -------------------------------------------------------------


@pytest.mark.postgres
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


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_batch_costs_the_same_statements_whatever_its_size() -> None:
    store = DatabaseStateStore()
    for n in range(80):
        store.create_job(request_id=f"q{n}", target="batch", input={"n": n})
    # A claimer's first claim also writes its Workers page row; later claims within its
    # beat write nothing else.
    assert store.claim_next_inhub_job(["elsewhere"], "worker") is None

    one, job = round_trips(lambda: store.claim_next_inhub_job(["batch"], "worker"))
    assert job is not None and job.input == {"n": 0} and job.status == JobStatus.RUNNING
    small, few = round_trips(lambda: store.claim_next_inhub_jobs(["batch"], "worker", limit=3))
    large, many = round_trips(lambda: store.claim_next_inhub_jobs(["batch"], "worker", limit=40))
    assert [j.input for j in [*few, *many]] == [{"n": n} for n in range(1, 44)]
    # START TRANSACTION with the locking read of the candidates (the rows themselves and
    # the database clock) in one text, one UPDATE ... WHERE id IN, COMMIT. Django's atomic
    # would have sent five: SET autocommit = 0 and = 1 and a text of its own per statement.
    assert (one, small, large) == (3, 3, 3)
    assert connection.get_autocommit() and not connection.in_atomic_block

    # START TRANSACTION, the UPDATE fenced by the claim token and the row read back in one
    # text, then COMMIT: the raw floor's report is an UPDATE and a COMMIT too.
    single, result = round_trips(
        lambda: store.complete_claimed_job(job.id, job.claim_token or "", "done", result={"a": 1})
    )
    assert result.completed and result.job and result.job.result == {"a": 1}
    assert result.job.status == JobStatus.DONE and result.job.claim_token is None
    assert single == 2

    def report(jobs: list[Job]) -> list[Any]:
        return store.complete_claimed_jobs(
            [ClaimReport(j.id, j.claim_token or "", "done", {"result": {"n": 1}}) for j in jobs]
        )

    small, few_results = round_trips(lambda: report(few))
    large, many_results = round_trips(lambda: report(many))
    assert all(r.completed and r.job and r.job.result == {"n": 1} for r in few_results)
    assert all(r.completed and r.job and r.job.result == {"n": 1} for r in many_results)
    # START TRANSACTION with the fenced locking read of the claims, one UPDATE, the rows
    # read back, COMMIT.
    assert (small, large) == (4, 4)


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_task_claim_costs_the_same_statements_whatever_its_size() -> None:
    store = DatabaseStateStore()
    Job.objects.bulk_create(
        Job(
            request_id=f"task-{n}",
            target="tasks:default",
            queue_name="default",
            task_path="app.tasks.work",
            priority=n % 3,
        )
        for n in range(60)
    )

    def claim(limit: int) -> list[Job]:
        return store.claim_tasks(
            target="tasks:default",
            queues=["default"],
            worker_id="worker",
            lease=timedelta(minutes=2),
            limit=limit,
        )

    small, few = round_trips(lambda: claim(3))
    large, many = round_trips(lambda: claim(40))
    # START TRANSACTION with the locking read of the candidates and the clock, one
    # UPDATE, COMMIT.
    assert (small, large) == (3, 3)
    claimed = [*few, *many]
    assert [job.priority for job in claimed] == sorted(
        (job.priority for job in claimed), reverse=True
    ), "tasks were not claimed in priority order"
    stored = {job.id: job for job in Job.objects.filter(id__in=[job.id for job in claimed])}
    for job in claimed:
        row = stored[job.id]
        assert (row.status, row.attempts, row.claim_token) == (
            JobStatus.RUNNING,
            1,
            job.claim_token,
        )
        assert job.attempts == 1 and job.lease_until == row.lease_until
    assert len({job.claim_token for job in claimed}) == 43


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_batch_of_threaded_jobs_costs_the_same_statements_whatever_its_size() -> None:
    store = DatabaseStateStore()
    for position in range(2):
        for thread in range(1, 31):
            store.create_job(request_id=f"t{thread}-{position}", target="batch", thread_id=thread)
    assert store.claim_next_inhub_job(["elsewhere"], "worker") is None
    # Each thread's gate row exists once the thread was gated: a claim's usual case.
    store.complete_claimed_jobs(
        [
            ClaimReport(job.id, job.claim_token or "", "queued")
            for job in store.claim_next_inhub_jobs(["batch"], "worker", limit=30)
        ]
    )

    small, few = round_trips(lambda: store.claim_next_inhub_jobs(["batch"], "worker", limit=3))
    large, many = round_trips(lambda: store.claim_next_inhub_jobs(["batch"], "worker", limit=20))
    assert [job.request_id for job in [*few, *many]] == [f"t{n}-0" for n in range(1, 24)]
    # START TRANSACTION with the locking read, the threads' gates locked by one read, the
    # gate read again under them, one UPDATE, COMMIT.
    assert (small, large) == (5, 5)


def _lockable_elsewhere(pk: uuid.UUID) -> bool:
    """Whether another connection can lock job ``pk``'s row right now (no transaction
    still holds it)."""
    table = Job._meta.db_table
    prepared = Job._meta.pk.get_db_prep_value(pk, connection)

    def lock(_index: int) -> bool:
        with transaction.atomic(), connections["default"].cursor() as cursor:
            try:
                cursor.execute(
                    f"SELECT id FROM {table} WHERE id = %s FOR UPDATE NOWAIT", [prepared]
                )
            except DatabaseError:
                return False
            return cursor.fetchone() is not None

    return in_parallel(1, lock)[0]


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_claim_and_a_report_leave_no_transaction_open() -> None:
    store = DatabaseStateStore()
    job = store.create_job(request_id="open", target="batch")
    claimed = store.claim_next_inhub_job(["batch"], "worker")
    assert claimed is not None and claimed.id == job.id
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert _lockable_elsewhere(job.id), "the claim's transaction still holds the row"
    store.complete_claimed_job(job.id, claimed.claim_token or "", "done")
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert _lockable_elsewhere(job.id), "the report's transaction still holds the row"


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_claim_that_fails_midway_rolls_back_and_releases_its_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = DatabaseStateStore()
    job = store.create_job(request_id="midway", target="batch")
    ops = database_ops("default")

    def broken(*args: Any, **kwargs: Any) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT no_such_column FROM jobstate_job")
        return 0

    # The candidate is locked by the claim's read; its UPDATE then fails.
    monkeypatch.setattr(ops, "update_jobs", broken)
    with pytest.raises(StoreError):
        store.claim_next_inhub_job(["batch"], "worker")
    monkeypatch.undo()
    assert connection.get_autocommit() and not connection.in_atomic_block
    assert _lockable_elsewhere(job.id), "the failed claim still holds the row"
    # The connection goes on working, and the job was never claimed.
    assert Job.objects.get(id=job.id).status == JobStatus.QUEUED
    claimed = store.claim_next_inhub_job(["batch"], "worker")
    assert claimed is not None and claimed.id == job.id


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_batch_claim_takes_a_thread_s_oldest_job_when_its_first_read_brings_two() -> None:
    # The first read of a batch claim leaves the per-thread gate out, so it brings both
    # of thread 7's jobs: the younger one waits behind the older, which is taken.
    store = DatabaseStateStore()
    store.create_job(request_id="t7-older", target="batch", thread_id=7)
    store.create_job(request_id="t7-younger", target="batch", thread_id=7)
    store.create_job(request_id="no-thread", target="batch")

    claimed = store.claim_next_inhub_jobs(["batch"], "worker", limit=3)

    assert sorted(job.request_id for job in claimed) == ["no-thread", "t7-older"]
    waiting = Job.objects.get(request_id="t7-younger")
    assert waiting.status == JobStatus.QUEUED
    assert store.claim_next_inhub_jobs(["batch"], "worker", limit=3) == []


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_claim_that_loses_a_deadlock_runs_again_instead_of_failing() -> None:
    """A claim creates a thread's gate row with an INSERT that waits for a concurrent
    transaction inserting the same row; when that transaction then waits for the job
    row the claim holds, InnoDB rolls the claim back (the lighter of the two) with a
    deadlock. The claim, rolled back whole, runs again rather than raise
    ``StoreConflict``: here it then finds the job held by the other and claims nothing."""
    from jobstate.stores.database.backends.mysql import THREAD_GATE_TABLE

    store = DatabaseStateStore()
    job = store.create_job(request_id="gated", target="deadlock", thread_id=4242)
    Job.objects.bulk_create(Job(request_id=f"filler-{n}", target="filler") for n in range(300))
    other = connections.create_connection("default")
    outcome: dict[str, Any] = {}

    def claim() -> None:
        try:
            outcome["claimed"] = store.claim_next_inhub_job(["deadlock"], "claimer")
        except StoreError as exc:
            outcome["error"] = exc
        finally:
            connection.close()

    try:
        with other.cursor() as cursor:
            other.set_autocommit(False)
            # The other transaction: the thread's gate row (not committed) and enough
            # written that InnoDB picks the claim as the deadlock's victim.
            cursor.execute(f"INSERT INTO {THREAD_GATE_TABLE} (thread_id) VALUES (4242)")
            cursor.execute("UPDATE jobstate_job SET source = 'heavy' WHERE target = 'filler'")
            claimer = threading.Thread(target=claim)
            claimer.start()
            # The claim waits at its INSERT of the gate row the other transaction holds.
            waiting = (
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST "
                f"WHERE INFO LIKE 'INSERT IGNORE INTO {THREAD_GATE_TABLE}%%'"
            )
            with connections.create_connection("default").cursor() as probe:
                for _ in range(1000):
                    probe.execute(waiting)
                    if probe.fetchone()[0]:
                        break
                    threading.Event().wait(0.01)
                else:
                    pytest.fail(f"the claim never reached the gate row: {outcome}")
            # The job row the claim holds: a cycle, which InnoDB breaks at once.
            cursor.execute("SELECT id FROM jobstate_job WHERE request_id = 'gated' FOR UPDATE")
            claimer.join(timeout=30)
            other.rollback()
    finally:
        other.close()
    assert "error" not in outcome, outcome
    assert outcome["claimed"] is None  # the job was the other transaction's by then
    again = store.claim_next_inhub_job(["deadlock"], "claimer")
    assert again is not None and again.id == job.id
