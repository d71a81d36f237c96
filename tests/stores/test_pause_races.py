"""Pausing a queue under load, on PostgreSQL with real concurrent connections: claimers
take jobs of two queues as fast as they can while another connection pauses one of
them. Every claim that started after the pause committed passes over the paused queue;
the other queue goes on being claimed.

A claim's ``claimed_at`` is its statement's start (``statement_timestamp()``), and a
statement under READ COMMITTED sees every commit before its start, so "started after the
pause committed" is read from the database: ``claimed_at`` later than a
``clock_timestamp()`` taken after the pause's commit.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection

from jobstate.models import Job
from jobstate.stores.database import DatabaseStateStore
from tests.support.threads import in_parallel

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CLAIMERS = 4
JOBS_PER_QUEUE = 3000
TASKS = "tasks:race"
LEASE = timedelta(minutes=5)


def seed() -> None:
    rows = []
    for n in range(JOBS_PER_QUEUE):
        rows.append(Job(request_id=f"held-{n}", target="held"))
        rows.append(Job(request_id=f"free-{n}", target="free"))
        for queue in ("slow", "fast"):
            rows.append(
                Job(
                    request_id=f"task-{queue}-{n}",
                    target=TASKS,
                    task_path="tests.support.task_functions.add",
                    queue_name=queue,
                    max_attempts=1,
                    attempt_log=[],
                )
            )
    Job.objects.bulk_create(rows, batch_size=2000)


def database_clock() -> datetime:
    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        (now,) = cursor.fetchone()
    return now  # type: ignore[no-any-return]


@pytest.mark.slow
def test_no_claim_that_starts_after_a_pause_commits_takes_the_paused_queue() -> None:
    seed()
    store = DatabaseStateStore()
    paused = threading.Event()
    stop = threading.Event()
    committed: list[datetime] = []

    def work(index: int) -> Any:
        if index == 0:
            # Let the claimers get going on both queues first.
            time.sleep(0.3)
            store.pause_queue(target="held", by="race")
            store.pause_queue(target=TASKS, queue="slow", by="race")
            committed.append(database_clock())
            paused.set()
            time.sleep(0.6)
            stop.set()
            return None
        claims = 0
        while not stop.is_set():
            if index % 2:
                store.claim_next_inhub_job(["held", "free"], f"hub-{index}")
            else:
                store.claim_tasks(
                    target=TASKS, queues=None, worker_id=f"task-{index}", lease=LEASE, limit=2
                )
            claims += 1
        return claims

    in_parallel(CLAIMERS + 1, work)
    assert paused.is_set()
    (after,) = committed

    def claimed(**where: Any) -> Any:
        return Job.objects.filter(claimed_at__isnull=False, **where)

    # The race was real: the paused queues were being claimed right up to the pause.
    assert claimed(target="held", claimed_at__lte=after).exists()
    assert claimed(target=TASKS, queue_name="slow", claimed_at__lte=after).exists()
    # No claim that started after the commit took one of them.
    assert not claimed(target="held", claimed_at__gt=after).exists()
    assert not claimed(target=TASKS, queue_name="slow", claimed_at__gt=after).exists()
    # The other queues went on being claimed after it.
    assert claimed(target="free", claimed_at__gt=after).count() > 10
    assert claimed(target=TASKS, queue_name="fast", claimed_at__gt=after).count() > 10
    # Nothing of the paused queues was left half-claimed: claimed rows are claimed whole.
    assert not Job.objects.filter(target="held", status="queued", claim_token__isnull=False)
