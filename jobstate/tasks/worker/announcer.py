"""Announcing settled attempts, and logging, off the control loop.

Once an attempt's report is written, the worker logs the attempt's line and sends
``task_finished``. Both run the host's code: its log handlers, its signal receivers, and
the task's own exception, which a handler formats. Run on the control loop, a receiver
or a log handler that takes long (a webhook, a handler writing to a stalled network
socket) held up everything the loop does: no lease was renewed meanwhile, so a healthy
task that was still running was recovered and run a second time elsewhere, and no task
was claimed.

An :class:`Announcer` runs them on a thread of its own, in order. The control loop's
own log records go the same way (:meth:`Announcer.deferring_logs`): they are made on
the loop, with its thread and time, and handed to the host's handlers on the
announcer's thread, so a handler that blocks never blocks the loop, and the lines keep
their order. The loop never waits for the announcer, except in three cases:

- more than ``backlog`` announcements are waiting: the worker claims nothing until the
  announcer catches up (:meth:`Announcer.lagging`), so a slow receiver slows the worker
  down rather than piling up the finished tasks, and the exceptions they hold, in memory;
- a ``--batch`` worker finds nothing ready: it lets the announcements run before it
  stops (:meth:`Announcer.settle`), as a receiver may enqueue a task;
- the worker stops: it waits for what is still queued, up to a deadline, before it exits
  (:meth:`Announcer.close`).
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from functools import partial

from django.db import connections

from jobstate.core.attempt_log import storable_class_path
from jobstate.core.wakeup import Wakeup
from jobstate.tasks.worker.task_connections import release_task_connections

__all__ = ["DEFERRED_LOGGERS", "Announcer", "write_plainly"]

logger = logging.getLogger("jobstate.worker")

#: The loggers whose records the control loop defers to its announcer.
DEFERRED_LOGGERS = ("jobstate.worker", "jobstate.schedules")

#: How many rounds of announcements (see :meth:`Announcer.gathering`) may wait before
#: the worker stops claiming.
DEFAULT_BACKLOG = 256


def write_plainly(line: str) -> None:
    """Write ``line`` on stderr without logging: logging may be what failed or blocks."""
    with suppress(OSError, ValueError):  # a closed or broken stderr
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()


class _Deferral(logging.Filter):
    """On the deferred loggers: a record made on a thread that defers its logs is handed
    to that thread's announcer, and not handled there and then."""

    def __init__(self) -> None:
        super().__init__()
        self.local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        announcer: Announcer | None = getattr(self.local, "announcer", None)
        if announcer is None:
            return True
        # On the announcer's thread this filter lets the record through.
        announcer.put(partial(logging.getLogger(record.name).handle, record))
        return False


_DEFERRAL = _Deferral()


_Rounds = queue.SimpleQueue[list[Callable[[], object]] | None]


class _Mark(list[Callable[[], object]]):
    """A round that marks a point of the queue (:meth:`Announcer.settle`), not counted
    among the announcements."""


def _drained(rounds: _Rounds) -> Iterator[list[Callable[[], object]] | None]:
    """What ``rounds`` holds now, taken out of it."""
    while True:
        try:
            yield rounds.get_nowait()
        except queue.Empty:
            return


