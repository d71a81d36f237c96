"""Announcing settled attempts off the control loop.

Once an attempt's report is written, the worker logs the attempt's line and sends
``task_finished``. Both run the host's code: its log handlers, its signal receivers, and
the task's own exception, which a handler formats. Run on the control loop, a receiver
that takes long (a webhook, a slow log handler) held up everything the loop does: no
lease was renewed meanwhile, so a healthy task that was still running was recovered and
run a second time elsewhere, and no task was claimed.

An :class:`Announcer` runs them on a thread of its own, in the order the reports were
written. The loop never waits for it, except in two cases:

- more than ``backlog`` announcements are waiting: the worker claims nothing until the
  announcer catches up (:meth:`Announcer.lagging`), so a slow receiver slows the worker
  down rather than piling up the finished tasks, and the exceptions they hold, in memory;
- the worker stops: it waits for the announcements still queued, up to ``grace`` (at
  least 5 s), before its last line (:meth:`Announcer.close`).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from django.db import close_old_connections, connections

__all__ = ["Announcer"]

logger = logging.getLogger("jobstate.worker")

#: How many announcements may wait before the worker stops claiming.
DEFAULT_BACKLOG = 256


class Announcer:
    """Runs announcements (callables that raise nothing) in order, on one thread."""

    def __init__(self, *, name: str, backlog: int = DEFAULT_BACKLOG) -> None:
        self._name = name
        self._backlog = backlog
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def put(self, announcement: Callable[[], None]) -> None:
        """Queue ``announcement``; the thread starts with the first one."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._queue.put(announcement)

    def lagging(self) -> bool:
        """More announcements wait than the backlog allows."""
        return self._queue.qsize() > self._backlog

    def close(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the queued announcements; say how many were
        never made when that runs out (the thread is a daemon: it ends with the
        process)."""
        thread = self._thread
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout)
        if thread.is_alive():
            logger.error(
                "The worker stops without announcing the end of %d task attempt(s): a "
                "task_finished receiver or a log handler did not return within %g s",
                max(self._queue.qsize() - 1, 0) + 1,
                timeout,
            )

    def _serve(self) -> None:
        try:
            while True:
                announcement = self._queue.get()
                if announcement is None:
                    return
                announcement()
                # As a request's end does: a receiver that used the database leaves
                # no broken or expired connection to the next one.
                close_old_connections()
        finally:
            connections.close_all()
