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


def release_task_connections() -> TransactionManagementError | None:
    """Close what a task left behind on this thread's connections; the error its
    attempt fails with when it left a ``transaction.atomic()`` block open or autocommit
    off, else ``None``."""
    left_open = roll_back_left_open("the task")
    close_old_connections()
    return left_open
