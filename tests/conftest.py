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
- ``backend``: has no test database yet consults the backend it runs against (its vendor
  or settings, a system check that reads them, a child process on ``DATABASE_URL``);
  every backend's step runs it.

A test with no test database (no ``django_db`` mark, no ``db``, ``transactional_db`` or
``live_server`` fixture) and none of the marks ``postgres``, ``concurrent``, ``only_on``
or ``backend`` runs the same on every backend: the SQLite step runs it, and the
PostgreSQL and MariaDB steps deselect it (counted as deselected). Wherever it runs, it
fails if it consults the backend after all (looks a configured database up, or starts a
child on ``DATABASE_URL``), saying to mark it ``backend``.

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

import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.db.utils import ConnectionHandler

from jobstate.stores.base import StateStore
from jobstate.stores.contracts.claimer_presence import claimer_beats
from jobstate.stores.database import DatabaseJobRunStore, DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore
from tests.support.browser import close_chromium
from tests.support.receiver import Receiver


def pytest_configure(config: pytest.Config) -> None:
    # A run started as a background job of a shell without job control (CI's, say)
    # starts with SIGINT ignored, and every process the tests start would inherit that:
    # a worker keeps a signal it was started ignoring, so the tests' Ctrl-C would not
    # reach it. The tests start their processes as a terminal's commands are started;
    # the ones about an ignored SIGINT ask for it (tests.support.processes.ignore_sigint).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _only_on(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("only_on")
    return None if marker is None else str(marker.args[0])


#: The fixtures that give a test the test database (the ``django_db`` mark does too).
DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}
    | {"live_server", "django_db_setup"}
)
#: The marks of a test whose outcome depends on the backend it runs against.
BACKEND_MARKS = ("django_db", "postgres", "concurrent", "only_on", "backend")


def consults_backend(item: pytest.Item) -> bool:
    """Whether the test says something about the backend it runs against: it has a test
    database (the ``django_db`` mark or a database fixture) or a mark saying so. The
    others run on SQLite alone; :func:`_backend_untouched` holds them to it."""
    if DATABASE_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    return any(item.get_closest_marker(name) for name in BACKEND_MARKS)


def _deselect(config: pytest.Config, items: list[pytest.Item], gone: list[pytest.Item]) -> None:
    if gone:
        config.hook.pytest_deselected(items=gone)
        dropped = set(gone)
        items[:] = [item for item in items if item not in dropped]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test of one backend's own behaviour (its settings, its guards), or a harness that
    # drives a MariaDB server of its own, runs on that backend's step only and is
    # counted as deselected on the others: never a skip that could hide a lost step.
    _deselect(
        config, items, [item for item in items if _only_on(item) not in (None, connection.vendor)]
    )
    if connection.vendor == "sqlite":
        return
    # A test that neither has a test database nor consults the backend any other way runs
    # the same on every backend: the SQLite step runs it; the server steps deselect it.
    _deselect(config, items, [item for item in items if not consults_backend(item)])
    if connection.vendor == "mysql":
        # A test of a ``mysql`` module that is also marked ``postgres``.
        postgresql_only = [item for item in items if item.get_closest_marker("postgres")]
        _deselect(
            config, items, [item for item in postgresql_only if item.get_closest_marker("mysql")]
        )


#: Each test's CPU seconds at its start (see :func:`pytest_runtest_makereport`).
_CPU_AT_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Each test's CPU seconds, its own and its finished child processes', as the JUnit
    report's property ``cpu_s``: where a slow run's time went, test by test (the test
    command writes the reports under artifacts/). The servers' CPU is not in it."""
    if call.when == "teardown" and _CPU_AT_START in item.stash:
        item.user_properties.append(("cpu_s", round(_cpu_seconds() - item.stash[_CPU_AT_START], 2)))
    yield


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def pytest_sessionfinish(session: pytest.Session) -> None:
    close_chromium()  # the browser tests' shared Chromium, if one was started


def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT_START] = _cpu_seconds()  # before the fixtures are set up
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


def _tidying_up(frame: FrameType | None) -> bool:
    """Whether a connection is looked up by Django's own tidying around each request of
    the test client (``reset_queries``, ``close_old_connections`` of ``django.db``,
    through ``connections.all()`` and, before Python 3.12, its comprehension's frame)."""
    for _ in range(3):
        frame = frame and frame.f_back
        if frame is not None and frame.f_globals.get("__name__") == "django.db":
            return True
    return False


@pytest.fixture(autouse=True)
def _backend_untouched(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A test the server steps deselect (one :func:`consults_backend` says no to) fails
    if it consults the backend after all: if it looks up a configured database (its
    vendor, its settings, a system check reading them) or starts a child process on
    ``DATABASE_URL``. Its outcome could then differ per backend, and it is marked
    ``backend`` so that every step runs it."""
    if consults_backend(request.node):
        yield
        return
    touched: list[str] = []
    configured = set(settings.DATABASES)  # not the aliases a test registers for itself
    look_up = ConnectionHandler.__getitem__

    def looked_up(handler: ConnectionHandler, alias: str) -> Any:
        if alias in configured and not _tidying_up(sys._getframe(1)):
            touched.append(f"looked up the database {alias!r}")
        return look_up(handler, alias)

    start = subprocess.Popen.__init__

    def started(process: subprocess.Popen[Any], args: Any, *rest: Any, **options: Any) -> None:
        env = options.get("env")
        if (os.environ if env is None else env).get("DATABASE_URL") == os.environ.get(
            "DATABASE_URL"
        ):
            touched.append(f"started {args!r} on DATABASE_URL")
        start(process, args, *rest, **options)

    monkeypatch.setattr(ConnectionHandler, "__getitem__", looked_up)
    monkeypatch.setattr(subprocess.Popen, "__init__", started)
    yield
    if touched:
        pytest.fail(
            f"{request.node.nodeid} has no test database but {touched[0]}: its outcome may "
            "differ per backend. Mark it backend so that every backend's step runs it.",
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


@pytest.fixture(params=[pytest.param("database", marks=pytest.mark.django_db), "memory"])
def any_store(request: pytest.FixtureRequest) -> StateStore:
    """The test runs twice: on the database store (with the test database) and on the
    in-memory reference store (which needs no database)."""
    if request.param == "database":
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
