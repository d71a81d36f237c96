"""Atomic tasks (``policy(atomic=True)``) for the atomic tests: each writes audit entries
tagged with its key through the ORM, which a test counts (:func:`rows`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.db import connection, transaction

from jobstate.models import AuditEntry
from jobstate.tasks import policy
from jobstate.tasks.compat import TaskContext, task
from tests.support.task_functions import Boom

#: The event of the rows these tasks write.
EVENT = "tests.atomic_write"


def rows(key: str) -> list[str]:
    """The titles of the rows written under ``key`` (committed ones, as the caller's
    connection sees them), oldest first."""
    return list(
        AuditEntry.objects.filter(event=EVENT, request_id=key)
        .order_by("id")
        .values_list("title", flat=True)
    )


def _write(key: str, attempt: int, count: int) -> None:
    AuditEntry.objects.bulk_create(
        AuditEntry(event=EVENT, request_id=key, title=f"attempt {attempt} row {n}")
        for n in range(count)
    )


def _wait_for(path: Path, seconds: float) -> None:
    until = time.monotonic() + seconds
    while not path.exists() and time.monotonic() < until:
        time.sleep(0.02)


@task(takes_context=True)
@policy(atomic=True)
def atomic_writes(
    context: TaskContext[Any, Any],
    key: str,
    count: int = 2,
    fail_before: int = 0,
    hold: str | None = None,
    write_first: bool = True,
    hold_seconds: float = 60,
) -> int:
    """Writes ``count`` rows under ``key`` and returns its attempt; raises ``Boom`` after
    writing on the attempts before ``fail_before``. With ``hold`` (a directory), its
    first attempt creates ``hold/started`` and waits (up to ``hold_seconds``) for
    ``hold/go`` before it returns, having written its rows before the wait
    (``write_first``) or after it."""
    if write_first:
        _write(key, context.attempt, count)
    if hold is not None and context.attempt == 1:
        Path(hold, "started").touch()
        _wait_for(Path(hold, "go"), hold_seconds)
    if not write_first:
        _write(key, context.attempt, count)
    if context.attempt < fail_before:
        raise Boom(f"attempt {context.attempt} fails after writing")
    return context.attempt


@task
@policy(atomic=True)
def atomic_probe() -> bool:
    """Whether its body runs inside a transaction."""
    return connection.in_atomic_block


@task
def plain_probe() -> bool:
    """Whether its body runs inside a transaction (it declares no policy)."""
    return connection.in_atomic_block


@task(takes_context=True)
@policy(atomic=True)
def atomic_with_callback(
    context: TaskContext[Any, Any],
    key: str,
    marker: str,
    fail_before: int = 0,
    raises: bool = False,
) -> int:
    """Writes a row under ``key`` and registers a ``transaction.on_commit`` callback that
    appends its attempt to the file ``marker`` (and then raises, with ``raises``); raises
    ``Boom`` itself on the attempts before ``fail_before``."""
    _write(key, context.attempt, 1)
    attempt = context.attempt

    def callback() -> None:
        with open(marker, "a") as file:
            file.write(f"{attempt}\n")
        if raises:
            raise Boom("the callback fails")

    transaction.on_commit(callback)
    if attempt < fail_before:
        raise Boom(f"attempt {attempt} fails after writing")
    return attempt


@task
@policy(atomic=True)
def atomic_rolls_itself_back(key: str) -> None:
    """Writes a row, then marks its transaction for rollback."""
    _write(key, 1, 1)
    transaction.set_rollback(True)


@task
@policy(atomic=True)
def atomic_leaves_a_block_open(key: str) -> str:
    """Writes a row, enters ``transaction.atomic()`` inside its body and returns without
    leaving that block."""
    _write(key, 1, 1)
    transaction.atomic().__enter__()
    return "left open"


@task
@policy(atomic=True)
def atomic_returns_text(key: str, length: int) -> str:
    """Writes a row and returns ``length`` characters."""
    _write(key, 1, 1)
    return "x" * length
