"""How a one-shot command stops on SIGTERM and Ctrl-C: as Ctrl-C stops Python, for both.

Without this, SIGTERM (a deploy, ``systemctl stop``, a cron daemon's timeout) ended a
command at once, without Python's clean-up: ``run_operations_job`` left its run RUNNING
and its overlap key held, so every later start was quietly SKIPPED until the run was
reaped. And Ctrl-C printed a traceback. Now the first stop signal raises
:class:`CommandInterrupted` (a ``KeyboardInterrupt``) in the main thread, so the
command unwinds as it does on Ctrl-C: a transaction under way rolls back, an operations
job's run is recorded as interrupted and frees its key. The command then says in one
line that it stopped and what stays done, and exits with status 128 + the signal's
number. A second signal exits at once.

The worker and the relay have their own graceful stop (they finish what they hold
first) and turn this off.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType
from typing import Any

from jobstate.core.stop_signals import StopAtOnce, handled_stop_signals

__all__ = [
    "CommandInterrupted",
    "deferred_stop_signals",
    "exit_stopped",
    "interrupted_by_stop_signals",
    "stop_line",
]


class CommandInterrupted(KeyboardInterrupt):
    """A stop signal arrived while a one-shot command ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _stop_signals(on_first: Callable[[int], None]) -> Iterator[list[int]]:
    """Within the block, the first stop signal is recorded (in the list yielded) and
    handed to ``on_first``; a second exits at once
    (:class:`~jobstate.core.stop_signals.StopAtOnce`). Only from the main thread, where
    Python delivers signals; elsewhere the block runs as it is."""
    received: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return

    def handle(signum: int, frame: FrameType | None) -> None:
        if received:
            raise StopAtOnce(128 + signum)
        received.append(signum)
        on_first(signum)

    previous: dict[int, Any] = {sig: signal.signal(sig, handle) for sig in handled_stop_signals()}
    try:
        yield received
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int) -> None:
    raise CommandInterrupted(signum)


def interrupted_by_stop_signals() -> AbstractContextManager[list[int]]:
    """Within the block, the first stop signal raises :class:`CommandInterrupted`; a
    second exits at once."""
    return _stop_signals(_interrupt)


def deferred_stop_signals() -> AbstractContextManager[list[int]]:
    """Within the block, the first stop signal is only recorded (in the list yielded),
    so the work under way finishes; a second exits at once. For a command whose work is
    short and must not be cut (one relay pass sends what it claimed)."""
    return _stop_signals(lambda signum: None)


def stop_line(name: str, exc: KeyboardInterrupt, done: str) -> tuple[str, int]:
    """The line a command that stopped on ``exc`` writes, and its exit status. ``done``
    says what stays done (each command knows its own)."""
    signum = getattr(exc, "signum", signal.SIGINT)
    return f"{name}: stopped by {signal.Signals(signum).name}. {done}", 128 + signum


def exit_stopped(stderr: Any, name: str, exc: KeyboardInterrupt, done: str) -> None:
    """Write :func:`stop_line` to ``stderr`` and exit with its status."""
    line, status = stop_line(name, exc, done)
    stderr.write(line)
    sys.exit(status)
