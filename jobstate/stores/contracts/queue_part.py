"""The job queue, the part of the state store every backend has: intake, updates,
claims, fenced reports, leases and the conditional maintenance of the queue.

Each method checks its arguments once and calls the primitives of
:class:`~jobstate.stores.contracts.primitives.StateStorePrimitives` with clean values.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import ClaimReport, CompletionOutcome, JobId, JobStatus
from jobstate.stores.contracts.claimer_presence import claimer_beats, claimer_fields
from jobstate.stores.contracts.primitives import Settled, StateStorePrimitives
from jobstate.stores.contracts.validation import (
    ENQUEUE_PAYLOAD_FIELDS,
    JOB_CREATE_FIELDS,
    JOB_ENQUEUE_FIELDS,
    JOB_PATCH_FIELDS,
    JOB_REPORT_FIELDS,
    check_same_request,
    clean_job_fields,
    parse_batch_limit,
    parse_claim_pairs,
    parse_claim_reports,
    parse_claim_targets,
    parse_limit,
    parse_statuses,
    parse_targets,
    parse_thread_id,
    parse_uuid,
    require_text,
    required_request_id,
    resolve_lease,
    validate_duration,
    validate_release_status,
)

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = ["REPORTS_PER_STATEMENT", "CompletionResult", "JobQueuePart", "completion_result"]

#: The most reports :meth:`JobQueuePart.complete_claimed_jobs` hands a store at once. A
#: statement takes at most 65,535 parameters on PostgreSQL and MySQL (32,766 on older
#: SQLite) and a report up to 22 (its id, token, status and each patched field): more
#: reports in one call are applied in turns, each fenced on its own as always.
REPORTS_PER_STATEMENT = 1000


@dataclass(frozen=True)
class CompletionResult:
    """The outcome of a fenced report and the job as stored afterwards (``None`` only
    for ``NOT_FOUND``)."""

    outcome: CompletionOutcome
    job: Job | None

    @property
    def completed(self) -> bool:
        return self.outcome is CompletionOutcome.COMPLETED


class JobQueuePart(StateStorePrimitives):
    """The job queue; see
    :class:`~jobstate.stores.contracts.state_store.StateStore` for the guarantees."""

    # --- jobs ------------------------------------------------------------------------

    def find_by_request_id(self, request_id: str) -> Job | None:
        """The job with that ``request_id``, or ``None``."""
        return self._find_by_request_id(require_text(request_id, field="request_id"))

    def get_job(self, job_id: JobId) -> Job | None:
        """The job with that id, or ``None``. A malformed id raises ``InvalidJobState``."""
        return self._get_job(parse_uuid(job_id, field="job_id"))

    def create_job(self, **fields: Any) -> Job:
        """Insert a job and return it as stored. ``request_id`` is required; the other
        fields come from :data:`JOB_PATCH_FIELDS` (``status`` defaults to queued). An
        existing ``request_id`` raises :class:`~jobstate.exceptions.DuplicateRequestId`
        and writes nothing."""
        cleaned = clean_job_fields(fields, allowed=JOB_CREATE_FIELDS, action="create_job")
        required_request_id(cleaned, action="create_job")
        return self._create_job(cleaned)

    def enqueue(self, **fields: Any) -> tuple[Job, bool]:
        """Queue a new job, idempotently by ``request_id``: return ``(job, True)`` when it
        was created, ``(existing, False)`` when the same request (see
        :data:`ENQUEUE_PAYLOAD_FIELDS`) was queued before, and raise
        :class:`~jobstate.exceptions.IdempotencyConflict` for a different payload under the
        same ``request_id``. A new job in a thread that already has
        ``JOBSTATE['THREAD_INFLIGHT_QUOTA']`` in-flight jobs raises
        :class:`~jobstate.exceptions.ThreadQuotaExceeded`. Accepts :data:`ENQUEUE_FIELDS`."""
        cleaned = clean_job_fields(fields, allowed=JOB_ENQUEUE_FIELDS, action="enqueue")
        required_request_id(cleaned, action="enqueue")
        job, created = self._enqueue_job(cleaned, jobstate_settings.THREAD_INFLIGHT_QUOTA)
        if not created:
            stored = {name: getattr(job, name) for name in ENQUEUE_PAYLOAD_FIELDS}
            check_same_request(job.request_id, stored, cleaned)
        return job, created

    def update_job(self, job_id: JobId, **patch: Any) -> Job | None:
        """Write ``patch`` (see :func:`clean_job_fields`) and ``updated_at``; return the job
        re-read, or ``None`` when no job has that id."""
        pk = parse_uuid(job_id, field="job_id")
        cleaned = clean_job_fields(patch, allowed=JOB_PATCH_FIELDS, action="update_job")
        return self._update_job(pk, cleaned, None)

    def update_job_if_status(
        self, job_id: JobId, expected_statuses: Iterable[str], **patch: Any
    ) -> Job | None:
        """Like :meth:`update_job`, but only while the job's status is one of
        ``expected_statuses`` (one atomic conditional write). ``None`` means the job is
        missing or another caller moved it on; nothing was written. An empty
        ``expected_statuses`` writes nothing and returns ``None``."""
        expected = parse_statuses(expected_statuses)
        pk = parse_uuid(job_id, field="job_id")
        cleaned = clean_job_fields(patch, allowed=JOB_PATCH_FIELDS, action="update_job_if_status")
        if not expected:
            return None
        return self._update_job(pk, cleaned, expected)

    # --- claims ----------------------------------------------------------------------

    def claim_next_job(
        self, targets: Sequence[str], executor_id: str, lease: timedelta | None = None
    ) -> Job | None:
        """Claim the oldest ready queued job of ``targets`` for a remote executor: it
        becomes ``dispatched`` with ``executor_id``, ``claimed_at`` and ``dispatched_at``
        set to the store's clock, ``lease_until`` = clock + ``lease`` (default
        ``JOBSTATE['EXECUTOR_LEASE']``), a fresh ``claim_token`` and ``run_after`` cleared.
        ``None`` when nothing is claimable or ``targets`` is empty. With a worker
        registry, the executor appears on the Workers page (:meth:`_note_claimer`)."""
        owner = require_text(executor_id, field="executor_id")
        duration = resolve_lease(lease, jobstate_settings.EXECUTOR_LEASE)
        scope = parse_claim_targets(targets)
        self._note_claimer(owner, duration)
        return self._claim(scope, owner, duration, JobStatus.DISPATCHED) if scope else None

    def claim_next_inhub_job(
        self, targets: Sequence[str], worker_id: str, lease: timedelta | None = None
    ) -> Job | None:
        """As :meth:`claim_next_job` for an in-process worker: the job becomes ``running``
        with ``executor_id = worker_id`` and no ``dispatched_at``; ``lease`` defaults to
        ``JOBSTATE['WORKER_LEASE']``."""
        owner = require_text(worker_id, field="worker_id")
        duration = resolve_lease(lease, jobstate_settings.WORKER_LEASE)
        scope = parse_claim_targets(targets)
        self._note_claimer(owner, duration)
        return self._claim(scope, owner, duration, JobStatus.RUNNING) if scope else None

    def complete_claimed_job(
        self, job_id: JobId, claim_token: uuid.UUID | str, status: str, **patch: Any
    ) -> CompletionResult:
        """Fenced report of a claim holder. ``status`` is terminal (done / error /
        rejected) or ``queued`` (give the job back, e.g. for a retry with ``run_after``
        and ``attempts`` in ``patch``). Writes only while the job is running or
        dispatched under ``claim_token``; then it clears the claim fields
        (:data:`JOB_CLAIM_FIELDS`). A stale token, or a job requeued meanwhile, writes
        nothing and answers ``STALE_CLAIM``."""
        pk = parse_uuid(job_id, field="job_id")
        token = parse_uuid(claim_token, field="claim_token")
        new_status = validate_release_status(status)
        cleaned = clean_job_fields(patch, allowed=JOB_REPORT_FIELDS, action="complete_claimed_job")
        return completion_result(*self._complete_claimed(pk, token, new_status, cleaned))

    def claim_next_inhub_jobs(
        self,
        targets: Sequence[str],
        worker_id: str,
        lease: timedelta | None = None,
        *,
        limit: int,
    ) -> list[Job]:
        """Claim up to ``limit`` ready queued jobs of ``targets`` for an in-process worker
        at once, each exactly as :meth:`claim_next_inhub_job` would (``running``, its own
        fresh ``claim_token``, the same lease). Returns them oldest first; an empty list
        when nothing is claimable or ``targets`` is empty.

        Guarantees: no job is claimed by two callers; every job returned was ready and
        passed the per-thread FIFO gate when it was claimed, and at most one job of a
        thread is in a batch (its siblings wait for it). Jobs without a thread may be
        taken ahead of an older threaded job: a store may claim the thread-less part of
        the batch in one step and the threaded part one job at a time through the gate.
        ``limit`` must be a positive int."""
        self._require(self.supports_batch_claims, "supports_batch_claims", "claim_next_inhub_jobs")
        owner = require_text(worker_id, field="worker_id")
        duration = resolve_lease(lease, jobstate_settings.WORKER_LEASE)
        count = parse_batch_limit(limit)
        scope = parse_claim_targets(targets)
        self._note_claimer(owner, duration)
        if not scope:
            return []
        claimed = self._claim_batch(scope, owner, duration, count)
        return sorted(claimed, key=lambda job: (job.created_at, job.id))

    def complete_claimed_jobs(self, reports: Sequence[ClaimReport]) -> list[CompletionResult]:
        """Apply many fenced reports (:class:`ClaimReport`) at once. Each report is
        fenced on its own exactly as :meth:`complete_claimed_job`: it writes only while
        its job is running or dispatched under its ``claim_token``, and a stale one
        writes nothing. Returns one :class:`CompletionResult` per report, in the order
        given. Every report is validated before anything is written: one bad report (or
        the same job twice) raises and writes nothing."""
        self._require(self.supports_batch_claims, "supports_batch_claims", "complete_claimed_jobs")
        parsed = parse_claim_reports(reports)
        settled: list[Settled] = []
        for start in range(0, len(parsed), REPORTS_PER_STATEMENT):
            settled.extend(
                self._complete_claimed_batch(parsed[start : start + REPORTS_PER_STATEMENT])
            )
        return [completion_result(*each) for each in settled]

    def extend_claim_lease(
        self, job_id: JobId, claim_token: uuid.UUID | str, lease: timedelta | None = None
    ) -> bool:
        """Move one claimed job's ``lease_until`` to the store's clock + ``lease``
        (default: the worker or executor lease for its status) while ``claim_token`` is
        current. ``False`` means the claim is gone and nothing was written."""
        pk = parse_uuid(job_id, field="job_id")
        token = parse_uuid(claim_token, field="claim_token")
        if lease is not None:
            lease = validate_duration(lease, field="lease", allow_zero=False)
        return self._extend_claim_lease(pk, token, lease)

    def extend_claim_leases(
        self, claims: Sequence[tuple[JobId, uuid.UUID | str]], lease: timedelta
    ) -> list[uuid.UUID]:
        """Renew many claims at once: each ``(job id, claim token)`` whose token is still
        its job's current claim gets ``lease_until`` = the store's clock + ``lease``.
        Returns the ids of the jobs renewed; a claim that is gone (requeued, recovered,
        finished) is left out and nothing is written for it, and so may be one whose
        row another transaction holds at that moment: it is passed over, not waited
        for. A worker calls this once per beat for every task it holds. Every pair is
        validated before anything is written; the same job twice raises."""
        self._require(self.supports_batch_claims, "supports_batch_claims", "extend_claim_leases")
        duration = validate_duration(lease, field="lease", allow_zero=False)
        parsed = parse_claim_pairs(claims)
        return self._extend_claim_leases(parsed, duration) if parsed else []

    # --- leases and maintenance ------------------------------------------------------

    def extend_executor_leases(self, executor_id: str, lease: timedelta | None = None) -> int:
        """Renew every ``dispatched`` job of ``executor_id`` to clock + ``lease`` (default
        ``JOBSTATE['EXECUTOR_LEASE']``); return how many were renewed."""
        require_text(executor_id, field="executor_id")
        duration = resolve_lease(lease, jobstate_settings.EXECUTOR_LEASE)
        self._note_claimer(executor_id, duration)
        return self._extend_executor_leases(executor_id, duration)

    def _note_claimer(self, owner: str, lease: timedelta) -> None:
        """Beat (or first register) a claiming process's row on the Workers page, at
        most once per beat of ``lease`` in this process
        (:mod:`~jobstate.stores.contracts.claimer_presence`). Written before the claim,
        so a failure here claims nothing rather than losing a claimed job."""
        if not self.supports_worker_registry:
            return
        if not claimer_beats.due(self, owner, lease):
            return
        if not self._beat_worker(owner):
            self._register_worker(claimer_fields(owner, lease))

    def requeue_stale_dispatched(
        self,
        dead_after: timedelta | None = None,
        hard_cap: timedelta | None = None,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> int:
        """Move up to ``limit`` (default ``JOBSTATE['SWEEP_BATCH_SIZE']``) ``dispatched``
        jobs back to ``queued`` with their claim fields cleared when their lease has
        expired, when they have no lease and were last written more than ``dead_after``
        ago, or when they were dispatched more than ``hard_cap`` ago (defaults:
        ``EXECUTOR_DEAD_AFTER``, ``EXECUTOR_HARD_CAP``), oldest lease first. Each job
        moved gets a ``recovered`` audit entry naming the executor that lost it.
        ``targets`` narrows the sweep. Returns the jobs this call moved; the ``dispatched``
        maintenance sweep calls it batch after batch."""
        dead = validate_duration(
            jobstate_settings.EXECUTOR_DEAD_AFTER if dead_after is None else dead_after,
            field="dead_after",
        )
        cap = validate_duration(
            jobstate_settings.EXECUTOR_HARD_CAP if hard_cap is None else hard_cap,
            field="hard_cap",
        )
        scope = parse_targets(targets)
        count = parse_limit(limit, default=jobstate_settings.SWEEP_BATCH_SIZE)
        return 0 if scope == [] else self._requeue_stale_dispatched(dead, cap, scope, count)

    def list_expired_leases(
        self,
        statuses: Iterable[str],
        fallback_older_than: timedelta,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs in ``statuses`` whose lease has expired, or that have no lease and were
        last written more than ``fallback_older_than`` ago; oldest first, at most ``limit``
        (default ``JOBSTATE['LIST_LIMIT']``). Empty ``statuses`` -> ``[]``."""
        wanted = parse_statuses(statuses)
        validate_duration(fallback_older_than, field="fallback_older_than")
        scope = parse_targets(targets)
        count = parse_limit(limit, default=jobstate_settings.LIST_LIMIT)
        if not wanted or scope == []:
            return []
        return self._list_expired_leases(wanted, fallback_older_than, scope, count)

    def list_jobs_by_status(
        self,
        statuses: Iterable[str],
        older_than: timedelta | None = None,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs in ``statuses`` (last written more than ``older_than`` ago when given),
        oldest first, at most ``limit`` (default ``JOBSTATE['LIST_LIMIT']``). Empty
        ``statuses`` -> ``[]``."""
        wanted = parse_statuses(statuses)
        if older_than is not None:
            validate_duration(older_than, field="older_than")
        scope = parse_targets(targets)
        count = parse_limit(limit, default=jobstate_settings.LIST_LIMIT)
        if not wanted or scope == []:
            return []
        return self._list_jobs_by_status(wanted, older_than, scope, count)

    def expire_stale_queued(
        self, ttl: timedelta | None = None, *, targets: Sequence[str] | None = None
    ) -> int:
        """Move ``queued`` jobs created more than ``ttl`` ago (default
        ``JOBSTATE['QUEUED_TTL']``) to ``error`` with :data:`EXPIRED_QUEUED_ERROR`; a job
        claimed meanwhile is left alone. Returns the jobs this call moved."""
        duration = validate_duration(
            jobstate_settings.QUEUED_TTL if ttl is None else ttl, field="ttl"
        )
        scope = parse_targets(targets)
        return 0 if scope == [] else self._expire_stale_queued(duration, scope)

    def count_inflight_by_thread(self, thread_id: int) -> int:
        """How many jobs of the thread are queued, running or dispatched."""
        return self._count_inflight(parse_thread_id(thread_id))


def completion_result(applied: bool, job: Job | None) -> CompletionResult:
    """What a fenced report answers (a primitive's :data:`Settled`) as its result."""
    if applied:
        return CompletionResult(CompletionOutcome.COMPLETED, job)
    if job is None:
        return CompletionResult(CompletionOutcome.NOT_FOUND, None)
    return CompletionResult(CompletionOutcome.STALE_CLAIM, job)
