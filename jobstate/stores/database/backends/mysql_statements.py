"""The text of MariaDB's and MySQL's claim and report statements, built once per shape.

A claim and a report run on every job, and on these servers each is a few statements
(no ``UPDATE ... RETURNING``; :mod:`jobstate.stores.database.set_claims` says which).
Building their text (quoting every column, one placeholder per value) cost the worker
more than sending them, so the text of each shape is kept: the ``UPDATE`` of a claim or
a report by which columns it sets and how, how many rows and statuses it names and
whether a claim token fences it; the read of whole rows by how many ids it names. The
parameters are still made on every call, in the order the text names them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field

from jobstate.core.states import JobStatus
from jobstate.models import Job
from jobstate.stores.database.backends.portable import rule_sql
from jobstate.stores.database.backends.shapes import kept

__all__ = [
    "column",
    "columns",
    "job_field",
    "marks",
    "prep",
    "select_jobs",
    "to_uuid",
    "update_jobs",
]

_UPDATES: dict[tuple[Any, ...], str] = {}
_SELECTS: dict[tuple[str, int], str] = {}


def marks(values: Collection[object] | range) -> str:
    """One placeholder per value, for ``IN (...)``."""
    return ", ".join(["%s"] * len(values))


def job_field(name: str) -> Field[Any, Any]:
    field = Job._meta.get_field(name)
    if not isinstance(field, Field):
        raise TypeError(f"Job.{name} is not a concrete field.")
    return field


def column(field: Field[Any, Any]) -> str:
    return field.column or field.attname


def columns(connection: BaseDatabaseWrapper, prefix: str) -> str:
    """Every concrete ``Job`` column in model order, each after ``prefix``."""
    quote = connection.ops.quote_name
    return ", ".join(f"{prefix}{quote(column(field))}" for field in Job._meta.concrete_fields)


def to_uuid(value: Any) -> uuid.UUID:
    """A UUID column's value as read by the driver (text, bytes or a UUID) as a UUID."""
    if isinstance(value, uuid.UUID):
        return value
    return uuid.UUID(value.decode() if isinstance(value, bytes) else str(value))


def prep(connection: BaseDatabaseWrapper) -> Callable[[Field[Any, Any], Any], Any]:
    """A field's value as a parameter of ``connection``, as an ORM update prepares it."""

    def prepared(field: Field[Any, Any], value: Any) -> Any:
        return field.get_db_prep_save(value, connection)

    return prepared


def update_jobs(
    connection: BaseDatabaseWrapper,
    now_sql: str,
    ids: Sequence[uuid.UUID],
    same: dict[str, Any],
    per_row: dict[str, dict[uuid.UUID, Any]],
    *,
    statuses: Collection[JobStatus],
    token: uuid.UUID | None,
    stamped: Sequence[str],
    attempt: bool,
) -> tuple[str, list[Any]]:
    """The ``UPDATE`` of ``ids`` (those in one of ``statuses``, and holding ``token``
    when given) and its parameters: each of ``same`` to its value, each of ``per_row``
    to its row's value (one value when all rows share it, else ``CASE id``), each of
    ``stamped`` to the database clock, and with ``attempt`` one more attempt."""
    prepared = prep(connection)
    keys = [prepared(Job._meta.pk, pk) for pk in ids]
    params = [prepared(job_field(name), value) for name, value in same.items()]
    per_row_shape: list[tuple[str, bool]] = []
    for name, by_id in per_row.items():
        field = job_field(name)
        values = [prepared(field, by_id[pk]) for pk in ids]
        shared = all(value == values[0] for value in values)
        per_row_shape.append((name, shared))
        if shared:
            params.append(values[0])
        else:
            for key, value in zip(keys, values, strict=True):
                params += [key, value]
    status_values = [status.value for status in statuses]
    params += [*keys, *status_values]
    if token is not None:
        params.append(prepared(job_field("claim_token"), token))
    shape = (
        connection.alias,
        tuple(same),
        tuple(per_row_shape),
        tuple(stamped),
        attempt,
        len(keys),
        len(status_values),
        token is not None,
    )

    def build() -> str:
        quote = connection.ops.quote_name

        def name_of(field_name: str) -> str:
            return quote(column(job_field(field_name)))

        sets = [f"{name_of(name)} = %s" for name in same]
        for name, shared in per_row_shape:
            value = "%s" if shared else f"CASE id{' WHEN %s THEN %s' * len(keys)} END"
            sets.append(f"{name_of(name)} = {value}")
        sets += [f"{name_of(name)} = {now_sql}" for name in stamped]
        if attempt:
            sets.append("attempts = attempts + 1")
        where = f"id IN ({marks(keys)}) AND status IN ({marks(status_values)})"
        if token is not None:
            where += " AND claim_token = %s"
        table = rule_sql(connection, "{job}", now_sql)
        return f"UPDATE {table} SET {', '.join(sets)} WHERE {where}"

    return kept(_UPDATES, shape, build), params


def select_jobs(connection: BaseDatabaseWrapper, now_sql: str, count: int) -> str:
    """The read of ``count`` jobs by id, every concrete column in model order."""

    def build() -> str:
        table = rule_sql(connection, "{job}", now_sql)
        return f"SELECT {columns(connection, '')} FROM {table} WHERE id IN ({marks(range(count))})"

    return kept(_SELECTS, (connection.alias, count), build)
