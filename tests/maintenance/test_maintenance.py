"""Maintenance sweeps: what each one moves or deletes, that every one is bounded
(batch size, time budget, limit), idempotent and exact under concurrent sweepers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any, ClassVar

import factory
import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.test import override_settings
from django.test.utils import CaptureQueriesContext

from jobstate import maintenance
from jobstate.exceptions import (
    ImproperlyConfiguredStore,
    InvalidJobState,
    InvalidRunnerConfiguration,
)
from jobstate.maintenance import SweepResult
from jobstate.models import AuditEntry, Job, JobRun, RuntimeLock
from jobstate.stores.base import (
    EXPIRED_QUEUED_ERROR,
    REAPED_RUN_ERROR,
    CompletionOutcome,
    JobRunStatus,
    JobStatus,
    NotificationState,
)
from jobstate.stores.database import DatabaseJobRunStore, DatabaseStateStore
from jobstate.stores.database.sweep_statements import (
    LEASE_EXPIRED_ERROR,
    SWEEP_ACTOR,
    DatabaseSweepStore,
)
from jobstate.testing.factories import (
    AuditEntryFactory,
    JobFactory,
    JobRunFactory,
    NotificationFactory,
    RuntimeLockFactory,
)
from tests.support.plans import plans_without_table_scans

LONG_AGO = datetime(2020, 1, 1, tzinfo=UTC)


def _past(delta: timedelta) -> Any:
    return Now() - delta


# --- seeding: candidates of every sweep, and rows every sweep must leave alone ---------


def seed_runs(count: int, *, fresh: bool = False) -> None:
    prefix = "fresh" if fresh else "stale"
    JobRunFactory.bulk_create_batch(
        count,
        running=True,
        job_key="tests.sweep",
        overlap_key=factory.Sequence(lambda n: f"{prefix}-{n}"),
        started_at=LONG_AGO,
        heartbeat_at=datetime.now(UTC) - (timedelta(0) if fresh else timedelta(hours=1)),
    )


def seed_queued(count: int, *, fresh: bool = False) -> None:
    jobs = JobFactory.bulk_create_batch(count, queued=True)
    if not fresh:
        Job.objects.filter(id__in=[j.id for j in jobs]).update(created_at=_past(timedelta(hours=2)))


def seed_dispatched(count: int, *, fresh: bool = False) -> None:
    lease = timedelta(hours=1) if fresh else -timedelta(minutes=1)
    JobFactory.bulk_create_batch(
        count,
        dispatched=True,
        claimed_at=LONG_AGO,
        dispatched_at=datetime.now(UTC),
        lease_until=datetime.now(UTC) + lease,
    )


def seed_leases(count: int, *, fresh: bool = False, attempts: int = 0) -> None:
    lease = timedelta(hours=1) if fresh else -timedelta(minutes=1)
    JobFactory.bulk_create_batch(
        count,
        running=True,
        claimed_at=LONG_AGO,
        lease_until=datetime.now(UTC) + lease,
        attempts=attempts,
    )


def seed_locks(count: int, *, fresh: bool = False) -> None:
    expires = datetime.now(UTC) + (timedelta(hours=1) if fresh else -timedelta(minutes=1))
    RuntimeLockFactory.bulk_create_batch(count, expires_at=expires)


def seed_audit(count: int, *, fresh: bool = False) -> None:
    ts = datetime.now(UTC) - (timedelta(days=1) if fresh else timedelta(days=60))
    AuditEntryFactory.bulk_create_batch(count, event="received", ts=ts)


def seed_finished_jobs(count: int, *, fresh: bool = False) -> None:
    jobs = JobFactory.bulk_create_batch(count, done=True)
    if not fresh:
        Job.objects.filter(id__in=[j.id for j in jobs]).update(updated_at=_past(timedelta(days=30)))


def seed_finished_runs(count: int, *, fresh: bool = False) -> None:
    finished = datetime.now(UTC) - (timedelta(days=1) if fresh else timedelta(days=60))
    JobRunFactory.bulk_create_batch(
        count,
        settled=True,
        job_key="tests.sweep",
        started_at=finished,
        finished_at=finished,
        duration_ms=0,
    )


@dataclass(frozen=True)
class Case:
    sweep: Callable[..., SweepResult]
    seed: Callable[..., None]
    left: Callable[[], QuerySet[Any]]
    """The candidates still waiting for the sweep."""
    untouched: Callable[[], QuerySet[Any]]
    """Where the fresh rows must still be, unchanged in state."""


CASES = {
    "runs": Case(
        maintenance.reap_stale_runs,
        seed_runs,
        lambda: JobRun.objects.stale(timedelta(minutes=5)),
        lambda: JobRun.objects.running().filter(overlap_key__startswith="fresh"),
    ),
    "queued": Case(
        maintenance.expire_stale_queued,
        seed_queued,
        lambda: Job.objects.stale_queued(timedelta(minutes=30)),
        lambda: Job.objects.queued(),
    ),
    "dispatched": Case(
        maintenance.requeue_stale_dispatched,
        seed_dispatched,
        lambda: Job.objects.stale_dispatched(timedelta(minutes=3), timedelta(hours=2)),
        lambda: Job.objects.filter(status=JobStatus.DISPATCHED),
    ),
    "leases": Case(
        maintenance.recover_expired_leases,
        seed_leases,
        lambda: Job.objects.filter(status=JobStatus.RUNNING).expired_leases(timedelta(minutes=20)),
        lambda: Job.objects.filter(status=JobStatus.RUNNING),
    ),
    "locks": Case(
        maintenance.release_expired_locks,
        seed_locks,
        lambda: RuntimeLock.objects.expired(),
        lambda: RuntimeLock.objects.held(),
    ),
    "audit": Case(
        maintenance.prune_audit,
        seed_audit,
        lambda: AuditEntry.objects.filter(ts__lt=_past(timedelta(days=30))),
        lambda: AuditEntry.objects.filter(ts__gte=_past(timedelta(days=30))),
    ),
    "jobs": Case(
        maintenance.prune_finished_jobs,
        seed_finished_jobs,
        lambda: Job.objects.terminal().not_written_for(timedelta(days=14)),
        lambda: Job.objects.terminal(),
    ),
    "finished runs": Case(
        maintenance.prune_finished_runs,
        seed_finished_runs,
        lambda: JobRun.objects.finished().filter(finished_at__lt=_past(timedelta(days=30))),
        lambda: JobRun.objects.finished(),
    ),
}


# --- every sweep: bounded, idempotent, dry run ----------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("name", CASES)
def test_a_sweep_moves_everything_in_batches_within_one_call_then_nothing(name: str) -> None:
    case = CASES[name]
    case.seed(35)
    case.seed(2, fresh=True)
    progress: list[int] = []

    result = case.sweep(batch_size=10, on_batch=lambda sweep, n: progress.append(n))

    assert (result.count, result.batches, result.complete) == (35, 4, True)
    assert progress == [10, 20, 30, 35]
    assert not case.left().exists()
    assert case.untouched().count() == 2
    again = case.sweep(batch_size=10)
    assert (again.count, again.batches, again.complete) == (0, 1, True)
    assert case.untouched().count() == 2


@pytest.mark.django_db
@pytest.mark.parametrize("name", CASES)
def test_a_sweep_stops_starting_batches_at_its_time_budget(name: str) -> None:
    case = CASES[name]
    case.seed(35)
    result = case.sweep(batch_size=10, time_budget=timedelta(microseconds=1))
    assert (result.count, result.batches, result.complete) == (10, 1, False)
    assert case.left().count() == 25
    rest = case.sweep(batch_size=10)
    assert (rest.count, rest.complete) == (25, True)


@pytest.mark.django_db
@pytest.mark.parametrize("name", CASES)
def test_a_sweep_honours_its_limit_and_its_dry_run_writes_nothing(name: str) -> None:
    case = CASES[name]
    case.seed(12)
    case.seed(1, fresh=True)
    dry = case.sweep(dry_run=True)
    assert (dry.count, dry.dry_run, dry.batches) == (12, True, 0)
    assert case.sweep(dry_run=True, limit=5).count == 5
    assert case.left().count() == 12
    capped = case.sweep(batch_size=4, limit=6)
    assert (capped.count, capped.batches, capped.complete) == (6, 2, False)
    assert case.left().count() == 6


@pytest.mark.django_db
def test_a_retention_sweep_resumes_after_its_last_batch_and_leaves_rows_behind_it() -> None:
    """Each batch starts after the last entry the previous one picked, instead of
    searching from the oldest again (which walks past every deleted row's index entry).
    So an entry that turns up behind that point mid-sweep is the next call's work."""
    seed_audit(6)
    behind = datetime.now(UTC) - timedelta(days=365)

    def after_first_batch(sweep: str, total: int) -> None:
        if total == 3:
            AuditEntryFactory(event="late", ts=behind)

    result = maintenance.prune_audit(batch_size=3, on_batch=after_first_batch)

    assert (result.count, result.complete) == (6, True)
    assert list(AuditEntry.objects.values_list("event", flat=True)) == ["late"]
    assert maintenance.prune_audit(batch_size=3).count == 1
    assert not AuditEntry.objects.exists()


@pytest.mark.django_db
def test_the_time_budget_and_batch_size_default_to_the_settings(settings: Any) -> None:
    # Retention sweeps delete RETENTION_BATCH_SIZE rows per batch, reaping sweeps move
    # SWEEP_BATCH_SIZE.
    settings.JOBSTATE = {**settings.JOBSTATE, "SWEEP_BATCH_SIZE": 4, "RETENTION_BATCH_SIZE": 7}
    seed_audit(20)
    seed_runs(10)
    assert maintenance.prune_audit().batches == 3
    assert maintenance.reap_stale_runs().batches == 3
    settings.JOBSTATE = {
        **settings.JOBSTATE,
        "RETENTION_BATCH_SIZE": 5,
        "SWEEP_TIME_BUDGET": timedelta(microseconds=1),
    }
    seed_audit(20)
    assert maintenance.prune_audit().count == 5


# --- what each reaping sweep writes ---------------------------------------------------


@pytest.mark.django_db
def test_stale_runs_time_out_and_free_their_keys() -> None:
    seed_runs(3)
    result = maintenance.reap_stale_runs()
    assert result.count == 3
    assert set(JobRun.objects.values_list("status", "error")) == {
        (JobRunStatus.TIMED_OUT, REAPED_RUN_ERROR)
    }


@pytest.mark.django_db
def test_stale_dispatched_jobs_return_to_the_queue_with_an_audit_entry() -> None:
    store = DatabaseStateStore()
    store.create_job(request_id="lost", target="exec")
    claimed = store.claim_next_job(["exec"], "executor-7", timedelta(minutes=5))
    assert claimed is not None and claimed.claim_token is not None
    Job.objects.filter(id=claimed.id).update(lease_until=LONG_AGO)

    assert maintenance.requeue_stale_dispatched().count == 1

    job = Job.objects.get(id=claimed.id)
    assert job.status == JobStatus.QUEUED
    assert (job.executor_id, job.claim_token, job.lease_until, job.dispatched_at) == (
        None,
        None,
        None,
        None,
    )
    [entry] = AuditEntry.objects.filter(job=job)
    assert (entry.event, entry.severity, entry.request_id) == ("recovered", "warning", "lost")
    assert entry.detail["executor_id"] == "executor-7"
    assert entry.detail["by"] == SWEEP_ACTOR
    late = store.complete_claimed_job(job.id, claimed.claim_token, JobStatus.DONE)
    assert late.outcome is CompletionOutcome.STALE_CLAIM
    again = store.claim_next_job(["exec"], "executor-8")
    assert again is not None and again.id == job.id


def _stale_executor_jobs() -> tuple[list[Job], list[Job]]:
    """Two dispatched jobs whose leases expired (the later lease first) and two that
    never had a lease and went silent; every one is stale."""
    now = datetime.now(UTC)
    # No dispatch instant, so the hard cap never picks one: only the lease or the silence.
    dispatched = {"dispatched": True, "claimed_at": LONG_AGO, "dispatched_at": None}
    leased = [
        JobFactory(**dispatched, lease_until=now - timedelta(minutes=1)),
        JobFactory(**dispatched, lease_until=now - timedelta(minutes=9)),
    ]
    silent = JobFactory.create_batch(2, **dispatched, lease_until=None)
    Job.objects.filter(id__in=[job.id for job in silent]).update(updated_at=now - timedelta(days=1))
    return leased, silent


@pytest.mark.django_db
def test_a_reaping_batch_takes_the_oldest_lease_first_and_jobs_without_one_last() -> None:
    leased, silent = _stale_executor_jobs()
    sweep = DatabaseStateStore().sweep_store()
    stale = {"dead_after": timedelta(minutes=5), "hard_cap": timedelta(days=7)}

    assert sweep.requeue_stale_dispatched_batch(**stale, limit=1) == 1
    assert _queued_ids() == {leased[1].id}  # its lease ended first
    assert sweep.requeue_stale_dispatched_batch(**stale, limit=2) == 2
    assert _queued_ids() == {leased[0].id, leased[1].id, min(job.id for job in silent)}
    assert sweep.requeue_stale_dispatched_batch(**stale, limit=5) == 1
    assert _queued_ids() == {job.id for job in [*leased, *silent]}


def _queued_ids() -> set[uuid.UUID]:
    return set(Job.objects.filter(status=JobStatus.QUEUED).values_list("id", flat=True))


@pytest.mark.postgres
@pytest.mark.django_db
def test_lease_sweeps_read_their_batches_from_the_lease_index_in_order() -> None:
    # Ordering the candidates by a sort instead meant reading every one for each batch:
    # 200 ms a batch with 100,000 stale jobs, growing with the backlog.
    seed_dispatched(300)
    seed_leases(300)
    sweep = DatabaseStateStore().sweep_store()
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")
    with CaptureQueriesContext(connections["default"]) as captured:
        sweep.requeue_stale_dispatched_batch(
            dead_after=timedelta(minutes=5), hard_cap=timedelta(days=7), limit=10
        )
        sweep.recover_expired_leases_batch(
            fallback_older_than=timedelta(minutes=5), attempt_limit=3, limit=10
        )
    picks = [query["sql"] for query in captured.captured_queries if "SKIP LOCKED" in query["sql"]]
    assert len(picks) == 2  # each batch filled from the jobs holding a lease
    plans = plans_without_table_scans(connections["default"], picks)
    for plan, status in zip(plans, ["dispatched", "running"], strict=True):
        assert f"'{status}'" in plan and "jobstate_job_lease_idx" in plan, plan
        assert "Sort" not in plan, plan


@pytest.mark.django_db
def test_expired_worker_leases_requeue_until_the_attempt_limit(settings: Any) -> None:
    settings.JOBSTATE = {**settings.JOBSTATE, "WORKER_ATTEMPT_LIMIT": 3}
    store = DatabaseStateStore()
    store.create_job(request_id="flaky", target="inhub", metadata={"no_delivery": True})
    token_of: list[Any] = []
    for attempt in range(1, 4):
        job = store.claim_next_inhub_job(["inhub"], f"worker-{attempt}")
        assert job is not None
        token_of.append(job.claim_token)
        Job.objects.filter(id=job.id).update(lease_until=LONG_AGO)
        result = maintenance.recover_expired_leases()
        job.refresh_from_db()
        assert job.attempts == attempt
        if attempt < 3:
            assert result.detail == {"requeued": 1, "failed": 0}
            assert job.status == JobStatus.QUEUED
            assert job.claim_token is None and job.executor_id is None
        else:
            assert result.detail == {"requeued": 0, "failed": 1}
            assert (job.status, job.error) == (JobStatus.ERROR, LEASE_EXPIRED_ERROR)
            assert job.claim_token is None and job.lease_until is None

    entries = list(AuditEntry.objects.filter(job=job).order_by("id"))
    assert [(e.event, e.severity) for e in entries] == [
        ("recovered", "warning"),
        ("recovered", "warning"),
        ("recovered", "error"),
    ]
    assert entries[0].detail["prev_status"] == "running"
    assert entries[0].detail["via"] == "worker-lease-expired:worker-1"
    assert entries[2].detail["attempts"] == 3
    # A worker that comes back after its lease was recovered cannot report any more.
    late = store.complete_claimed_job(job.id, token_of[0], JobStatus.DONE)
    assert late.outcome is CompletionOutcome.STALE_CLAIM


@pytest.mark.django_db
def test_a_renewed_worker_lease_is_not_recovered() -> None:
    store = DatabaseStateStore()
    store.create_job(request_id="alive", target="inhub")
    job = store.claim_next_inhub_job(["inhub"], "worker-1", timedelta(seconds=30))
    assert job is not None and job.claim_token is not None
    assert maintenance.recover_expired_leases().count == 0
    assert store.extend_claim_lease(job.id, job.claim_token)
    assert Job.objects.get(id=job.id).status == JobStatus.RUNNING


@pytest.mark.django_db
def test_the_dry_run_of_lease_recovery_splits_requeues_from_failures(settings: Any) -> None:
    settings.JOBSTATE = {**settings.JOBSTATE, "WORKER_ATTEMPT_LIMIT": 2}
    seed_leases(3, attempts=0)
    seed_leases(2, attempts=1)
    dry = maintenance.recover_expired_leases(dry_run=True)
    assert (dry.count, dry.detail) == (5, {"requeued": 3, "failed": 2})
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 5
    done = maintenance.recover_expired_leases()
    assert (done.count, done.detail) == (5, {"requeued": 3, "failed": 2})
    assert Job.objects.filter(status=JobStatus.ERROR).count() == 2


@pytest.mark.django_db
def test_stale_queued_jobs_expire_with_an_audit_entry() -> None:
    seed_queued(2)
    seed_queued(1, fresh=True)
    assert maintenance.expire_stale_queued().count == 2
    expired = Job.objects.filter(status=JobStatus.ERROR)
    assert set(expired.values_list("error", flat=True)) == {EXPIRED_QUEUED_ERROR}
    assert set(AuditEntry.objects.values_list("event", "job_id")) == {
        ("expired", job_id) for job_id in expired.values_list("id", flat=True)
    }


@pytest.mark.django_db
def test_released_locks_are_only_the_expired_ones() -> None:
    store = DatabaseStateStore()
    assert store.acquire_runtime_lock("held", "me", timedelta(hours=1))
    RuntimeLockFactory(lock_key="gone", owner="crashed", expires_at=LONG_AGO)
    assert maintenance.release_expired_locks().count == 1
    assert list(RuntimeLock.objects.values_list("lock_key", "owner")) == [("held", "me")]
    assert not store.acquire_runtime_lock("held", "other", timedelta(hours=1))


# --- what each retention sweep deletes ------------------------------------------------


@pytest.mark.django_db
def test_pruning_finished_jobs_keeps_their_audit_and_undelivered_notifications() -> None:
    store = DatabaseStateStore()
    old = store.create_job(request_id="old", target="t", status=JobStatus.DONE)
    store.append_audit(job=old, event="finished", detail={"status": "done"})
    note = NotificationFactory(job=old, state=NotificationState.PENDING)
    waiting = store.create_job(request_id="waiting", target="t")
    recent = store.create_job(request_id="recent", target="t", status=JobStatus.ERROR)
    Job.objects.filter(id__in=[old.id, waiting.id]).update(updated_at=_past(timedelta(days=30)))

    assert maintenance.prune_finished_jobs().count == 1

    assert set(Job.objects.values_list("request_id", flat=True)) == {"waiting", "recent"}
    assert AuditEntry.objects.filter(job_id=old.id).count() == 1
    note.refresh_from_db()
    assert note.job_id is None and note.state == "pending"
    assert Job.objects.get(id=recent.id).status == JobStatus.ERROR


@pytest.mark.django_db
def test_pruning_runs_never_deletes_a_running_run() -> None:
    seed_runs(2)  # running, silent for an hour, started long ago
    seed_finished_runs(3)
    assert maintenance.prune_finished_runs(older_than=timedelta(minutes=1)).count == 3
    assert JobRun.objects.running().count() == 2


@pytest.mark.django_db
def test_retention_sweeps_use_their_settings_or_one_override(settings: Any) -> None:
    seed_audit(2)  # 60 days old
    seed_finished_runs(2)  # 60 days old
    seed_finished_jobs(2)  # 30 days old
    settings.JOBSTATE = {
        **settings.JOBSTATE,
        "AUDIT_RETENTION": timedelta(days=90),
        "FINISHED_JOB_RETENTION": timedelta(days=90),
        "FINISHED_RUN_RETENTION": timedelta(days=90),
    }
    report = maintenance.run_retention_sweeps()
    assert report.counts == {"audit": 0, "jobs": 0, "runs": 0, "notifications": 0, "workers": 0}
    report = maintenance.run_retention_sweeps(older_than=timedelta(days=45), dry_run=True)
    assert report.as_dict() == {
        "audit": 2,
        "jobs": 0,
        "runs": 2,
        "notifications": 0,
        "workers": 0,
        "dry_run": True,
        "complete": True,
    }
    report = maintenance.run_retention_sweeps(timedelta(days=20), 1)
    assert report.counts == {"audit": 2, "jobs": 2, "runs": 2, "notifications": 0, "workers": 0}
    assert report["audit"].batches == 3
    assert not AuditEntry.objects.exists() and not JobRun.objects.exists()


# --- running the registries -----------------------------------------------------------


@pytest.mark.django_db
def test_run_reaping_sweeps_reports_every_count_in_order() -> None:
    seed_runs(1)
    seed_queued(2)
    seed_dispatched(3)
    seed_leases(4)
    seed_locks(5)
    report = maintenance.run_reaping_sweeps()
    assert [r.sweep for r in report.results] == list(maintenance.REAPING_SWEEPS)
    assert report.as_dict() == {
        "runs": 1,
        "queued": 2,
        "dispatched": 3,
        "leases": 4,
        "leases_requeued": 4,
        "leases_failed": 0,
        "tasks": 0,
        "tasks_requeued": 0,
        "tasks_failed": 0,
        "outbox": 0,
        "outbox_rearmed": 0,
        "outbox_dead": 0,
        "locks": 5,
        "dry_run": False,
        "complete": True,
    }
    assert report.total == 15
    assert maintenance.run_reaping_sweeps().total == 0


@pytest.mark.django_db
def test_run_reaping_sweeps_can_narrow_to_some_sweeps() -> None:
    seed_runs(1)
    seed_locks(1)
    report = maintenance.run_reaping_sweeps(sweeps=["locks"])
    assert report.counts == {"locks": 1}
    assert JobRun.objects.running().count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: maintenance.run_reaping_sweeps(batch_size=0), InvalidJobState),
        (lambda: maintenance.run_reaping_sweeps(limit=-1), InvalidJobState),
        (lambda: maintenance.run_reaping_sweeps(time_budget=timedelta(0)), InvalidJobState),
        (lambda: maintenance.run_reaping_sweeps(sweeps=["runs", "nope"]), InvalidJobState),
        (lambda: maintenance.run_reaping_sweeps(sweeps="runs"), InvalidJobState),
        (
            lambda: maintenance.run_reaping_sweeps(stale_after=timedelta(seconds=1)),
            InvalidRunnerConfiguration,
        ),
        (lambda: maintenance.run_retention_sweeps(older_than=timedelta(0)), InvalidJobState),
        (lambda: maintenance.recover_expired_leases(attempt_limit=0), InvalidJobState),
        (lambda: maintenance.prune_audit(dryrun=True), TypeError),
        (lambda: maintenance.release_expired_locks(older_than=timedelta(days=1)), TypeError),
        (lambda: maintenance.run_reaping_sweeps(ttl=timedelta(hours=1)), TypeError),
    ],
)
def test_bad_arguments_raise_before_anything_is_written(
    call: Callable[[], Any], error: type[Exception]
) -> None:
    seed_runs(1)
    seed_locks(1)
    seed_leases(1)
    seed_audit(1)
    with pytest.raises(error):
        call()
    assert JobRun.objects.running().count() == 1
    assert RuntimeLock.objects.count() == 1
    assert Job.objects.filter(status=JobStatus.RUNNING).count() == 1
    assert AuditEntry.objects.count() == 1


