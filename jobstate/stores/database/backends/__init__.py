"""What differs between the databases jobstate runs on, in one place, organised the way
Django keeps its own differences (``connection.ops``, ``connection.features``).

One operations object per backend holds that backend's statements and choices:

- :mod:`.postgresql`: the one-statement hot path (claim, batch claim, task claim and
  enqueue, batch completion, outbox completion, run reaper; text in
  :mod:`.postgresql_statements`, run on the cursor of :mod:`.postgresql_cursor`), the
  per-thread gate as a transaction-scoped advisory lock, the planner's estimates,
  ``LISTEN``/``NOTIFY``;
- :mod:`.mysql` (MariaDB and MySQL): the per-thread gate as a row lock on the thread's
  row of the gate table, the guards of migration ``0009_mysql_guards``, the session's
  clock on UTC, InnoDB's deadlocks;
- :mod:`.sqlite`: no per-thread gate (its ``IMMEDIATE`` transactions serialise
  writers), instants stored as text;
- :mod:`.portable`: the defaults each of them starts from.

:func:`database_ops` chooses the object once per database alias and keeps it. The
concern modules of the store ask it, never the vendor's name; facts Django already
states (``SKIP LOCKED``, ``FOR UPDATE OF``, whether an ``UPDATE`` may read its own table)
come from ``connection.features``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q

from jobstate.stores.database.backends.mysql import MySQLOperations
from jobstate.stores.database.backends.portable import BackendOperations
from jobstate.stores.database.backends.postgresql import PostgreSQLOperations
from jobstate.stores.database.backends.sqlite import SQLiteOperations

__all__ = ["BackendOperations", "database_ops", "instant_filter", "prepare_connection"]

#: The operations class of each of Django's vendor names; any other backend gets the
#: portable defaults (jobstate's deploy checks refuse it, ``jobstate.E041``).
_CLASSES: dict[str, type[BackendOperations]] = {
    cls.vendor: cls for cls in (PostgreSQLOperations, MySQLOperations, SQLiteOperations)
}

#: The object chosen for each (alias, vendor).
_CHOSEN: dict[tuple[str, str], BackendOperations] = {}


def database_ops(using: str) -> BackendOperations:
    """The operations object of database ``using``, chosen by its backend on first use
    and kept."""
    # On every claim and report: once chosen, a subscript and no further call.
    vendor = connections[using].vendor
    try:
        return _CHOSEN[using, vendor]
    except KeyError:
        return _chosen(using, vendor)


def _chosen(alias: str, vendor: str) -> BackendOperations:
    ops = _CHOSEN.get((alias, vendor))
    if ops is None:
        ops = _CHOSEN[alias, vendor] = _CLASSES.get(vendor, BackendOperations)(alias)
    return ops


def instant_filter(using: str, field: str, lookup: str, instant: datetime) -> Q:
    """The filter ``field__lookup=instant`` on database ``using`` that compares a stored
    instant in the database's own terms, whichever clock wrote the row (see
    :meth:`BackendOperations.instant_filter`)."""
    return database_ops(using).instant_filter(field, lookup, instant)


def prepare_connection(*, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Set up a new connection's session as its backend needs (a receiver of
    ``connection_created``, connected by :mod:`jobstate.signals`). Django opens
    connections of its own outside ``connections`` (to create a test database), so the
    connection is not looked up by its alias."""
    _chosen(connection.alias, connection.vendor).prepare_connection(connection)
