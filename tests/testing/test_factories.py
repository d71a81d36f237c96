"""The factory-boy factories of ``jobstate.testing.factories``: every default and trait
makes a row that passes the models' validation and the stores' JSON checks, and that the
stores treat as the state the trait names."""

from __future__ import annotations

import ast
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, models
from django.test.utils import CaptureQueriesContext

from jobstate.core.jsonvalues import ensure_json
from jobstate.models import AuditEntry, Job, JobRun, Notification, RuntimeLock
from jobstate.stores import get_run_store, get_state_store
from jobstate.stores.base import (
    CompletionOutcome,
    DeliveryRequeueOutcome,
    JobRunStatus,
    JobStatus,
    NotificationState,
    Trigger,
)
from jobstate.testing import factories
from jobstate.testing.factories import (
    AuditEntryFactory,
    JobFactory,
    JobRunFactory,
    NotificationFactory,
    RuntimeLockFactory,
)

VARIANTS: dict[str, tuple[Any, dict[str, Any]]] = {
    "job": (JobFactory, {}),
    "queued job": (JobFactory, {"queued": True}),
    "running job": (JobFactory, {"running": True}),
    "dispatched job": (JobFactory, {"dispatched": True}),
    "done job": (JobFactory, {"done": True}),
    "failed job": (JobFactory, {"failed": True}),
    "run": (JobRunFactory, {}),
    "running run": (JobRunFactory, {"running": True}),
    "settled run": (JobRunFactory, {"settled": True}),
    "skipped run": (JobRunFactory, {"skipped": True}),
    "audit entry": (AuditEntryFactory, {}),
    "notification": (NotificationFactory, {}),
    "delivering notification": (NotificationFactory, {"delivering": True}),
    "delivered notification": (NotificationFactory, {"delivered": True}),
    "dead notification": (NotificationFactory, {"dead": True}),
    "lock": (RuntimeLockFactory, {}),
    "expired lock": (RuntimeLockFactory, {"expired": True}),
}


@pytest.mark.django_db
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_default_and_trait_makes_a_valid_row(variant: str) -> None:
    factory, traits = VARIANTS[variant]
    rows = [factory(**traits), factory(**traits)]
    for row in rows:
        row.refresh_from_db()
        row.full_clean()  # choices, lengths, unique and check constraints
        for field in row._meta.concrete_fields:
            if isinstance(field, models.JSONField):
                ensure_json(getattr(row, field.attname), field=field.name)
    assert rows[0].pk != rows[1].pk


@pytest.mark.django_db
def test_job_traits_are_the_states_the_store_sees() -> None:
    store = get_state_store()
    queued = JobFactory(target="mail")
    running = JobFactory(running=True, target="mail")
    dispatched = JobFactory(dispatched=True, target="exec", executor_id="executor-9")
    finished = [JobFactory(done=True), JobFactory(failed=True)]

    assert set(Job.objects.ready()) == {queued}
    assert set(Job.objects.claimed()) == {running, dispatched}
    assert set(Job.objects.terminal()) == set(finished)
    assert all(job.is_terminal for job in finished)
    assert dispatched.dispatched_at == dispatched.claimed_at
    assert store.extend_executor_leases("executor-9") == 1
    assert running.lease_until > datetime.now(UTC)
    assert store.extend_claim_lease(running.id, running.claim_token)
    reported = store.complete_claimed_job(running.id, running.claim_token, JobStatus.DONE)
    assert reported.outcome is CompletionOutcome.COMPLETED
    claimed = store.claim_next_inhub_job(["mail"], "worker-2")
    assert claimed is not None and claimed.id == queued.id


@pytest.mark.django_db
def test_run_traits_are_the_states_the_run_store_sees() -> None:
    runs = get_run_store()
    held = JobRunFactory(overlap_key="billing:2024-05-01")
    settled = JobRunFactory(settled=True)
    skipped = JobRunFactory(skipped=True)

    trigger = Trigger("CLI")
    at = datetime.now(UTC)
    taken = runs.claim(
        job_key="billing",
        overlap_key="billing:2024-05-01",
        trigger=trigger,
        input={},
        started_at=at,
    )
    assert taken is None  # the factory's RUNNING row holds its overlap key
    assert runs.heartbeat(run_id=str(held.id))
    assert not runs.heartbeat(run_id=str(settled.id))
    assert (settled.status, settled.finished_at) == (JobRunStatus.SUCCEEDED, settled.started_at)
    assert (skipped.status, skipped.overlap_key) == (JobRunStatus.SKIPPED, None)
    assert set(JobRun.objects.finished()) == {settled, skipped}


@pytest.mark.django_db
def test_audit_entries_take_their_jobs_request_id() -> None:
    job = JobFactory(request_id="order-7")
    assert AuditEntryFactory(job=job).request_id == "order-7"
    assert AuditEntryFactory().request_id == ""
    assert AuditEntry.objects.filter(job=job).count() == 1


@pytest.mark.django_db
def test_a_dead_notification_is_a_dead_letter_the_store_can_replay() -> None:
    store = get_state_store()
    job = JobFactory(done=True)
    dead = NotificationFactory(dead=True, job=job)
    NotificationFactory(delivered=True, job=job)
    NotificationFactory(delivering=True, job=job)

    assert [row.id for row in store.notification_outbox.dead_letters()] == [dead.id]
    outcome = store.requeue_delivery_job_once(
        notification_id=dead.id, dlq_key="dlq-1", requested_by="ops"
    )
    assert outcome is DeliveryRequeueOutcome.REQUEUED
    dead.refresh_from_db()
    assert dead.state == NotificationState.PENDING


@pytest.mark.django_db
def test_a_held_lock_is_refused_and_an_expired_one_taken() -> None:
    store = get_state_store()
    held = RuntimeLockFactory(owner="worker-1")
    expired = RuntimeLockFactory(expired=True, owner="worker-1")
    assert not store.acquire_runtime_lock(held.lock_key, "worker-2", timedelta(minutes=1))
    assert store.acquire_runtime_lock(expired.lock_key, "worker-2", timedelta(minutes=1))
    assert RuntimeLock.objects.get(lock_key=expired.lock_key).owner == "worker-2"


@pytest.mark.django_db
def test_bulk_create_batch_writes_distinct_rows_in_one_statement() -> None:
    with CaptureQueriesContext(connection) as captured:
        rows = NotificationFactory.bulk_create_batch(50, dead=True, payload={"n": 1})
    inserts = [q for q in captured.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == 1
    assert len({row.idempotency_key for row in rows}) == 50
    assert Notification.objects.filter(state=NotificationState.DEAD).count() == 50


@pytest.mark.backend
@pytest.mark.slow
def test_the_factories_need_no_database_store_and_load_only_on_request() -> None:
    source = Path(factories.__file__).read_text()
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    allowed = ("__future__", "uuid", "datetime", "typing", "factory", "django.")
    allowed += ("jobstate.models", "jobstate.stores.base")
    assert all(str(name).startswith(allowed) for name in imported), imported
    # factory-boy is an optional extra: importing the testing kit must not need it.
    probe = "import sys, jobstate.testing; print('factory' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
