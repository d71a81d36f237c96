"""The wake-up that stop signals set (:class:`jobstate.core.wakeup.Wakeup`).

A worker's control loop sleeps on it, and its SIGTERM handler sets it. With a
``threading.Event`` there, a signal landing while the loop held the event's lock hung
the worker for good: it neither ran its task's report nor stopped (seen when a worker was
continued after SIGSTOP and told to stop at once)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from jobstate.core.wakeup import Wakeup

#: A worker's control loop sleeping on its wake-up while a timer's signal asks it, over
#: and over, to stop: each stop request lands somewhere inside a wait or a clear.
_SIGNAL_STORM = textwrap.dedent(
    """
    import signal, time
    import django
    django.setup()
    from jobstate.tasks.compat import task_backends
    from jobstate.tasks.worker import TaskWorker, WorkerConfig

    worker = TaskWorker(WorkerConfig(schedules=False), task_backends["default"])
    signal.signal(signal.SIGALRM, lambda signum, frame: worker.request_stop("SIGALRM"))
    rounds, until = 0, time.monotonic() + 5
    while time.monotonic() < until:
        signal.setitimer(signal.ITIMER_REAL, 0.0001)
        worker._wake.wait(0.0002)
        worker._wake.clear()
        rounds += 1
    print(rounds)
    """
)


@pytest.mark.slow
def test_a_stop_asked_by_a_signal_handler_never_hangs_the_sleeping_worker() -> None:
    try:
        done = subprocess.run(
            [sys.executable, "-c", _SIGNAL_STORM],
            # The worker is only built, never run: no database is needed.
            env={
                **os.environ,
                "DATABASE_URL": "sqlite://:memory:",
                "DJANGO_SETTINGS_MODULE": "project.settings",
            },
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the worker hung: a stop signal's handler waited for a lock its loop held")
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 1000  # the storm did interrupt the loop's waits


def test_it_stays_set_until_cleared() -> None:
    wake = Wakeup()
    try:
        assert not wake.is_set()
        wake.set()
        wake.set()
        assert wake.is_set() and wake.wait(0) and wake.wait(5)
        wake.clear()
        assert not wake.is_set()
        started = time.monotonic()
        assert wake.wait(0.05) is False
        assert time.monotonic() - started >= 0.04
    finally:
        wake.close()


def test_another_thread_wakes_a_waiter_at_once() -> None:
    wake = Wakeup()
    try:
        threading.Timer(0.05, wake.set).start()
        started = time.monotonic()
        assert wake.wait(30) is True
        assert wake.wait() is True  # no timeout: it is set, so it returns
        assert time.monotonic() - started < 10
    finally:
        wake.close()


def test_thousands_of_wake_ups_before_a_clear_never_block_the_setter() -> None:
    wake = Wakeup()
    try:
        for _ in range(200_000):  # far past the socket's buffer
            wake.set()
        assert wake.is_set()
        wake.clear()
        assert not wake.is_set()
    finally:
        wake.close()


def test_once_closed_it_ignores_a_late_set() -> None:
    wake = Wakeup()
    wake.close()
    wake.set()  # a watchdog or a signal after the loop ended: nothing to wake, no error


def test_a_set_racing_its_close_never_raises() -> None:
    # A worker closes its wake-up when it stops; a task thread it abandoned may end and
    # set it at that very moment.
    errors: list[BaseException] = []

    def keep_setting(wake: Wakeup, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                wake.set()  # a full buffer is no error: set already
        except BaseException as exc:  # the test reports whatever escaped
            errors.append(exc)

    for _ in range(300):
        wake, stop = Wakeup(), threading.Event()
        setter = threading.Thread(target=keep_setting, args=(wake, stop))
        setter.start()
        wake.close()
        stop.set()
        setter.join()
    assert errors == []
