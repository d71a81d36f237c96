"""Deleting a large set of old rows in short batches, each starting where the last stopped.

A retention sweep deletes the oldest candidates first, in ``(order, pk)`` order. The
index entries of the rows a batch deletes stay in the index until ``VACUUM``, so a
batch that searched from the start of the range again would walk past every entry the
sweep had already deleted: each batch slower than the last, and on a million-row table
the late batches spend most of their time (and the CPU live traffic needs) walking. Each
batch here starts after the last key the previous batch picked, so every batch costs the
same.

On PostgreSQL, when Django can delete the model's rows without loading them (no
cascades, no delete signals: ``Collector.can_fast_delete``), a batch is one statement:
the locked pick is materialized first, so the delete can never take more rows than the
batch's limit, and no keys travel to Python and back.
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import connections, models, transaction
from django.db.models import Q
from django.db.models.deletion import Collector

_M = TypeVar("_M", bound=models.Model)


def pick_oldest(candidates: models.QuerySet[_M], order: str, limit: int) -> models.QuerySet[_M]:
    """The oldest ``limit`` candidates (by ``order``, then pk), locked for the current
    transaction; rows another transaction holds are passed over. Backends without row
    locks ignore the lock."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}.")
    return candidates.select_for_update(skip_locked=True).order_by(order, "pk")[:limit]


class BatchedDeleter:
    """Deletes candidates of one or more kinds (a model and its order field) batch by
    batch on database ``using``, remembering per kind the last key it picked. Use one
    instance per sweep: a new instance starts again from the oldest candidate."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._last_key: dict[tuple[str, str], tuple[Any, Any]] = {}

    def delete_batch(self, candidates: models.QuerySet[_M], order: str, limit: int) -> int:
        """Delete up to ``limit`` of the oldest ``candidates`` (by ``order``, then pk)
        after the last key picked so far, in one short transaction. Rows another
        transaction holds are passed over (``SKIP LOCKED`` where the backend has it), and
        the delete repeats the candidate condition, so a row that changed since the pick
        is kept. Returns the rows deleted."""
        model = candidates.model
        kind = (model._meta.label, order)
        last = self._last_key.get(kind)
        if last is not None:
            value, pk = last
            # The ``>=`` bound lets the index scan start at the last key; the ``OR`` only
            # settles ties on the order value.
            candidates = candidates.filter(**{f"{order}__gte": value}).filter(
                Q(**{f"{order}__gt": value}) | Q(pk__gt=pk)
            )
        picked = pick_oldest(candidates, order, limit).values_list(order, "pk")
        with transaction.atomic(using=self.using):
            if self._in_one_statement(candidates):
                keys = self._delete_in_one_statement(picked)
                deleted = len(keys)
            else:
                keys = list(picked)
                deleted = 0
                if keys:
                    _, per_model = candidates.filter(pk__in=[pk for _, pk in keys]).delete()
                    deleted = per_model.get(model._meta.label, 0)
        if keys:
            # The order fields are timestamps and the keys UUIDs or integers: Python
            # orders them as the database does.
            self._last_key[kind] = max(keys)
        return deleted

    def _in_one_statement(self, candidates: models.QuerySet[Any]) -> bool:
        connection = connections[self.using]
        return connection.vendor == "postgresql" and Collector(
            using=self.using, origin=None
        ).can_fast_delete(candidates)

    def _delete_in_one_statement(self, picked: models.QuerySet[Any]) -> list[tuple[Any, Any]]:
        connection = connections[self.using]
        pick_sql, params = picked.query.get_compiler(self.using).as_sql()
        model = picked.model
        table = connection.ops.quote_name(model._meta.db_table)
        pk = connection.ops.quote_name(model._meta.pk.column)
        # MATERIALIZED: the pick runs once, so the delete takes exactly the rows it locked.
        sql = (
            f"WITH picked (sort_key, pk) AS MATERIALIZED ({pick_sql}) "
            f"DELETE FROM {table} AS gone USING picked WHERE gone.{pk} = picked.pk "
            "RETURNING picked.sort_key, picked.pk"
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [tuple(row) for row in cursor.fetchall()]
