"""No task can stop, wedge or fool the worker fleet: real ``jobstate_worker`` processes
run tasks that raise NUL characters, lone surrogates, exceptions whose ``__str__`` or
``__repr__`` raise (or whose ``__str__`` returns a ``str`` subclass whose methods raise),
BaseExceptions, 30 kB messages on every one of 100 attempts (with a lowered payload
limit), exceptions from ``__del__`` and generators that raise when closed. Every task
ends SUCCESSFUL or FAILED with its exact attempt count, the worker goes on serving its
other tasks and queues, and it stops with status 0 on SIGTERM. A task whose log is long
does not stop the recovery of its lost attempt either."""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from jobstate.core.states import TERMINAL_JOB_STATUSES
from jobstate.models import Job
from jobstate.stores.database import DatabaseStateStore
from jobstate.tasks.compat import TaskResult, TaskResultStatus
from tests.support.attempts import claim, enqueue, report_failures
from tests.support.hostile_tasks import (
    MISBEHAVIOURS,
    drops_hostile_objects,
    hostile,
    leaves_a_transaction_open,
    locks_its_own_row,
    reads_the_database,
    returns_a_generator,
    turns_autocommit_off,
)
from tests.support.task_functions import add, always_fails, changes_the_payload_limit
from tests.support.tasks_kit import run_batch, start_worker, use_options, wait_for

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True), pytest.mark.slow]

SUCCESSFUL, FAILED = TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED
LIMIT = 200_000

#: The class path each misbehaviour's attempts must record, exactly.
CLASS_PATHS = {
    "nul": "builtins.ValueError",
    "surrogate": "builtins.ValueError",
    "str-raises": "tests.support.hostile_tasks.StrRaises",
    "str-not-text": "tests.support.hostile_tasks.StrNotText",
    "str-subclass": "tests.support.hostile_tasks.StrSubclass",
    "repr-raises": "builtins.ValueError",
    "del-raises": "tests.support.hostile_tasks.DelRaises",
    "system-exit": "builtins.SystemExit",
    "keyboard-interrupt": "builtins.KeyboardInterrupt",
    "generator-exit": "builtins.GeneratorExit",
    "base-exception": "tests.support.hostile_tasks.HostileBase",
    "long": "builtins.ValueError",
}


def lower_limit(settings: Any) -> dict[str, str]:
    """Lower ``MAX_PAYLOAD_BYTES`` here and in the workers (their environment)."""
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "MAX_PAYLOAD_BYTES": LIMIT}
    return {"JOBSTATE_TEST_MAX_PAYLOAD_BYTES": str(LIMIT)}


