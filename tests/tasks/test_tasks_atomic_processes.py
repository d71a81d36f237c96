"""Atomic tasks in ``jobstate_worker`` processes on a real database: a worker killed
(SIGKILL) in the middle of an atomic body leaves none of its writes, and once its lease
has run out the task is recovered and runs to completion once; a worker stopped
(SIGSTOP) past its lease, whose task another worker recovered and completed, commits
nothing when it is continued. On SQLite a stopped atomic body holds the database's
write lock, so nobody can recover its task meanwhile: continued, it completes once.

The rows the tasks write are audit entries tagged with a key of the test's own
(:mod:`tests.support.atomic_tasks`)."""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from django.db.models.functions import Now

from jobstate.core.states import JobStatus
from jobstate.models import Job
from jobstate.tasks.compat import TaskResultStatus
from tests.support.atomic_tasks import atomic_writes, rows
from tests.support.tasks_kit import finish, start_worker, stop, use_options, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.mysql]

SUCCESSFUL = TaskResultStatus.SUCCESSFUL
SECOND_ATTEMPT = ["attempt 2 row 0", "attempt 2 row 1"]


@pytest.fixture
def key() -> str:
    return f"atomic-{uuid.uuid4().hex[:12]}"


def lease_ran_out(result_id: str) -> bool:
    return Job.objects.filter(
        id=result_id, status=JobStatus.RUNNING, lease_until__lt=Now()
    ).exists()


def run_to_the_end(options: dict[str, Any], worker_id: str) -> str:
    """A ``--batch`` worker run to its end; its log."""
    worker = start_worker("--batch", "--worker-id", worker_id, options=options)
    try:
        code, _out, err = finish(worker)
    finally:
        stop(worker)
    assert code == 0, err
    return err


def test_a_killed_atomic_body_leaves_nothing_and_its_task_then_runs_once(
    settings: Any, key: str, tmp_path: Path
) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2, LEASE=1.0)
    queued = atomic_writes.enqueue(key, hold=str(tmp_path), write_first=True)
    doomed = start_worker("--worker-id", "doomed", options=options)
    try:
        wait_for((tmp_path / "started").exists, what="the body to write and wait")
        assert rows(key) == []  # written, not committed
        doomed.send_signal(signal.SIGKILL)
        code, _out, _err = finish(doomed)
    finally:
        stop(doomed)
    assert code == -signal.SIGKILL
    assert rows(key) == []
    wait_for(lambda: lease_ran_out(queued.id), what="the lease to run out")
    # The next worker recovers the task (its first round's sweep) and runs it.
    err = run_to_the_end(options, "rescuer")
    assert "Recovered 1 task(s)" in err
    result = atomic_writes.get_result(queued.id)
    assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 2, 2)
    assert result.worker_ids == ["doomed", "rescuer"]
    assert rows(key) == SECOND_ATTEMPT


@pytest.mark.concurrent
def test_a_stopped_atomic_body_recovered_elsewhere_commits_nothing_when_continued(
    settings: Any, key: str, tmp_path: Path
) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2, LEASE=1.0)
    queued = atomic_writes.enqueue(key, hold=str(tmp_path), write_first=True)
    stopped = start_worker("--worker-id", "stopped", options=options)
    try:
        wait_for((tmp_path / "started").exists, what="the body to write and wait")
        stopped.send_signal(signal.SIGSTOP)
        wait_for(lambda: lease_ran_out(queued.id), what="the lease to run out")
        err = run_to_the_end(options, "rescuer")
        assert "Recovered 1 task(s)" in err
        result = atomic_writes.get_result(queued.id)
        assert (result.status, result.return_value, result.attempts) == (SUCCESSFUL, 2, 2)
        assert rows(key) == SECOND_ATTEMPT
        # Continued, the stopped body finishes: its report is refused, its writes roll back.
        (tmp_path / "go").touch()
        stopped.send_signal(signal.SIGCONT)
        # A graceful stop lets the running task finish first.
        stopped.send_signal(signal.SIGTERM)
        code, _out, err = finish(stopped)
    finally:
        stopped.send_signal(signal.SIGCONT)
        stop(stopped)
    assert rows(key) == SECOND_ATTEMPT
    assert code == 0, err
    assert "attempt 1 successful after" in err and "but its claim was lost" in err, err
    assert "what its body wrote was rolled back" in err
    result = atomic_writes.get_result(queued.id)
    assert (result.status, result.attempts, result.worker_ids) == (
        SUCCESSFUL,
        2,
        ["stopped", "rescuer"],
    )


@pytest.mark.only_on("sqlite")
def test_on_sqlite_a_stopped_atomic_body_holds_the_write_lock_and_completes_once_continued(
    settings: Any, key: str, tmp_path: Path
) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2, LEASE=1.0)
    queued = atomic_writes.enqueue(key, hold=str(tmp_path), write_first=True)
    stopped = start_worker("--worker-id", "stopped", options=options)
    rescuer = None
    try:
        wait_for((tmp_path / "started").exists, what="the body to write and wait")
        stopped.send_signal(signal.SIGSTOP)
        wait_for(lambda: lease_ran_out(queued.id), what="the lease to run out")
        # Another worker waits for the write lock the stopped body holds: it can neither
        # register nor recover the task meanwhile.
        rescuer = start_worker("--batch", "--worker-id", "rescuer", options=options)
        time.sleep(1.5)
        (tmp_path / "go").touch()
        stopped.send_signal(signal.SIGCONT)
        code, _out, err = finish(rescuer)
        assert code == 0, err
        assert "Recovered" not in err
        stopped.send_signal(signal.SIGTERM)
        code, _out, err = finish(stopped)
    finally:
        stopped.send_signal(signal.SIGCONT)
        stop(stopped)
        if rescuer is not None:
            stop(rescuer)
    assert code == 0, err
    assert "attempt 1/2 successful" in err, err
    result = atomic_writes.get_result(queued.id)
    assert (result.status, result.attempts, result.worker_ids) == (SUCCESSFUL, 1, ["stopped"])
    assert rows(key) == ["attempt 1 row 0", "attempt 1 row 1"]