# --- the configured stores -------------------------------------------------------------


class RecordingSweepStore(DatabaseSweepStore):
    """The database sweep store, noting each queue-TTL operation it is asked for."""

    calls: ClassVar[list[tuple[str, int | None]]] = []

    def expire_stale_queued_batch(self, *, ttl: timedelta, limit: int) -> int:
        self.calls.append(("expire_stale_queued_batch", limit))
        return super().expire_stale_queued_batch(ttl=ttl, limit=limit)

    def count_stale_queued(self, *, ttl: timedelta, limit: int | None = None) -> int:
        self.calls.append(("count_stale_queued", limit))
        return super().count_stale_queued(ttl=ttl, limit=limit)


class RecordingStateStore(DatabaseStateStore):
    """A host's state store: the database one, with its own sweep store."""

    def sweep_store(self) -> RecordingSweepStore:
        return RecordingSweepStore(self.using, state=self)


class RecordingRunStore(DatabaseJobRunStore):
    """A host's run store: the database one, noting every reap it is asked for."""

    reaps: ClassVar[list[int | None]] = []

    def reap_stale(self, **arguments: Any) -> int:
        self.reaps.append(arguments.get("limit"))
        return super().reap_stale(**arguments)


def _configured(**stores: type) -> Any:
    paths = {setting: f"{__name__}.{store.__qualname__}" for setting, store in stores.items()}
    return override_settings(JOBSTATE=paths)


