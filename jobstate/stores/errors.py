"""Turn the database errors a store lets through into jobstate's documented errors.

A store catches the errors it can answer on purpose (a named constraint's violation
becomes ``None``, ``DuplicateRequestId`` and the like). Whatever database error
(``django.db.Error``) still escapes is translated here, once, into
:class:`~jobstate.exceptions.StoreError` or the subclass that says what happened and
whether retrying helps:

- :class:`~jobstate.exceptions.StoreConflict`: deadlock (40P01), serialization failure
  (40001);
- :class:`~jobstate.exceptions.StoreTimeout`: statement timeout (57014), lock not
  available (55P03), SQLite busy or locked;
- :class:`~jobstate.exceptions.StoreUnavailable`: connection refused, lost or closed,
  server shutting down or starting up;
- :class:`~jobstate.exceptions.StoreError`: anything else.

The original error is the ``__cause__``; the message holds no value from the statement.

Django keeps a dead connection until something closes it, which only its request cycle
does. A long-running worker, relay or runner thread has no request cycle, so after a lost
connection the store closes it itself (:func:`discard_broken_connection`) unless a
transaction is open: the host's ``atomic()`` block rolls back when the error leaves it,
and Django drops the broken connection then.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager, suppress
from typing import Any, TypeVar

from django.db import (
    DEFAULT_DB_ALIAS,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
    connections,
)
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils.connection import ConnectionDoesNotExist

from jobstate.exceptions import (
    JobStateError,
    StoreConflict,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
)

__all__ = [
    "classify",
    "discard_broken_connection",
    "sqlstate",
    "store_error",
    "translate_store_errors",
    "translated_database_errors",
]

_T = TypeVar("_T")

_CONFLICT = frozenset({"40001", "40P01"})
_TIMEOUT = frozenset({"57014", "55P03"})
#: Besides SQLSTATE class 08 (connection exception): admin, crash and startup shutdown,
#: too many connections, and the two idle-session timeouts that end the session.
_UNAVAILABLE = frozenset({"57P01", "57P02", "57P03", "53300", "25P03", "57P05"})

# MariaDB/MySQL error numbers (mysqlclient gives no SQLSTATE, only the number): a
# deadlock; a lock wait timeout, MySQL's max_execution_time, MariaDB's
# max_statement_time and a NOWAIT lock; too many connections, a server shutting down, a
# killed connection, no connection (socket or TCP), the server gone away, the
# connection lost mid-query, and MySQL's idle-session disconnect.
_MYSQL_CONFLICT = frozenset({1213})
_MYSQL_TIMEOUT = frozenset({1205, 3024, 1969, 3572})
_MYSQL_UNAVAILABLE = frozenset({1040, 1053, 1927, 2002, 2003, 2006, 2013, 4031})
#: The SQLSTATE MySQL documents for the one number whose SQLSTATE says more than HY000.
_MYSQL_SQLSTATE = {1213: "40001"}

# SQLite primary result codes (the low byte of ``sqlite_errorcode``).
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_CANTOPEN = 14

_DESCRIPTIONS: dict[type[StoreError], str] = {
    StoreUnavailable: "the database is unavailable (connection refused, lost or closed)",
    StoreConflict: "the database aborted the transaction to resolve a conflict "
    "(deadlock or serialization failure)",
    StoreTimeout: "the statement timed out (statement or lock timeout)",
}
#: What a plain :class:`StoreError` says, by Django's error class (first match).
_OTHER_FAILURES: tuple[tuple[type[Error], str], ...] = (
    (IntegrityError, "an unexpected constraint was violated"),
    (DataError, "the database rejected a value"),
    (ProgrammingError, "the database rejected the statement (schema or SQL)"),
    (Error, "the database failed"),
)

#: A table or column the statement names does not exist: PostgreSQL's undefined table
#: and column, MariaDB/MySQL's unknown table and column, SQLite's own words.
_MISSING_SQLSTATES = frozenset({"42P01", "42703"})
_MYSQL_MISSING = frozenset({1146, 1054})
_SQLITE_MISSING = ("no such table", "no such column")
_MISSING = (
    "a table or column it needs is missing: are jobstate's migrations applied? "
    "Run manage.py migrate"
)

#: Marks a method already wrapped, so a subclass decorated again is not wrapped twice.
_WRAPPED = "__jobstate_translates_errors__"


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of ``exc`` or of the driver error Django chained to it (psycopg 3
    ``sqlstate``, psycopg 2 ``pgcode``), if any."""
    for candidate in (exc, exc.__cause__):
        if candidate is None:
            continue
        code = getattr(candidate, "sqlstate", None) or getattr(candidate, "pgcode", None)
        if isinstance(code, str) and code:
            return code
    return None


