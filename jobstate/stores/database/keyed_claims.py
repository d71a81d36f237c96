"""Claims of the tasks under a concurrency key (``policy(concurrency_key=...)``): at most
the key's limit of its tasks run at once, across every worker.

The other task claims leave these tasks out (``concurrency_digest IS NULL`` is part of
their condition). Here each candidate, in claim order and locked with ``SKIP LOCKED``,
is taken only under its key's gate (a transaction-scoped advisory lock on PostgreSQL, a
gate row on MariaDB and MySQL; SQLite's ``IMMEDIATE`` transactions serialise writers
already), and only if a fresh statement under that gate counts fewer of the key's jobs
running than the candidate's limit. Every claim of the key holds the gate until it
commits, and the count is read after the gate is taken (READ COMMITTED gives each
statement its own snapshot), so it sees every claim of the key that committed before:
no count can miss a running job. The count reads the key's part of the concurrency
index, at most the limit's worth of running rows, never the whole running set.

Nothing is counted up or down: a job stops counting when it stops running, however it
stops (report, cancel, or a lease that ran out and was recovered), so no slot leaks.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

from django.db import connections

from jobstate.core.states import JobStatus
from jobstate.models import Job, JobQuerySet
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.backends.shapes import kept
from jobstate.stores.database.tables import job_rows
from jobstate.stores.database.task_queue import attempt_started

__all__ = ["claim_keyed_tasks"]


def claim_keyed_tasks(
    using: str,
    target: str,
    queues: list[str] | None,
    owner: str,
    lease: timedelta,
    limit: int,
    claim_round: uuid.UUID,
) -> list[Job]:
    """Claim up to ``limit`` due tasks of ``target`` under a concurrency key, each while
    fewer than its limit of its key's jobs run."""
    # Most rounds find no keyed task at all: one plain read says so, where the
    # transaction below costs three round trips (and a writer's lock on SQLite). A task
    # enqueued just after it waits for the next claim, as one enqueued just after the
    # transaction would.
    if not _any_due(using, target, queues):
        return []
    ops = database_ops(using)
    candidates = _candidates(using, target, queues)
    passed: set[str] = set()
    claimed: list[uuid.UUID] = []
    with ops.short_transaction():
        # Each round claims one task or rules out one more key, so the loop ends.
        while len(claimed) < limit:
            rest = candidates.exclude(concurrency_digest__in=passed) if passed else candidates
            picked = (
                ops.lock_candidates(rest.in_task_claim_order())
                .values_list("id", "concurrency_digest", "concurrency_limit")
                .first()
            )
            if picked is None:
                break
            pk, digest, most = picked[0], str(picked[1]), picked[2]
            if not ops.try_lock_key(digest) or _running(using, target, digest) >= (most or 1):
                # Another claim holds the key's gate (what it claims counts against the
                # key anyway), or the key is at its limit: its other tasks wait too.
                passed.add(digest)
                continue
            moved = (
                job_rows(using)
                .filter(id=pk, status=JobStatus.QUEUED)
                .update(**attempt_started(owner, lease, claim_round, pk))
            )
            if moved:
                claimed.append(pk)
            else:
                passed.add(digest)
        return list(job_rows(using).filter(id__in=claimed)) if claimed else []


def _candidates(using: str, target: str, queues: list[str] | None) -> JobQuerySet:
    candidates = job_rows(using).due_tasks(target, keyed=True).unpaused()
    return candidates if queues is None else candidates.filter(queue_name__in=queues)


#: The probe's SQL and parameters per database, target and queues (see
#: :func:`_any_due`).
_PROBES: dict[tuple[str, str, tuple[str, ...] | None], tuple[str, tuple[Any, ...]]] = {}


def _any_due(using: str, target: str, queues: list[str] | None) -> bool:
    """Whether a keyed task of ``target`` is due. Every worker asks once a second,
    busy or idle, so its SQL is compiled once per shape and kept: building the
    queryset each time cost an idle worker most of its CPU."""
    if queues is not None and not queues:
        return False  # Django compiles no statement for "in no queue".
    connection = connections[using]
    shape = (using, target, None if queues is None else tuple(queues))
    sql, params = kept(_PROBES, shape, _probe, using, target, queues)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


def _probe(using: str, target: str, queues: list[str] | None) -> tuple[str, tuple[Any, ...]]:
    query = _candidates(using, target, queues).values_list("id", flat=True)[:1].query
    sql, params = query.get_compiler(using).as_sql()
    return sql, tuple(params)


def _running(using: str, target: str, digest: str) -> int:
    return (
        job_rows(using)
        .filter(concurrency_digest=digest, status=JobStatus.RUNNING, target=target)
        .count()
    )