@pytest.mark.django_db
def test_the_sweeps_run_on_the_configured_stores() -> None:
    RecordingSweepStore.calls.clear()
    RecordingRunStore.reaps.clear()
    seed_queued(5)
    seed_runs(3)
    with _configured(STATE_STORE=RecordingStateStore, RUN_STORE=RecordingRunStore):
        assert maintenance.expire_stale_queued(dry_run=True, limit=4).count == 4
        report = maintenance.run_reaping_sweeps(batch_size=2, sweeps=["runs", "queued"])
    assert report.counts == {"runs": 3, "queued": 5}
    assert RecordingSweepStore.calls == [
        ("count_stale_queued", 4),
        ("expire_stale_queued_batch", 2),
        ("expire_stale_queued_batch", 2),
        ("expire_stale_queued_batch", 2),
    ]
    assert RecordingRunStore.reaps == [2, 2]
    assert not Job.objects.stale_queued(timedelta(minutes=30)).exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("setting", "path", "sweep"),
    [
        (
            "STATE_STORE",
            "jobstate.testing.memory_state.MemoryStateStore",
            maintenance.expire_stale_queued,
        ),
        ("RUN_STORE", "jobstate.testing.MemoryJobRunStore", maintenance.reap_stale_runs),
        ("RUN_STORE", "jobstate.testing.MemoryJobRunStore", maintenance.prune_finished_runs),
    ],
)
def test_a_configured_store_that_cannot_be_swept_is_refused_by_name(
    setting: str, path: str, sweep: Callable[..., SweepResult]
) -> None:
    seed_queued(1)
    seed_runs(1)
    seed_finished_runs(1)
    with override_settings(JOBSTATE={setting: path}):
        for dry_run in (False, True):
            with pytest.raises(ImproperlyConfiguredStore) as raised:
                sweep(dry_run=dry_run)
            message = str(raised.value)
            assert f"JOBSTATE['{setting}'] = '{path}'" in message
            assert "does not support the maintenance sweeps" in message
    assert Job.objects.stale_queued(timedelta(minutes=30)).count() == 1
    assert JobRun.objects.running().count() == 1
    assert JobRun.objects.finished().count() == 1


