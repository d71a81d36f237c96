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
batch's limit, and no keys travel to Python and back (the backend's ``delete_picked``).
"""

from __future__ import annotations

from typing import Any, TypeVar

from django.db import OperationalError, connections, models, transaction
from django.db.models import Q

from jobstate.stores.database.backends import database_ops

_M = TypeVar("_M", bound=models.Model)


def pick_oldest(candidates: models.QuerySet[_M], order: str, limit: int) -> models.QuerySet[_M]:
    """The oldest ``limit`` candidates (by ``order``, then pk), locked for the current
    transaction; rows another transaction holds are passed over. Backends without row
    locks ignore the lock."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit must be a positive int, got {limit!r}.")
    return candidates.select_for_update(skip_locked=True).order_by(order, "pk")[:limit]


def after_key(
    candidates: models.QuerySet[_M], order: str, key: tuple[Any, Any]
) -> models.QuerySet[_M]:
    """The ``candidates`` after ``key`` ``(order value, pk)`` in ``(order, pk)`` order.
    The ``>=`` bound lets the index scan start at the key; the ``OR`` only settles ties
    on the order value. The order values are instants the database's clock wrote, read
    back: they are compared in the database's own terms (the backend's
    ``instant_filter``), or on SQLite the rest of an instant's ties would be passed over."""
    value, pk = key
    ops = database_ops(candidates.db)
    return candidates.filter(ops.instant_filter(order, "gte", value)).filter(
        ops.instant_filter(order, "gt", value) | Q(pk__gt=pk)
    )


def _lock_oldest_by_key(
    candidates: models.QuerySet[Any], order: str, limit: int
) -> tuple[list[tuple[Any, Any]], tuple[Any, Any] | None]:
    """The keys ``(order value, pk)`` of the oldest ``limit`` candidates that no other
    transaction holds, locked, and the key the next batch may start after (``None``:
    where this one started); for the backends whose locking read locks every row it
    reads (MariaDB and MySQL: ``locks_every_row_read``).

    There a locking read whose order no index serves (a sort) locks every candidate it
    reads before the limit applies, so a second sweeper would find all of them held and
    stop with rows left. Instead the candidates' keys are read without locks, as many at
    a time as the batch still lacks, and only those rows are locked (``SKIP LOCKED``),
    until the batch is full or the candidates run out: what PostgreSQL's ``SKIP LOCKED
    ... LIMIT`` answers.

    A sweeper that finds its batch short stops, trusting that every row it passed over
    is held by a sweeper that deletes it; so this transaction must lock no row it does
    not delete. The locking read and the delete (:func:`_delete_locked`) therefore name
    their rows by primary key alone: with the candidate condition beside the keys,
    MariaDB may walk the order field's index instead and lock every row it passes on the
    way (the oldest ones left, as the walk starts there), and two sweepers each finding
    those rows held by the other both stopped with them left. The candidate condition is
    read again, without a lock, once the rows are locked: a row that stopped being a
    candidate meanwhile is not returned, and is kept."""
    ordered = candidates.order_by(order, "pk")
    ops = database_ops(candidates.db)
    rest = ordered
    locked: list[tuple[Any, Any]] = []
    skipped: tuple[Any, Any] | None = None
    while len(locked) < limit:
        wanted = limit - len(locked)
        window = list(rest.values_list(order, "pk")[:wanted])
        if not window:
            break
        held = ops.lock_by_key(candidates.model, [pk for _, pk in window])
        for key in window:
            if key[1] in held:
                locked.append(key)
            elif skipped is None:
                skipped = key
        if len(window) < wanted:
            break
        rest = after_key(ordered, order, window[-1])
    # The next batch starts before the first row passed over here: its holder may not
    # delete it (it stopped being a candidate, or that holder's transaction failed).
    resume = max((key for key in locked if skipped is None or key < skipped), default=None)
    if not locked:
        return [], resume
    # The rows are this transaction's now: a plain read sees them as they stay until it
    # ends. Those that stopped being candidates since the window was read are kept.
    still = set(candidates.filter(pk__in=[pk for _, pk in locked]).values_list("pk", flat=True))
    return [key for key in locked if key[1] in still], resume


def _delete_locked(candidates: models.QuerySet[Any], keys: list[tuple[Any, Any]]) -> int:
    """Delete the rows ``keys`` name, which :func:`_lock_oldest_by_key` locked and found
    still candidates, by primary key alone; returns the candidates' rows deleted."""
    if not keys:
        return 0
    model = candidates.model
    by_key = model._base_manager.db_manager(candidates.db)
    _, per_model = by_key.filter(pk__in=[pk for _, pk in keys]).delete()
    return per_model.get(model._meta.label, 0)


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
            candidates = after_key(candidates, order, last)
        picked = pick_oldest(candidates, order, limit).values_list(order, "pk")
        ops = database_ops(self.using)
        # A deadlock rolled the whole transaction back, so the batch can simply run
        # again (MariaDB and MySQL, see ``delete_rounds``). Inside a caller's
        # transaction that rollback took the caller's work too, so there the error is
        # theirs to see.
        rounds = 1 if connections[self.using].in_atomic_block else ops.delete_rounds
        for round_ in range(1, rounds + 1):
            try:
                resume, deleted = self._delete_picked(candidates, picked, order, limit)
                break
            except OperationalError as exc:
                if round_ == rounds or not ops.deadlocked(exc):
                    raise
        if resume is not None:
            # The order fields are timestamps and the keys UUIDs or integers: Python
            # orders them as the database does.
            self._last_key[kind] = resume
        return deleted

    def _delete_picked(
        self,
        candidates: models.QuerySet[_M],
        picked: models.QuerySet[Any],
        order: str,
        limit: int,
    ) -> tuple[tuple[Any, Any] | None, int]:
        """Pick and delete one batch in one transaction: the key the next batch starts
        after (``None``: where this one started), and the rows deleted."""
        label = candidates.model._meta.label
        ops = database_ops(self.using)
        with transaction.atomic(using=self.using):
            if ops.deletes_in_one_statement(candidates):
                keys = ops.delete_picked(picked)
                return max(keys, default=None), len(keys)
            if ops.locks_every_row_read:
                keys, resume = _lock_oldest_by_key(candidates, order, limit)
                return resume, _delete_locked(candidates, keys)
            keys = list(picked)
            resume = max(keys, default=None)
            if not keys:
                return resume, 0
            _, per_model = candidates.filter(pk__in=[pk for _, pk in keys]).delete()
            return resume, per_model.get(label, 0)
