"""Tasks the task backend's tests enqueue and their workers run (the workers import
this module by the tasks' dotted paths)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from jobstate.tasks.compat import TaskContext, task, task_finished


class Boom(Exception):
    """What the failing tasks raise."""


@task
def echo(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def always_fails(message: str) -> None:
    raise Boom(message)


@task(takes_context=True)
def fails_before(context: TaskContext[Any, Any], succeed_on: int) -> int:
    """Fails every attempt before attempt ``succeed_on``; returns the attempt it ran as."""
    if context.attempt < succeed_on:
        raise Boom(f"attempt {context.attempt} fails")
    return context.attempt


@task
def started_then_sleeps(seconds: float, marker: str | None = None) -> dict[str, float]:
    """Returns when it started (the wall clock, shared by the test and its workers);
    creates the file ``marker`` first, when given, to tell a test it has started."""
    started = time.time()
    if marker is not None:
        Path(marker).touch()
    time.sleep(seconds)
    return {"started": started, "ended": time.time()}


@task
def returns_a_set() -> Any:
    return {1, 2, 3}


@task
def returns_bytes(text: str, encoding: str) -> Any:
    return text.encode(encoding)


@task
def returns_a_deep_list() -> Any:
    """A list nested deeper than Python's recursion limit lets JSON walk."""
    value: list[Any] = []
    for _ in range(5000):
        value = [value]
    return value


def nested(levels: int) -> list[Any]:
    """A list ``levels`` lists deep, holding 1 at the bottom."""
    value: list[Any] = [1]
    for _ in range(levels - 1):
        value = [value]
    return value


@task
def returns_a_list_32_deep() -> Any:
    """One level deeper than MariaDB's JSON check lets a column hold."""
    return nested(32)


@task
def returns_a_list_31_deep() -> Any:
    return nested(31)


@task
async def async_add(a: int, b: int) -> int:
    await asyncio.sleep(0)
    return a + b


def _note(path: str, line: str) -> None:
    with open(path, "a") as file:
        file.write(f"{line} {time.time()}\n")


@task(takes_context=True)
def notes_its_run(context: TaskContext[Any, Any], path: str, seconds: float) -> None:
    """Works for ``seconds`` in small steps, noting in the file ``path`` when each
    attempt starts and when it ends (its ``finally``, which an interrupt runs too)."""
    _note(path, f"{context.attempt} start")
    try:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            time.sleep(0.02)
    finally:
        _note(path, f"{context.attempt} end")


@task(takes_context=True)
def ignores_the_interrupt_once(context: TaskContext[Any, Any], path: str, seconds: float) -> int:
    """On its first attempt, loops for ``seconds`` catching everything, the timeout's
    interrupt too, and noting each step in the file ``path``; later attempts note their
    start and return at once."""
    _note(path, f"{context.attempt} start")
    if context.attempt > 1:
        return context.attempt
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        try:
            time.sleep(0.02)
            _note(path, "1 step")
        except BaseException:  # the point: a task that swallows everything
            _note(path, "1 caught")
    return 1


@task
async def async_sleeps(seconds: float, marker: str | None = None) -> float:
    """Creates the file ``marker`` first, when given: a test that must signal the
    worker while the task runs waits for it (a job's RUNNING row only says it was
    claimed, not that a thread started it)."""
    started = time.time()
    if marker is not None:
        Path(marker).touch()
    await asyncio.sleep(seconds)
    return started


@task
def records_its_run(path: str, key: int) -> None:
    """Appends ``key`` to the file ``path``: one line per run, so a test counts how many
    times each task ran."""
    _note(path, str(key))


@task
def kills_then_fails(pid: int) -> None:
    """Kills the process ``pid`` (a test's pooler) with SIGKILL, then fails, so the
    worker reports a failure while its connection is cut."""
    os.kill(pid, signal.SIGKILL)
    raise Boom("the pooler is gone")


