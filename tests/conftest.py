"""Shared fixtures and the database markers.

- ``postgres``: PostgreSQL only (query plans, LISTEN/NOTIFY, prepared statements,
  table statistics). Collected against another backend it fails rather than skips, so a
  missing database cannot pass silently.
- ``concurrent``: needs a server database with real concurrent connections (row locks,
  ``SKIP LOCKED``): PostgreSQL, MariaDB or MySQL. Collected on SQLite it fails.
- ``mysql``: part of the MariaDB/MySQL run (``-m mysql``): the contract kits, the race
  tests, the task backend and worker, the schedules. On MariaDB or MySQL a test without
  it fails, since nothing claims it holds there; a test of a ``mysql`` module that is
  also marked ``postgres`` is deselected there (and counted as deselected).

- ``only_on(vendor)``: a test of one backend's own behaviour (``"sqlite"``,
  ``"postgresql"``, ``"mysql"``), or a harness driving a MariaDB server of its own
  (``"mysql"``); deselected, and counted, on the other backends' runs.
- ``slow``: starts a process, a server or a browser, or waits on the real clock for a
  second or more. ``-m "not slow"`` (added to a step's own selection, e.g.
  ``-m "not postgres and not concurrent and not slow"`` on SQLite) is the quick tier,
  a few minutes long; the steps of the test command run every tier.

The test command runs SQLite with ``-m "not postgres and not concurrent"``, PostgreSQL
with everything, and MariaDB with ``-m mysql``.

The fixtures here are the ones tests of several packages share (the stores, an admin
user, a local HTTP receiver); each folder's ``conftest.py`` holds its own, and
``tests/support/`` the helpers that are not fixtures.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.db import connection

from jobstate.stores.base import StateStore
from jobstate.stores.contracts.claimer_presence import claimer_beats
from jobstate.stores.database import DatabaseJobRunStore, DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore
from tests.support.receiver import Receiver


def _only_on(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("only_on")
    return None if marker is None else str(marker.args[0])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test of one backend's own behaviour (its settings, its guards), or a harness that
    # drives a MariaDB server of its own, runs on that backend's step only and is
    # counted as deselected on the others: never a skip that could hide a lost step.
    elsewhere = [item for item in items if _only_on(item) not in (None, connection.vendor)]
    if elsewhere:
        config.hook.pytest_deselected(items=elsewhere)
        items[:] = [item for item in items if item not in elsewhere]
    if connection.vendor != "mysql":
        return
    kept, postgresql_only = [], []
    for item in items:
        both = item.get_closest_marker("mysql") and item.get_closest_marker("postgres")
        (postgresql_only if both else kept).append(item)
    if postgresql_only:
        config.hook.pytest_deselected(items=postgresql_only)
        items[:] = kept


def pytest_runtest_setup(item: pytest.Item) -> None:
    vendor = connection.vendor
    if item.get_closest_marker("postgres") and vendor != "postgresql":
        pytest.fail(
            f"{item.nodeid} needs PostgreSQL but DATABASE_URL points at {vendor}; "
            "run it with DATABASE_URL=postgres://... (the test command does).",
            pytrace=False,
        )
    if item.get_closest_marker("concurrent") and vendor == "sqlite":
        pytest.fail(
            f"{item.nodeid} needs real concurrent connections but DATABASE_URL points at "
            "SQLite; run it with DATABASE_URL=postgres://... or mysql://...",
            pytrace=False,
        )
    if vendor == "mysql" and not item.get_closest_marker("mysql"):
        pytest.fail(
            f"{item.nodeid} is not part of the MariaDB/MySQL run; select it with -m mysql "
            "or mark it mysql once it holds there.",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _fresh_claimer_beats() -> None:
    """Each test starts with no executor beat remembered: a claim's first beat in a test
    writes its Workers page row, whatever an earlier test claimed with the same id."""
    claimer_beats.forget()


@pytest.fixture
def store(db: None) -> DatabaseStateStore:
    """The database state store, on the test database."""
    return DatabaseStateStore()


@pytest.fixture(params=["database", "memory"])
def any_store(request: pytest.FixtureRequest) -> StateStore:
    """The test runs twice: on the database store and on the in-memory reference store
    (which needs no database)."""
    if request.param == "database":
        request.getfixturevalue("db")
        return DatabaseStateStore()
    return MemoryStateStore()


@pytest.fixture
def runs(db: None) -> DatabaseJobRunStore:
    """The database run store, on the test database."""
    return DatabaseJobRunStore()


@pytest.fixture
def admin_user(db: None, django_user_model: Any) -> Any:
    """A superuser without a password: the clients log in with ``force_login`` (as
    pytest-django's ``admin_client`` does with this user), and skipping the password
    hash keeps every test fast."""
    return django_user_model.objects.create_superuser("admin", "admin@example.com", None)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A local HTTP server taking the relay's webhooks, stopped after the test."""
    server = Receiver()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()
