"""Tasks a worker cannot import: its code is older than the enqueuer's (a rolling
deploy), so the task is not the one failing.

Such a task is handed back, its attempt not counted, due again after
:data:`UNKNOWN_TASK_DELAY`, for a worker with newer code; the worker warns once per
task path. A task enqueued longer ago than the backend's ``UNKNOWN_TASK_TIMEOUT`` fails
instead, for good, with :class:`~jobstate.exceptions.UnknownTask`. An ``ImportError``
the task raises while it runs is its own failure, as any other exception.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta

from django.utils import timezone

from jobstate.core.attempt_log import AttemptOutcome
from jobstate.exceptions import UnknownTask
from jobstate.tasks.options import TaskOptions
from jobstate.tasks.worker.execution import Attempt, Outcome, ended_by_worker
from jobstate.tasks.worker.reports import Reporter

__all__ = ["UNKNOWN_TASK_DELAY", "UnknownTasks"]

logger = logging.getLogger("jobstate.worker")

#: How long a task this worker cannot import waits, handed back, before any worker may
#: claim it again: long enough that the worker does not spin on it, short enough that
#: a worker with newer code gets it soon.
UNKNOWN_TASK_DELAY = timedelta(seconds=5)


class UnknownTasks:
    """One worker's handling of the tasks it cannot import."""

    def __init__(self, reporter: Reporter, options: TaskOptions) -> None:
        self.reporter = reporter
        self.options = options
        #: Task paths this worker could not import, warned about once each.
        self._warned: set[str] = set()

    def hand_back(self, outcomes: Sequence[Outcome]) -> tuple[list[Outcome], list[Attempt]]:
        """Hand back the tasks of ``outcomes`` whose dotted path did not import here
        (one enqueued longer ago than ``UNKNOWN_TASK_TIMEOUT`` becomes a final failure
        instead): the outcomes left to settle, and the attempts handed back. A store
        failure raises before anything is handed back or warned about."""
        unknown = [
            outcome
            for outcome in outcomes
            if outcome.attempt.unloadable is not None
            and outcome.record.outcome is AttemptOutcome.FAILED
        ]
        if not unknown:
            return list(outcomes), []
        limit = self.options.unknown_task_timeout
        now = timezone.now()
        expired = [
            outcome
            for outcome in unknown
            if limit is not None and now - outcome.attempt.job.created_at >= limit
        ]
        back = [outcome.attempt for outcome in unknown if outcome not in expired]
        if back:
            self.reporter.hand_back(back, run_after=now + UNKNOWN_TASK_DELAY)
        for attempt in back:
            self._warn(attempt)
        left = [outcome for outcome in outcomes if outcome not in unknown]
        return left + [_failed_for_good(outcome, limit) for outcome in expired], back

    def _warn(self, attempt: Attempt) -> None:
        path = attempt.job.task_path or ""
        level = logging.DEBUG if path in self._warned else logging.WARNING
        self._warned.add(path)
        logger.log(
            level,
            "Task %s %s: this worker cannot import it (%s); handed back, its attempt not "
            "counted, for a worker with newer code (due again in %g s). It fails once "
            "enqueued longer ago than UNKNOWN_TASK_TIMEOUT (%s). Restart this worker to "
            "load the new code (--reload does it by itself)",
            path,
            attempt.job.id,
            attempt.unloadable,
            UNKNOWN_TASK_DELAY.total_seconds(),
            self.options.unknown_task_timeout or "never",
        )


def _failed_for_good(outcome: Outcome, limit: timedelta | None) -> Outcome:
    """The final failure of a task no worker could import within ``limit``."""
    attempt = outcome.attempt
    message = (
        f"no worker could import the task {attempt.job.task_path!r} within "
        f"UNKNOWN_TASK_TIMEOUT ({limit}) of its enqueueing; the last one said: "
        f"{attempt.unloadable}"
    )
    record = ended_by_worker(
        attempt,
        AttemptOutcome.FAILED,
        UnknownTask,
        message,
        before=f"{outcome.record.traceback}\n",
    )
    return Outcome(attempt, record, final=True)
