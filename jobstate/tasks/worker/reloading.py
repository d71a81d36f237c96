"""``jobstate_worker --reload``: a fresh worker process whenever the code changes.

With ``--reload`` the command becomes a small *supervising* process (:func:`supervise`)
that runs the worker as a child process, the way Django's ``runserver`` does, with
Django's own file watcher (``django.utils.autoreload``). Unlike ``runserver``'s, the
child stops *gracefully* when a file changes (:class:`CodeWatcher`): it claims nothing
more, lets its running tasks finish within ``--grace``, hands back the rest and exits
with autoreload's "restart me" status, 3; the supervisor then starts a fresh child.
A child that fails with an error (status 1: a module it imports at start-up no longer
loads, say, saved half-edited) does not end the supervisor either: it waits, as
``runserver`` does, for the next change to a file of the code, then starts a fresh child.

The supervisor forwards each SIGTERM and SIGINT it gets to the child, which runs in a
process group of its own so a terminal's Ctrl-C reaches it once, through the
supervisor: the first signal stops the worker gracefully, a second at once, as without
``--reload``. The supervisor exits with the child's status (128 + the signal's number
when the child was killed by one, which it logs when the signal did not come through it:
SIGKILL, the OOM killer). A supervisor (systemd's default ``KillMode``, GNU
``timeout``) that signals every process of the service reaches the child twice at once,
which the child takes as one stop (:data:`~.shutdown.ONE_STOP_SECONDS`); ``--reload`` is
for development all the same: run production workers with ``DEBUG`` off or
``--no-reload``. A child
whose supervisor was killed stops too (gracefully), as nobody would restart it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from django.utils import autoreload

from jobstate.core.stop_signals import handled_stop_signals

__all__ = ["RELOAD_EXIT", "CodeWatcher", "is_reloaded_child", "supervise"]

logger = logging.getLogger("jobstate.worker")

#: The exit status with which a child asks its supervisor for a fresh start (Django's).
RELOAD_EXIT = 3


def is_reloaded_child() -> bool:
    """Whether this process is the worker a :func:`supervise` process started."""
    return os.environ.get(autoreload.DJANGO_AUTORELOAD_ENV) == "true"


def supervise() -> int:
    """Run this command again as a child process while it exits with
    :data:`RELOAD_EXIT`; forward SIGTERM and SIGINT to it; its exit status."""
    arguments = autoreload.get_child_arguments()
    environ = {**os.environ, autoreload.DJANGO_AUTORELOAD_ENV: "true"}
    child: subprocess.Popen[bytes] | None = None
    stopping: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        stopping.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    # A signal the supervisor ignores, its child (which inherits the ignore) does too.
    previous: dict[int, Any] = {sig: signal.signal(sig, forward) for sig in handled_stop_signals()}
    logger.info(
        "Watching for code changes: the worker restarts when a file of its code changes "
        "(--no-reload turns it off)"
    )
    try:
        while True:
            # The files as the child is about to read them: a fix saved while it is
            # still starting (and failing) is a change to wait for, not the baseline.
            started_on = _code_snapshot()
            child = subprocess.Popen(arguments, env=environ, close_fds=False, process_group=0)
            if stopping:
                # A signal came while the child was starting, before it could be forwarded.
                child.send_signal(stopping[0])
            code = child.wait()
            if code < 0 and -code not in stopping:
                # Killed by a signal nobody forwarded (SIGKILL, the OOM killer): the
                # worker could not say so itself.
                logger.error(
                    "The worker (pid %d) was killed by %s; exiting with status %d",
                    child.pid,
                    _signal_name(-code),
                    128 - code,
                )
            if code == _FAILED and not stopping:
                logger.error(
                    "The worker exited with status %d (its error is above); waiting for a "
                    "change to the code to start a fresh one",
                    code,
                )
                if not _wait_for_change(started_on, stopping):
                    return 0
            elif code != RELOAD_EXIT:
                return code if code >= 0 else 128 - code
            if stopping:
                return 0
            logger.info("Starting a fresh worker with the changed code")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


#: The status of a Python process ended by an uncaught exception.
_FAILED = 1

#: How often the supervisor looks at the files' modification times while it waits.
_POLL_SECONDS = 0.5


def _code_snapshot() -> dict[Any, float]:
    """The modification time of each file of the code this process loaded (Django's
    watched files: every imported module, the settings among them)."""
    return dict(autoreload.StatReloader().snapshot_files())


def _wait_for_change(before: dict[Any, float], stopping: list[int]) -> bool:
    """Wait until a file of the code differs from ``before`` (at once if it already
    does); ``False`` when a stop signal came first."""
    while not stopping:
        if _code_snapshot() != before:
            return True
        time.sleep(_POLL_SECONDS)
    return False


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a number the signal module has no name for
        return f"signal {signum}"


class CodeWatcher:
    """Watches the files of every imported module (Django's reloader, in a thread) and
    asks the worker to stop, with ``request_stop(reason)``, when one changes
    (:attr:`changed` then names it) or when the supervising process is gone (killed:
    nobody would restart this one)."""

    def __init__(self, request_stop: Callable[[str], None]) -> None:
        self.changed: str | None = None
        self._request_stop = request_stop
        self._reloader = autoreload.get_reloader()
        self._supervisor = os.getppid()
        self._stopped = threading.Event()
        autoreload.file_changed.connect(self._file_changed, weak=False)
        for target, args, name in (
            (self._reloader.run, (threading.main_thread(),), "jobstate-reloader"),
            (self._watch_supervisor, (), "jobstate-supervisor-watch"),
        ):
            threading.Thread(target=target, args=args, name=name, daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        self._reloader.stop()
        autoreload.file_changed.disconnect(self._file_changed)

    def _file_changed(self, sender: Any, file_path: Any, **kwargs: Any) -> bool:
        if self.changed is None:
            self.changed = str(file_path)
            logger.info("%s changed: stopping, for a fresh worker to start", file_path)
            self._request_stop(f"code changed: {file_path}")
        # Handled: Django's reloader would otherwise exit its thread (sys.exit(3)).
        return True

    def _watch_supervisor(self) -> None:
        while not self._stopped.wait(1.0):
            if os.getppid() != self._supervisor:
                logger.warning("The --reload supervisor is gone: stopping")
                self._request_stop("its --reload supervisor is gone")
                return
