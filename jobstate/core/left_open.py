"""Rolling back what the host's code left open on Django's connections.

A task the worker runs and a channel the outbox relay calls are the host's code, run on
a connection the worker or the relay goes on using. Such code can leave more behind than
a request can:

- A ``transaction.atomic()`` block entered and never left: the connection stays inside
  the block. Whatever runs next on it (the next task of the thread, the relay's own
  report of the send) runs as if nested in the dead block: its writes are never
  committed, or, once something reconnected, are committed outside any transaction.
- Autocommit turned off (``transaction.set_autocommit(False)``) and never turned back
  on: everything written next on the connection waits in a transaction nobody commits,
  holding its row locks.

:func:`roll_back_left_open` ends either: the connection is closed (the server rolls the
open transaction back), Django's connection is reset to what connecting anew gives (no
block, no savepoints, autocommit as configured), and the caller gets an error saying
what was rolled back, to fail the attempt of the code that left it.
"""

from __future__ import annotations

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.transaction import TransactionManagementError

__all__ = ["roll_back_left_open"]


def roll_back_left_open(actor: str) -> TransactionManagementError | None:
    """Close what ``actor`` (e.g. ``"the task"``) left open on this thread's
    connections; the error naming it when it left a ``transaction.atomic()`` block open
    or autocommit off, else ``None``."""
    problems: list[str] = []
    for connection in connections.all(initialized_only=True):
        problem = _left_open(connection, actor)
        if problem is None:
            continue
        problems.append(problem)
        # Inside a block, close() shuts the socket and keeps the closed connection for
        # the block to drop on exit; outside one it drops it. Either way the server
        # rolls back what was not committed.
        connection.close()
        _reset(connection)
    if not problems:
        return None
    return TransactionManagementError("; ".join(problems))


def _left_open(connection: BaseDatabaseWrapper, actor: str) -> str | None:
    """What ``actor`` left open on ``connection``, in its attempt's words, or ``None``."""
    alias = repr(connection.alias)
    if connection.in_atomic_block:
        return (
            f"{actor} left a transaction.atomic() block open on database {alias}; what it "
            "wrote in that block was rolled back"
        )
    configured = connection.settings_dict["AUTOCOMMIT"]
    if connection.connection is not None and connection.autocommit != configured:
        return (
            f"{actor} turned autocommit off on database {alias} and did not turn it back "
            "on; what it wrote since was rolled back"
        )
    return None


def _reset(connection: BaseDatabaseWrapper) -> None:
    """The transaction state Django's own ``connect()`` starts from, so that the next
    use connects anew and nothing of the block or its savepoints remains."""
    connection.connection = None
    connection.closed_in_transaction = False
    connection.in_atomic_block = False
    connection.savepoint_ids = []
    connection.atomic_blocks = []
    connection.needs_rollback = False
    connection.commit_on_exit = True
    connection.run_on_commit = []
