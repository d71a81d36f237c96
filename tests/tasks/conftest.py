"""Fixtures of the task backend's and the worker's tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone

from jobstate.testing import FakeClock
from jobstate.testing.memory_state import MemoryStateStore
from tests.support.pgbouncer import PgBouncer
from tests.support.stores import MemoryTasks, SharedMemoryStateStore


@pytest.fixture
def memory_tasks(settings: Any, monkeypatch: pytest.MonkeyPatch, db: None) -> Iterator[MemoryTasks]:
    """Tasks kept in an in-memory store on a fake clock, for a worker run in-process.

    The database is still open to the test: the worker writes the audit entry of a
    failed attempt inside ``transaction.atomic()`` on its database, and the queue
    coverage warning at start-up reads the database's workers, jobs and pauses tables.
    ``LISTEN_NOTIFY`` is off, so no worker listens on a database connection."""
    clock = FakeClock()
    store = MemoryStateStore(clock=clock.now)
    monkeypatch.setattr(timezone, "now", clock.now)
    monkeypatch.setattr(SharedMemoryStateStore, "installed", store)
    settings.JOBSTATE = {
        **getattr(settings, "JOBSTATE", {}),
        "STATE_STORE": "tests.support.stores.SharedMemoryStateStore",
        "LISTEN_NOTIFY": False,
    }
    yield MemoryTasks(store=store, clock=clock)


@pytest.fixture
def pgbouncer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PgBouncer]:
    """A PgBouncer of the test's own in transaction mode, pooling the test database in at
    most 3 server connections; the test may kill and start it again."""
    pooler = PgBouncer(tmp_path_factory.mktemp("pgbouncer"), pool_size=3)
    pooler.start()
    try:
        yield pooler
    finally:
        # Its server connections must be gone before the test database is flushed or
        # dropped.
        pooler.stop()
