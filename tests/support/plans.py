"""Reading PostgreSQL's plan for a statement a test captured."""

from __future__ import annotations

from collections.abc import Iterable

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper


def plans_without_table_scans(
    connection: BaseDatabaseWrapper, statements: Iterable[str], *, bitmap: bool = False
) -> list[str]:
    """The ``EXPLAIN`` text of each statement with sequential and bitmap scans ruled out.

    A test database's few pages are cheapest to read whole, so the planner would read
    the table whatever the indexes allow; ruling that out shows the plan an index gives
    on a large table. ``bitmap`` leaves bitmap scans allowed: a GIN index is read only
    through one."""
    plans = []
    with transaction.atomic(using=connection.alias), connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        if not bitmap:
            cursor.execute("SET LOCAL enable_bitmapscan = off")
        for sql in statements:
            cursor.execute(f"EXPLAIN {sql}")
            plans.append("\n".join(row[0] for row in cursor.fetchall()))
    return plans
