"""The short transaction of a claim or a report on MariaDB and MySQL, and the next result
of a statement text that holds several.

A claim or a report runs on every job, so its round trips to the server are most of its
cost. Django's outermost ``atomic`` takes three of its own here (``SET autocommit = 0``,
``COMMIT``, ``SET autocommit = 1``); :func:`short_transaction` takes one, the
``COMMIT``: ``START TRANSACTION`` travels with the transaction's first statement, in one
text (``START TRANSACTION; SELECT ...``), where the connection allows several statements
in one text (mysqlclient's default, ``multi_statements``). Where it does not (the option
turned off, or another driver), ``START TRANSACTION`` is a round trip of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, Error, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["next_result", "several_statements", "short_transaction"]

#: CLIENT_MULTI_STATEMENTS, the client capability of the MySQL protocol that lets one
#: text hold several statements (the same bit in mysqlclient and PyMySQL).
_MULTI_STATEMENTS = 1 << 16

_START = "START TRANSACTION"


def several_statements(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` (open) sends one text of several statements."""
    flags = getattr(connection.connection, "client_flag", 0)
    return bool(flags & _MULTI_STATEMENTS)


def next_result(cursor: Any) -> None:
    """Move ``cursor`` (a Django cursor) to the result of the next statement of its
    text. The server runs the statements of a text one after the other and stops at the
    first that fails; that statement's error is raised here, as Django's ``execute``
    would raise it (the codes Django's MySQL backend reads as integrity errors
    included)."""
    connection = cursor.db
    backend_cursor = cursor.cursor
    integrity_codes = getattr(backend_cursor, "codes_for_integrityerror", ())
    database = connection.Database
    with connection.wrap_database_errors:
        try:
            backend_cursor.nextset()
        except database.OperationalError as exc:
            if exc.args and exc.args[0] in integrity_codes:
                raise database.IntegrityError(*exc.args) from exc
            raise


class _StartWithFirstStatement:
    """An execute wrapper that sends ``START TRANSACTION`` in the text of the first
    statement run through it, and then steps aside (it removes itself)."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self.started = False

    def __call__(
        self,
        execute: Callable[[str, Any, bool, dict[str, Any]], Any],
        sql: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        self._step_aside()
        self.started = True
        if many:
            # ``executemany`` sends its statement once per set of parameters.
            execute(_START, None, False, context)
            return execute(sql, params, many, context)
        outcome = execute(f"{_START}; {sql}", params, many, context)
        next_result(context["cursor"])
        return outcome

    def _step_aside(self) -> None:
        wrappers = self.connection.execute_wrappers
        if self in wrappers:
            wrappers.remove(self)


@contextmanager
def short_transaction(connection: BaseDatabaseWrapper, using: str) -> Iterator[None]:
    """A transaction that costs one round trip of its own, the ``COMMIT`` (the module's
    text says how). Inside the caller's transaction (an ``atomic`` block, or
    autocommit turned off) this is ``atomic`` as before: a savepoint in it."""
    if connection.in_atomic_block or not connection.get_autocommit():
        with transaction.atomic(using=using):
            yield
        return
    connection.ensure_connection()
    starter: _StartWithFirstStatement | None = None
    if several_statements(connection):
        starter = _StartWithFirstStatement(connection)
        connection.execute_wrappers.append(starter)
    else:
        with connection.cursor() as cursor:
            cursor.execute(_START)
    # Django is told what the server has once the transaction starts, a transaction open
    # as with autocommit off (what ``set_autocommit(False)`` records, without its round
    # trip): so the ORM's locking reads are allowed in it, and an ``atomic`` block opened
    # inside is a savepoint that leaves the commit to this one.
    connection.autocommit = False
    try:
        yield
    except BaseException:
        _rolled_back(connection)
        raise
    else:
        if starter is None or starter.started:
            try:
                connection.commit()
            except DatabaseError:
                # As Django's atomic does: roll back what the failed commit left open,
                # and drop a connection that cannot even do that.
                _rolled_back(connection)
                raise
    finally:
        if starter is not None:
            starter._step_aside()
        connection.autocommit = True


def _rolled_back(connection: BaseDatabaseWrapper) -> None:
    """Roll back; a connection that cannot is closed (Django's atomic does the same)."""
    try:
        connection.rollback()
    except Error:
        connection.close()
