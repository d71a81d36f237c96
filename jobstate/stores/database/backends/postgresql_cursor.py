"""The cursor the PostgreSQL hot-path statements run on, and how their rows become jobs.

One server-binding cursor is kept per connection (:func:`hot_cursor`); the statements'
text is constant per shape, so psycopg can prepare them. Django turns psycopg's prepared
statements off on every connection (``prepare_threshold = None``) unless the host sets
``OPTIONS["prepare_threshold"]``, because PgBouncer in transaction mode before 1.22
cannot keep a statement prepared on one server connection for a client that lands on
another. With ``JOBSTATE["PREPARED_STATEMENTS"]`` (the default) the hot cursor turns
psycopg's automatic preparation on for its own statements only, while each one runs:
a hot statement is prepared once it has run :data:`PREPARE_AFTER` times on the
connection, and the host's own statements are left as the host configured them. Rows
become ``Job`` instances through the same converters a queryset applies
(:func:`load_jobs`).
"""

from __future__ import annotations

import functools
import json
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField, Model, signals
from django.db.models.base import ModelState

from jobstate.core.conf import jobstate_settings
from jobstate.models import Job

__all__ = ["PREPARE_AFTER", "hot_cursor", "load_jobs"]

#: Runs of a hot statement on one connection before psycopg prepares it: psycopg's own
#: default threshold. A statement run once per connection (a web request's report on a
#: short-lived connection) is never prepared, which would cost it a round trip more.
PREPARE_AFTER = 5


@contextmanager
def hot_cursor(connection: BaseDatabaseWrapper) -> Iterator[Any]:
    """A cursor for the hot-path statements: on psycopg 3 one that binds parameters on
    the server and prepares its statements (see the module's docstring). It goes through
    Django's cursor wrapper, so query logging and execute wrappers still see the
    statement.

    One such cursor is kept per connection, with psycopg's compiled ``timestamptz``
    loader instead of the Python one Django installs (the claim and the report each
    return several timestamps); :func:`load_jobs` then applies Django's time zone
    itself. Creating a cursor, and its adapters, for every call cost more than the
    statement's own Python work."""
    cursor_class = _hot_cursor_class()
    if cursor_class is None:
        with connection.cursor() as cursor:
            yield cursor
        return
    connection.ensure_connection()
    raw = connection.connection
    reused = _HOT_CURSORS.get(connection)
    if reused is None or reused.connection is not raw or reused.closed:
        reused = cursor_class(raw)
        reused.adapters.register_loader("timestamptz", _compiled_timestamptz_loader())
        _HOT_CURSORS[connection] = reused
    # Read on every call, so a test's settings override applies to a kept cursor too. A
    # host that set a threshold already has psycopg prepare as it chose.
    reused.prepare_hot = raw.prepare_threshold is None and jobstate_settings.PREPARED_STATEMENTS
    # Django wraps its own cursors the same way (``_prepare_cursor``): debug logging,
    # execute wrappers and thread-sharing checks apply unchanged. The wrapper is not
    # closed: the psycopg cursor is reused by the next call on this connection.
    wrapper: Any = connection
    yield wrapper._prepare_cursor(reused)


#: Per connection: its reusable hot-path cursor (see :func:`hot_cursor`).
_HOT_CURSORS: weakref.WeakKeyDictionary[BaseDatabaseWrapper, Any] = weakref.WeakKeyDictionary()


@functools.cache
def _hot_cursor_class() -> type[Any] | None:
    """The hot cursor's class for psycopg 3 (Django's server-binding cursor, preparing
    its statements), or ``None`` (psycopg 2: Django's own cursor)."""
    try:
        from django.db.backends.postgresql.base import ServerBindingCursor
    except (ImportError, AttributeError):
        return None
    base: Any = ServerBindingCursor

    class HotCursor(base):
        """Prepares what it runs while ``prepare_hot`` is set (by :func:`hot_cursor`: the
        setting is on and the connection's threshold is ``None``).

        psycopg ignores ``execute(..., prepare=True)`` on a connection whose
        ``prepare_threshold`` is ``None`` (Django's default), so the threshold is set
        for the duration of this one statement and put back afterwards: psycopg counts
        and prepares this cursor's statements, and never the host's."""

        prepare_hot = True

        def execute(
            self,
            query: Any,
            params: Any = None,
            *,
            prepare: bool | None = None,
            binary: bool | None = None,
        ) -> Any:
            if not self.prepare_hot or prepare is not None:
                return super().execute(query, params, prepare=prepare, binary=binary)
            connection = self.connection
            connection.prepare_threshold = PREPARE_AFTER
            try:
                return super().execute(query, params, binary=binary)
            finally:
                connection.prepare_threshold = None

    return HotCursor


@functools.cache
def _compiled_timestamptz_loader() -> type[Any]:
    """psycopg's own ``timestamptz`` text loader (registering it picks the compiled
    version when psycopg has one)."""
    from psycopg.types.datetime import TimestamptzLoader

    return TimestamptzLoader


# --- rows into jobs -------------------------------------------------------------------


