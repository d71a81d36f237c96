"""The per-thread lock on MariaDB and MySQL: a row lock on the thread's row of the
thread gate table (migration ``0009_mysql_guards``).

PostgreSQL serialises one thread's claims and quota counts with transaction-scoped
advisory locks (:mod:`jobstate.stores.database.hotpath`). MariaDB's and MySQL's named
locks (``GET_LOCK``) belong to the session, not the transaction, so they would outlive a
rollback or a caller's transaction; an InnoDB row lock ends exactly with the
transaction, as the advisory lock does. A thread's row is created by its first lock and
kept: one short row per thread ever gated.
"""

from __future__ import annotations

from django.db import connections

__all__ = ["lock_thread_row", "try_lock_thread_row"]

#: The table migration 0009 creates on MariaDB and MySQL only.
THREAD_GATE_TABLE = "jobstate_threadgate"


def lock_thread_row(using: str, thread_id: int) -> None:
    """Lock ``thread_id``'s row until the transaction ends, waiting for it. On a
    duplicate key ``INSERT ... ON DUPLICATE KEY UPDATE`` takes the existing row's
    exclusive lock, so one statement both creates and locks it."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {THREAD_GATE_TABLE} (thread_id) VALUES (%s) "
            "ON DUPLICATE KEY UPDATE thread_id = thread_id",
            [thread_id],
        )


def try_lock_thread_row(using: str, thread_id: int) -> bool:
    """Like :func:`lock_thread_row` but never waits for a holder: ``False`` when another
    transaction holds the thread's row."""
    with connections[using].cursor() as cursor:
        cursor.execute(
            f"SELECT thread_id FROM {THREAD_GATE_TABLE} WHERE thread_id = %s "
            "FOR UPDATE SKIP LOCKED",
            [thread_id],
        )
        if cursor.fetchone() is not None:
            return True
        # Not handed over: the row is held, or the thread was never gated.
        cursor.execute(f"SELECT 1 FROM {THREAD_GATE_TABLE} WHERE thread_id = %s", [thread_id])
        if cursor.fetchone() is not None:
            return False
        # A new row is locked by its insert; a concurrent first lock of the same thread
        # makes this one a duplicate, which IGNORE answers with no row: held.
        cursor.execute(
            f"INSERT IGNORE INTO {THREAD_GATE_TABLE} (thread_id) VALUES (%s)", [thread_id]
        )
        return cursor.rowcount == 1
