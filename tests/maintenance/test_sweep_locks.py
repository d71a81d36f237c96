"""What a retention sweep's batch holds while it deletes: the rows it deletes and no
other. A sweeper whose batch comes back short stops, taking every row it passed over
for one that another sweeper is deleting; a row held by a batch that does not delete it
would be passed over by both and left behind, with both sweeps saying they were
complete (seen on MariaDB, whose optimizer walks a covering secondary index on a small
table and kept the lock of every row the walk passed)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, connections, transaction

from jobstate import maintenance
from jobstate.models import AuditEntry
from jobstate.testing.factories import AuditEntryFactory

#: Small enough that MariaDB's optimizer prefers walking an index to a lookup by key.
ROWS = 40
BATCH = 10


def _old_audit_entries(count: int) -> list[int]:
    ts = datetime.now(UTC) - timedelta(days=60)
    AuditEntryFactory.bulk_create_batch(count, event="received", ts=ts)
    return sorted(AuditEntry.objects.values_list("pk", flat=True))


@contextmanager
def _paused_after_the_first_delete(
    sweep: Callable[[], Any],
) -> Iterator[Callable[[], None]]:
    """Run ``sweep`` in a thread of its own that stops after its first ``DELETE`` has
    run, inside that batch's transaction, until the caller is done; yields a function
    that lets it go on."""
    deleted = threading.Event()
    go_on = threading.Event()
    errors: list[BaseException] = []

    def pause_after_delete(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        # PostgreSQL's batch is one statement that picks and deletes (WITH ... DELETE).
        if "DELETE FROM" in sql.upper() and not deleted.is_set():
            deleted.set()
            go_on.wait(timeout=30)
        return result

    def sweeper() -> None:
        try:
            with connection.execute_wrapper(pause_after_delete):
                sweep()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=sweeper)
    thread.start()
    try:
        assert deleted.wait(timeout=30), "the sweep never deleted"
        yield go_on.set
    finally:
        go_on.set()
        thread.join(timeout=30)
    assert not errors, errors


def _lockable(keys: list[int]) -> list[int]:
    """The rows of ``keys`` another transaction can lock now, each asked for alone (a
    lookup by primary key, which locks that row only)."""
    found: list[int] = []

    def probe() -> None:
        try:
            with transaction.atomic():
                for key in keys:
                    row = (
                        AuditEntry.objects.filter(pk=key)
                        .select_for_update(skip_locked=True)
                        .values_list("pk", flat=True)
                    )
                    found.extend(row)
        finally:
            connections.close_all()

    thread = threading.Thread(target=probe)
    thread.start()
    thread.join(timeout=30)
    return found


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_a_sweep_batch_holds_only_the_rows_it_deletes() -> None:
    keys = _old_audit_entries(ROWS)

    def sweep() -> None:
        maintenance.prune_audit(older_than=timedelta(days=30), batch_size=BATCH)

    with _paused_after_the_first_delete(sweep):
        deleted = set(keys) - set(AuditEntry.objects.values_list("pk", flat=True))
        # The batch's delete is not committed yet: every row is still there to others.
        assert not deleted
        rest = _lockable(keys)
        assert len(rest) == ROWS - BATCH, (
            f"the batch held {ROWS - len(rest)} rows while deleting {BATCH}"
        )
    assert not AuditEntry.objects.exists()
