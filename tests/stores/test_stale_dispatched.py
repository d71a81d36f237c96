"""One bounded, audited requeue of stale dispatched jobs: the store's
``requeue_stale_dispatched``, which the ``dispatched`` maintenance sweep runs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobstate import maintenance
from jobstate.stores.base import JobStatus, StateStore
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore

pytestmark = [pytest.mark.django_db, pytest.mark.mysql]

PAST = datetime(2001, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


def dispatched(
    store: StateStore, name: str, *, target: str = "t", lease: Any = PAST, since: Any = PAST
) -> Any:
    return store.create_job(
        request_id=name,
        status=JobStatus.DISPATCHED,
        target=target,
        executor_id=f"exec-{name}",
        lease_until=lease,
        dispatched_at=since,
        claim_token="0b7f3c4e-8a56-4a53-9d3a-6f8c3a1c9e01",
    )


def stores() -> list[Any]:
    return [
        pytest.param(DatabaseStateStore, id="database"),
        pytest.param(lambda: MemoryStateStore(), id="memory"),
    ]


@pytest.mark.parametrize("make", stores())
def test_the_requeue_is_bounded_and_audits_each_job(make) -> None:
    store = make()
    jobs = [dispatched(store, f"stale-{index}") for index in range(3)]
    fresh = dispatched(store, "fresh", lease=datetime(2999, 1, 1, tzinfo=UTC), since=None)
    other = dispatched(store, "other", target="elsewhere")
    assert store.requeue_stale_dispatched(HOUR, 10 * HOUR, targets=["t"], limit=2) == 2
    assert store.requeue_stale_dispatched(HOUR, 10 * HOUR, targets=["t"], limit=5) == 1
    assert store.requeue_stale_dispatched(HOUR, 10 * HOUR, targets=["t"]) == 0
    for job in jobs:
        stored = store.get_job(job.pk)
        assert stored.status == JobStatus.QUEUED
        assert stored.claim_token is None and stored.executor_id is None
        (entry,) = [e for e in store.list_audit(job=job.pk) if e.event == "recovered"]
        assert entry.title == "Requeued: executor lease expired"
        assert entry.detail["via"] == "executor-lease-expired"
        assert entry.detail["executor_id"] == f"exec-{job.request_id}"
        assert entry.detail["prev_status"] == JobStatus.DISPATCHED.value
    assert store.get_job(fresh.pk).status == JobStatus.DISPATCHED
    assert store.get_job(other.pk).status == JobStatus.DISPATCHED
    assert store.list_audit(job=other.pk) == []


def test_the_default_bound_is_the_sweep_batch_size(settings) -> None:
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "SWEEP_BATCH_SIZE": 2}
    store = MemoryStateStore()
    for index in range(3):
        dispatched(store, f"stale-{index}")
    assert store.requeue_stale_dispatched() == 2
    assert store.requeue_stale_dispatched() == 1


def test_the_dispatched_sweep_runs_the_configured_stores_requeue(monkeypatch) -> None:
    calls: list[dict[str, Any]] = []
    original = DatabaseStateStore.requeue_stale_dispatched

    def requeue(self: DatabaseStateStore, *args: Any, **kwargs: Any) -> int:
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DatabaseStateStore, "requeue_stale_dispatched", requeue)
    store = DatabaseStateStore()
    for index in range(3):
        dispatched(store, f"stale-{index}")
    result = maintenance.requeue_stale_dispatched(batch_size=2)
    assert result.count == 3
    assert [call["limit"] for call in calls] == [2, 2]
    assert len(store.list_audit(request_id="stale-0")) == 1
