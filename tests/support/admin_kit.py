"""Helpers of the admin tests: staff users and their clients, posting admin actions
like the changelist does, and jobs, runs and notifications in the states the pages show."""

from __future__ import annotations

import html
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone

from jobstate.core.states import NewTask
from jobstate.models import Job, JobRun, Notification
from jobstate.stores import get_state_store
from jobstate.stores.base import StateStore, Trigger
from jobstate.stores.database import DatabaseJobRunStore
from jobstate.testing.factories import NotificationFactory
from tests.support.task_functions import echo

JOBS = "/admin/jobstate/job/"

PAST = datetime(2020, 1, 1, tzinfo=UTC)


def operator(user_model: Any, username: str, *codenames: str) -> Any:
    """A staff user with exactly the given jobstate permissions."""
    # No password: tests log in with force_login, and hashing one is slow.
    user = user_model.objects.create_user(username=username, password=None, is_staff=True)
    perms = list(
        Permission.objects.filter(content_type__app_label="jobstate", codename__in=codenames)
    )
    assert len(perms) == len(codenames), f"unknown permission among {codenames}"
    user.user_permissions.add(*perms)
    return user


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def act(
    client: Client, url: str, action: str, pks: list[Any], *, confirm: bool = False, **extra: Any
) -> Any:
    """Post an admin action like the changelist's form does; ``confirm`` posts the
    confirmation page's form instead. Follows the redirect back to the list."""
    data: dict[str, Any] = {"action": action, "_selected_action": [str(pk) for pk in pks]}
    if confirm:
        data["post"] = "yes"
    else:
        data["index"] = "0"
    data.update(extra)
    return client.post(url, data, follow=True)


def confirm_page(client: Client, url: str, action: str, pks: list[Any], **extra: Any) -> Any:
    """The confirmation page: the first step, posted without ``index`` as the job
    page's buttons do (the changelist's "Go" posts ``index`` and lands on it too)."""
    data: dict[str, Any] = {"action": action, "_selected_action": [str(pk) for pk in pks]}
    data.update(extra)
    return client.post(url, data)


def seen_fields(page: str) -> dict[str, str]:
    """The hidden fields a confirmation page sends back to say what it showed of each
    row (a lock's owner), to post with its ``post=yes``."""
    found = re.findall(r'name="(_jobstate_seen:[^"]*)" value="([^"]*)"', page)
    return {html.unescape(name): html.unescape(value) for name, value in found}


def shown_messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def failed_job(store: StateStore, request_id: str, **fields: Any) -> Job:
    """A job that was claimed, ran and failed."""
    fields.setdefault("target", "mail")
    store.create_job(request_id=request_id, **fields)
    claimed = store.claim_next_inhub_job([fields["target"]], "worker-1")
    assert claimed is not None and claimed.request_id == request_id
    result = store.complete_claimed_job(
        claimed.id, claimed.claim_token, "error", error="boom", attempts=2
    )
    assert result.job is not None
    return result.job


def running_job(store: StateStore, request_id: str, *, expired: bool) -> Job:
    store.create_job(request_id=request_id, target="llm")
    job = store.claim_next_inhub_job(["llm"], "worker-7")
    assert job is not None and job.request_id == request_id
    if expired:
        # The worker vanished: its lease ran out long ago.
        job = store.update_job(job.id, lease_until=PAST)
        assert job is not None
    return job


def run(runs: DatabaseJobRunStore, key: str, *, stale: bool) -> str:
    run_id = runs.claim(
        job_key="billing.close-day",
        overlap_key=key,
        trigger=Trigger("CLI", "ops"),
        input={"day": "2030-01-01"},
        started_at=datetime.now(UTC),
    )
    assert run_id is not None
    if stale:
        # The runner died an hour ago: its heartbeat stopped then.
        JobRun.objects.filter(id=run_id).update(heartbeat_at=datetime.now(UTC) - timedelta(hours=1))
    return run_id


def dead_letter(job: Any = None, key: str = "k1", **fields: Any) -> Notification:
    values: dict[str, Any] = {
        "job": job,
        "channel": "webhook",
        "destination": "https://hooks.example/orders",
        "payload": {"order": 7, "secret": "s-hidden"},
        "idempotency_key": key,
        "attempts": 8,
        "last_error": "HTTP 503",
    }
    values.update(fields)
    return NotificationFactory(dead=True, **values)


