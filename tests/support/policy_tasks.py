"""Tasks that declare a policy (``jobstate.tasks.policy``), for the policy tests."""

from __future__ import annotations

import os
import time
from datetime import timedelta
from typing import Any

from jobstate.tasks import policy
from jobstate.tasks.compat import TaskContext, task


class Transient(ConnectionError):
    """A failure a retry can cure."""


@task(takes_context=True)
@policy(max_attempts=4, retry_on=(ConnectionError,), discard_on=(ValueError,))
def picky(context: TaskContext[Any, Any], error: str) -> int:
    """Raises ``error`` (a builtin's name or ``Transient``) on each attempt but the fourth."""
    if context.attempt < 4:
        raise {"Transient": Transient, "ValueError": ValueError, "KeyError": KeyError}[error]()
    return context.attempt


@task
@policy(timeout=timedelta(seconds=0.3), max_attempts=1)
def sleeps_past_its_timeout(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@task
@policy(timeout=None)
def no_timeout(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


@policy(max_attempts=3)
@task
def policy_over_task() -> None:
    """Declared over ``@task``: the order does not matter."""


@task
@policy(max_attempts=2, retry_backoff=timedelta(minutes=10))
def slow_retry() -> None:
    raise ConnectionError("the upstream is down")


@task
@policy(unique=True)
def unique_by_arguments(*args: Any, **kwargs: Any) -> None:
    """Unique by its arguments."""


@task
@policy(unique=lambda customer_id, **_: None if customer_id < 0 else f"customer:{customer_id}")
def import_customer(customer_id: int, full: bool = False) -> int:
    """Unique per customer; a negative id is never unique."""
    return customer_id


@task
@policy(unique=True, unique_states=("READY", "RUNNING", "SUCCESSFUL"))
def unique_until_it_succeeds(key: str) -> None:
    """Once successful, never again; a failed one may be enqueued anew."""


@task
@policy(unique=True, unique_for=timedelta(hours=1))
def unique_per_hour(key: str) -> None:
    """Unique per key and hour, finished ones included."""


@task
@policy(unique=lambda key: key)
def keyed_by(key: Any) -> None:
    """Its key is whatever it is given: a test hands it hostile ones."""


@task
@policy(unique=lambda: 1 / 0)
def key_raises() -> None:
    """Its key function raises."""


@task
@policy(concurrency_key=lambda key, path, seconds: key, concurrency_limit=2, max_attempts=5)
def two_at_a_time(key: str, path: str, seconds: float) -> None:
    """At most two per ``key`` run at once: each run appends its start and end (with
    its process) to ``path``, for the test to check afterwards."""
    _note(path, f"start {key} {os.getpid()} {time.time():.6f}")
    time.sleep(seconds)
    _note(path, f"end {key} {os.getpid()} {time.time():.6f}")


@task
@policy(concurrency_key="the-one-printer")
def one_at_a_time() -> None:
    """A constant key: one at a time, whatever the arguments."""


def _note(path: str, line: str) -> None:
    # One write of a whole line in append mode: lines of several processes never mix.
    with open(path, "a", encoding="utf-8") as notes:
        notes.write(line + "\n")


@task
@policy(max_attempts=3, timeout=timedelta(minutes=1), retry_on=(ConnectionError,))
def add_with_a_policy(a: int, b: int) -> int:
    """``add`` with a policy stored with each job, for the statement counts."""
    return a + b