class Worker:
    """A ``jobstate_worker`` process whose stderr is read as it comes, so the log of
    many failing attempts never fills the pipe and blocks the worker."""

    def __init__(self, *args: str, options: dict[str, Any], **env: str) -> None:
        self.process = start_worker(*args, options=options, **env)
        self._err: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._err.append(line)

    @property
    def err(self) -> str:
        return "".join(self._err)

    def finished(self, results: list[TaskResult[Any, Any]]) -> bool:
        """Whether every result is finished; fails at once when the worker has exited.
        Polls in one query, at most twice a second, to leave the database to it."""
        if self.process.poll() is not None:
            self._reader.join(5)
            raise AssertionError(f"the worker exited with {self.process.returncode}:\n{self.err}")
        time.sleep(0.5)
        ids = [result.id for result in results]
        return Job.objects.filter(id__in=ids, status__in=TERMINAL_JOB_STATUSES).count() == len(ids)

    def wait_finished(
        self, results: list[TaskResult[Any, Any]], *, timeout: float = 30, what: str
    ) -> None:
        """:meth:`finished` within ``timeout`` seconds, or a failure that quotes the
        worker's log: what it was doing tells a wedged loop from a starved machine."""
        try:
            wait_for(lambda: self.finished(results), timeout=timeout, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the worker's log:\n{self.err[-5000:]}") from None

    def serves_others_then_stops(self, timeout: float = 20) -> str:
        """A task on the worker's default queue and one on its other queue run; then
        SIGTERM stops it with status 0 (within ``timeout``). Its stderr."""
        others = [add.enqueue(1, 2), add.using(queue_name="emails").enqueue(3, 4)]
        self.wait_finished(others, timeout=timeout, what="the other tasks")
        assert [add.get_result(other.id).return_value for other in others] == [3, 7]
        self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker did not stop within {timeout} s") from None
        self._reader.join(5)
        err = self.err
        assert code == 0, err
        # Tracebacks: Django's log of each failed task (tagged with its logger's name:
        # django.tasks, or django_tasks on 5.2) and Python's report of the exceptions
        # raised in __del__ and while closing generators, nothing else.
        # Counted wherever they stand: two threads closing generators at once write
        # their reports piece by piece into the same stderr, so a report's first line
        # can start in the middle of another's.
        untagged = re.findall(r"(?<!django[._]tasks\| )Traceback \(most recent call last\)", err)
        assert len(untagged) == err.count("Exception ignored in"), err[-5000:]
        assert "Exception in thread" not in err
        return err

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def test_no_hostile_task_stops_wedges_or_fools_the_worker(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=100)
    env = lower_limit(settings)
    retried = {how: hostile.enqueue(how, 3) for how in MISBEHAVIOURS if how != "long"}
    long = hostile.enqueue("long", 0)
    dropped = drops_hostile_objects.enqueue(2)
    generator = returns_a_generator.enqueue()
    everything = [*retried.values(), long, dropped, generator]
    worker = Worker("--concurrency", "3", "--queue-name", "default,emails", options=options, **env)
    try:
        worker.wait_finished(everything, timeout=90, what="the hostile tasks")
        err = worker.serves_others_then_stops()
    finally:
        worker.stop()

    for how, queued in retried.items():
        result = hostile.get_result(queued.id)
        assert (how, result.status, result.attempts, result.return_value) == (how, SUCCESSFUL, 3, 3)
        assert [e.exception_class_path for e in result.errors] == [CLASS_PATHS[how]] * 2, how
    for how in ("nul", "surrogate"):
        (first, _second) = hostile.get_result(retried[how].id).errors
        assert first.traceback.endswith("\ufffd value\n") or "\ufffd" in first.traceback, how

    result = hostile.get_result(long.id)
    assert result.status == FAILED and result.attempts == 100 and len(result.worker_ids) == 100
    paths = [e.exception_class_path for e in result.errors]
    assert paths.count("jobstate.exceptions.AttemptsLeftOut") == 1
    assert paths.count("builtins.ValueError") == 20
    assert "x" * 1000 in result.errors[0].traceback and len(result.errors[0].traceback) < 20_000

    result = drops_hostile_objects.get_result(dropped.id)
    assert (result.status, result.attempts, result.return_value) == (SUCCESSFUL, 2, 2)
    result = returns_a_generator.get_result(generator.id)
    assert result.status == FAILED and result.attempts == 100
    assert result.errors[-1].exception_class_path == "jobstate.exceptions.TaskReturnValueNotJSON"

    # Django's own log of each failed task carries the task's exception.
    assert re.search(r"(?m)^django[._]tasks\| ValueError: x{100}", err)


def test_an_exception_whose_str_raises_leaves_the_only_slot_free(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=2)
    broken = [hostile.enqueue("str-raises", 0), hostile.enqueue("repr-raises", 0)]
    worker = Worker("--concurrency", "1", "--queue-name", "default,emails", options=options)
    try:
        worker.wait_finished(broken, timeout=30, what="the tasks to fail")
        worker.serves_others_then_stops(timeout=10)
    finally:
        worker.stop()
    for queued, name in zip(broken, ("StrRaises", "ValueError"), strict=True):
        result = hostile.get_result(queued.id)
        assert result.status == FAILED and result.attempts == 2
        assert result.errors[0].traceback.startswith("Traceback (most recent call last):")
        assert name in result.errors[0].traceback


def test_a_long_log_does_not_stop_a_worker_recovering_its_lost_attempt(settings: Any) -> None:
    options = use_options(settings, MAX_ATTEMPTS=100)
    env = lower_limit(settings)
    store = DatabaseStateStore()
    task = enqueue(store, max_attempts=100)
    report_failures(store, task.id, 60)
    lost = claim(store, "died")
    store.update_job(lost.id, lease_until=timezone.now() - timedelta(days=1))
    # The worker recovers it when it starts, runs the 39 attempts left and goes on.
    recovered = always_fails.get_result(str(task.id))
    worker = Worker("--queue-name", "default,emails", options=options, **env)
    try:
        worker.wait_finished([recovered], timeout=60, what="the recovery")
        worker.serves_others_then_stops()
    finally:
        worker.stop()
    result = always_fails.get_result(recovered.id)
    assert result.status == FAILED and result.attempts == 100
    job = store.get_job(task.id)
    assert job is not None
    assert [e.event for e in store.list_audit(job=job)].count("recovered") == 1


def test_a_task_that_leaves_a_transaction_open_fails_alone(settings: Any) -> None:
    """The task entered ``transaction.atomic()`` and never left it. Its thread's
    connection was then closed inside the block and never opened again: every later task
    of the thread that used the database failed ("the connection is closed"), for the
    life of the worker, and the task itself was stored as a success, its writes lost."""
    options = use_options(settings, MAX_ATTEMPTS=1)
    DatabaseStateStore().create_job(request_id="marker", target="t")
    open_block = leaves_a_transaction_open.enqueue("marker")
    readers = [reads_the_database.enqueue() for _ in range(3)]
    run_batch(options, "--concurrency", "1")
    result = leaves_a_transaction_open.get_result(open_block.id)
    assert result.status == FAILED
    (error,) = result.errors
    assert error.exception_class_path == "django.db.transaction.TransactionManagementError"
    assert "left a transaction.atomic() block open" in error.traceback
    # What it wrote in the block was rolled back, as the failure says.
    assert Job.objects.get(request_id="marker").source == ""
    for queued in readers:
        assert reads_the_database.get_result(queued.id).status == SUCCESSFUL


def test_after_a_task_left_a_transaction_open_the_next_tasks_start_clean(settings: Any) -> None:
    """After a task left a block open, the next tasks of its thread that did not use
    the database failed with its error; and the next task that entered a block ran it
    as if nested in the dead one, with autocommit on: stored as a success, its writes
    committed although it never left the block."""
    options = use_options(settings, MAX_ATTEMPTS=1)
    store = DatabaseStateStore()
    for marker in ("first", "second", "third"):
        store.create_job(request_id=marker, target="t")
    queued = [
        leaves_a_transaction_open.enqueue("first"),
        add.enqueue(1, 2),
        add.enqueue(3, 4),
        leaves_a_transaction_open.enqueue("second"),
        turns_autocommit_off.enqueue("third"),
        add.enqueue(5, 6),
        reads_the_database.enqueue(),
    ]
    run_batch(options, "--concurrency", "1")
    outcomes = [
        (result.status, result.errors[-1].traceback.splitlines()[-1] if result.errors else "")
        for result in (
            task.get_result(q.id)
            for task, q in zip(
                [
                    leaves_a_transaction_open,
                    add,
                    add,
                    leaves_a_transaction_open,
                    turns_autocommit_off,
                    add,
                    reads_the_database,
                ],
                queued,
                strict=True,
            )
        )
    ]
    statuses = [status for status, _ in outcomes]
    assert statuses == [FAILED, SUCCESSFUL, SUCCESSFUL, FAILED, FAILED, SUCCESSFUL, SUCCESSFUL]
    assert "left a transaction.atomic() block open" in outcomes[3][1]
    assert "turned autocommit off on database 'default'" in outcomes[4][1]
    # Nothing the three wrote outside a committed transaction was kept.
    sources = dict(Job.objects.filter(target="t").values_list("request_id", "source"))
    assert sources == {"first": "", "second": "", "third": ""}


@pytest.mark.concurrent
def test_a_task_that_locks_its_own_row_holds_up_nothing_else(settings: Any, tmp_path: Path) -> None:
    """The task locked its own job's row in a transaction and held it. The worker's next
    lease renewal (one statement for every task it held) waited for that lock, and its
    whole loop with it: it claimed nothing and renewed no other task's lease until the
    task let go; another worker's recovery of an expired task waited the same way."""
    options = use_options(settings, MAX_ATTEMPTS=1, LEASE=6.0)
    holding, release = tmp_path / "holding", tmp_path / "release"
    locker = locks_its_own_row.enqueue(str(holding), str(release))
    worker = Worker(
        "--concurrency", "2", "--interval", "0.2", "--queue-name", "default,emails", options=options
    )
    try:
        wait_for(holding.exists, what="the task to lock its row")
        time.sleep(2)  # past the worker's first beat (a quarter of the lease)
        other = add.enqueue(1, 2)
        worker.wait_finished([other], timeout=10, what="the other task")
        assert not release.exists()
        release.touch()
        worker.wait_finished([locker], what="the locking task")
        worker.serves_others_then_stops()
    finally:
        release.touch()
        worker.stop()
    assert add.get_result(other.id).return_value == 3
    result = locks_its_own_row.get_result(locker.id)
    assert (result.status, result.attempts, result.return_value) == (SUCCESSFUL, 1, "released")


@pytest.mark.parametrize(
    ("limit", "how", "fails"),
    [("lots", "item", False), (0, "dict", True), (1, "item", True), (None, "dict", False)],
)
def test_a_task_that_changes_the_payload_limit_is_reported_and_the_worker_goes_on(
    settings: Any, limit: Any, how: str, fails: bool
) -> None:
    """The task changed ``settings.JOBSTATE['MAX_PAYLOAD_BYTES']`` as it ran. The worker
    read the setting at its first report, so the new value counted: one the setting's
    check refuses stopped the worker with status 2, a tiny one refused even the
    failure's record and stopped it with status 1, the task's row left RUNNING either
    way. The worker keeps the settings it started with."""
    options = use_options(settings, MAX_ATTEMPTS=1)
    hostile_one = changes_the_payload_limit.enqueue(limit, how, fails)
    after = add.enqueue(2, 3)
    run_batch(options, "--concurrency", "1", tracebacks=fails)
    result = changes_the_payload_limit.get_result(hostile_one.id)
    if fails:
        assert result.status == FAILED
        assert "failed after changing the payload limit" in result.errors[0].traceback
    else:
        assert result.status == SUCCESSFUL and result.return_value == "done"
    assert add.get_result(after.id).status == SUCCESSFUL
