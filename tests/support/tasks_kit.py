"""What the task backend's tests share: setting the backend's options for a test and its
workers alike, starting workers as processes, and waiting for what they do."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings
from django.utils import timezone

from tests.support.processes import database_url, ignore_sigint

#: The options the tests' backend runs with unless a test says otherwise: retries at
#: once, and leases short enough for a killed worker's tasks to come back quickly.
FAST = {"MAX_ATTEMPTS": 1, "RETRY_BACKOFF": 0.0, "LEASE": 2.0, "TIMEOUT": None}

_DURATIONS = ("RETRY_BACKOFF", "LEASE", "TIMEOUT", "UNKNOWN_TASK_TIMEOUT")


def use_options(settings: Any, **options: Any) -> dict[str, Any]:
    """Give the ``default`` task backend ``FAST`` with ``options`` (durations in seconds)
    in this test, and return them for the workers the test starts."""
    chosen = {**FAST, **options}
    settings.TASKS = {
        "default": {
            **django_settings.TASKS["default"],
            "OPTIONS": {
                name: timedelta(seconds=value)
                if name in _DURATIONS and value is not None
                else value
                for name, value in chosen.items()
            },
        }
    }
    return chosen


def start_worker(
    *args: str, options: dict[str, Any], ignoring_sigint: bool = False, **env: str
) -> subprocess.Popen[str]:
    """``manage.py jobstate_worker *args`` as a process on the test database, its
    backend configured with ``options`` (see :func:`use_options`); ``ignoring_sigint``:
    started with SIGINT ignored, as a background job of a shell script is."""
    base = Path(django_settings.BASE_DIR)
    return subprocess.Popen(
        [sys.executable, str(base / "manage.py"), "jobstate_worker", *args],
        cwd=base,
        env={
            **os.environ,
            "DATABASE_URL": database_url(),
            "DJANGO_SETTINGS_MODULE": "tests.support.worker_settings",
            "JOBSTATE_TEST_TASK_OPTIONS": json.dumps(options),
            "PYTHONUNBUFFERED": "1",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if ignoring_sigint else None,
    )


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    """Wait for a worker to exit; its status, stdout and stderr."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise AssertionError(f"the worker did not exit within {timeout} s:\n{err}") from None
    return process.returncode, out, err


def stop(process: subprocess.Popen[str]) -> None:
    """Make sure a worker a test started is gone (the test's ``finally``)."""
    if process.poll() is None:
        process.kill()
        process.communicate()


def worker_tracebacks(err: str) -> list[str]:
    """The tracebacks in a worker's stderr other than those of Django's log of a failed
    task (tagged by ``tests.support.worker_settings``), which carries the task's exception."""
    return re.findall(r"(?m)^Traceback.*$", err)


def run_batch(
    options: dict[str, Any], *args: str, timeout: float = 60, tracebacks: bool = False
) -> str:
    """Run a ``--batch`` worker to its end; its stderr (the log). Unless ``tracebacks``
    (a test whose tasks are interrupted, say), the log holds no traceback of the worker's
    own."""
    worker = start_worker("--batch", *args, options=options)
    try:
        code, _out, err = finish(worker, timeout)
    finally:
        stop(worker)
    assert code == 0, err
    if not tracebacks:
        assert not worker_tracebacks(err), err
    return err


def wait_for(condition: Callable[[], Any], *, timeout: float = 30, what: str = "") -> Any:
    """Poll ``condition`` until it returns something true; that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up after {timeout} s waiting for {what or condition}")
        time.sleep(0.05)


def sleep_past(instant: datetime, margin: float = 0.1) -> None:
    """Sleep until ``margin`` seconds after ``instant`` on this machine's clock (the
    database's too, for SQLite and the local servers the tests run against): past a
    lease's end, or a minute boundary."""
    time.sleep(max(0.0, (instant - timezone.now()).total_seconds()) + margin)
