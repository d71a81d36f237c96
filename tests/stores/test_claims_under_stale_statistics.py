"""A claim reads the rows it claims, however stale the planner's statistics are.

A host's jobs table is analyzed while its queue is empty (every job done), then a burst
of work is enqueued before the table is analyzed again. The statistics then say that no
job is queued, so a partial index of queued jobs looks empty to the planner: cheaper to
read whole than one probe of the primary key. A claim whose ``UPDATE`` found its picked
row by id *and* status was read through such an index, every queued row of it, on every
claim: with 100,000 tasks waiting a claim took about 100 ms instead of half a
millisecond, until the next ``ANALYZE``.

The ``UPDATE`` now finds its rows by id alone (see
:mod:`jobstate.stores.database.backends.postgresql_statements`). A batch claim and a
task claim of several queues or of any queue still pick through the smallest such index
under those statistics, reading the queue once per claim: docs/databases.md says so and
what to set.

Each test counts the index entries the claim read (PostgreSQL's statistics of this
transaction's own index scans) and holds them to a few per claimed job, with many more jobs
queued than that.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import connection, transaction

from jobstate.core.states import NewTask
from jobstate.models import Job
from jobstate.stores.base import ClaimReport
from jobstate.stores.database import DatabaseStateStore

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

#: Jobs queued after the table was analyzed: what a claim must not read.
QUEUED = 600
#: Index entries a claim may read per job it claims (the claim index, the key, the
#: thread gate's probe, the pause probe).
ENTRIES_PER_CLAIM = 8
LEASE = timedelta(minutes=1)


@pytest.fixture
def target() -> str:
    """A target of this test's own: rows other tests wrote and rolled back leave dead
    entries in the indexes (which lead with the target), and a scan steps over them."""
    return f"tasks:stale-{uuid.uuid4().hex[:12]}"


def _analyzed_with_nothing_queued(target: str, *, tasks: bool) -> None:
    """Done jobs, the table analyzed, then :data:`QUEUED` queued jobs of ``target`` the
    statistics do not know of."""
    done = [
        Job(
            request_id=f"done-{n}",
            target=target,
            status="done",
            task_path="tests.support.task_functions.add" if tasks else None,
            queue_name="default" if tasks else None,
            input={"n": n},
        )
        for n in range(2 * QUEUED)
    ]
    Job.objects.bulk_create(done)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")
    store = DatabaseStateStore()
    for n in range(QUEUED):
        if tasks:
            store.enqueue_task(
                NewTask(
                    target=target,
                    task_path="tests.support.task_functions.add",
                    queue_name="default",
                    priority=0,
                    args=[n, 1],
                    kwargs={},
                    max_attempts=1,
                )
            )
        else:
            store.create_job(request_id=f"queued-{n}", target=target, input={"n": n})


def _entries_read(action: Callable[[], int]) -> tuple[int, int]:
    """``action`` run in a transaction: the index entries its statements read from the
    jobs table's indexes, and what ``action`` returned (the jobs it claimed)."""
    sql = """
        SELECT COALESCE(SUM(pg_stat_get_xact_tuples_returned(indexrelid)), 0)
        FROM pg_index WHERE indrelid = 'jobstate_job'::regclass
    """
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql)
        before = cursor.fetchone()[0]
        claimed = action()
        cursor.execute(sql)
        after = cursor.fetchone()[0]
    return after - before, claimed


def test_a_one_job_claim_reads_no_other_queued_job(target: str) -> None:
    _analyzed_with_nothing_queued(target, tasks=False)
    store = DatabaseStateStore()

    def claim() -> int:
        return int(store.claim_next_inhub_job([target], "w") is not None)

    read, claimed = _entries_read(claim)
    assert claimed == 1
    assert read <= ENTRIES_PER_CLAIM, f"one claim read {read} index entries"


def test_a_task_claim_of_one_queue_reads_no_other_queued_task(target: str) -> None:
    """A worker's claim of one queue: Django's default ``QUEUES`` and so the default
    worker's."""
    _analyzed_with_nothing_queued(target, tasks=True)
    store = DatabaseStateStore()

    def claim() -> int:
        return len(
            store.claim_tasks(
                target=target, queues=["default"], worker_id="w", lease=LEASE, limit=4
            )
        )

    read, claimed = _entries_read(claim)
    assert claimed == 4
    assert read <= 4 * ENTRIES_PER_CLAIM, f"a task claim of 4 read {read} index entries"


def test_a_worker_round_reads_no_other_queued_task(target: str) -> None:
    """The worker's round: its reports and its next claim in one statement."""
    _analyzed_with_nothing_queued(target, tasks=True)
    store = DatabaseStateStore()
    running = store.claim_tasks(
        target=target, queues=["default"], worker_id="w", lease=LEASE, limit=2
    )
    reports = [ClaimReport(job.id, job.claim_token or uuid.uuid4(), "done") for job in running]

    def round_() -> int:
        results, claimed = store.complete_and_claim_tasks(
            reports, target=target, queues=["default"], worker_id="w", lease=LEASE, limit=2
        )
        assert all(result.completed for result in results)
        return len(claimed)

    read, claimed = _entries_read(round_)
    assert claimed == 2
    assert read <= 4 * ENTRIES_PER_CLAIM, f"a round of 2 reports and 2 claims read {read}"


def test_a_batch_report_reads_no_other_claimed_job(target: str) -> None:
    """The same for a report: analyzed while nothing was claimed, then many jobs
    claimed; a report of some of them reads only theirs."""
    _analyzed_with_nothing_queued(target, tasks=False)
    store = DatabaseStateStore()
    claimed = store.claim_next_inhub_jobs([target], "w", limit=QUEUED)
    assert len(claimed) == QUEUED
    reports = [ClaimReport(job.id, job.claim_token or uuid.uuid4(), "done") for job in claimed[:5]]

    def report() -> int:
        return sum(result.completed for result in store.complete_claimed_jobs(reports))

    read, reported = _entries_read(report)
    assert reported == 5
    assert read <= 5 * ENTRIES_PER_CLAIM, f"a report of 5 read {read} index entries"
