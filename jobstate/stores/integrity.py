"""Tell one named constraint's violation apart from every other ``IntegrityError``.

A store turns exactly one violation into a domain answer (for example "the overlap key
is held") and must re-raise everything else, so the match is by constraint name.
PostgreSQL (psycopg) reports the name in the error's diagnostics. SQLite reports only
the table and columns (``UNIQUE constraint failed: table.col``), so callers also pass the
columns the constraint covers; jobstate never puts two unique constraints on the same
columns, which keeps that match exact. MariaDB and MySQL report error 1062, ``Duplicate
entry '...' for key '<name>'`` (MySQL 8 writes ``'<table>.<name>'``); a primary key is
always named ``PRIMARY`` there, where PostgreSQL names it ``<table>_pkey``. The partial
unique constraints that MariaDB and MySQL ignore are unique indexes of the same name
there (migration ``0009_mysql_guards``), so their names match too.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError

#: MariaDB's and MySQL's ``ER_DUP_ENTRY``.
_MYSQL_DUPLICATE_ENTRY = 1062


def violates(exc: IntegrityError, *, constraint: str, table: str, columns: Sequence[str]) -> bool:
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == constraint
    args: tuple[object, ...] = getattr(cause, "args", ())
    if len(args) >= 2 and isinstance(args[0], int):
        return args[0] == _MYSQL_DUPLICATE_ENTRY and _mysql_key(str(args[1]), table) == (
            "PRIMARY" if constraint == f"{table}_pkey" else constraint
        )
    message = str(exc)
    if message.startswith("UNIQUE constraint failed: "):
        failed = message.removeprefix("UNIQUE constraint failed: ").split(", ")
        return failed == [f"{table}.{column}" for column in columns]
    return False


def _mysql_key(message: str, table: str) -> str | None:
    """The key a MariaDB or MySQL duplicate-entry message names, without MySQL 8's table
    prefix. The duplicated value comes first and may hold anything, so the key is read
    from the end."""
    _, found, key = message.rpartition(" for key ")
    if not found:
        return None
    return key.strip("'").removeprefix(f"{table}.")
