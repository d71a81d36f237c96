"""Bulk operations against real concurrent claimers on PostgreSQL (threads with their
own connections), two drivers of one operation at once, and a driver killed mid-run
(a real subprocess, SIGKILL) then resumed: no job is both claimed and
requeued/rejected/deleted, counts are exact, and no job is handled twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest
from django.db import connections

from jobstate.console.bulk import advance_bulk_operation, start_bulk_operation
from jobstate.models import AuditEntry, BulkOperation, BulkState, Job
from jobstate.stores.base import JobStatus
from jobstate.stores.database import DatabaseStateStore
from tests.support.threads import in_parallel

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TARGET = "race"


def drive(operation_id: int) -> int:
    """Advance the operation in small steps until it is done; the batches taken."""
    steps = 0
    while True:
        operation = advance_bulk_operation(operation_id, batch_size=15, seconds=0.05)
        steps += 1
        if operation.state != BulkState.RUNNING:
            return steps


def bulk_entries(operation: BulkOperation, event: str) -> Counter[Any]:
    entries = AuditEntry.objects.filter(event=event, detail__by="ops")
    if event != "rejected":
        entries = entries.filter(detail__via=f"bulk:{operation.pk}")
    return Counter(entries.values_list("job_id", flat=True))


def claimers_and_drivers(
    operation_id: int, work: Any, *, claimers: int = 4, drivers: int = 2
) -> list[Any]:
    """Run ``claimers`` threads of ``work(i)`` and ``drivers`` threads driving the
    operation, all started together."""

    def body(index: int) -> Any:
        if index < claimers:
            return work(index)
        return drive(operation_id)

    return in_parallel(claimers + drivers, body, timeout=120)


@pytest.mark.slow
def test_bulk_reject_while_workers_claim_never_rejects_a_claimed_job() -> None:
    store = DatabaseStateStore()
    jobs = {store.create_job(request_id=f"q{n}", target=TARGET).pk for n in range(400)}
    operation = start_bulk_operation(
        action="reject", filters={"target": TARGET}, search="", operator="ops"
    )
    assert operation.total == 400

    def claim(index: int) -> set[Any]:
        claimed = set()
        while True:
            job = store.claim_next_inhub_job([TARGET], f"w{index}")
            if job is None:
                return claimed
            claimed.add(job.pk)
            time.sleep(0.001)

    results = claimers_and_drivers(operation.pk, claim)
    claimed = set().union(*results[:4])
    operation.refresh_from_db()
    rejected = set(Job.objects.filter(status=JobStatus.REJECTED).values_list("pk", flat=True))
    running = set(Job.objects.filter(status=JobStatus.RUNNING).values_list("pk", flat=True))
    assert claimed == running
    assert not claimed & rejected
    assert claimed | rejected == jobs
    entries = bulk_entries(operation, "rejected")
    assert set(entries) == rejected and set(entries.values()) == {1}
    assert operation.state == BulkState.DONE
    assert operation.done == len(rejected)
    # Skipped: read as queued by a batch but claimed before its row lock.
    assert operation.done + operation.skipped <= operation.total


@pytest.mark.slow
def test_bulk_requeue_while_workers_claim_and_fail_handles_each_job_once() -> None:
    store = DatabaseStateStore()
    for n in range(300):
        store.create_job(request_id=f"f{n}", target=TARGET)
    while (job := store.claim_next_inhub_job([TARGET], "first")) is not None:
        store.complete_claimed_job(job.pk, job.claim_token, "error", error="boom")
    failed = set(Job.objects.values_list("pk", flat=True))
    operation = start_bulk_operation(
        action="requeue", filters={"target": TARGET}, search="", operator="ops"
    )
    assert operation.total == 300
    lost: list[Any] = []

    def work(index: int) -> int:
        """Claim what the bulk requeue puts back and fail it again; every report of a
        claim must apply (a requeue never takes a job from under its worker)."""
        runs = 0
        idle_since = time.monotonic()
        while time.monotonic() - idle_since < 1.5:
            job = store.claim_next_inhub_job([TARGET], f"w{index}")
            if job is None:
                time.sleep(0.01)
                continue
            idle_since = time.monotonic()
            result = store.complete_claimed_job(job.pk, job.claim_token, "error", error="again")
            if not result.completed:
                lost.append(job.pk)
            runs += 1
        return runs

    results = claimers_and_drivers(operation.pk, work)
    operation.refresh_from_db()
    assert not lost
    entries = bulk_entries(operation, "rerun")
    # Each job at most once, though a failed-again job matches the filter again.
    assert set(entries.values()) == {1}
    assert set(entries) <= failed
    assert (
        operation.done
        == len(entries)
        == sum(results[:4]) + Job.objects.filter(status=JobStatus.QUEUED).count()
    )
    assert operation.state == BulkState.DONE


@pytest.mark.slow
def test_bulk_delete_while_workers_run_jobs_deletes_only_finished_ones() -> None:
    store = DatabaseStateStore()
    for n in range(300):
        store.create_job(request_id=f"d{n}", target=TARGET)
    operation = start_bulk_operation(
        action="delete", filters={"target": TARGET}, search="", operator="ops"
    )
    lost: list[Any] = []

    def work(index: int) -> int:
        runs = 0
        while (job := store.claim_next_inhub_job([TARGET], f"w{index}")) is not None:
            time.sleep(0.002)
            if not store.complete_claimed_job(job.pk, job.claim_token, "done").completed:
                lost.append(job.pk)
            runs += 1
        return runs

    # Fresh jobs are queued, so the operation counted none at confirmation; a later one
    # over the same filter sees the finished ones.
    assert operation.total == 0
    in_parallel(2, lambda i: work(i))
    operation = start_bulk_operation(
        action="delete", filters={"target": TARGET}, search="", operator="ops"
    )
    for n in range(200):
        store.create_job(request_id=f"late{n}", target=TARGET)
    results = claimers_and_drivers(operation.pk, work)
    operation.refresh_from_db()
    assert not lost
    deleted = bulk_entries(operation, "deleted")
    assert operation.done == len(deleted) == 300 and set(deleted.values()) == {1}
    assert {
        entry.detail["prev_status"] for entry in AuditEntry.objects.filter(event="deleted")
    } == {"done"}
    # The jobs created after the confirmation ran and stay.
    assert Job.objects.filter(request_id__startswith="late").count() == 200
    assert sum(results[:4]) == 200


@pytest.mark.slow
def test_a_driver_killed_mid_run_is_resumed_without_handling_a_job_twice() -> None:
    store = DatabaseStateStore()
    for n in range(1500):
        store.create_job(request_id=f"k{n}", target=TARGET)
    operation = start_bulk_operation(
        action="reject", filters={"target": TARGET}, search="", operator="ops"
    )
    command = [sys.executable, "manage.py", "run_bulk_operation", str(operation.pk)]
    env = {**os.environ, "DATABASE_URL": _test_database_url()}
    child = subprocess.Popen([*command, "--batch-size", "10"], env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        operation.refresh_from_db()
        if operation.processed >= 100:
            break
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    operation.refresh_from_db()
    assert operation.state == BulkState.RUNNING and 100 <= operation.processed < 1500
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert finished.returncode == 0, finished.stderr
    operation.refresh_from_db()
    assert operation.state == BulkState.DONE
    assert (operation.done, operation.skipped) == (1500, 0)
    assert f"{operation.pk} (reject) done: 1500 done, 0 skipped" in finished.stdout
    entries = bulk_entries(operation, "rejected")
    assert len(entries) == 1500 and set(entries.values()) == {1}


def _test_database_url() -> str:
    settings = connections["default"].settings_dict
    return f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}/{settings['NAME']}"