@pytest.mark.django_db
def test_the_commands_refuse_a_store_that_cannot_be_swept_as_a_settings_error() -> None:
    seed_queued(1)
    path = "jobstate.testing.memory_state.MemoryStateStore"
    with override_settings(JOBSTATE={"STATE_STORE": path}):
        for command in ("reap_stale", "prune_jobstate"):
            with pytest.raises(CommandError) as raised:
                call_command(command, stdout=StringIO(), stderr=StringIO())
            assert raised.value.returncode == 2
            assert path in str(raised.value)
    assert Job.objects.stale_queued(timedelta(minutes=30)).count() == 1


# --- concurrent sweepers on PostgreSQL ------------------------------------------------


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", CASES)
def test_two_sweepers_at_once_move_each_row_exactly_once(name: str) -> None:
    case = CASES[name]
    case.seed(300)
    case.seed(3, fresh=True)
    barrier = threading.Barrier(2)
    results: list[SweepResult] = []
    errors: list[BaseException] = []

    def sweeper() -> None:
        try:
            barrier.wait(timeout=10)
            results.append(case.sweep(batch_size=10))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=sweeper) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert sum(result.count for result in results) == 300
    assert not case.left().exists()
    assert case.untouched().count() == 3
    if name in {"queued", "dispatched", "leases"}:
        # One audit entry per moved job: no job was moved twice.
        assert AuditEntry.objects.count() == 300
        assert AuditEntry.objects.values("job_id").distinct().count() == 300