def _mysql_errno(exc: BaseException) -> int | None:
    """The MariaDB/MySQL error number of the mysqlclient error Django chained to ``exc``
    (Django copies its arguments, the number first), if it is one."""
    for candidate in (exc.__cause__, exc):
        if candidate is None or not type(candidate).__module__.startswith("MySQLdb"):
            continue
        args = candidate.args
        if args and isinstance(args[0], int):
            return args[0]
    return None


def _sqlite_code(exc: BaseException) -> int | None:
    for candidate in (exc, exc.__cause__):
        code = getattr(candidate, "sqlite_errorcode", None)
        if isinstance(code, int):
            return code & 0xFF
    return None


def _connection_lost(connection: BaseDatabaseWrapper) -> bool:
    """Whether Django's connection has no live driver connection behind it."""
    raw = connection.connection
    if raw is None:
        return True
    # psycopg 3 has ``closed`` (bool) and ``broken``; psycopg 2 an int ``closed``.
    return bool(getattr(raw, "closed", False)) or bool(getattr(raw, "broken", False))


def classify(exc: Error, connection: BaseDatabaseWrapper | None) -> type[StoreError]:
    """The :class:`StoreError` class for ``exc``, raised on ``connection``."""
    code = sqlstate(exc)
    if code is not None:
        if code in _CONFLICT:
            return StoreConflict
        if code in _TIMEOUT:
            return StoreTimeout
        if code in _UNAVAILABLE or code.startswith("08"):
            return StoreUnavailable
    errno = _mysql_errno(exc)
    if errno in _MYSQL_CONFLICT:
        return StoreConflict
    if errno in _MYSQL_TIMEOUT:
        return StoreTimeout
    if errno in _MYSQL_UNAVAILABLE:
        return StoreUnavailable
    sqlite = _sqlite_code(exc)
    if sqlite in (_SQLITE_BUSY, _SQLITE_LOCKED):
        return StoreTimeout
    if sqlite == _SQLITE_CANTOPEN:
        return StoreUnavailable
    if connection is not None:
        if isinstance(exc, OperationalError | InterfaceError):
            # libpq's own errors (a connection refused, cut or closed) carry no SQLSTATE;
            # everything the server says does. The connection's state cannot tell: when
            # a store's atomic block ends, Django may already have reconnected.
            if code is None and _server_errors_carry_sqlstate(connection):
                return StoreUnavailable
            if _connection_lost(connection):
                return StoreUnavailable
        # "Cannot open a new connection in an atomic block": the connection died earlier
        # in the same transaction and the caller went on using it.
        if isinstance(exc, ProgrammingError) and connection.closed_in_transaction:
            return StoreUnavailable
    return StoreError


def _server_errors_carry_sqlstate(connection: BaseDatabaseWrapper) -> bool:
    # Imported here: importing the backends runs jobstate.stores.database's __init__,
    # whose stores import this module.
    from jobstate.stores.database.backends import database_ops

    return database_ops(connection.alias).server_errors_carry_sqlstate


def _missing_schema(exc: Error, code: str | None, errno: int | None) -> bool:
    """Whether ``exc`` says a table or column does not exist (a database not migrated,
    or not up to date); SQLite says so only in its message, which names no value."""
    if code in _MISSING_SQLSTATES or errno in _MYSQL_MISSING:
        return True
    return _sqlite_code(exc) is not None and str(exc).startswith(_SQLITE_MISSING)


