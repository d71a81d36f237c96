"""A job's timeline on its page: a task retried by a real worker (a subprocess) reads
in order — enqueued, attempt 1 on its worker failed with the traceback, retry scheduled
and after how long, attempt 2 retried that long after and succeeded, finished — each
attempt one item, and a running job's heartbeats are summarised. Redaction applies to
what the timeline quotes."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from jobstate.core.states import NewTask
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import JOBS, failed_task
from tests.support.task_functions import fails_before
from tests.support.tasks_kit import finish, start_worker, stop, use_options

#: The console's pages and their queries run on MariaDB/MySQL too (scripts/test's MariaDB step).
pytestmark = pytest.mark.mysql


def timeline_items(html: str) -> list[str]:
    section = html.split('id="jobstate-timeline"', 1)[1].split("</fieldset>", 1)[0]
    items = re.findall(r"<li class=\"([^\"]+)\">(.*?)</li>", section, re.S)
    # Tags become spaces (a worker's name is a link), runs of spaces one.
    text = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body)) for _classes, body in items]
    return [f"{classes} | {body}" for (classes, _body), body in zip(items, text, strict=True)]


def failed_html(html: str) -> str:
    """The timeline's failed items, as HTML."""
    section = html.split('id="jobstate-timeline"', 1)[1].split("</fieldset>", 1)[0]
    return "".join(re.findall(r'<li class="jobstate-timeline-failed.*?</li>', section, re.S))


def position(items: list[str], *needles: str) -> int:
    for index, item in enumerate(items):
        if all(needle in item for needle in needles):
            return index
    raise AssertionError(f"no timeline item with {needles}: {items}")


@pytest.mark.slow
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
        position(items, "enqueued", "Enqueued", "tests.support.task_functions.fails_before"),
        position(
            items,
            "failed",
            "Attempt 1 on",
            "worker-a",
            "tests.support.task_functions.Boom: attempt 1 fails",
        ),
        position(items, "audit", "Retry scheduled", "after"),
        position(
            items, "succeeded", "Attempt 2 on", "worker-a", "retried", "after the previous", "ran"
        ),
        position(items, "finished", "Finished: SUCCESSFUL"),
    ]
    assert steps == sorted(steps), items
    retried = items[steps[3]]
    wait = float(re.search(r"retried (\d+\.\d) s after", retried).group(1))  # type: ignore[union-attr]
    assert wait >= 0.3  # the backoff
    failed = items[steps[1]]
    assert "Traceback" in failed and "attempt 1 fails" in failed
    # Each attempt is one item: the traceback is on the page once, folded.
    assert html.count("attempt 1 fails\n") == 1
    assert '<details class="jobstate-traceback">' in failed_html(html)


@pytest.mark.django_db
def test_the_timeline_masks_what_the_page_masks(admin_client: Client, settings: Any) -> None:
    use_options(settings, MAX_ATTEMPTS=3)
    secret = "hunter2-very-secret"
    task = failed_task(secret)
    html = admin_client.get(f"{JOBS}{task.id}/change/").content.decode()
    items = timeline_items(html)
    failed = items[position(items, "failed", "Attempt 2 on", "builtins.ValueError")]
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


def attempt(worker: str, started: datetime, seconds: float = 1.0) -> dict[str, Any]:
    return {
        "worker_id": worker,
        "started_at": started.isoformat(),
        "finished_at": (started + timedelta(seconds=seconds)).isoformat(),
        "outcome": "failed",
        "exception_class_path": "builtins.ValueError",
        "message": f"failed on {worker}",
        "traceback": "ValueError\n",
    }


@pytest.mark.django_db
def test_attempts_left_out_of_a_long_log_are_named_where_they_were(admin_client: Client) -> None:
    # A long log keeps its first and latest attempts and counts those between; the page
    # said "Attempt 32 claimed … retried 2.0 h after the previous attempt ended" of an
    # attempt whose previous one (31) is not in the log, and the table jumped from 1 to 32.
    store = DatabaseStateStore()
    job = store.enqueue_task(
        NewTask(
            target="tasks:default",
            task_path="tests.support.task_functions.echo",
            queue_name="default",
            priority=0,
            args=[],
            kwargs={},
            max_attempts=40,
        )
    )
    (claimed,) = store.claim_tasks(
        target="tasks:default", queues=["default"], worker_id="w-33", lease=timedelta(1), limit=1
    )
    assert claimed.claim_token is not None
    first = timezone.now() - timedelta(hours=3)
    log = [
        attempt("w-1", first),
        {"left_out": 30},
        attempt("w-32", first + timedelta(hours=2)),
        attempt("w-33", first + timedelta(hours=2, minutes=1)),
    ]
    store.complete_claimed_job(
        claimed.id, claimed.claim_token, "error", attempt_log=log, error="ValueError", attempts=33
    )
    html = admin_client.get(f"{JOBS}{job.id}/change/").content.decode()
    items = timeline_items(html)
    steps = [
        position(items, "failed", "Attempt 1 on", "w-1"),
        position(items, "Attempts 2-31", "30 in all", "left out of the attempt log"),
        position(items, "failed", "Attempt 32 on", "w-32"),
        position(items, "failed", "Attempt 33 on", "w-33", "retried 59 s after"),
    ]
    assert steps == sorted(steps), items
    assert steps == list(range(steps[0], steps[0] + 4)), items  # in a row, the gap between
    assert "after the previous attempt" not in items[steps[2]]


@pytest.mark.django_db
def test_a_lost_attempt_shows_when_it_was_found_lost_in_its_place(admin_client: Client) -> None:
    # The recovery left the lost attempt without an end: the page put it after
    # "Finished", without a time.
    store = DatabaseStateStore()
    job = store.enqueue_task(
        NewTask(
            target="tasks:default",
            task_path="tests.support.task_functions.echo",
            queue_name="default",
            priority=0,
            args=[],
            kwargs={},
            max_attempts=1,
        )
    )
    (claimed,) = store.claim_tasks(
        target="tasks:default", queues=["default"], worker_id="w-gone", lease=timedelta(1), limit=1
    )
    store.update_job(claimed.id, lease_until=timezone.now() - timedelta(minutes=5))
    assert store.recover_expired_tasks().failed == 1
    items = timeline_items(admin_client.get(f"{JOBS}{job.id}/change/").content.decode())
    lost = position(items, "failed", "Attempt 1 on", "w-gone", "worker lost", "found lost")
    assert lost < position(items, "Failed: worker lost")
    assert re.search(r"found lost [\d.]+ s after it started, at \d\d:\d\d:\d\d", items[lost])
