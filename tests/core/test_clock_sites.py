"""Filters on instants the database's clock wrote, on the real clock with no ``now=``
handed in: a value read back from such a row must compare equal to the row it came from
(on SQLite the clock writes milliseconds and Django microseconds, see
:mod:`jobstate.core.clock`). The schedules' sites are in
:mod:`tests.schedules.test_schedules_clock`."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models.functions import Now

from jobstate import maintenance
from jobstate.core.states import JobStatus
from jobstate.models import AuditEntry, Job
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.backends import instant_filter
from jobstate.testing.factories import AuditEntryFactory, JobFactory

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]


def test_a_retention_sweep_deletes_every_entry_stamped_at_one_instant() -> None:
    # Entries the database's clock stamped at one instant (one statement): each batch
    # resumes after the last (ts, id) it picked, and must find the rest of that instant.
    AuditEntryFactory.bulk_create_batch(5, event="received")
    AuditEntry.objects.update(ts=Now())
    assert AuditEntry.objects.values("ts").distinct().count() == 1
    time.sleep(0.01)
    result = maintenance.prune_audit(older_than=timedelta(milliseconds=1), batch_size=2)
    assert (result.count, result.complete) == (5, True)
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize("microsecond", [0, 5000, 5123])
def test_an_instant_read_back_finds_its_row_whichever_clock_wrote_it(microsecond: int) -> None:
    database = JobFactory()
    python = JobFactory()
    Job.objects.filter(id=database.id).update(run_after=Now())
    written = datetime(2026, 12, 2, 4, 59, 54, microsecond, tzinfo=UTC)
    Job.objects.filter(id=python.id).update(run_after=written)
    for job in (database, python):
        at = Job.objects.get(id=job.id).run_after
        assert at is not None
        rows = Job.objects.filter(id=job.id)
        assert rows.filter(instant_filter("default", "run_after", "exact", at)).exists()
        assert rows.filter(instant_filter("default", "run_after", "lte", at)).exists()
        assert rows.filter(instant_filter("default", "run_after", "gte", at)).exists()
        assert not rows.filter(instant_filter("default", "run_after", "lt", at)).exists()
        assert not rows.filter(instant_filter("default", "run_after", "gt", at)).exists()
        after = at + timedelta(microseconds=1)
        assert rows.filter(instant_filter("default", "run_after", "lt", after)).exists()
        assert not rows.filter(instant_filter("default", "run_after", "exact", after)).exists()


def test_a_lookup_it_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match="lookup must be one of"):
        instant_filter("default", "run_after", "range", datetime.now(UTC))


@pytest.mark.slow
def test_the_bulk_requeue_takes_a_lease_that_ended_on_the_real_clock_only() -> None:
    # The console's "Requeue all matching" on running jobs: the lease the database's
    # clock wrote is judged against the same clock, in SQL.
    store = DatabaseStateStore()
    store.create_job(request_id="short", target="llm")
    store.create_job(request_id="long", target="llm")
    short = store.claim_next_inhub_job(["llm"], "worker-1", lease=timedelta(seconds=2))
    long = store.claim_next_inhub_job(["llm"], "worker-2", lease=timedelta(minutes=5))
    assert short is not None and long is not None and short.lease_until is not None
    pairs = [(short.id, JobStatus.RUNNING), (long.id, JobStatus.RUNNING)]
    assert store.requeue_jobs(pairs, by="alice", via="admin-bulk") == []
    time.sleep(max(0.0, (short.lease_until - datetime.now(UTC)).total_seconds()) + 0.1)
    assert store.requeue_jobs(pairs, by="alice", via="admin-bulk") == [short.id]
    assert Job.objects.get(id=long.id).status == JobStatus.RUNNING
