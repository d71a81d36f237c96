"""The no-op task of each contender, and the timing tasks of jobstate's task benchmark.
Imported after ``django.setup()`` with ``bench.settings``."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

from procrastinate.contrib.django import app as procrastinate_app

from jobstate.tasks import policy

try:  # Django 6 ships django.tasks; on 5.2 the django-tasks backport provides it.
    from django.tasks import task
except ImportError:  # pragma: no cover - depends on the Django version
    from django_tasks import task  # type: ignore[no-redef]


@procrastinate_app.task(name="bench.noop", queue="bench")
def procrastinate_noop(**payload: Any) -> None:
    """Does nothing: the benchmark measures the queue, not the work."""


@task(queue_name="default")
def tasks_db_noop(**payload: Any) -> None:
    """Does nothing: the benchmark measures the queue, not the work."""


@task(backend="jobstate")
def jobstate_noop(**payload: Any) -> None:
    """Does nothing: the benchmark measures the queue, not the work."""


@task(backend="jobstate")
@policy(max_attempts=3, timeout=timedelta(minutes=1), retry_on=(ConnectionError,))
def jobstate_policy_noop(**payload: Any) -> None:
    """Does nothing, as :func:`jobstate_noop`, under a policy the worker reads from each
    claimed job: the benchmark measures what the policy costs the drain."""


@task(backend="jobstate")
def jobstate_started(**payload: Any) -> float:
    """Returns when it started (the wall clock the harness shares)."""
    return time.time()


@task(backend="jobstate")
def jobstate_sleep(seconds: float) -> float:
    """Returns when it started, after working for ``seconds``."""
    started = time.time()
    time.sleep(seconds)
    return started


@task(backend="jobstate")
def jobstate_recorded(n: int, runs: str, **payload: Any) -> None:
    """Appends ``n`` to the file ``runs``, one line per run (a short append is written
    whole even when many processes append at once): the PgBouncer benchmark counts each
    task's runs there, apart from the queue it measures."""
    with open(runs, "a") as out:
        out.write(f"{n}\n")
