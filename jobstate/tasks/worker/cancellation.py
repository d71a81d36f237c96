"""Stopping the tasks an operator cancels while this worker holds them.

``StateStore.cancel_job`` rejects a running task and revokes its claim in one
transaction; the worker learns of it by asking the store which of its claims are gone
(:meth:`~jobstate.stores.base.StateStore.lost_claims`, one primary-key read) about the
attempts still running, on every turn of its loop, at most once per ``--interval``. A
task whose job is now ``rejected`` was cancelled: its attempt is interrupted
(:class:`~jobstate.exceptions.TaskCancelled` raised in its thread, as a timeout raises
``TaskTimeLimitExceeded``), or taken back if no thread has started it. Its report is
then refused by the fencing, so nothing it returns is recorded. A thread that ignores
the interrupt (an ``async def`` task, a call into C that does not return) is a stuck
attempt like a timed-out one: ``--grace`` later the worker stops claiming and exits with
status 4 (see :mod:`.loop`).

A claim lost any other way (its lease ran out and a sweep recovered it) is only marked,
as the beat's lease renewal marks it: its result will be dropped, and the task runs on.
An attempt that has already ended is left to its report, which the fencing refuses
and which reads the cancel from the row it finds: so a worker whose tasks end before
their next turn asks nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from jobstate.core.states import JobStatus
from jobstate.exceptions import TaskCancelled
from jobstate.stores.base import StateStore
from jobstate.tasks.worker.execution import Attempt

__all__ = ["CancelWatch"]

logger = logging.getLogger("jobstate.worker")


class CancelWatch:
    """Asks ``store`` about the claims of the attempts it is shown, at most once per
    ``every`` seconds, and stops those whose task was cancelled."""

    def __init__(self, store: StateStore, every: float) -> None:
        self.store = store
        self.every = every
        self._next = 0.0

    def check(self, attempts: Iterable[Attempt], *, due_now: bool = False) -> list[Attempt]:
        """Mark the attempts whose claim is gone; interrupt the running ones whose task
        was cancelled. Returns the attempts taken back before any thread started them
        (the caller forgets them). Unless ``due_now``, at most once per ``every``."""
        now = time.monotonic()
        if not due_now and now < self._next:
            return []
        if not due_now:
            self._next = now + self.every
        # An attempt that has ended is left to its report, which learns of a cancel from
        # the row that refuses it: asking about it here would cost a worker of quick
        # tasks one statement per turn, for nothing its thread could still be told.
        held = [
            attempt
            for attempt in attempts
            if not attempt.claim_lost and attempt.job.claim_token and not attempt.ended
        ]
        if not held:
            return []
        claims: list[tuple[Any, Any]] = [
            (attempt.job.id, attempt.job.claim_token) for attempt in held
        ]
        lost = self.store.lost_claims(claims)
        dropped: list[Attempt] = []
        for attempt in held:
            if attempt.job.id not in lost:
                continue
            job = attempt.job
            if attempt.ended:
                # It ended since the list above was made: its report tells.
                continue
            attempt.claim_lost = True
            if lost[job.id] != JobStatus.REJECTED:
                logger.warning(
                    "Lost the claim of task %s %s: its lease ran out and it was recovered "
                    "elsewhere; what this attempt returns will be dropped",
                    job.task_path,
                    job.id,
                )
            elif attempt.hand_back():
                attempt.cancelled = True
                dropped.append(attempt)
                logger.warning("Task %s %s was cancelled before it started", job.task_path, job.id)
            elif attempt.interrupt(TaskCancelled):
                how = (
                    "interrupted it (TaskCancelled raised in its thread)"
                    if attempt.interruptible
                    else "an async task cannot be interrupted"
                )
                logger.warning(
                    "Task %s %s was cancelled: %s; it ends once its thread has stopped",
                    job.task_path,
                    job.id,
                    how,
                )
        return dropped