@task
def floods_the_log(lines: int, marker: str | None = None) -> None:
    """Logs ``lines`` warnings of a kilobyte each: more than a pipe holds, so a worker
    whose stderr nobody reads blocks in the middle of writing them. Creates the file
    ``marker`` first, when given, to tell a test it has started."""
    if marker is not None:
        Path(marker).touch()
    flood = logging.getLogger("tests.flood")
    for number in range(lines):
        flood.warning("line %d of the flood: %s", number, "x" * 1000)


@task(takes_context=True)
def cancelled_as_it_returns(context: TaskContext[Any, Any]) -> int:
    """Cancels its own task as its last step, so the cancel lands after the task's code
    and before the worker's report of it (an operator's cancel at that moment)."""
    from jobstate.stores import get_state_store

    get_state_store().cancel_job(context.task_result.id, by="ops", reason="too late")
    return 1


class PayloadError(Exception):
    """An API client's error: any attribute it lacks is read from its payload, so asking
    for one the payload has not (``__notes__``, which Python's traceback formatting asks
    for) raises ``KeyError`` rather than ``AttributeError``."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__(payload.get("message", "api error"))
        self.payload = payload

    def __getattr__(self, name: str) -> Any:
        return self.payload[name]


@task
def raises_a_payload_error() -> None:
    raise PayloadError({"message": "upstream said no", "code": 503})


@task(takes_context=True)
def first_attempt_waits(context: TaskContext[Any, Any], hold: str) -> int:
    """Its first attempt creates ``hold/started`` and waits (up to 30 s) for
    ``hold/go``; later attempts return at once. Returns the attempt's number."""
    if context.attempt == 1:
        Path(hold, "started").touch()
        until = time.monotonic() + 30
        while not Path(hold, "go").exists() and time.monotonic() < until:
            time.sleep(0.01)
    return context.attempt


@task
def changes_the_payload_limit(limit: Any, how: str, fails: bool) -> str:
    """Hostile code: changes ``settings.JOBSTATE['MAX_PAYLOAD_BYTES']`` in the worker's
    process as it runs, to ``limit`` (a value the setting's check may refuse), by
    setting the dict's item (``how="item"``) or a new dict (``how="dict"``); then raises
    (``fails``) or returns, for the worker to report either way."""
    from django.conf import settings

    if how == "dict":
        settings.JOBSTATE = {**settings.JOBSTATE, "MAX_PAYLOAD_BYTES": limit}
    else:
        settings.JOBSTATE["MAX_PAYLOAD_BYTES"] = limit
    if fails:
        raise Boom("failed after changing the payload limit")
    return "done"


@task
def fails_with_a_long_message(length: int) -> None:
    """Raises a ``ValueError`` of ``length`` two-byte characters."""
    raise ValueError("é" * length)


def _stuck_receiver(sender: Any, **kwargs: Any) -> None:
    """A ``task_finished`` receiver that never returns (a webhook with no timeout)."""
    threading.Event().wait()


if os.environ.get("JOBSTATE_TEST_STUCK_RECEIVER"):
    # Only in a worker started with it: the test process imports this module too.
    task_finished.connect(_stuck_receiver)


def _raising_receiver(sender: Any, **kwargs: Any) -> None:
    """A ``task_finished`` receiver that raises what ``JOBSTATE_TEST_RAISING_RECEIVER``
    names, a ``BaseException`` that is not an ``Exception``."""
    raised = {"SystemExit": SystemExit, "KeyboardInterrupt": KeyboardInterrupt}
    raise raised[os.environ["JOBSTATE_TEST_RAISING_RECEIVER"]]("a receiver gives up")


def _noting_receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """A ``task_finished`` receiver that appends the task's id to the file
    ``JOBSTATE_TEST_RECEIVER_NOTES`` names."""
    with open(os.environ["JOBSTATE_TEST_RECEIVER_NOTES"], "a") as notes:
        notes.write(f"{task_result.id}\n")


if os.environ.get("JOBSTATE_TEST_RAISING_RECEIVER"):
    # Only in a worker started with it; the noting receiver is connected after it.
    task_finished.connect(_raising_receiver)
    task_finished.connect(_noting_receiver)
