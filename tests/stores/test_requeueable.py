"""``JobQuerySet.requeueable()`` is the one rule for which jobs may be requeued, and the
bulk statements, the console's bulk operations, the store and the admin use it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from jobstate.console.bulk import applicable_jobs
from jobstate.models import BulkAction, Job, JobQuerySet
from jobstate.stores.base import JobStatus
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore

pytestmark = [pytest.mark.django_db, pytest.mark.mysql]

PAST = datetime(2001, 1, 1, tzinfo=UTC)
FUTURE = datetime(2999, 1, 1, tzinfo=UTC)

#: One job per (status, lease) shape a requeue must tell apart.
SHAPES: list[tuple[JobStatus, datetime | None]] = [
    (status, lease) for status in JobStatus for lease in (None, PAST, FUTURE)
]


def make_jobs(store: Any, prefix: str) -> dict[str, Any]:
    jobs = {}
    for index, (status, lease) in enumerate(SHAPES):
        fields: dict[str, Any] = {"status": status, "target": "t"}
        if lease is not None:
            fields["lease_until"] = lease
        job = store.create_job(request_id=f"{prefix}-{index}", **fields)
        jobs[job.request_id] = job
    return jobs


def expected(status: JobStatus, lease: datetime | None) -> bool:
    if status in (JobStatus.DONE, JobStatus.ERROR, JobStatus.REJECTED):
        return True
    return status in (JobStatus.RUNNING, JobStatus.DISPATCHED) and lease == PAST


def test_requeueable_and_its_twin_take_the_same_jobs() -> None:
    store = DatabaseStateStore()
    make_jobs(store, "rule")
    now = Job.objects.annotate(now=Now()).values_list("now", flat=True).first()
    taken = set(Job.objects.requeueable().values_list("request_id", flat=True))
    for index, (status, lease) in enumerate(SHAPES):
        name = f"rule-{index}"
        job = Job.objects.get(request_id=name)
        assert (name in taken) is expected(status, lease), (status, lease)
        assert job.requeueable_at(now) is (name in taken), (status, lease)


def spy_on_requeueable(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    original = JobQuerySet.requeueable

    def requeueable(self: JobQuerySet) -> JobQuerySet:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(JobQuerySet, "requeueable", requeueable)
    return calls


def test_the_console_bulk_requeue_selects_through_requeueable(monkeypatch) -> None:
    calls = spy_on_requeueable(monkeypatch)
    DatabaseStateStore().create_job(request_id="one", status=JobStatus.DONE, target="t")
    assert applicable_jobs(Job.objects.all(), BulkAction.REQUEUE).count() == 1
    assert calls


def test_the_database_store_requeues_through_requeueable(monkeypatch) -> None:
    store = DatabaseStateStore()
    jobs = make_jobs(store, "store")
    calls = spy_on_requeueable(monkeypatch)
    seen = [(job.pk, job.status) for job in jobs.values()]
    requeued = set(store.requeue_jobs(seen, by="tester", via="test"))
    assert calls
    for job in jobs.values():
        index = int(job.request_id.rsplit("-", 1)[1])
        assert (job.pk in requeued) is expected(*SHAPES[index])


def test_the_memory_store_requeues_the_same_jobs() -> None:
    store = MemoryStateStore(clock=lambda: datetime(2500, 1, 1, tzinfo=UTC))
    jobs = make_jobs(store, "memory")
    seen = [(job.pk, job.status) for job in jobs.values()]
    requeued = set(store.requeue_jobs(seen, by="tester", via="test"))
    for job in jobs.values():
        index = int(job.request_id.rsplit("-", 1)[1])
        assert (job.pk in requeued) is expected(*SHAPES[index])


def test_a_requeue_writes_the_same_on_both_paths() -> None:
    """The single-job refire and the set-based batch write the same fields and audit."""
    store = DatabaseStateStore()
    results = []
    for name, batch in (("single", False), ("batch", True)):
        job = store.create_job(
            request_id=name,
            status=JobStatus.ERROR,
            target="t",
            error="boom",
            attempts=3,
            run_after=PAST,
            metadata={"no_delivery": True, "kept": 1},
            attempt_log=[{"n": 1}],
            task_path="x.y",
        )
        if batch:
            store.requeue_jobs([(job.pk, job.status)], by="tester", via="test")
        else:
            store.requeue_job(job.pk, from_statuses=[job.status], by="tester", via="test")
        stored = store.get_job(job.pk)
        entry = store.list_audit(job=job.pk)[-1]
        results.append(
            (
                stored.status,
                stored.attempts,
                stored.run_after,
                stored.error,
                stored.metadata,
                stored.attempt_log,
                stored.claim_token,
                entry.event,
                entry.detail,
            )
        )
    assert results[0] == results[1]
    assert results[0][4] == {"kept": 1}
    assert results[0][8]["previous_attempts"] == 1


def test_the_admin_action_previews_with_the_rule_and_requeues_through_the_store(
    monkeypatch, rf, django_user_model
) -> None:
    from django.contrib import admin

    from jobstate.admin.common import with_database_now
    from jobstate.admin.jobs import JobAdmin

    def loaded(pk: Any) -> Job:
        job: Job = with_database_now(Job.objects.all()).get(pk=pk)
        return job

    store = DatabaseStateStore()
    jobs = make_jobs(store, "admin")
    request = rf.post("/")
    request.user = django_user_model(username="operator")
    spec = JobAdmin(Job, admin.site).requeue_spec(request)
    preview_calls = []
    original = Job.requeueable_at

    def requeueable_at(self: Job, now: datetime) -> bool:
        preview_calls.append(self.pk)
        return original(self, now)

    monkeypatch.setattr(Job, "requeueable_at", requeueable_at)
    batches: list[list[Any]] = []
    original_requeue = DatabaseStateStore.requeue_jobs

    def requeue_jobs(self: DatabaseStateStore, pairs: Any, **kwargs: Any) -> Any:
        batches.append(list(pairs))
        return original_requeue(self, pairs, **kwargs)

    monkeypatch.setattr(DatabaseStateStore, "requeue_jobs", requeue_jobs)
    for job in jobs.values():
        index = int(job.request_id.rsplit("-", 1)[1])
        refusable = job.status != JobStatus.QUEUED
        row = spec.row(loaded(job.pk))
        assert (row.skip_reason is None) is expected(*SHAPES[index])
        if refusable:
            assert job.pk in preview_calls
        if row.skip_reason is None:
            assert spec.perform(request, loaded(job.pk), {}) is None
    assert batches and all(len(batch) == 1 for batch in batches)


def test_lease_boundaries_follow_the_database_clock() -> None:
    store = DatabaseStateStore()
    job = store.create_job(
        request_id="fresh",
        status=JobStatus.RUNNING,
        target="t",
        lease_until=datetime.now(UTC) + timedelta(hours=1),
    )
    assert not Job.objects.filter(pk=job.pk).requeueable().exists()
    assert store.requeue_jobs([(job.pk, job.status)], by="tester", via="test") == []
