"""Tasks that try to stop, wedge or fool the worker (the hostile-task suite enqueues
them and its workers import them by their dotted paths).

Each takes the context and ``fail_until``: it misbehaves on every attempt before that
one and returns the attempt it succeeded on after, so a test knows the exact number of
attempts each must end with. ``fail_until=0`` misbehaves on every attempt."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from jobstate.tasks.compat import TaskContext, task


class HostileBase(BaseException):
    """A BaseException that is neither SystemExit nor KeyboardInterrupt."""


class StrRaises(Exception):
    """An exception whose ``__str__`` raises (and ``__repr__`` too)."""

    def __str__(self) -> str:
        raise RuntimeError("__str__ of the task's exception raised")

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ of the task's exception raised")


class StrNotText(Exception):
    """An exception whose ``__str__`` returns something that is not text."""

    def __str__(self) -> Any:
        return 42


class HostileText(str):
    """Text whose own methods raise."""

    def __contains__(self, item: object) -> bool:
        raise RuntimeError("__contains__ of the message raised")

    def replace(self, *args: Any, **kwargs: Any) -> str:
        raise RuntimeError("replace() of the message raised")

    def encode(self, *args: Any, **kwargs: Any) -> bytes:
        raise RuntimeError("encode() of the message raised")


class StrSubclass(Exception):
    """An exception whose ``__str__`` returns text of a ``str`` subclass whose methods
    raise."""

    def __str__(self) -> str:
        return HostileText("a message of a str subclass")


class ReprRaises:
    """An argument whose ``repr()`` (so also ``str()``) raises."""

    def __repr__(self) -> str:
        raise RuntimeError("__repr__ of the exception's argument raised")


class DelRaises(Exception):
    """An exception whose ``__del__`` raises, when the worker lets it go."""

    def __del__(self) -> None:
        raise RuntimeError("__del__ of the task's exception raised")


class _RaisesOnDel:
    def __del__(self) -> None:
        raise RuntimeError("__del__ of an object the task dropped raised")


def _raises_on_close() -> Iterator[int]:
    try:
        yield 1
        yield 2
    finally:
        raise RuntimeError("the generator raised while it was closed")


#: The misbehaviours, by name; each is called on a failing attempt.
MISBEHAVIOURS = {
    "nul": lambda: ValueError("bad\x00value"),
    "surrogate": lambda: ValueError("bad \ud800 value \udfff"),
    "str-raises": StrRaises,
    "str-not-text": StrNotText,
    "str-subclass": StrSubclass,
    "repr-raises": lambda: ValueError(ReprRaises()),
    "del-raises": lambda: DelRaises("its __del__ raises"),
    "system-exit": lambda: SystemExit(3),
    "keyboard-interrupt": KeyboardInterrupt,
    "generator-exit": GeneratorExit,
    "base-exception": lambda: HostileBase("a BaseException of the task's own"),
    "long": lambda: ValueError("x" * 30_000 + "\x00 the end"),
}


@task(takes_context=True)
def hostile(context: TaskContext[Any, Any], how: str, fail_until: int) -> int:
    """Raises the misbehaviour ``how`` on each attempt before ``fail_until``."""
    if fail_until == 0 or context.attempt < fail_until:
        raise MISBEHAVIOURS[how]()
    return context.attempt


@task(takes_context=True)
def drops_hostile_objects(context: TaskContext[Any, Any], fail_until: int) -> int:
    """Leaves an object whose ``__del__`` raises and a generator that raises when it is
    closed to the garbage collector, and fails (with an ordinary error) before
    ``fail_until``."""
    _RaisesOnDel()
    generator = _raises_on_close()
    next(generator)
    del generator
    if context.attempt < fail_until:
        raise ValueError(f"attempt {context.attempt} fails")
    return context.attempt


@task
def returns_a_generator() -> Any:
    """Returns a value that cannot be stored, and raises when it is closed."""
    generator = _raises_on_close()
    next(generator)
    return generator


@task
def leaves_a_transaction_open(request_id: str) -> str:
    """Enters ``transaction.atomic()``, writes, and returns without leaving the block:
    Django's connection of the thread stays marked inside it."""
    from django.db import transaction

    from jobstate.models import Job

    transaction.atomic().__enter__()
    Job.objects.filter(request_id=request_id).update(source="written in the open block")
    return "left open"


@task
def turns_autocommit_off(request_id: str) -> str:
    """Turns autocommit off, writes, and returns without committing or turning it on."""
    from django.db import transaction

    from jobstate.models import Job

    transaction.set_autocommit(False)
    Job.objects.filter(request_id=request_id).update(source="written with autocommit off")
    return "autocommit left off"


@task
def reads_the_database() -> int:
    """Needs the thread's connection: fails if a task before it broke it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        return int(cursor.fetchone()[0])


@task(takes_context=True)
def locks_its_own_row(context: TaskContext[Any, Any], holding: str, release: str) -> str:
    """Locks its own job's row (``select_for_update`` in a transaction) and holds it until
    the file ``release`` exists (for 20 s at most), having created ``holding``."""
    from django.db import transaction

    from jobstate.models import Job

    with transaction.atomic():
        Job.objects.select_for_update().get(id=context.task_result.id)
        Path(holding).touch()
        until = time.monotonic() + 20
        while not Path(release).exists() and time.monotonic() < until:
            time.sleep(0.02)
    return "released"