def failed_task(secret: str) -> Any:
    """An ``echo`` task whose two attempts failed, the second for good: a worker lost,
    then an exception quoting ``secret``."""
    queued = echo.using(priority=5, queue_name="emails").enqueue(
        "hello", password=secret, nested={"token": secret}
    )
    store = get_state_store()
    (claimed,) = store.claim_tasks(
        target="tasks:default", queues=["emails"], worker_id="w-1", lease=timedelta(1), limit=1
    )
    assert claimed.claim_token is not None
    started = claimed.claimed_at.isoformat() if claimed.claimed_at else None
    log = [
        {
            "worker_id": "w-0",
            "started_at": started,
            "finished_at": None,
            "outcome": "worker lost",
            "exception_class_path": "jobstate.exceptions.WorkerLost",
            "message": "the worker running this attempt stopped renewing its lease",
            "traceback": "jobstate.exceptions.WorkerLost: the worker stopped\n",
        },
        {
            "worker_id": "w-1",
            "started_at": started,
            "finished_at": timezone.now().isoformat(),
            "outcome": "failed",
            "exception_class_path": "builtins.ValueError",
            "message": f"bad password {secret}",
            "traceback": f"Traceback (most recent call last):\nValueError: bad password {secret}\n",
        },
    ]
    outcome = store.complete_claimed_job(
        claimed.id, claimed.claim_token, "error", attempt_log=log, error="builtins.ValueError"
    )
    assert outcome.completed
    return queued


# Far beyond STALE_RUN_AFTER (five minutes), so only the clock used can decide.
SKEW = timedelta(hours=2)


def traceback_of(attempt: int) -> str:
    """A task's traceback, told apart from the other attempts' by its line number."""
    return (
        "Traceback (most recent call last):\n"
        f'  File "/srv/app/billing.py", line {100 + attempt}, in send_invoice\n'
        "    smtp.send(invoice)\n"
        f"ConnectionRefusedError: SMTP refused attempt {attempt}\n"
    )


def thrice_failed_task() -> Job:
    """A ``send_invoice``-like task (``echo``) whose three attempts all failed, each with
    its own traceback, on workers w-1, w-2 and w-3, a minute apart."""
    store = get_state_store()
    enqueued = store.enqueue_task(
        NewTask(
            target="tasks:default",
            task_path="tests.support.task_functions.echo",
            queue_name="billing",
            priority=10,
            args=["invoice-4711"],
            kwargs={"customer": 42},
            max_attempts=3,
        )
    )
    (claimed,) = store.claim_tasks(
        target="tasks:default", queues=["billing"], worker_id="w-3", lease=timedelta(1), limit=1
    )
    assert claimed.claim_token is not None
    first = timezone.now() - timedelta(minutes=3)
    log = [
        {
            "worker_id": f"w-{n}",
            "started_at": (first + timedelta(minutes=n - 1)).isoformat(),
            "finished_at": (first + timedelta(minutes=n - 1, seconds=2.3)).isoformat(),
            "outcome": "failed",
            "exception_class_path": "builtins.ConnectionRefusedError",
            "message": f"SMTP refused attempt {n}",
            "traceback": traceback_of(n),
        }
        for n in (1, 2, 3)
    ]
    outcome = store.complete_claimed_job(
        claimed.id,
        claimed.claim_token,
        "error",
        attempt_log=log,
        attempts=3,
        error="builtins.ConnectionRefusedError: SMTP refused attempt 3",
    )
    assert outcome.completed and outcome.job is not None
    # Enqueued just before its first attempt, as a real one would be.
    Job.objects.filter(id=enqueued.id).update(created_at=first - timedelta(seconds=1))
    return Job.objects.get(id=enqueued.id)


def task_job(store: StateStore, *, failed_once: bool) -> Job:
    """A queued task; ``failed_once``: its first attempt failed and its retry is an
    hour away."""
    job = store.enqueue_task(
        NewTask(
            target="tasks:default",
            task_path="tests.support.task_functions.add",
            queue_name="default",
            priority=0,
            args=[1, 2],
            kwargs={},
            max_attempts=3,
        )
    )
    if not failed_once:
        return job
    (claimed,) = store.claim_tasks(
        target="tasks:default", queues=None, worker_id="w-1", lease=timedelta(minutes=5), limit=1
    )
    result = store.complete_claimed_job(
        claimed.id,
        claimed.claim_token,
        "queued",
        run_after=timezone.now() + timedelta(hours=1),
        error="ValueError: no",
    )
    assert result.job is not None
    return result.job
