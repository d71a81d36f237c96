"""SIGTERM and SIGINT for a worker process.

The first signal asks for a graceful stop: the worker claims nothing more, lets the
tasks it runs finish (up to ``--grace``) and hands back the rest. The second exits the
process at once with status 128 + the signal number: no ``finally`` block, no waiting
for a thread. The leases of the tasks it held then run out, and a sweep or another
worker recovers them, as after a crash. A signal the process was started ignoring stays
ignored (:mod:`jobstate.core.stop_signals`).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any

from jobstate.core.stop_signals import STOP_SIGNALS, handled_stop_signals

__all__ = ["STOP_SIGNALS", "exit_leaving_given_up_threads", "stop_signals"]

logger = logging.getLogger("jobstate.worker")


#: A second signal of the same kind this soon after the first is the same stop
#: delivered twice, not an operator's second: ``timeout`` signals its command and then
#: its process group (the reload supervisor with it, which forwards both), systemd's
#: default kill signals every process of the service. A second Ctrl-C comes later.
ONE_STOP_SECONDS = 0.1


@contextmanager
def stop_signals(on_first: Callable[[int], None]) -> Iterator[None]:
    """Within the block, the first SIGTERM or SIGINT calls ``on_first(signum)`` and the
    second ends the process (either one, unless the process was started ignoring it;
    the same one within :data:`ONE_STOP_SECONDS` is taken as the first delivered twice).
    The previous handlers come back afterwards. Outside the
    main thread (a worker run from a test's thread) signals cannot be handled and the
    block changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[tuple[int, float]] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        now = time.monotonic()
        if received:
            first, at = received[0]
            if signum == first and now - at < ONE_STOP_SECONDS:
                return  # the same stop, delivered twice
            _exit_at_once(signum)
        received.append((signum, now))
        on_first(signum)

    previous: dict[int, Any] = {sig: signal.signal(sig, handle) for sig in handled_stop_signals()}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: How long the second signal waits for its log line and the flush of the log.
_FLUSH_SECONDS = 1.0


def _exit_at_once(signum: int) -> None:
    """Say so, write out the log, and end the process: on a thread of its own that is
    waited for :data:`_FLUSH_SECONDS` at most. A log that blocks (a pipe nobody reads,
    held by a task thread halfway through a write) would otherwise keep the process
    that was told to exit at once."""
    farewell = threading.Thread(
        target=_say_and_flush, args=(signum,), name="jobstate-exit-at-once", daemon=True
    )
    farewell.start()
    farewell.join(_FLUSH_SECONDS)
    os._exit(128 + signum)


def _say_and_flush(signum: int) -> None:
    logger.warning(
        "%s again: exiting at once; the leases of the tasks still running will "
        "run out and the tasks will be recovered",
        signal.Signals(signum).name,
    )
    _flush()


def _flush() -> None:
    """Write out what the process has buffered before ``os._exit`` skips it."""
    logging.shutdown()
    _flush_streams()


def _flush_streams() -> None:
    """Write out what stdout and stderr hold (a closed or broken one is left)."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(OSError, ValueError):
            stream.flush()


def exit_leaving_given_up_threads(status: int, tasks: int) -> None:
    """End the process with ``status`` now, when threads are left after the worker gave
    up on ``tasks`` tasks (their grace ran out, or a timed-out task did not stop); else
    return, and the process exits as usual. The caller asks only when ``tasks`` > 0.

    An ``async def`` task runs in an event loop's thread of its own, which no interrupt
    reaches and which Python waits for at exit. The worker has reported such an attempt
    as lost: its next attempt may start elsewhere once the lease runs out, and the two
    must not overlap. Exiting this way skips ``atexit`` handlers, so it is done only
    then; the log is written out first."""
    # A daemon thread holds the process too when it is an executor's: Python joins
    # those at exit, and asgiref runs each event loop in one.
    waiting = [
        thread
        for thread in threading.enumerate()
        if thread.is_alive() and thread is not threading.main_thread()
    ]
    if not waiting:
        return
    logger.info(
        "Exiting without waiting for the thread%s of the %d task%s the worker gave up on",
        "" if len(waiting) == 1 else "s",
        tasks,
        "" if tasks == 1 else "s",
    )
    _flush()
    os._exit(status)


def exit_past_a_stuck_announcer(status: int) -> None:
    """End the process with ``status`` now: the worker stopped while its announcer was
    still inside a ``task_finished`` receiver or a log handler (see
    :mod:`.announcer`). Python's exit would flush the log's handlers, waiting for a
    lock that thread may hold; what is on stdout and stderr is written out first."""
    _flush_streams()
    os._exit(status)
