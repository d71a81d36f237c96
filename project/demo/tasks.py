"""Demo django.tasks tasks, run by jobstate's task backend (``TASKS`` in the settings).

Enqueue them from a shell (``python manage.py shell``) and watch a worker run them::

    from project.demo.tasks import build_report, flaky_sync, send_welcome_email
    send_welcome_email.enqueue(user_id=42)
    flaky_sync.enqueue("crm")           # fails its first attempt, succeeds on the retry
    build_report.enqueue(rows=5_000)    # takes a few seconds

    python manage.py jobstate_worker --queue-name '*' --concurrency 4

``demo_traffic`` enqueues a few of each now and then.
"""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta
from typing import Any

from jobstate.tasks import policy
from jobstate.tasks.compat import TaskContext, task


@task(queue_name="emails")
def send_welcome_email(user_id: int) -> dict[str, Any]:
    """A quick task: pretends to send an e-mail and returns what it sent."""
    return {"to": f"user-{user_id}@example.com", "template": "welcome"}


class UpstreamBusy(Exception):
    """The demo's transient failure: the upstream system asks to try again later."""


@task(takes_context=True, priority=10)
@policy(max_attempts=3, retry_on=(UpstreamBusy,), unique=lambda system: system)
def flaky_sync(context: TaskContext[Any, Any], system: str) -> str:
    """Fails its first attempt and succeeds on the next one (its policy retries
    ``UpstreamBusy`` after ``RETRY_BACKOFF``; any other error would fail it at once): the
    attempts and their errors show on the job's page. One sync per system waits or runs
    at a time: enqueueing another returns the one already there."""
    if context.attempt == 1:
        raise UpstreamBusy(f"{system} answered 503; retry later")
    return f"{system} synced on attempt {context.attempt}"


@task(queue_name="reports", priority=-10)
@policy(concurrency_key="report-builder", concurrency_limit=1, timeout=timedelta(minutes=1))
def build_report(rows: int, seconds: float = 3.0) -> dict[str, Any]:
    """A slow task: works for ``seconds`` and returns a digest of ``rows`` rows. One
    report builds at a time, whatever the number of workers (the Queues page lists its
    key while it is at its limit)."""
    time.sleep(seconds)
    digest = hashlib.sha256()
    for row in range(rows):
        digest.update(str(row).encode())
    return {"rows": rows, "sha256": digest.hexdigest()[:16]}
