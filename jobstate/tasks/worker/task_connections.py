"""Giving back the database connections a task used, as a request's end does.

Django closes a connection that a request left outside autocommit. A task can leave
more than that (a ``transaction.atomic()`` block open, autocommit off), and the worker's
thread runs the next task on the same connection: what it left is rolled back
(:mod:`jobstate.core.left_open`) and the attempt fails saying so. Only the task that
left the state fails; the next task of the thread starts clean.
"""

from __future__ import annotations

from django.db import close_old_connections
from django.db.transaction import TransactionManagementError

from jobstate.core.left_open import roll_back_left_open

__all__ = ["release_task_connections"]


def release_task_connections(actor: str = "the task") -> TransactionManagementError | None:
    """Close what a task (or another ``actor`` of the host's code, a ``task_finished``
    receiver) left behind on this thread's connections; the error naming it when it
    left a ``transaction.atomic()`` block open or autocommit off, else ``None``."""
    left_open = roll_back_left_open(actor)
    close_old_connections()
    return left_open
