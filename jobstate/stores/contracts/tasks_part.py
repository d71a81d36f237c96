"""The state store's django.tasks capability (``supports_tasks``): enqueueing a task as a
job, claiming tasks in priority order, and recovering the tasks of workers that died.

A task is a job whose target is ``tasks:<backend alias>`` and whose ``task_path``,
``queue_name``, ``priority``, ``max_attempts`` and ``attempt_log`` say what it is and how
its attempts went (:mod:`jobstate.core.attempt_log`). Claims, fenced reports, lease renewal and
the audit ledger are the job queue's own; what is here is what tasks add: their claim
order, their attempt count and the recovery that records a lost attempt.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from django.utils import timezone

from jobstate.core.attempt_log import (
    AttemptOutcome,
    TaskAttempt,
    refused_settlement,
    settle_attempt,
)
from jobstate.core.conf import jobstate_settings
from jobstate.core.states import (
    TASK_TARGET_PREFIX,
    ClaimReport,
    JobStatus,
    NewTask,
    TaskRecovery,
    task_claim_token,
)
from jobstate.exceptions import InvalidJobState, InvalidPatch, InvalidPayload, WorkerLost
from jobstate.stores.contracts.audit import AuditSeverity
from jobstate.stores.contracts.ledger_part import LedgerPart
from jobstate.stores.contracts.queue_part import CompletionResult, completion_result
from jobstate.stores.contracts.validation import (
    JOB_REPORT_FIELDS,
    clean_job_fields,
    column_limit,
    parse_batch_limit,
    parse_claim_reports,
    parse_limit,
    require_text,
    resolve_lease,
    task_job_fields,
)

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = ["LOST_WORKER_MESSAGE", "TasksPart", "task_claim_order"]

#: What a lost attempt's error says.
LOST_WORKER_MESSAGE = (
    "the worker running this attempt stopped renewing its lease (it was killed, hung or "
    "lost its database), so the attempt was recovered; the task may have run partly"
)

_WORKER_LOST_PATH = f"{WorkerLost.__module__}.{WorkerLost.__qualname__}"


def task_claim_order(job: Job) -> tuple[int, object, object, object]:
    """The order tasks are claimed in: higher ``priority`` first, then the instant each
    became due (its ``run_after``, or when it was enqueued), then enqueue order."""
    due = job.run_after if job.run_after is not None else job.created_at
    return (-job.priority, due, job.created_at, job.id)


class TasksPart(LedgerPart):
    """The task methods of :class:`~jobstate.stores.contracts.state_store.StateStore`; see
    the module docstring."""

    def enqueue_task(self, task: NewTask) -> Job:
        """Queue ``task`` as a job and return it as stored: ``queued`` (due at
        ``run_after``, or at once), ``attempts`` 0, an empty attempt log, ``input`` =
        ``{"args": ..., "kwargs": ...}``. Runs in the caller's transaction when there is
        one, so a task enqueued in a transaction that rolls back never existed. On
        PostgreSQL the database store also sends ``NOTIFY`` (delivered at commit) so
        idle workers wake at once, unless ``JOBSTATE['LISTEN_NOTIFY']`` is False."""
        self._require(self.supports_tasks, "supports_tasks", "enqueue_task")
        return self._enqueue_task(task_job_fields(task))

    def claim_tasks(
        self,
        *,
        target: str,
        queues: Sequence[str] | None,
        worker_id: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` ready queued tasks of ``target`` (``tasks:<alias>``) in
        ``queues`` (``None``: any queue) for the in-process worker ``worker_id``, in
        claim order (:func:`task_claim_order`): higher priority first, then the instant
        each became due, then enqueue order. Tasks whose ``run_after`` is in the future
        wait.

        Each claimed task becomes ``running`` with ``executor_id = worker_id``,
        ``claimed_at`` = the store's clock, ``lease_until`` = clock + ``lease``, a
        ``claim_token`` of its own, and ``attempts`` one higher (the claim starts an
        attempt); ``run_after`` is kept. No task is claimed by two callers. Returns them
        in claim order; ``[]`` when none is ready or ``queues`` is empty.

        Each task's token is :func:`~jobstate.core.states.task_claim_token` of
        ``claim_round`` (a UUID the caller picks afresh for each claim; by default one
        of the store's) and the task's id: a caller whose reply was lost gives back
        what the claim took with :meth:`release_task_claim`."""
        self._require(self.supports_tasks, "supports_tasks", "claim_tasks")
        scope, owner, duration, count = _claim_arguments(target, queues, worker_id, lease, limit)
        round_id = _claim_round(claim_round)
        if scope == []:
            return []
        return sorted(
            self._claim_tasks(target, scope, owner, duration, count, round_id),
            key=task_claim_order,
        )

    def claim_keyed_tasks(
        self,
        *,
        target: str,
        queues: Sequence[str] | None,
        worker_id: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID | None = None,
    ) -> list[Job]:
        """Claim, as :meth:`claim_tasks` does, up to ``limit`` due tasks that run under a
        concurrency key (``jobstate.tasks.policy(concurrency_key=...)``), which
        :meth:`claim_tasks` and :meth:`complete_and_claim_tasks` leave out: each is
        claimed only while fewer than its ``concurrency_limit`` of the tasks of its key
        (on ``target``) are running, whoever claims them at once. A task stops counting
        when it stops running, however it stops (reported, cancelled, or recovered after
        its lease ran out), so a crashed worker's tasks free their key when recovered."""
        self._require(self.supports_tasks, "supports_tasks", "claim_keyed_tasks")
        scope, owner, duration, count = _claim_arguments(target, queues, worker_id, lease, limit)
        round_id = _claim_round(claim_round)
        if scope == []:
            return []
        return sorted(
            self._claim_keyed_tasks(target, scope, owner, duration, count, round_id),
            key=task_claim_order,
        )

    def complete_and_claim_tasks(
        self,
        reports: Sequence[ClaimReport],
        *,
        target: str,
        queues: Sequence[str] | None,
        worker_id: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID | None = None,
    ) -> tuple[list[CompletionResult], list[Job]]:
        """A worker's round: apply ``reports`` exactly as :meth:`complete_claimed_jobs`
        (each fenced by its own claim token; a stale one writes nothing), then claim up
        to ``limit`` tasks exactly as :meth:`claim_tasks`. Returns the results, one per
        report in the order given, and the tasks claimed, in claim order.

        Every argument is checked before anything is written: a bad report or a bad
        claim argument raises and neither writes nor claims. A task one of ``reports``
        puts back in its queue may or may not be claimed by the same call. The two
        steps need not be one unit of work: a store may write the reports and then fail
        to claim. The database store does both in one statement on PostgreSQL, where
        either both happen or neither does; elsewhere it makes the two calls."""
        self._require(self.supports_tasks, "supports_tasks", "complete_and_claim_tasks")
        self._require(
            self.supports_batch_claims, "supports_batch_claims", "complete_and_claim_tasks"
        )
        parsed = parse_claim_reports(reports)
        scope, owner, duration, count = _claim_arguments(target, queues, worker_id, lease, limit)
        settled, claimed = self._complete_and_claim_tasks(
            parsed, target, scope, owner, duration, count, _claim_round(claim_round)
        )
        results = [completion_result(*answer) for answer in settled]
        return results, sorted(claimed, key=task_claim_order)

    def release_task_claim(self, *, worker_id: str, claim_round: uuid.UUID) -> int:
        """Give back, uncounted, the tasks that the claim ``claim_round`` of
        ``worker_id`` took and that it still holds: each goes back to ``queued`` as it
        was before the claim (its attempt count one lower, its claim cleared, due as
        it was). For a worker whose claim reply was lost with its connection: it never
        learnt which tasks the claim took, if it took any, and they would otherwise
        wait for their leases to run out and be recovered as lost attempts though
        they never started. Fenced by each task's claim token, so a task reported,
        recovered or claimed again meanwhile is left alone. Returns how many were
        given back (0 when the claim never committed)."""
        self._require(self.supports_tasks, "supports_tasks", "release_task_claim")
        owner = require_text(worker_id, field="worker_id")
        if claim_round is None:
            raise InvalidJobState("claim_round must be the uuid.UUID the claim was made with.")
        round_id = _claim_round(claim_round)
        reports = [
            ClaimReport(job.id, token, JobStatus.QUEUED, {"attempts": max(job.attempts - 1, 0)})
            for job in self._list_claimed_tasks(owner)
            if job.claim_token == (token := task_claim_token(round_id, job.id))
        ]
        if not reports:
            return 0
        settled = self._complete_claimed_batch(parse_claim_reports(reports))
        return sum(1 for applied, _job in settled if applied)

    def recover_expired_tasks(self, *, limit: int | None = None) -> TaskRecovery:
        """Recover up to ``limit`` (default ``JOBSTATE['SWEEP_BATCH_SIZE']``) running
        tasks whose lease ran out: their worker died, hung or lost its database.

        The lost attempt was counted when it was claimed; it is recorded in the attempt
        log with a :class:`~jobstate.exceptions.WorkerLost` error, ended when it was
        found lost (the recovering process's clock). While ``attempts`` is
        below ``max_attempts`` the task goes back to ``queued``, due at once; otherwise
        it is ``error``. Each recovery is its own unit of work, fenced by the lost
        claim's token with the job held and its lease re-checked, so a worker that
        renews or reports at that moment either wins (nothing recovered) or finds its
        claim gone; concurrent recoveries recover a task once. A ``recovered`` audit
        entry is written with each."""
        self._require(self.supports_tasks, "supports_tasks", "recover_expired_tasks")
        count = parse_limit(limit, default=jobstate_settings.SWEEP_BATCH_SIZE)
        requeued = failed = 0
        for candidate in self._list_expired_tasks(count):
            status = self._recover_task(candidate)
            if status is None:
                continue
            if status == "queued":
                requeued += 1
            else:
                failed += 1
        return TaskRecovery(requeued=requeued, failed=failed)

    def count_expired_tasks(self, *, limit: int | None = None) -> TaskRecovery:
        """What :meth:`recover_expired_tasks` would do now with at most ``limit`` tasks
        (``None``: no cap), writing nothing (a sweep's dry run)."""
        self._require(self.supports_tasks, "supports_tasks", "count_expired_tasks")
        count = parse_limit(limit, default=2**63 - 1)
        candidates = self._list_expired_tasks(count)
        failing = sum(1 for job in candidates if job.attempts >= (job.max_attempts or 1))
        return TaskRecovery(requeued=len(candidates) - failing, failed=failing)

    def _recover_task(self, candidate: Job) -> str | None:
        """Recover one expired task; its new status, or ``None`` when it no longer
        needed recovering."""
        with self._atomic():
            job = self._lock_job(candidate.pk, lease_ended=True)
            if (
                job is None
                or job.task_path is None
                or job.claim_token is None
                or job.claim_token != candidate.claim_token
            ):
                return None
            worker = job.executor_id or "unknown"
            attempt = TaskAttempt(
                worker_id=worker,
                started_at=job.claimed_at,
                # When it was found lost: this process's clock, as a worker records the
                # end of the attempts it ran itself.
                finished_at=timezone.now(),
                outcome=AttemptOutcome.WORKER_LOST,
                exception_class_path=_WORKER_LOST_PATH,
                traceback=f"{_WORKER_LOST_PATH}: {LOST_WORKER_MESSAGE}\n",
                message=LOST_WORKER_MESSAGE,
            )
            settlement = settle_attempt(
                attempt_log=job.attempt_log,
                attempts=job.attempts,
                max_attempts=job.max_attempts,
                attempt=attempt,
            )
            try:
                cleaned = clean_job_fields(
                    settlement.patch, allowed=JOB_REPORT_FIELDS, action="recover_expired_tasks"
                )
                applied, stored = self._complete_claimed(
                    job.pk, job.claim_token, settlement.status, cleaned
                )
            # The log is bounded and its text storable, so only a store that checks more
            # (before it writes) gets here: the task fails, naming the refusal, and the
            # sweep goes on with the others.
            except (InvalidPatch, InvalidPayload) as exc:
                _record, settlement = refused_settlement(
                    attempt_log=job.attempt_log, attempt=attempt, refusal=exc, what="recovery"
                )
                cleaned = clean_job_fields(
                    settlement.patch, allowed=JOB_REPORT_FIELDS, action="recover_expired_tasks"
                )
                applied, stored = self._complete_claimed(
                    job.pk, job.claim_token, settlement.status, cleaned
                )
            if not applied:
                return None
            self.append_audit(
                job=stored or job,
                event="recovered",
                severity=AuditSeverity.WARNING if settlement.retrying else AuditSeverity.ERROR,
                title="Requeued: worker lost" if settlement.retrying else "Failed: worker lost",
                detail={
                    "via": "task-lease-expired",
                    "worker": worker,
                    "task": job.task_path,
                    "attempt": job.attempts,
                    "max_attempts": job.max_attempts,
                    "prev_status": job.status,
                    "status": settlement.status.value,
                },
            )
            return settlement.status.value


