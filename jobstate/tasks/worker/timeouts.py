"""Attempts that run past their timeout, or do not stop once interrupted.

An attempt past its timeout is interrupted; it ends, as timed out, once its thread has
stopped, so no other attempt of the task starts anywhere meanwhile (the worker keeps its
lease). An interrupted attempt (timed out or cancelled) whose thread has not stopped
``grace`` later (it catches the interrupt, or is blocked in C code) is *stuck*: a thread
cannot be killed, only the process, so the worker stops. The stuck attempt keeps its
lease while the worker winds down and is settled last, its retry due no sooner than a
lease later, by when the process and its thread are gone.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

from jobstate.tasks.worker.execution import Attempt

__all__ = ["next_due", "overdue_attempts"]

logger = logging.getLogger("jobstate.worker")


def overdue_attempts(
    attempts: Iterable[Attempt],
    *,
    grace: float,
    worker_id: str,
    stuck: list[Attempt],
) -> list[Attempt]:
    """Interrupt the attempts past their deadline, and return those newly stuck (not
    already in ``stuck``): the caller stops the worker for them."""
    now = time.monotonic()
    newly_stuck: list[Attempt] = []
    for attempt in list(attempts):
        deadline = attempt.deadline
        if deadline is not None and now >= deadline and attempt.interrupt():
            how = (
                "interrupted it (TaskTimeLimitExceeded raised in its thread)"
                if attempt.interruptible
                else "an async task cannot be interrupted"
            )
            logger.warning(
                "Task %s %s ran past its timeout of %s: %s; it ends once its thread has stopped",
                attempt.job.task_path,
                attempt.job.id,
                attempt.timeout,
                how,
            )
        elif (
            attempt.interrupted
            and attempt.interrupted_at is not None
            and now >= attempt.interrupted_at + grace
            and attempt not in stuck
        ):
            newly_stuck.append(attempt)
            logger.error(
                "Task %s %s %s and its thread did not stop "
                "within %g s of the interrupt: worker %s stops claiming, hands back "
                "what it has not started and exits with status 4 so that its "
                "supervisor restarts it; the task is retried only after this process "
                "has ended",
                attempt.job.task_path,
                attempt.job.id,
                "was cancelled"
                if attempt.cancelled
                else f"ran past its timeout of {attempt.timeout}",
                grace,
                worker_id,
            )
    return newly_stuck


def next_due(attempts: Iterable[Attempt], *, grace: float) -> float:
    """The monotonic instant the first of ``attempts`` is due a look: its timeout, or
    ``grace`` after its interrupt; infinity when none has either."""
    due = math.inf
    for attempt in attempts:
        if attempt.interrupted_at is not None:
            due = min(due, attempt.interrupted_at + grace)
        elif attempt.deadline is not None:
            due = min(due, attempt.deadline)
    return due
