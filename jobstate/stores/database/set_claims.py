"""Claims and reports in sets, on databases that lock rows but have no ``UPDATE ...
RETURNING`` (MariaDB, MySQL: :attr:`BackendOperations.claims_in_sets`).

A claim of one job or of ``k`` is the same few statements in one transaction, whatever
``k``:

1. one locking read of up to ``k`` candidates (``SELECT ... ORDER BY created_at, id
   LIMIT k FOR UPDATE SKIP LOCKED``) with the guards of a claim in it: the targets,
   ``run_after`` on the database clock, paused queues. It reads the whole rows and the
   database clock, so nothing needs reading back. The first read leaves the per-thread
   gate's subquery out (planning it took a good part of the read, and most jobs
   have no thread) and keeps the oldest job of each thread it brings; once a thread
   was found blocked, the further reads carry the gate;
2. for the candidates that belong to a thread, the threads' gate locks taken without
   waiting, then the gate read again under them by one statement (a snapshot read
   before the lock can miss a sibling claimed a moment earlier); a candidate whose
   thread is held elsewhere or blocked is passed over and another read fills its place;
3. one ``UPDATE ... WHERE id IN (...) AND status = 'queued'`` that moves them all, each
   with its own claim token, the claim instants and the lease from the clock read in
   step 1.

The rows stay locked from step 1 to the commit, so the ``UPDATE`` moves every row it
names; should it move fewer, the rows are read back and only those that carry this
claim's token are handed out. Task claims take the same path with their own candidates
and order. A batch of reports is one fenced locking read, one ``UPDATE`` per shape of
patch (the values of each row given by ``CASE id``), and one read of the rows back; a
single report is the fenced ``UPDATE`` and its row read back.

What each statement is for, and why nothing more is sent: the transaction is a
``COMMIT`` and a ``START TRANSACTION`` sent with its first statement
(:meth:`BackendOperations.short_transaction`), not Django's autocommit switches; the
locking read is what hands each row to one claimer;
the ``UPDATE`` is the write; no row is read back after a claim, because the tokens are
made here and the instants come from the read's clock; a report's rows are read back
inside its transaction, while its locks hold, so the job handed back is the one the
report wrote (there is no ``RETURNING`` to do it in the ``UPDATE``; a single report
sends the ``UPDATE`` and the read in one text where the backend can). Where the backend
can, the statements are SQL text rather than querysets (:mod:`.backends.mysql`): they
run on every job, and building a queryset cost more than sending the statement.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import OperationalError, connections
from django.db.models import Exists
from django.db.models.functions import Now

from jobstate.core.states import CLAIMED_JOB_STATUSES, JobStatus, task_claim_token
from jobstate.models import Job, JobQuerySet, thread_blockers
from jobstate.stores.contracts.primitives import Settled
from jobstate.stores.contracts.validation import CLEARED_CLAIM, ParsedReport
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.tables import job_rows

__all__ = ["claim", "claim_tasks", "complete_batch", "complete_one"]

#: The annotation that carries the database clock on a locked task.
_CLOCK = "jobstate_clock"


def claim(
    using: str, scope: list[str], owner: str, lease: timedelta, status: JobStatus, limit: int
) -> list[Job]:
    """Claim up to ``limit`` ready jobs of ``scope`` that pass the per-thread gate, each
    moved to ``status``; at most one job of a thread. Oldest first. A claim that lost a
    deadlock was rolled back whole and runs again (``claim_rounds``), unless it ran
    inside the caller's transaction, which the rollback took too."""
    ops = database_ops(using)
    connection = connections[using]
    own = not connection.in_atomic_block and connection.get_autocommit()
    rounds = ops.claim_rounds if own else 1
    for _ in range(rounds - 1):
        try:
            return _claim_once(using, scope, owner, lease, status, limit)
        except OperationalError as exc:
            if not ops.deadlocked(exc):
                raise
    return _claim_once(using, scope, owner, lease, status, limit)


def _claim_once(
    using: str, scope: list[str], owner: str, lease: timedelta, status: JobStatus, limit: int
) -> list[Job]:
    ops = database_ops(using)
    taken: list[Job] = []
    clocks: list[datetime] = []
    passed_threads: set[int] = set()
    # The first read is without the gate's subquery (step 1 of the module's text);
    # without row locks, though, the gate in the read is the only one.
    gated = not ops.locks_rows
    with ops.short_transaction():
        # Each round either fills the batch, finds nothing more, or rules out at least
        # one more thread, so the loop ends. Rows this transaction holds are not skipped
        # by its own locking read, so a later round leaves out the ones taken.
        while len(taken) < limit:
            read = ops.claim_candidates(
                scope, limit - len(taken), [job.id for job in taken], passed_threads, gated=gated
            )
            picked, picked_clocks = _oldest_of_each_thread(read)
            clocks += picked_clocks
            passed = _failing_the_gate(using, picked) if ops.locks_rows else set()
            taken += [job for job in picked if job.thread_id not in passed]
            if not passed:
                break
            passed_threads |= passed
            gated = True
        if not taken:
            return []
        fixed: dict[str, Any] = {
            "status": status,
            "executor_id": owner,
            "dispatched_at": None,
            "run_after": None,
        }
        dispatched = status == JobStatus.DISPATCHED
        return _move(using, taken, max(clocks), fixed, lease, dispatched=dispatched, attempt=False)