def _claim_arguments(
    target: str, queues: Sequence[str] | None, worker_id: str, lease: timedelta, limit: int
) -> tuple[list[str] | None, str, timedelta, int]:
    """A task claim's arguments checked: the queue scope, owner, lease and limit."""
    require_text(target, field="target")
    if not target.startswith(TASK_TARGET_PREFIX):
        raise InvalidJobState(f"target must start with {TASK_TARGET_PREFIX!r}, got {target!r}.")
    scope = None if queues is None else _queue_scope(queues)
    owner = require_text(worker_id, field="worker_id")
    duration = resolve_lease(lease, jobstate_settings.WORKER_LEASE)
    return scope, owner, duration, parse_batch_limit(limit)


def _claim_round(claim_round: uuid.UUID | None) -> uuid.UUID:
    """A claim's round: the caller's, or a fresh one."""
    if claim_round is None:
        return uuid.uuid4()
    if not isinstance(claim_round, uuid.UUID):
        raise InvalidJobState(f"claim_round must be a uuid.UUID or None, got {claim_round!r}.")
    return claim_round


def _queue_scope(queues: Sequence[str]) -> list[str]:
    # A worker claims from the same tuple of queues on every round: checked once.
    if type(queues) is tuple:
        try:
            return list(_CHECKED_QUEUES[queues])
        except (KeyError, TypeError):  # not checked yet; a name that is no str
            pass
    if type(queues) is not list and (isinstance(queues, str) or not isinstance(queues, Sequence)):
        raise InvalidJobState(f"queues must be a list of queue names or None, got {queues!r}.")
    longest = column_limit("Job", "queue_name")
    scope = [
        require_text(name, field="queue name", max_length=longest) for name in dict.fromkeys(queues)
    ]
    if type(queues) is tuple and len(_CHECKED_QUEUES) < 64:
        _CHECKED_QUEUES[queues] = tuple(scope)
    return scope


#: Tuples of queue names checked by :func:`_queue_scope`, with the scope of each.
_CHECKED_QUEUES: dict[tuple[str, ...], tuple[str, ...]] = {}