class Announcer:
    """Runs announcements in order, on one thread; see the module docstring."""

    def __init__(self, *, name: str, backlog: int = DEFAULT_BACKLOG) -> None:
        self._name = name
        self._backlog = backlog
        self._queue: _Rounds = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        #: Announcements put within :meth:`gathering`, not yet queued.
        self._gathered: list[Callable[[], object]] | None = None
        #: What is left of the round the thread is making.
        self._unmade = 0
        #: Rounds queued (by the control loop) and made (by the thread).
        self._queued = 0
        self._made = 0

    def put(self, announcement: Callable[[], object]) -> None:
        """Queue ``announcement``; the thread starts with the first one. Called on the
        control loop's thread only, as :meth:`gathering` is."""
        if self._gathered is not None:
            self._gathered.append(announcement)
        else:
            self._enqueue([announcement])

    @contextmanager
    def gathering(self) -> Iterator[None]:
        """Within the block, what is put is queued together at its end. A round of
        the control loop settles and claims in the block: the announcer's thread wakes
        once a round, after the round's next tasks started, rather than once per
        announcement in the middle of the round, competing with it for the
        interpreter."""
        if self._gathered is not None:
            yield
            return
        gathered: list[Callable[[], object]] = []
        self._gathered = gathered
        try:
            yield
        finally:
            self._gathered = None
            if gathered:
                self._enqueue(gathered)

    def _enqueue(self, announcements: list[Callable[[], object]]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        self._queued += 1
        self._queue.put(announcements)

    def settle(self, wake: Wakeup, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the announcements queued so far to be made,
        or until ``wake`` is set (a stop requested); whether some were waiting and all
        were made. A ``--batch`` worker asks before it stops, as a ``task_finished``
        receiver may enqueue a task."""
        if self._made == self._queued:
            return False
        made = threading.Event()
        self._enqueue(_Mark([made.set, wake.set]))
        wake.wait(timeout)
        return made.is_set()

    def lagging(self) -> bool:
        """More rounds of announcements wait than the backlog allows."""
        return self._queue.qsize() > self._backlog

    @contextmanager
    def deferring_logs(self) -> Iterator[None]:
        """Within the block, what this thread logs on :data:`DEFERRED_LOGGERS` is
        handled on the announcer's thread."""
        for name in DEFERRED_LOGGERS:
            logger = logging.getLogger(name)
            if _DEFERRAL not in logger.filters:
                logger.addFilter(_DEFERRAL)
        _DEFERRAL.local.announcer = self
        try:
            yield
        finally:
            _DEFERRAL.local.announcer = None

    def close(self, last_line: str, *, timeout: float) -> int:
        """Log ``last_line`` (the worker's stop line) after the queued announcements,
        waiting up to ``timeout`` seconds for them; return how many were not made. Those
        are counted, and the line written plainly, on stderr: a handler may be what
        blocks. (The thread is a daemon: it ends with the process.)"""
        logger.info("%s", last_line)
        thread = self._thread
        if thread is None:
            return 0
        self._queue.put(None)
        thread.join(timeout)
        if not thread.is_alive():
            return 0
        # The ones it is making, and the queued ones but the end marker.
        unmade = self._unmade + sum(
            len(round_)
            for round_ in _drained(self._queue)
            if round_ and not isinstance(round_, _Mark)
        )
        write_plainly(
            f"jobstate_worker: {unmade} log line(s) or task_finished announcement(s) were "
            f"not made: a receiver or log handler did not return within {timeout:g} s"
        )
        write_plainly(last_line)
        return unmade

    def _serve(self) -> None:
        try:
            while True:
                announcements = self._queue.get()
                if announcements is None:
                    return
                if isinstance(announcements, _Mark):
                    # Counted before it says so: a settle that follows at once must find
                    # nothing waiting, not wait again for this mark.
                    self._made += 1
                    for announcement in announcements:
                        self._make(announcement)
                    continue
                self._unmade = len(announcements)
                for announcement in announcements:
                    self._make(announcement)
                    self._unmade -= 1
                self._made += 1
        finally:
            connections.close_all()

    def _make(self, announcement: Callable[[], object]) -> None:
        try:
            announcement()
        # The host's code (a handler, a filter, a receiver): whatever it raises, the
        # announcements after it are still made.
        except BaseException as exc:
            write_plainly(
                f"jobstate_worker: a log line or task_finished announcement raised "
                f"{storable_class_path(type(exc))}"
            )
        if not connections.all(initialized_only=True):
            return  # what most receivers and handlers do: no database
        # As a request's end does: a receiver that used the database leaves no open
        # block, broken or expired connection to the next one.
        left_open = release_task_connections("a task_finished receiver")
        if left_open is not None:
            write_plainly(f"jobstate_worker: {left_open}")
