"""Giving back the database connections a task used, as a request's end does.

Django closes a connection that a request left outside autocommit. A task can leave
more than that, and the worker's thread runs the next task on the same connection:

- A task that entered ``transaction.atomic()`` and never left the block: closed inside
  the block, the connection stays marked as closed in a transaction and inside the
  block. Every later task of the thread that used that database failed ("the
  connection is closed"), or, once something reconnected, ran its own block as if
  nested in the dead one and committed its writes outside any transaction.
- A task that turned autocommit off (``transaction.set_autocommit(False)``) and
  returned: what it wrote since is rolled back when the connection closes.

The worker ends either here: the connection is closed (the server rolls the open
transaction back), Django's connection is reset to what connecting anew gives (no
block, no savepoints, autocommit as configured), and the attempt fails saying what
was rolled back. Only the task that left the state fails; the next task of the thread
starts clean.
"""

from __future__ import annotations

from django.db import close_old_connections, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError

__all__ = ["release_task_connections"]


def release_task_connections() -> TransactionManagementError | None:
    """Close what a task left behind on this thread's connections; the error its
    attempt fails with when it left a ``transaction.atomic()`` block open or autocommit
    off, else ``None``."""
    problems: list[str] = []
    for connection in connections.all(initialized_only=True):
        problem = _left_behind(connection)
        if problem is None:
            continue
        problems.append(problem)
        # Inside a block, close() shuts the socket and keeps the closed connection for
        # the block to drop on exit; outside one it drops it. Either way the server
        # rolls back what was not committed.
        connection.close()
        _reset(connection)
    close_old_connections()
    if not problems:
        return None
    return TransactionManagementError("; ".join(problems))


def _left_behind(connection: BaseDatabaseWrapper) -> str | None:
    """What the task left open on ``connection``, in the attempt's words, or ``None``."""
    alias = repr(connection.alias)
    if connection.in_atomic_block:
        return (
            f"the task left a transaction.atomic() block open on database {alias}; what it "
            "wrote in that block was rolled back"
        )
    configured = connection.settings_dict["AUTOCOMMIT"]
    if connection.connection is not None and connection.autocommit != configured:
        return (
            f"the task turned autocommit off on database {alias} and did not turn it back "
            "on; what it wrote since was rolled back"
        )
    return None


def _reset(connection: BaseDatabaseWrapper) -> None:
    """The transaction state Django's own ``connect()`` starts from, so that the next
    use connects anew and nothing of the task's block or savepoints remains."""
    connection.connection = None
    connection.closed_in_transaction = False
    connection.in_atomic_block = False
    connection.savepoint_ids = []
    connection.atomic_blocks = []
    connection.needs_rollback = False
    connection.commit_on_exit = True
    connection.run_on_commit = []