def claim_tasks(
    using: str,
    candidates: JobQuerySet,
    owner: str,
    lease: timedelta,
    limit: int,
    claim_round: uuid.UUID,
) -> list[Job]:
    """Claim up to ``limit`` of ``candidates`` (due tasks, in task claim order): each
    becomes running for ``owner`` with one more attempt and its token of
    ``claim_round``; ``run_after`` is kept."""
    ops = database_ops(using)
    with ops.short_transaction():
        read = ops.lock_candidates(candidates).annotate(**{_CLOCK: Now()})[:limit]
        picked = list(read)
        if not picked:
            return []
        fixed: dict[str, Any] = {
            "status": JobStatus.RUNNING,
            "executor_id": owner,
            "dispatched_at": None,
        }
        # The claim starts an attempt: ``attempts`` counts the attempts that started.
        clock = max(getattr(job, _CLOCK) for job in picked)
        return _move(
            using, picked, clock, fixed, lease, dispatched=False, attempt=True, round_id=claim_round
        )


def _oldest_of_each_thread(read: list[tuple[Job, datetime]]) -> tuple[list[Job], list[datetime]]:
    """The jobs of a read (oldest first) and their clocks, keeping only the first job of
    each thread: a read without the gate can bring a thread's younger jobs, which its
    oldest blocks."""
    seen: set[int] = set()
    jobs: list[Job] = []
    clocks: list[datetime] = []
    for job, clock in read:
        if job.thread_id is not None:
            if job.thread_id in seen:
                continue
            seen.add(job.thread_id)
        jobs.append(job)
        clocks.append(clock)
    return jobs, clocks


def _failing_the_gate(using: str, picked: list[Job]) -> set[int]:
    """The threads of ``picked`` whose job may not be claimed: another transaction
    holds the thread's gate, or, read again under the gate's lock, a sibling blocks the
    job (running or dispatched, or ready and ahead of it)."""
    threads = {job.thread_id for job in picked if job.thread_id is not None}
    if not threads:
        return set()
    held = database_ops(using).try_lock_threads(threads)
    passed = threads - held
    if held:
        rows = job_rows(using).filter(id__in=[job.id for job in picked if job.thread_id in held])
        blocked = rows.filter(Exists(thread_blockers())).values_list("thread_id", flat=True)
        passed.update(thread_id for thread_id in blocked if thread_id is not None)
    return passed


def _move(
    using: str,
    taken: list[Job],
    clock: datetime,
    fixed: dict[str, Any],
    lease: timedelta,
    *,
    dispatched: bool,
    attempt: bool,
    round_id: uuid.UUID | None = None,
) -> list[Job]:
    """One ``UPDATE`` of the locked ``taken`` rows to ``fixed``, each with a fresh claim
    token, the claim instants and the lease from ``clock`` (the latest clock read), and
    with ``attempt`` one more attempt; the rows as written. The tokens are made here (a
    task claim's are those of its round, ``round_id``) and the instants come from the
    clock the locking read returned, so every value written is known without reading
    the rows back."""
    tokens = {
        job.id: uuid.uuid4() if round_id is None else task_claim_token(round_id, job.id)
        for job in taken
    }
    stamps: dict[str, Any] = {
        "claimed_at": clock,
        "lease_until": clock + lease,
        "updated_at": clock,
    }
    if dispatched:
        stamps["dispatched_at"] = clock
    moved = database_ops(using).update_jobs(
        list(tokens),
        {**fixed, **stamps},
        {"claim_token": tokens},
        statuses=[JobStatus.QUEUED],
        attempt=attempt,
    )
    if moved != len(taken):
        # Only a row another transaction could write despite the lock; what this claim
        # wrote is what carries its tokens.
        written = job_rows(using).filter(id__in=list(tokens))
        return [job for job in written if job.claim_token == tokens[job.id]]
    for job in taken:
        job.__dict__.pop(_CLOCK, None)
        for name, value in {**fixed, **stamps}.items():
            setattr(job, name, value)
        job.claim_token = tokens[job.id]
        if attempt:
            job.attempts += 1
    return taken


# --- reports ---------------------------------------------------------------------------


def complete_one(
    using: str, pk: uuid.UUID, token: uuid.UUID, status: JobStatus, cleaned: dict[str, Any]
) -> Settled:
    """Apply one fenced report: the ``UPDATE`` fenced by the claim token (its matched
    row count says whether the report applied), and the row read back in the same
    transaction, while the ``UPDATE`` still holds its lock: the job as this report left
    it."""
    ops = database_ops(using)
    with ops.short_transaction():
        moved, job = ops.update_and_read(
            pk,
            {**cleaned, **CLEARED_CLAIM, "status": status},
            statuses=CLAIMED_JOB_STATUSES,
            token=token,
            stamped=["updated_at"],
        )
        return moved > 0, job


def complete_batch(using: str, parsed: list[ParsedReport]) -> list[Settled]:
    """Apply many fenced reports: the claims still current are locked by one read
    (id and claim token per report, the job running or dispatched), each shape of patch
    is one ``UPDATE`` of those rows, and every reported row is read back once, under
    the locks (the jobs as these reports left them). One answer per report, in the
    order given."""
    ops = database_ops(using)
    ids = [pk for pk, *_ in parsed]
    with ops.short_transaction():
        current = ops.lock_claims([(pk, token) for pk, token, *_ in parsed])
        shapes: dict[tuple[str, ...], list[ParsedReport]] = {}
        for report in parsed:
            if report[0] in current:
                shapes.setdefault(tuple(sorted(report[3])), []).append(report)
        for columns, group in shapes.items():
            per_row: dict[str, dict[uuid.UUID, Any]] = {
                "status": {pk: status for pk, _token, status, _c in group}
            }
            for name in columns:
                per_row[name] = {pk: cleaned[name] for pk, _token, _s, cleaned in group}
            ops.update_jobs(
                [report[0] for report in group],
                dict(CLEARED_CLAIM),
                per_row,
                statuses=CLAIMED_JOB_STATUSES,
                stamped=["updated_at"],
            )
        rows = ops.jobs_by_id(ids)
    return [(pk in current, rows.get(pk)) for pk in ids]
