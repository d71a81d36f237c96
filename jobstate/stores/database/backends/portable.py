"""The defaults every backend's operations object starts from: what holds on any database
Django supports, on the ORM alone.

A backend module overrides what its database does differently (Django's own
``BaseDatabaseOperations`` and its subclasses are the model). The facts Django already
states are read from ``connection.features``, never inferred from the vendor's name; the
ones only jobstate knows (whether it ships one-statement forms of the hot path for the
backend, how the per-thread gate is locked) are said here, as class attributes and
methods.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import NotSupportedError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.base.features import BaseDatabaseFeatures
from django.db.models import Model, Q, QuerySet, Value
from django.db.models.functions import Now

from jobstate.core.states import JobStatus, NotificationRequest
from jobstate.models import NO_QUEUE, Job, QueuePause

if TYPE_CHECKING:
    from jobstate.stores.contracts.validation import ParsedReport

__all__ = ["BackendOperations", "FinishedEntry", "TableStatistics", "input_path", "rule_sql"]

_M = TypeVar("_M", bound=Model)

#: A ``finished`` audit entry's completed stage, severity, title, summary, and detail as
#: JSON text: the parameters a one-statement outbox completion inserts it with.
FinishedEntry = tuple[str, str, str, str, str]

#: The lookups :meth:`BackendOperations.instant_filter` takes.
INSTANT_LOOKUPS = frozenset({"exact", "lt", "lte", "gt", "gte"})


@dataclass(frozen=True)
class TableStatistics:
    """What a database's planner statistics say of a table: its rows now (estimated as
    the planner does) and, per value of a column it sampled, that value's frequency."""

    rows: float
    frequencies: dict[str, float]


