"""Operational metrics: the six figures on a hand-computed data set, on the database
store and the in-memory reference store, their query budget, and their Prometheus text
exposition (``jobstate.observability.metrics`` and the ``/metrics`` view)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models.functions import Now
from django.test import Client
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from jobstate.exceptions import InvalidJobState
from jobstate.models import Job
from jobstate.observability.metrics import CONTENT_TYPE, render_metrics
from jobstate.stores.base import JobOperationalMetrics, StateStore
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.fake_clock import FakeClock
from jobstate.testing.memory_state import MemoryStateStore
from tests.support.plans import plans_without_table_scans

# Microseconds set on purpose: every stored instant carries them, so SQLite's text
# comparison of instants sees one format throughout.
NOW = datetime(2030, 5, 4, 12, 0, 0, 500_000, tzinfo=UTC)


@dataclass(frozen=True)
class Row:
    request_id: str
    status: str
    created: int  # seconds relative to NOW
    updated: int | None = None  # seconds relative to NOW; defaults to ``created``
    fields: dict[str, Any] = field(default_factory=dict)


def at(seconds: int) -> datetime:
    return NOW + timedelta(seconds=seconds)


# Hand-computed expectations are in EXPECTED below; each row says what it tests.
ROWS = [
    Row("queued-oldest", "queued", -600, fields={"source": "api", "thread_id": 7}),
    Row("queued-monitor-probe", "queued", -900, fields={"source": "monitor"}),
    Row("queued-delayed", "queued", -300, fields={"run_after": at(60)}),
    Row("queued-due-again", "queued", -100, fields={"run_after": at(-10), "thread_id": 8}),
    Row("queued-second-in-thread-7", "queued", -50, fields={"thread_id": 7}),
    Row("queued-thread-11-a", "queued", -45, fields={"thread_id": 11}),
    Row("queued-thread-11-b", "queued", -40, fields={"thread_id": 11}),
    Row("running-expired", "running", -700, fields={"thread_id": 7, "lease_until": at(-5)}),
    Row("running-alive", "running", -700, fields={"thread_id": 10, "lease_until": at(300)}),
    Row("dispatched-alive", "dispatched", -700, fields={"thread_id": 9, "lease_until": at(60)}),
    Row("dispatched-no-lease", "dispatched", -700, fields={"thread_id": 8}),
    Row("done-recent", "done", -3600, -60, fields={"lease_until": at(-100)}),
    Row("done-old", "done", -3600, -16 * 60),
    Row("error-at-the-boundary", "error", -3600, -15 * 60),
    Row("error-recent", "error", -3600, -1),
    Row("rejected-old", "rejected", -3600, -20 * 60),
]

EXPECTED = JobOperationalMetrics(
    by_status={"queued": 7, "running": 2, "dispatched": 2, "done": 2, "error": 2, "rejected": 1},
    terminal_last_15m={"done": 1, "error": 2, "rejected": 0},
    # The monitor probe (900 s) does not age the queue.
    oldest_queued_age_seconds=600.0,
    delayed_queued_jobs=1,
    # Only running/dispatched leases count: not the done job's stale one, not a null lease.
    expired_leases=1,
    # Threads 7 and 8 have queued work behind a claimed job; 11 only waits on itself.
    blocked_threads=2,
)


def load_database(store: StateStore) -> None:
    for row in ROWS:
        job = store.create_job(request_id=row.request_id, status=row.status, **row.fields)
        updated = row.created if row.updated is None else row.updated
        Job.objects.filter(id=job.id).update(created_at=at(row.created), updated_at=at(updated))


def load_memory(store: MemoryStateStore, clock: FakeClock) -> None:
    for row in ROWS:
        clock.set(at(row.created))
        job = store.create_job(request_id=row.request_id, status=row.status, **row.fields)
        clock.set(at(row.created if row.updated is None else row.updated))
        store.update_job(job.id)
    clock.set(NOW)


@pytest.fixture
def database_store(db: None) -> StateStore:
    store = DatabaseStateStore()
    load_database(store)
    return store


def test_snapshot_matches_the_hand_computed_figures(database_store: StateStore) -> None:
    assert database_store.operational_metrics_snapshot(NOW) == EXPECTED


def test_reference_store_gives_the_same_figures(database_store: StateStore) -> None:
    clock = FakeClock(NOW)
    memory = MemoryStateStore(clock=clock.now)
    load_memory(memory, clock)

    assert memory.operational_metrics_snapshot(NOW) == EXPECTED
    assert memory.operational_metrics_snapshot() == EXPECTED  # its clock is at NOW
    later = NOW + timedelta(minutes=10)
    assert memory.operational_metrics_snapshot(later) == (
        database_store.operational_metrics_snapshot(later)
    )


def test_snapshot_takes_a_fixed_number_of_queries_whatever_the_data(
    database_store: StateStore, django_assert_max_num_queries: Any
) -> None:
    # Seven small statements, plus one read of the table statistics on PostgreSQL.
    with django_assert_max_num_queries(8):
        database_store.operational_metrics_snapshot(NOW)
    for index in range(30):
        database_store.create_job(request_id=f"more-{index}", thread_id=index % 4)
    with django_assert_max_num_queries(8):
        database_store.operational_metrics_snapshot()


def _mixed_history(store: StateStore, finished: int) -> None:
    """``finished`` done / error / rejected jobs (4:1:1) and 12 queued ones."""
    statuses = ["done", "done", "done", "done", "error", "rejected"]
    for index in range(finished):
        job = store.create_job(request_id=f"old-{index}")
        Job.objects.filter(id=job.id).update(status=statuses[index % 6])
    for index in range(12):
        store.create_job(request_id=f"live-{index}")


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_large_history_is_estimated_from_table_statistics(settings: Any) -> None:
    settings.JOBSTATE = {"METRICS_EXACT_LIMIT": 100}
    store = DatabaseStateStore()
    _mixed_history(store, 300)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")
    # Written after ANALYZE: the estimate does not see them, the exact counts do.
    for index in range(6):
        store.create_job(request_id=f"new-{index}")

    estimated = store.operational_metrics_snapshot()
    exact = store.operational_metrics_snapshot(exact=True)

    assert estimated.estimated_statuses == ("done", "error", "rejected")
    assert exact.estimated_statuses == ()
    assert exact.by_status == {
        "queued": 18,
        "running": 0,
        "dispatched": 0,
        "done": 200,
        "error": 50,
        "rejected": 50,
    }
    # In-flight counts stay exact; finished ones are close (the table grew after ANALYZE).
    assert estimated.by_status["queued"] == 18
    for status in ("done", "error", "rejected"):
        assert abs(estimated.by_status[status] - exact.by_status[status]) <= (
            0.1 * exact.by_status[status] + 2
        )
    rendered = render_metrics(store).decode()
    assert 'jobstate_jobs_estimated{status="done"} 1.0' in rendered
    assert 'jobstate_jobs_estimated{status="queued"} 0.0' in rendered


@pytest.mark.postgres
@pytest.mark.django_db
def test_status_counts_are_answered_by_an_index_alone() -> None:
    # The in-flight count is the snapshot's costliest statement on a large queue: read
    # from the table instead of the index, it took three times as long at 1,000,000 jobs.
    store = DatabaseStateStore()
    _mixed_history(store, 30)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")
    with CaptureQueriesContext(connection) as captured:
        store.operational_metrics_snapshot(exact=True)
    counts = [query["sql"] for query in captured.captured_queries if "GROUP BY" in query["sql"]]
    assert len(counts) == 3  # in flight, finished, finished in the last 15 minutes
    for plan in plans_without_table_scans(connection, counts):
        assert "Index Only Scan" in plan, plan


@pytest.mark.django_db
def test_a_small_history_is_counted_exactly(settings: Any) -> None:
    store = DatabaseStateStore()
    _mixed_history(store, 30)

    snapshot = store.operational_metrics_snapshot()

    assert snapshot.estimated_statuses == ()
    assert snapshot.by_status["done"] == 20 and snapshot.by_status["rejected"] == 5


@pytest.mark.django_db
def test_an_empty_queue_reports_every_status_at_zero() -> None:
    snapshot = DatabaseStateStore().operational_metrics_snapshot()

    assert snapshot == JobOperationalMetrics(
        by_status=dict.fromkeys(
            ["queued", "running", "dispatched", "done", "error", "rejected"], 0
        ),
        terminal_last_15m={"done": 0, "error": 0, "rejected": 0},
        oldest_queued_age_seconds=0.0,
        delayed_queued_jobs=0,
        expired_leases=0,
        blocked_threads=0,
    )
    assert MemoryStateStore().operational_metrics_snapshot() == snapshot


@pytest.mark.django_db
def test_without_now_the_database_clock_is_used() -> None:
    store = DatabaseStateStore()
    job = store.create_job(request_id="r1")
    Job.objects.filter(id=job.id).update(created_at=Now() - timedelta(seconds=120))

    age = store.operational_metrics_snapshot().oldest_queued_age_seconds

    assert 120 <= age < 180


def test_figures_never_go_negative(database_store: StateStore) -> None:
    # An instant before every row was created: the queue cannot be -600 s old.
    snapshot = database_store.operational_metrics_snapshot(NOW - timedelta(days=1))

    assert snapshot.oldest_queued_age_seconds == 0.0
    assert snapshot.terminal_last_15m == {"done": 2, "error": 2, "rejected": 1}


@pytest.mark.parametrize("now", [datetime(2030, 1, 1), "2030-01-01T00:00:00Z"])
def test_a_bad_instant_is_refused(db: None, now: Any) -> None:
    for store in (DatabaseStateStore(), MemoryStateStore()):
        with pytest.raises(InvalidJobState):
            store.operational_metrics_snapshot(now)


# --- Prometheus text exposition ------------------------------------------------------


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_exposition_carries_every_figure(database_store: StateStore) -> None:
    parsed = samples(render_metrics(database_store, now=NOW).decode())

    assert all(name.startswith("jobstate_") for name, _ in parsed)
    for status, count in EXPECTED.by_status.items():
        assert parsed[("jobstate_jobs", (("status", status),))] == count
    for status, count in EXPECTED.terminal_last_15m.items():
        assert parsed[("jobstate_jobs_terminal_15m", (("status", status),))] == count
    assert parsed[("jobstate_queue_oldest_queued_age_seconds", ())] == 600.0
    assert parsed[("jobstate_queue_delayed_jobs", ())] == 1
    assert parsed[("jobstate_jobs_expired_leases", ())] == 1
    assert parsed[("jobstate_threads_blocked", ())] == 2
    for status in EXPECTED.by_status:  # a small table: every count is exact
        assert parsed[("jobstate_jobs_estimated", (("status", status),))] == 0
    assert len(parsed) == 6 + 6 + 3 + 4


def test_exposition_leaves_the_global_registry_alone(database_store: StateStore) -> None:
    from prometheus_client import REGISTRY

    render_metrics(database_store)

    assert REGISTRY.get_sample_value("jobstate_queue_delayed_jobs") is None


def test_metrics_view_serves_the_exposition(database_store: StateStore, client: Client) -> None:
    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"] == CONTENT_TYPE
    assert "no-cache" in response["Cache-Control"]
    parsed = samples(response.content.decode())
    assert parsed[("jobstate_jobs", (("status", "queued"),))] == 7
    assert parsed[("jobstate_threads_blocked", ())] == 2
