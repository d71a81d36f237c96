"""``jobstate_worker --reload`` as a real process: a change to a task's module stops the
worker gracefully and a fresh one runs the new code; SIGTERM to the supervising process
stops the worker gracefully and the supervisor exits with the worker's status."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from jobstate.core.states import NewTask
from jobstate.models import Job, Worker
from jobstate.stores import get_state_store
from jobstate.tasks.compat import TaskResultStatus, task_backends
from tests.support.tasks_kit import finish, start_worker, stop, use_options, wait_for

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True), pytest.mark.slow]

MODULE = """
from jobstate.tasks.compat import task


@task
def version():
    return {version}
"""


def enqueue_version() -> Job:
    return get_state_store().enqueue_task(
        NewTask(
            target="tasks:default",
            task_path="jobstate_reloaded_tasks.version",
            queue_name="default",
            priority=0,
            args=[],
            kwargs={},
            max_attempts=1,
        )
    )


def returned(job: Job) -> Any:
    result = task_backends["default"].get_result(str(job.id))
    return result.status == TaskResultStatus.SUCCESSFUL and result.return_value


def test_a_reload_worker_runs_the_changed_code_and_sigterm_stops_it(
    settings: Any, tmp_path: Path
) -> None:
    options = use_options(settings)
    code = tmp_path / "code"
    code.mkdir()
    module = code / "jobstate_reloaded_tasks.py"
    module.write_text(MODULE.format(version=1))
    first = enqueue_version()
    worker = start_worker("--reload", "--interval", "0.2", options=options, PYTHONPATH=str(code))
    try:
        assert wait_for(lambda: returned(first), timeout=60, what="version 1") == 1
        module.write_text(MODULE.format(version=2))
        bumps = itertools.count(1)

        def restarted() -> bool:
            # Newer and newer: the watcher may have first seen the file after the write.
            later = time.time() + next(bumps)
            os.utime(module, (later, later))
            return (
                Worker.objects.filter(stopped_reason__startswith="code changed").exists()
                and Worker.objects.filter(stopped_at__isnull=True).exists()
            )

        wait_for(restarted, timeout=60, what="a fresh worker after the change")
        second = enqueue_version()
        assert wait_for(lambda: returned(second), timeout=60, what="version 2") == 2
        worker.send_signal(signal.SIGTERM)
        status, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    assert status == 0, err
    assert "Traceback" not in err
    assert "jobstate_reloaded_tasks.py changed" in err
    rows = list(Worker.objects.order_by("started_at"))
    assert len(rows) == 2
    assert all(row.pid != worker.pid for row in rows)  # the workers were its children
    assert rows[0].stopped_reason.startswith("code changed")
    assert rows[1].stopped_reason == "SIGTERM"


def test_a_reload_supervisor_whose_worker_was_killed_says_so(settings: Any) -> None:
    options = use_options(settings)
    worker = start_worker("--reload", "--interval", "0.2", options=options)
    try:
        child = wait_for(
            lambda: Worker.objects.filter(stopped_at__isnull=True).first(),
            timeout=60,
            what="the supervised worker",
        )
        os.kill(child.pid, signal.SIGKILL)
        status, _out, err = finish(worker, timeout=30)
    finally:
        stop(worker)
    assert status == 128 + signal.SIGKILL
    assert f"The worker (pid {child.pid}) was killed by SIGKILL" in err


@contextmanager
def _reload_worker_with_a_startup_module(
    settings: Any, tmp_path: Path
) -> Iterator[tuple[subprocess.Popen[str], Callable[[str], None]]]:
    """A ``--reload`` worker whose settings import ``jobstate_startup_module`` (as a
    project's settings import its code), once it has run a task; and a function that
    saves that module with a new text and a newer modification time each time (the
    watcher may first see the file after a write). Each failed import of the module
    appends a line to ``tmp_path / "import-failures"``."""
    options = use_options(settings)
    code = tmp_path / "code"
    code.mkdir()
    startup = code / "jobstate_startup_module.py"
    startup.write_text("READY = True\n")
    (code / "jobstate_reloaded_tasks.py").write_text(MODULE.format(version=1))
    worker = start_worker(
        "--reload",
        "--interval",
        "0.2",
        options=options,
        PYTHONPATH=str(code),
        JOBSTATE_TEST_IMPORT_AT_START="jobstate_startup_module",
        JOBSTATE_TEST_IMPORT_FAILURES=str(tmp_path / "import-failures"),
    )
    bumps = itertools.count(1)

    def save(text: str) -> None:
        startup.write_text(text)
        later = time.time() + next(bumps)
        os.utime(startup, (later, later))

    try:
        first = enqueue_version()
        assert wait_for(lambda: returned(first), timeout=60, what="a worker") == 1
        yield worker, save
    finally:
        stop(worker)


def _saved_until_the_worker_stops_for_it(save: Callable[[str], None], text: str) -> None:
    def stopped_for_the_change() -> bool:
        save(text)
        return Worker.objects.filter(stopped_reason__startswith="code changed").exists()

    wait_for(stopped_for_the_change, timeout=60, what="the worker stopping for the change")


def _a_worker_runs_again(worker: subprocess.Popen[str]) -> str:
    """A task enqueued now runs; then SIGTERM stops the supervisor, which exits 0. Its
    standard error."""
    after = enqueue_version()
    assert wait_for(lambda: returned(after), timeout=60, what="a worker after the fix") == 1
    worker.send_signal(signal.SIGTERM)
    status, _out, err = finish(worker, timeout=30)
    assert status == 0, err
    return err


def test_a_reload_worker_whose_code_stops_loading_waits_for_the_fix(
    settings: Any, tmp_path: Path
) -> None:
    """A module the worker imports at start-up saved half-edited: the fresh worker
    fails to start, and the supervisor waits for the next change instead of exiting."""
    with _reload_worker_with_a_startup_module(settings, tmp_path) as (worker, save):
        _saved_until_the_worker_stops_for_it(save, "READY = (\n")  # a syntax error
        failures = tmp_path / "import-failures"
        wait_for(failures.exists, timeout=60, what="the fresh worker failing to import")
        assert failures.read_text() == "SyntaxError\n"
        time.sleep(1)  # the supervisor sees its worker exit; it must stay
        assert worker.poll() is None, "the supervisor exited on the broken code"
        save("READY = True\n")
        err = _a_worker_runs_again(worker)
    assert "SyntaxError" in err
    assert "waiting for a change to the code to start a fresh one" in err


def test_a_fix_saved_while_the_fresh_worker_is_still_failing_starts_a_worker(
    settings: Any, tmp_path: Path
) -> None:
    """The fix lands while the fresh worker is still importing the broken module: the
    supervisor must not take the fixed file for the state to wait on (it did, and then
    waited for a further change that never came)."""
    importing = tmp_path / "importing-the-broken-module"
    # Slow to fail: it says it is being imported, then fails three seconds later.
    broken = (
        f"import pathlib, time\npathlib.Path({str(importing)!r}).touch()\n"
        "time.sleep(3)\nraise RuntimeError('saved half-edited')\n"
    )
    with _reload_worker_with_a_startup_module(settings, tmp_path) as (worker, save):
        _saved_until_the_worker_stops_for_it(save, broken)
        wait_for(importing.exists, timeout=60, what="the fresh worker importing the module")
        save("READY = True\n")  # while that worker is still failing
        err = _a_worker_runs_again(worker)
    assert "saved half-edited" in err