class BackendOperations:
    """The operations object of one database alias: its backend's statements and
    choices. Chosen once per alias by
    :func:`~jobstate.stores.database.backends.database_ops`."""

    #: Django's vendor name of the backend this object is for.
    vendor = "portable"

    #: Whether jobstate has one-statement forms of the hot path on this backend: the
    #: claim, the batch claim, the task claim and enqueue, the batch completion, the
    #: outbox completion and the run reaper (:meth:`claim_one` and the methods after it).
    #: Elsewhere the ORM paths in the concern modules do the same in a transaction.
    hot_statements = False

    #: Whether claims, task claims and batch reports take the set-based path of
    #: :mod:`jobstate.stores.database.set_claims` (one locking read of every candidate,
    #: one ``UPDATE ... WHERE id IN``): where rows are locked but no ``UPDATE ...
    #: RETURNING`` hands the moved rows back in the same statement.
    claims_in_sets = False

    #: Whether the claim's ``UPDATE`` may re-check the per-thread gate in a subquery of
    #: the job table it updates (else the gate is read by a statement of its own, under
    #: the same thread lock, before the ``UPDATE``).
    gate_in_update = True

    #: How often a batched delete runs before it gives up on a deadlock
    #: (:meth:`deadlocked`).
    delete_rounds = 1
    #: How often a claim in sets (:mod:`..set_claims`) runs before it gives up on a
    #: deadlock.
    claim_rounds = 1

    #: Whether a locking read locks every row it reads, not just those it returns, when
    #: no index serves its order (then a batched delete locks its candidates by key).
    locks_every_row_read = False

    #: Whether an index serves the jobs list's ``input:`` search on its own.
    indexes_input_search = False

    #: Whether a long list is counted exactly (the admin's paginator caps or estimates
    #: the count elsewhere).
    counts_exactly = False

    #: Whether every error the server reports carries a SQLSTATE, so a driver error
    #: without one is the driver's own (a connection refused, cut or closed).
    server_errors_carry_sqlstate = False

    #: The database clock in SQL (what ``Now()`` compiles to), escaped for a statement
    #: run with parameters.
    now_sql = "CURRENT_TIMESTAMP"

    def __init__(self, using: str) -> None:
        self.using = using

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.using!r})"

    @property
    def connection(self) -> BaseDatabaseWrapper:
        """This thread's connection to the alias (Django keeps one per thread)."""
        return connections[self.using]

    @property
    def features(self) -> BaseDatabaseFeatures:
        return connections[self.using].features

    # --- what Django's features say --------------------------------------------------

    @property
    def locks_rows(self) -> bool:
        """Whether writers run concurrently here, so a path must lock what it reads
        (``SELECT ... FOR UPDATE``, ``SKIP LOCKED`` where claimers should pass each
        other). SQLite has no row locks: its ``IMMEDIATE`` transactions take the
        database's one write lock at ``BEGIN``, so a read already sees what the
        following write will."""
        return bool(self.features.has_select_for_update)

    def lock_by_key(self, model: type[Model], keys: Collection[Any]) -> set[Any]:
        """Of the rows of ``model`` whose primary keys are ``keys``, lock those no other
        transaction holds and return their keys; the rest are passed over (``SKIP
        LOCKED``). Only the named rows are locked."""
        return set(
            model._base_manager.db_manager(self.using)
            .filter(pk__in=list(keys))
            .order_by()
            .select_for_update(skip_locked=True)
            .values_list("pk", flat=True)
        )

    def lock_candidates(self, candidates: QuerySet[_M]) -> QuerySet[_M]:
        """``candidates`` locked for the transaction, passing over rows another
        transaction holds; the lock on the queried table alone where the backend can
        name it (``FOR UPDATE OF``; a query of one table locks only it either way)."""
        if not self.locks_rows:
            return candidates
        if self.features.has_select_for_update_of:
            return candidates.select_for_update(skip_locked=True, of=("self",))
        return candidates.select_for_update(skip_locked=True)

    # --- SQL text --------------------------------------------------------------------

    def sql(self, text: str) -> str:
        """A rule's SQL text (:mod:`jobstate.models.jobs`) for this backend: its quoted
        tables and its clock filled in."""
        return rule_sql(connections[self.using], text, self.now_sql)

    def short_transaction(self) -> AbstractContextManager[object]:
        """The transaction of a claim or a batch of reports: Django's ``atomic`` (a
        savepoint inside the caller's transaction)."""
        return transaction.atomic(using=self.using)

    # --- the per-thread gate ---------------------------------------------------------

    def lock_thread(self, thread_id: int) -> None:
        """Hold ``thread_id``'s gate until the transaction ends, waiting for it: what
        serialises one thread's claims and quota counts. Nothing is needed where writers
        never run concurrently (:attr:`locks_rows` false)."""
        if self.locks_rows:
            raise NotSupportedError(f"jobstate has no per-thread gate on {self.vendor}.")

    def try_lock_thread(self, thread_id: int) -> bool:
        """Like :meth:`lock_thread` but never waits: ``False`` when another transaction
        holds the thread. A claim uses this because it already holds a candidate's row
        lock; waiting here while another claimer waits for that row would deadlock."""
        self.lock_thread(thread_id)
        return True

    def try_lock_key(self, digest: str) -> bool:
        """Hold a concurrency key's gate (by its digest) until the transaction ends, or
        ``False`` at once when another transaction holds it: what serialises the claims
        of one key's tasks, each counting the key's running jobs under it. Where the
        backend has no gate of its own, the key shares the per-thread gates in a range
        no thread uses (negative numbers); where writers never run concurrently
        (SQLite) nothing is needed."""
        return self.try_lock_thread(key_gate(digest))

    def claim_candidates(
        self,
        scope: list[str],
        limit: int,
        passed_ids: Sequence[uuid.UUID],
        passed_threads: Collection[int],
        *,
        gated: bool = True,
    ) -> list[tuple[Job, datetime]]:
        """Up to ``limit`` claimable jobs of ``scope`` (ready, of an unpaused queue,
        through the per-thread gate unless not ``gated``), oldest first and locked as
        :meth:`lock_candidates` locks, leaving out ``passed_ids`` and the jobs of
        ``passed_threads``; each with the database clock of the read (the set-based
        claims, :attr:`claims_in_sets`)."""
        candidates = Job.objects.using(self.using).claimable(scope, gated=gated)
        if passed_ids:
            candidates = candidates.exclude(id__in=list(passed_ids))
        if passed_threads:
            candidates = candidates.exclude(thread_id__in=list(passed_threads))
        read = self.lock_candidates(candidates).annotate(jobstate_clock=Now())[:limit]
        return [(job, job.__dict__.pop("jobstate_clock")) for job in read]

    def try_lock_threads(self, thread_ids: Collection[int]) -> set[int]:
        """:meth:`try_lock_thread` for several threads at once: the ones now held by
        this transaction."""
        return {thread_id for thread_id in thread_ids if self.try_lock_thread(thread_id)}

    # --- instants read back from the database ----------------------------------------

    def instant_filter(self, field: str, lookup: str, instant: datetime) -> Q:
        """The filter ``field__lookup=instant``, true exactly when the stored instant
        compares so with ``instant`` whichever clock wrote the row: ``lookup`` is one of
        ``exact``, ``lt``, ``lte``, ``gt``, ``gte``. Databases that store instants as
        timestamps compare them as they are."""
        check_instant_lookup(lookup)
        return Q(**{f"{field}__{lookup}": instant})

    def clock_instant(self, instant: datetime) -> datetime | Value:
        """``instant`` as a comparison with a column the database clock wrote should
        take it: as it is, where instants are timestamps."""
        return instant

    # --- figures ---------------------------------------------------------------------

    def table_statistics(self, model: type[Model], column: str) -> TableStatistics | None:
        """The planner's statistics of ``model``'s table and ``column``, or ``None`` where
        the backend keeps none worth reading (then figures are counted exactly)."""
        return None

    def estimated_rows(self, model: type[Model]) -> int | None:
        """The planner's row estimate of ``model``'s whole table (``-1`` when the table
        was never analysed), or ``None`` where the backend has none."""
        return None

    def missing_server_guards(self) -> list[str]:
        """What the database lacks of what jobstate's migrations add for this backend
        (``table.index`` or table names); nothing on a backend that enforces jobstate's
        constraints itself."""
        return []

    # --- connections and errors ------------------------------------------------------

    def prepare_connection(self, connection: BaseDatabaseWrapper) -> None:
        """Set up a new connection's session (``connection_created``)."""

    @property
    def can_listen(self) -> bool:
        """Whether a worker can wait for ``NOTIFY`` on this database instead of polling."""
        return False

    def deadlocked(self, exc: BaseException) -> bool:
        """Whether ``exc`` is a deadlock that rolled the whole transaction back, so a
        batched delete may simply run again (see :attr:`delete_rounds`)."""
        return False

    # --- the jobs list's search ------------------------------------------------------

    def filter_input(self, rows: QuerySet[Job], value: dict[str, Any]) -> QuerySet[Job]:
        """``rows`` whose input holds ``value`` (a path of one-key objects down to a
        scalar) at its path, as PostgreSQL's ``@>`` would answer."""
        return rows.filter(input__contains=value)

    # --- the one-statement hot path (where :attr:`hot_statements`) -------------------

    def _no_statement(self) -> NotSupportedError:
        return NotSupportedError(f"jobstate has no one-statement form of this on {self.vendor}.")

    def claim_one(
        self, scope: list[str], owner: str, lease: timedelta, status: JobStatus
    ) -> tuple[bool, Job | None]:
        """The oldest claimable job of ``scope`` picked and, when it has no thread,
        claimed: ``(False, None)`` when nothing is claimable, ``(True, None)`` when the
        oldest candidate has a thread and needs the gated path."""
        raise self._no_statement()

    def claim_unthreaded(
        self, scope: list[str], owner: str, lease: timedelta, limit: int
    ) -> list[Job]:
        """Up to ``limit`` ready jobs without a thread, claimed."""
        raise self._no_statement()

    def complete_group(
        self, columns: tuple[str, ...], group: Sequence[ParsedReport]
    ) -> dict[uuid.UUID, Job]:
        """Reports that patch the same ``columns`` applied, each fenced by its claim
        token; the jobs written, by id."""
        raise self._no_statement()

    # --- the set-based statements (where :attr:`claims_in_sets`) ---------------------

    def update_jobs(
        self,
        ids: Sequence[uuid.UUID],
        same: dict[str, Any],
        per_row: dict[str, dict[uuid.UUID, Any]],
        *,
        statuses: Collection[JobStatus],
        token: uuid.UUID | None = None,
        stamped: Sequence[str] = (),
        attempt: bool = False,
    ) -> int:
        """One ``UPDATE`` of the jobs ``ids`` still in one of ``statuses`` (and, with
        ``token``, still under that claim token): ``same`` on every row, ``per_row``
        each row's own value, the ``stamped`` fields on the database clock, and with
        ``attempt`` one more attempt. The rows matched."""
        raise self._no_statement()

    def update_and_read(
        self,
        pk: uuid.UUID,
        same: dict[str, Any],
        *,
        statuses: Collection[JobStatus],
        token: uuid.UUID,
        stamped: Sequence[str] = (),
    ) -> tuple[int, Job | None]:
        """:meth:`update_jobs` of the one job ``pk`` (fenced by ``token``), then the job
        as stored: the rows matched and the job, or ``None`` if there is none."""
        moved = self.update_jobs([pk], same, {}, statuses=statuses, token=token, stamped=stamped)
        return moved, self.jobs_by_id([pk]).get(pk)

    def lock_claims(self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]]) -> set[uuid.UUID]:
        """The ids of ``(id, claim token)`` pairs whose token is still the job's
        current claim, those rows locked until the transaction ends."""
        raise self._no_statement()

    def jobs_by_id(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, Job]:
        """The jobs ``ids`` as stored, by id (the ones that exist)."""
        raise self._no_statement()

    def finish_with_notifications(
        self,
        original: Job,
        cleaned: dict[str, Any],
        entry: FinishedEntry,
        requests: Sequence[NotificationRequest],
    ) -> Job | None:
        """The fenced terminal transition with its audit entry and outbox rows."""
        raise self._no_statement()

    def enqueue_task(self, cleaned: dict[str, Any]) -> Job | None:
        """A task's job inserted, waking the workers of its queue; ``None``, with nothing
        written, when the task is unique and a job holds its key."""
        raise self._no_statement()

    def claim_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> list[Job]:
        """Up to ``limit`` due tasks of ``target`` in ``queues`` (``None``: any), claimed
        in claim order, each with its token of ``claim_round``."""
        raise self._no_statement()

    def renew_claims(
        self, pairs: Sequence[tuple[uuid.UUID, uuid.UUID]], lease: timedelta
    ) -> set[uuid.UUID]:
        """The leases of the claims ``pairs`` still current and held by no other
        transaction renewed to the database clock + ``lease``; their ids."""
        raise self._no_statement()

    def complete_and_claim_tasks(
        self,
        columns: tuple[str, ...],
        group: Sequence[ParsedReport],
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> tuple[dict[uuid.UUID, Job], list[Job]]:
        """Reports that patch the same ``columns`` applied as :meth:`complete_group`
        does, and up to ``limit`` tasks claimed as :meth:`claim_tasks` does, in one
        statement: the jobs written by id, and the tasks claimed."""
        raise self._no_statement()

    def reap_stale_runs(
        self,
        stale_after: timedelta,
        job_key: str | None,
        overlap_key: str | None,
        limit: int | None,
    ) -> int:
        """Running job runs silent for ``stale_after`` timed out; how many."""
        raise self._no_statement()

    def deletes_in_one_statement(self, candidates: QuerySet[Any]) -> bool:
        """Whether a batch of ``candidates`` is deleted by :meth:`delete_picked`."""
        return False

    def delete_picked(self, picked: QuerySet[Any]) -> list[tuple[Any, Any]]:
        """Delete the rows of ``picked`` (a locked pick of ``(order, pk)`` keys); the
        keys deleted."""
        raise self._no_statement()


def key_gate(digest: str) -> int:
    """The per-thread gate number standing in for a concurrency key: negative (threads
    are numbered from 0 up), from the digest's first 60 bits. Two keys sharing a gate
    only wait for each other."""
    return -1 - int(digest[:15], 16)


def rule_sql(connection: BaseDatabaseWrapper, text: str, now: str) -> str:
    """``text`` with ``connection``'s quoted job and queue pause tables and the clock
    ``now`` filled in."""
    quote = connection.ops.quote_name
    return text.format(
        job=quote(Job._meta.db_table),
        pauses=quote(QueuePause._meta.db_table),
        now=now,
        no_queue=NO_QUEUE,
    )


def check_instant_lookup(lookup: str) -> None:
    if lookup not in INSTANT_LOOKUPS:
        raise ValueError(f"lookup must be one of {sorted(INSTANT_LOOKUPS)}, got {lookup!r}.")


def input_path(rows: QuerySet[Job], value: dict[str, Any]) -> tuple[Value, Any, str]:
    """The JSON path of a search value (one-key objects down to a scalar), the scalar,
    and an alias name free on ``rows``. Each key is quoted, so a key of digits is a key,
    not a list index; the search refused the keys a quoted path cannot hold (a double
    quote, a backslash)."""
    keys: list[str] = []
    leaf: Any = value
    while isinstance(leaf, dict):
        key, leaf = next(iter(leaf.items()))
        keys.append(key)
    path = Value("$" + "".join(f'."{key}"' for key in keys))
    return path, leaf, f"_jobstate_input_{len(rows.query.annotations)}"
