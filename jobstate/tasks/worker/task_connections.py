"""Giving back the database connections a task used, as a request's end does.

Django closes a connection that a request left outside autocommit. A task that entered
``transaction.atomic()`` and never left the block leaves more than that: closed inside
the block, the connection stays marked as closed in a transaction, and Django opens it
again only when the block exits, which it never will. Every later task of the same
thread that used that database then failed ("the connection is closed"). The worker
ends such a block here: the server rolls the transaction back as the connection
closes, Django's connection is reset to open anew, and the attempt fails saying so.
"""

from __future__ import annotations

from django.db import close_old_connections, connections
from django.db.transaction import TransactionManagementError

__all__ = ["release_task_connections"]


def release_task_connections() -> TransactionManagementError | None:
    """Close what a task left behind on this thread's connections; the error its
    attempt fails with when it left a ``transaction.atomic()`` block open, else
    ``None``."""
    left_open = [
        connection.alias
        for connection in connections.all(initialized_only=True)
        if connection.in_atomic_block
    ]
    for alias in left_open:
        connection = connections[alias]
        # Inside the block, close() shuts the socket (the server rolls back what the
        # block wrote) and keeps the closed connection for the block to drop on exit.
        connection.close()
        # What leaving the block would do: the next use connects anew, and connecting
        # resets the transaction state (Django's own connect()).
        connection.connection = None
        connection.closed_in_transaction = False
    close_old_connections()
    if not left_open:
        return None
    names = ", ".join(repr(alias) for alias in left_open)
    return TransactionManagementError(
        f"the task left a transaction.atomic() block open on database {names}; what it "
        "wrote in that block was rolled back"
    )
