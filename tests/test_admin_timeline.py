"""A job's timeline on its page: a task retried by a real worker (a subprocess) reads
in order — enqueued, attempt 1 claimed by its worker, failed with the traceback, retry
scheduled and after how long, attempt 2 claimed, succeeded, finished — and a running
job's heartbeats are summarised. Redaction applies to what the timeline quotes."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client

from jobstate.stores.database import DatabaseStateStore
from tests.task_functions import fails_before
from tests.tasks_kit import finish, start_worker, stop, use_options
from tests.test_admin_jobs import JOBS
from tests.test_admin_tasks import failed_task

#: The console's pages and their queries run on MariaDB/MySQL too (scripts/test's MariaDB step).
pytestmark = pytest.mark.mysql


def timeline_items(html: str) -> list[str]:
    section = html.split('id="jobstate-timeline"', 1)[1].split("</fieldset>", 1)[0]
    items = re.findall(r"<li class=\"([^\"]+)\">(.*?)</li>", section, re.S)
    return [f"{classes} | {re.sub(r'<[^>]+>', ' ', body)}" for classes, body in items]


def position(items: list[str], *needles: str) -> int:
    for index, item in enumerate(items):
        if all(needle in item for needle in needles):
            return index
    raise AssertionError(f"no timeline item with {needles}: {items}")


@pytest.mark.django_db(transaction=True)
def test_a_retried_tasks_timeline_reads_in_order(admin_client: Client, settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=3, RETRY_BACKOFF=0.3)
    result = fails_before.enqueue(2)
    # Two tasks' worth (the attempt and its retry), polling until the retry is due.
    worker = start_worker(
        "--max-tasks", "2", "--interval", "0.1", "--worker-id", "worker-a", options=options
    )
    try:
        code, _out, err = finish(worker, 90)
    finally:
        stop(worker)
    assert code == 0, err
    html = admin_client.get(f"{JOBS}{result.id}/change/").content.decode()
    items = timeline_items(html)
    steps = [
        position(items, "enqueued", "Enqueued", "tests.task_functions.fails_before"),
        position(items, "claimed", "Attempt 1 claimed by worker-a"),
        position(items, "failed", "Attempt 1 failed", "tests.task_functions.Boom: attempt 1 fails"),
        position(items, "audit", "Retry scheduled", "after"),
        position(
            items, "claimed", "Attempt 2 claimed by worker-a", "retried", "after the previous"
        ),
        position(items, "succeeded", "Attempt 2 succeeded"),
        position(items, "finished", "Finished: Done"),
    ]
    assert steps == sorted(steps), items
    retried = items[steps[4]]
    wait = float(re.search(r"retried (\d+\.\d) s after", retried).group(1))  # type: ignore[union-attr]
    assert wait >= 0.3  # the backoff
    failed = items[steps[2]]
    assert "Traceback" in failed and "attempt 1 fails" in failed


@pytest.mark.django_db
def test_the_timeline_masks_what_the_page_masks(admin_client: Client, settings: Any) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    secret = "hunter2-very-secret"
    task = failed_task(secret)
    html = admin_client.get(f"{JOBS}{task.id}/change/").content.decode()
    items = timeline_items(html)
    failed = items[position(items, "failed", "Attempt 2 failed", "builtins.ValueError")]
    assert secret not in html
    assert "••••" in failed


@pytest.mark.django_db
def test_a_running_jobs_heartbeats_are_summarised(admin_client: Client) -> None:
    store = DatabaseStateStore()
    job = store.create_job(request_id="long", target="llm")
    claimed = store.claim_next_inhub_job(["llm"], "worker-7", lease=timedelta(minutes=5))
    assert claimed is not None
    items = timeline_items(admin_client.get(f"{JOBS}{job.pk}/change/").content.decode())
    assert position(items, "claimed", "Claimed by worker-7") < position(
        items, "heartbeat", "Heartbeats", "heartbeats keep the lease", "ends in"
    )
    store.update_job(job.pk, lease_until=claimed.claimed_at)  # the worker went silent
    items = timeline_items(admin_client.get(f"{JOBS}{job.pk}/change/").content.decode())
    position(items, "heartbeat", "Heartbeats stopped", "expired")