def store_error(exc: Error, *, operation: str, using: str) -> StoreError:
    """The documented error for ``exc``, raised by ``operation`` on database ``using``.

    The message names the operation, the failure and the driver's error class and
    SQLSTATE; the driver's message (which can quote the statement's values) is left on
    the cause. A lost connection is dropped here so the next call reconnects."""
    connection = _connection(using)
    kind = classify(exc, connection)
    errno = _mysql_errno(exc)
    code = sqlstate(exc) or (_MYSQL_SQLSTATE.get(errno) if errno is not None else None)
    origin = type(exc).__name__ + (f", SQLSTATE {code}" if code else "")
    if errno is not None:
        origin += f", MySQL error {errno}"
    what = _DESCRIPTIONS.get(kind) or next(
        text for cls, text in _OTHER_FAILURES if isinstance(exc, cls)
    )
    if kind is StoreError and _missing_schema(exc, code, errno):
        what = _MISSING
    error = kind(f"{operation} failed: {what} ({origin}).", sqlstate=code)
    if kind is StoreUnavailable:
        discard_broken_connection(using)
    return error


def discard_broken_connection(using: str = DEFAULT_DB_ALIAS) -> bool:
    """Close this thread's connection to ``using`` if it no longer answers, so the next
    query opens a new one. Returns whether it closed it.

    Does nothing inside an atomic block: closing there would leave the host's block
    unable to roll back cleanly, and Django drops a dead connection itself when the
    outermost block ends. Costs one ``SELECT 1`` round trip on an open connection."""
    connection = _connection(using)
    if connection is None or connection.in_atomic_block or connection.connection is None:
        return False
    if connection.is_usable():
        return False
    # Closing a dead connection can fail in the driver; Django has dropped it anyway.
    with suppress(Error):
        connection.close()
    return True


def _connection(using: str) -> BaseDatabaseWrapper | None:
    # ``connections`` has no ``get``; an unknown alias has no connection to look at.
    try:
        return connections[using]
    except ConnectionDoesNotExist:
        return None


def translated_database_errors(
    operation: str, using: str = DEFAULT_DB_ALIAS
) -> AbstractContextManager[None]:
    """Raise the documented :class:`StoreError` for any database error in the block.
    jobstate's own errors pass through unchanged (a lost connection is still dropped)."""
    return _Translated(operation, using)


class _Translated:
    """:func:`translated_database_errors`'s block. A class rather than a generator
    context manager: a worker's report enters one per round, and this costs half the
    calls."""

    __slots__ = ("operation", "using")

    def __init__(self, operation: str, using: str) -> None:
        self.operation = operation
        self.using = using

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if isinstance(exc, JobStateError):
            if isinstance(exc, StoreUnavailable):
                discard_broken_connection(self.using)
        elif isinstance(exc, Error):
            raise store_error(exc, operation=self.operation, using=self.using) from exc


def translate_store_errors(cls: type[_T]) -> type[_T]:
    """Class decorator: every public method of ``cls``, its own and inherited ones (the
    mixins), raises documented errors instead of raw database errors.

    The database alias is read from the instance's ``using`` attribute. Errors the
    methods translate on purpose never reach the wrapper, and jobstate errors pass
    through untouched, so a call nested in another store call is translated once.
    Properties, static and class methods are left alone; so are methods a subclass
    overrides later (its ``super()`` calls are translated)."""
    for name in dir(cls):
        if name.startswith("_"):
            continue
        method = inspect.getattr_static(cls, name)
        if not inspect.isfunction(method) or getattr(method, _WRAPPED, False):
            continue
        setattr(cls, name, _translating(method, f"{cls.__name__}.{name}"))
    return cls


def _translating(method: Callable[..., Any], operation: str) -> Callable[..., Any]:
    # A plain try block rather than the context manager: this runs on every hot-path call.
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except JobStateError as exc:
            if isinstance(exc, StoreUnavailable):
                discard_broken_connection(getattr(self, "using", DEFAULT_DB_ALIAS))
            raise
        except Error as exc:
            using = getattr(self, "using", DEFAULT_DB_ALIAS)
            raise store_error(exc, operation=operation, using=using) from exc

    setattr(wrapper, _WRAPPED, True)
    return wrapper