@dataclass(frozen=True)
class _RowPlan:
    """How one connection's rows of every concrete ``Job`` column become field values."""

    #: The fields' attribute names, in model field order (the rows' column order).
    names: list[str]
    #: The ``DateTimeField`` columns: psycopg's compiled loader gives the session's wall
    #: time, to which Django's time zone is attached (inline: a function call per
    #: timestamp cost more than the rest of a claim's Python work per column).
    zoned: tuple[int, ...]
    #: The plain ``JSONField`` columns (no decoder of their own): decoded inline, as
    #: their ``from_db_value`` would (a job has seven, so a call saved is seven).
    json: tuple[tuple[int, Any, Any], ...]
    #: The other converters of each column that has any, bound to the connection:
    #: working them out costs more than a claim's other Python work.
    converters: tuple[tuple[int, Any, tuple[Any, ...]], ...]


#: Per connection: its :class:`_RowPlan`.
_PLANS: weakref.WeakKeyDictionary[BaseDatabaseWrapper, _RowPlan] = weakref.WeakKeyDictionary()


def _row_plan(connection: BaseDatabaseWrapper) -> _RowPlan:
    plan = _PLANS.get(connection)
    if plan is not None:
        return plan
    fields = Job._meta.concrete_fields
    zoned: list[int] = []
    plain_json: list[tuple[int, Any, Any]] = []
    converters: list[tuple[int, Any, tuple[Any, ...]]] = []
    for position, field in enumerate(fields):
        column = field.get_col(Job._meta.db_table)
        functions = (
            *connection.ops.get_db_converters(column),
            *column.get_db_converters(connection),
        )
        if field.get_internal_type() == "DateTimeField":
            # Before the column's other converters, as Django's own loader would be.
            zoned.append(position)
        if _plain_json(field, functions):
            plain_json.append((position, column, functions[0]))
        elif functions:
            converters.append((position, column, functions))
    names = [field.attname for field in fields]
    plan = _RowPlan(names, tuple(zoned), tuple(plain_json), tuple(converters))
    _PLANS[connection] = plan
    return plan


def load_jobs(
    connection: BaseDatabaseWrapper, using: str, rows: Iterable[Sequence[Any]]
) -> list[Job]:
    """Turn raw rows of every concrete ``Job`` column, in model field order, into
    ``Job`` instances, through the same backend and field converters (JSON decoding,
    time zones) a queryset applies."""
    plan = _row_plan(connection)
    names, zoned, plain_json, converters = plan.names, plan.zoned, plan.json, plan.converters
    zone = connection.timezone
    instantiate = _instantiate if _plain_instances() else Job.from_db
    jobs: list[Job] = []
    for row in rows:
        values = list(row)
        for position in zoned:
            # What Django's own timestamptz loader does: keep the wall time in the
            # session's time zone and attach connection.timezone (UTC with USE_TZ,
            # naive without).
            value = values[position]
            if value is not None:
                values[position] = value.replace(tzinfo=zone)
        for position, column, from_db_value in plain_json:
            value = values[position]
            if type(value) is str:
                # What from_db_value does: the decoded value, or the text itself when it
                # is no JSON (json.loads also refuses a leading BOM; decode() does too).
                # Not contextlib.suppress: the point is fewer calls per value.
                try:  # noqa: SIM105
                    values[position] = _decode_json(value)
                except json.JSONDecodeError:
                    pass
            elif value is not None:
                values[position] = from_db_value(value, column, connection)
        for position, column, functions in converters:
            value = values[position]
            for function in functions:
                value = function(value, column, connection)
            values[position] = value
        jobs.append(instantiate(using, names, values))
    return jobs


#: ``json.loads`` without arguments decodes with a decoder of its defaults, as this one.
_decode_json = json.JSONDecoder().decode


def _plain_json(field: Any, functions: tuple[Any, ...]) -> bool:
    """Whether ``field``'s only converter is Django's own ``JSONField.from_db_value``
    with no decoder of its own: one that ``load_jobs`` may apply inline."""
    return (
        isinstance(field, JSONField)
        and type(field).from_db_value is JSONField.from_db_value
        and field.decoder is None
        and functions == (field.from_db_value,)
    )


def _plain_instances() -> bool:
    """Whether a loaded ``Job`` may skip ``Model.__init__``: the model overrides neither
    it nor ``from_db``, no field sets its attribute through a descriptor, and no
    ``pre_init`` or ``post_init`` receiver listens for ``Job`` (asked on every call: a
    receiver may be connected at any time). What ``Model.__init__`` then does is what
    :func:`_instantiate` does, at a tenth of the calls: the worker builds two jobs per
    task (the one it reported, the one it claimed)."""
    pre, post = signals.pre_init, signals.post_init
    # A signal with no receiver at all is answered without a call.
    return (
        _plain_model()
        and not (pre.receivers and pre.has_listeners(Job))
        and not (post.receivers and post.has_listeners(Job))
    )


@functools.cache
def _plain_model() -> bool:
    if Job.__init__ is not Model.__init__:
        return False
    if Job.from_db.__func__ is not Model.from_db.__func__:  # type: ignore[attr-defined]
        return False
    return all(
        not hasattr(type(getattr(Job, field.attname, None)), "__set__")
        for field in Job._meta.concrete_fields
    )


def _instantiate(using: str, names: list[str], values: list[Any]) -> Job:
    """``Job.from_db(using, names, values)`` for a model :func:`_plain_instances`
    allows: a fresh ``ModelState`` loaded from ``using``, then each field's value, set
    in the same order."""
    job: Job = Job.__new__(Job)
    state = ModelState()
    job._state = state
    job.__dict__.update(zip(names, values, strict=True))
    state.adding = False
    state.db = using
    return job
