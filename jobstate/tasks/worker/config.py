"""What a worker is asked to do (:class:`WorkerConfig`, the options of ``manage.py
jobstate_worker``) and what it reports when it stops (:class:`WorkerSummary`)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from django.utils.crypto import get_random_string

__all__ = ["ScheduleEvaluation", "WorkerConfig", "WorkerSummary", "default_worker_id"]

#: What the worker calls between claims to evaluate the periodic schedules: it enqueues
#: the due slots and returns how many it enqueued and the seconds until the next call.
#: ``manage.py jobstate_worker`` passes :class:`jobstate.schedules.WorkerSchedulePass`;
#: the schedules sit above this package, so the worker knows only this shape.
ScheduleEvaluation = Callable[[], tuple[int, float]]


def default_worker_id() -> str:
    """``<host>:<pid>:<random>``: unique among running workers, even in containers where
    every worker is pid 1, and new for each start of a process."""
    return f"{socket.gethostname()}:{os.getpid()}:{get_random_string(6)}"


@dataclass(frozen=True)
class WorkerConfig:
    """What ``manage.py jobstate_worker`` was asked to do (see its help)."""

    backend: str = "default"
    queues: tuple[str, ...] | None = ("default",)
    """The queues to run; ``None``: every queue the backend allows."""
    concurrency: int = 1
    batch: bool = False
    max_tasks: int | None = None
    interval: float = 1.0
    worker_id: str = field(default_factory=default_worker_id)
    grace: float = 30.0
    using: str = "default"
    schedules: bool = True
    """Evaluate the periodic schedules (``--no-schedules`` turns it off) with the
    worker's ``schedule_pass``."""


@dataclass
class WorkerSummary:
    """What a worker did before it stopped."""

    worker_id: str
    started: int = 0
    succeeded: int = 0
    retrying: int = 0
    failed: int = 0
    lost: int = 0
    """Attempts whose result was dropped: their claim had been recovered elsewhere."""
    cancelled: int = 0
    """Attempts stopped (or never started) because their task was cancelled."""
    handed_back: int = 0
    interrupted: int = 0
    """Attempts still running when ``--grace`` ran out, counted and handed back."""
    stopped_by: str = ""
    scheduled: int = 0
    """Occurrences of periodic schedules this worker enqueued."""
    stuck: int = 0
    """Timed-out attempts whose thread did not stop within ``grace`` of the interrupt:
    the worker stopped because of them (``jobstate_worker`` then exits with status 4)."""
    unknown: int = 0
    """Tasks handed back, uncounted, because this worker could not import them."""
    unannounced: int = 0
    """Log lines and ``task_finished`` announcements not made when the worker stopped: a
    receiver or log handler did not return in time (see :mod:`.announcer`)."""

    def counts(self) -> str:
        """The counts of the worker's stop line."""
        return (
            f"{self.started} started, {self.succeeded} succeeded, {self.retrying} retrying, "
            f"{self.failed} failed, {self.cancelled} cancelled, {self.lost} lost, "
            f"{self.handed_back} handed back, {self.interrupted} interrupted"
        )
