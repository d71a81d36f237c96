"""Tell one named constraint's violation apart from every other ``IntegrityError``.

A store turns exactly one violation into a domain answer (for example "the overlap key
is held") and must re-raise everything else, so the match is by constraint name.
PostgreSQL (psycopg) reports the name in the error's diagnostics. SQLite reports only
the table and columns (``UNIQUE constraint failed: table.col``), so callers also pass the
columns the constraint covers; jobstate never puts two unique constraints on the same
columns, which keeps that match exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import IntegrityError


def violates(exc: IntegrityError, *, constraint: str, table: str, columns: Sequence[str]) -> bool:
    cause = exc.__cause__
    diag = getattr(cause, "diag", None)
    if diag is not None:
        return getattr(diag, "constraint_name", None) == constraint
    message = str(exc)
    if message.startswith("UNIQUE constraint failed: "):
        failed = message.removeprefix("UNIQUE constraint failed: ").split(", ")
        return failed == [f"{table}.{column}" for column in columns]
    # MySQL/MariaDB: "Duplicate entry '...' for key '<name>'" (or 'table.<name>').
    return message.rstrip("'\")").endswith(constraint) and "Duplicate entry" in message
