"""The run store's contract (JobRunStore): overlap-guarded runs of operations jobs.

The public methods are concrete: each checks its arguments once, the same way for every
store, and hands the checked values to a protected primitive that a backend implements,
the way Django's ``SessionBase`` leaves a session backend a few primitives to fill in.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobstate.core.jsonvalues import ensure_json
from jobstate.core.states import JobRunStatus, Trigger
from jobstate.exceptions import UnsupportedStoreOperation
from jobstate.stores.contracts.validation import (
    optional_key,
    require_text,
    validate_claim_arguments,
    validate_duration,
    validate_duration_ms,
    validate_error_text,
    validate_instant,
    validate_reap_limit,
    validate_run_id,
    validate_skip_reason,
    validate_terminal_status,
)

if TYPE_CHECKING:
    from jobstate.stores.contracts.sweep_store import RunSweepStore

__all__ = ["JobRunSettlement", "JobRunStore", "NewJobRun"]


@dataclass(frozen=True)
class NewJobRun:
    """A run to insert, as :meth:`JobRunStore.claim` (a RUNNING run) and
    :meth:`JobRunStore.record_skipped` (a SKIPPED run) hand it to their primitives.

    Every field has passed the contract's checks: the texts are strings a text column can
    hold (no NUL, no lone surrogate), the instants are aware and in UTC, ``input`` and
    ``summary`` survive a strict JSON round trip. A store writes the fields as they are."""

    job_key: str
    #: The key a RUNNING run holds; ``None`` for a SKIPPED run, which never holds one.
    overlap_key: str | None
    status: JobRunStatus
    trigger: Trigger
    input: Any
    summary: dict[str, Any] | None
    #: Recorded instants (S6): the runner's clock, stored verbatim.
    started_at: datetime
    finished_at: datetime | None
    duration_ms: int | None
    service_revision: str | None


@dataclass(frozen=True)
class JobRunSettlement:
    """How :meth:`JobRunStore.complete` settles a RUNNING run, checked: a terminal
    ``status``, the runner's ``finished_at`` in UTC, a non-negative 64-bit ``duration_ms``,
    and the ``summary`` (strict JSON) and ``error`` to write, where ``None`` keeps the
    stored value."""

    status: JobRunStatus
    finished_at: datetime
    duration_ms: int
    summary: dict[str, Any] | None
    error: str | None


class JobRunStore(ABC):
    """Persistence port for runs of operations jobs (the JobRunStore contract).

    Obligations every implementation keeps (checked by
    :func:`jobstate.testing.job_run_store_contract_cases`):

    - **S1 single claimer**: for one ``overlap_key`` at most one RUNNING row exists at
      any instant. ``claim`` is an atomic compare-and-set; the loser gets ``None``. Only
      the overlap uniqueness violation may become ``None``; every other error propagates.
    - **S2 monotonic heartbeat**: ``heartbeat`` moves the liveness watermark to the
      store's own clock, never backwards, and only while the row is RUNNING.
    - **S3 idempotent completion**: ``complete`` writes only on RUNNING -> terminal.
    - **S4 atomic reap**: ``reap_stale`` moves stale RUNNING rows to TIMED_OUT in one
      statement and counts only the rows this call moved; the key is free at once.
    - **S5 unique ids**: ids returned by ``claim`` and ``record_skipped`` never repeat.
    - **S6 clock split**: recorded instants (``started_at``, ``at``, ``finished_at``)
      are stored verbatim; liveness instants come from the store's clock only.
    - **S7 strict JSON**: ``input`` and ``summary`` round-trip through JSON or raise.

    A store implements the primitives ``_claim``, ``_heartbeat``, ``_complete``,
    ``_record_skipped`` and ``_reap_stale``. They receive checked values only: the public
    methods raise ``InvalidJobState`` or ``InvalidPayload`` for anything malformed before
    a primitive runs, so every store refuses the same input with the same error.
    """

    # The contract: argument checks, then the primitive.

    def claim(
        self,
        *,
        job_key: str,
        overlap_key: str,
        trigger: Trigger,
        input: Any,
        started_at: datetime,
        service_revision: str | None = None,
    ) -> str | None:
        """Atomically take ``overlap_key`` and return the new run's id, or ``None`` when
        another RUNNING row holds the key. The liveness watermark starts at the store's
        clock; ``started_at`` is stored verbatim."""
        validate_claim_arguments(
            job_key=job_key,
            # A claim takes a key; only a skipped run (record_skipped) holds none.
            overlap_key=require_text(overlap_key, field="overlap_key", max_length=None),
            trigger=trigger,
            service_revision=service_revision,
        )
        started_at = validate_instant(started_at, field="started_at")
        run = NewJobRun(
            job_key=job_key,
            overlap_key=overlap_key,
            status=JobRunStatus.RUNNING,
            trigger=trigger,
            input=ensure_json(input, field="input"),
            summary=None,
            started_at=started_at,
            finished_at=None,
            duration_ms=None,
            service_revision=service_revision,
        )
        return self._claim(run)

    def heartbeat(self, *, run_id: str, progress: dict[str, Any] | None = None) -> bool:
        """Advance the watermark to the store's clock (never backwards) and store
        ``progress`` as the summary. ``False`` means the run is no longer RUNNING (or
        unknown) and nothing was written."""
        key = self._parse_run_id(run_id)
        if progress is not None:
            progress = ensure_json(progress, field="progress")
        return self._heartbeat(key, progress)

    def complete(
        self,
        *,
        run_id: str,
        status: str,
        finished_at: datetime,
        duration_ms: int,
        summary: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> bool:
        """Settle a RUNNING run with a terminal ``status``. ``False`` means the run was
        already settled (or unknown) and its stored outcome is unchanged."""
        key = self._parse_run_id(run_id)
        # Keyword arguments are evaluated as written, so the checks keep their order:
        # a call wrong in two ways reports the same error it always has.
        settlement = JobRunSettlement(
            status=validate_terminal_status(status),
            finished_at=validate_instant(finished_at, field="finished_at"),
            duration_ms=validate_duration_ms(duration_ms),
            error=validate_error_text(error),
            summary=None if summary is None else ensure_json(summary, field="summary"),
        )
        return self._complete(key, settlement)

    def record_skipped(
        self,
        *,
        job_key: str,
        trigger: Trigger,
        input: Any,
        at: datetime,
        reason: str = "overlap",
        service_revision: str | None = None,
    ) -> str:
        """Record a run that never executed and return its id. The row holds no key."""
        validate_claim_arguments(
            job_key=job_key, overlap_key=None, trigger=trigger, service_revision=service_revision
        )
        at = validate_instant(at, field="at")
        reason = validate_skip_reason(reason)
        skipped = NewJobRun(
            job_key=job_key,
            overlap_key=None,
            status=JobRunStatus.SKIPPED,
            trigger=trigger,
            input=ensure_json(input, field="input"),
            summary={"reason": reason},
            started_at=at,
            finished_at=at,
            duration_ms=0,
            service_revision=service_revision,
        )
        return self._record_skipped(skipped)

    def reap_stale(
        self,
        *,
        stale_after: timedelta,
        job_key: str | None = None,
        overlap_key: str | None = None,
        limit: int | None = None,
    ) -> int:
        """Move RUNNING rows whose watermark is at or before ``store now - stale_after``
        to TIMED_OUT, oldest watermark first, at most ``limit`` of them, optionally
        narrowed to ``job_key`` / ``overlap_key``. Returns the rows this call moved."""
        validate_duration(stale_after, field="stale_after")
        validate_reap_limit(limit)
        optional_key(job_key, field="job_key")
        optional_key(overlap_key, field="overlap_key")
        return self._reap_stale(stale_after, job_key, overlap_key, limit)

    #: Whether :meth:`sweep_store` gives the batch methods of the maintenance sweeps
    #: over this store's runs (:mod:`jobstate.maintenance`).
    supports_sweeps: bool = False

    def sweep_store(self) -> RunSweepStore:
        """A new :class:`~jobstate.stores.contracts.sweep_store.RunSweepStore` over this store's
        runs,
        for one sweep. Only stores with ``supports_sweeps`` have one."""
        raise UnsupportedStoreOperation(
            f"{type(self).__name__} does not support sweep_store() (supports_sweeps is False)."
        )

    # The primitives a store implements. Each receives checked values only.

    @abstractmethod
    def _claim(self, run: NewJobRun) -> str | None:
        """Insert ``run`` (RUNNING) unless a RUNNING run holds ``run.overlap_key``, as one
        atomic compare-and-set (S1), and return the new id (S5); the watermark starts at
        the store's clock (S6). ``None`` only when the key is held: any other failure,
        including another constraint's violation, raises."""

    @abstractmethod
    def _heartbeat(self, run_id: str, progress: dict[str, Any] | None) -> bool:
        """If run ``run_id`` is RUNNING, move its watermark to the later of itself and
        the store's clock (S2), store ``progress`` as the summary unless it is ``None``,
        and return ``True``. Otherwise (settled or unknown) write nothing and return
        ``False``. ``run_id`` is what :meth:`_parse_run_id` returned."""

    @abstractmethod
    def _complete(self, run_id: str, settlement: JobRunSettlement) -> bool:
        """If run ``run_id`` is RUNNING, write ``settlement`` in one conditional write
        that re-checks RUNNING (S3) and return ``True``; a ``None`` summary or error keeps
        the stored one. Otherwise write nothing and return ``False``. ``run_id`` is what
        :meth:`_parse_run_id` returned."""

    @abstractmethod
    def _record_skipped(self, run: NewJobRun) -> str:
        """Insert ``run`` (SKIPPED, holding no key) and return its new id (S5). The
        watermark is the store's clock (S6); nothing else is derived."""

    @abstractmethod
    def _reap_stale(
        self,
        stale_after: timedelta,
        job_key: str | None,
        overlap_key: str | None,
        limit: int | None,
    ) -> int:
        """Move the RUNNING runs whose watermark is at or before ``store now -
        stale_after`` (narrowed to ``job_key`` / ``overlap_key`` when given; at most
        ``limit``, oldest watermark first, when given) to TIMED_OUT with
        ``finished_at = store now`` and ``error = REAPED_RUN_ERROR``, atomically (S4).
        Return how many this call moved: never a row another reaper moved."""

    def _parse_run_id(self, run_id: str | uuid.UUID) -> str:
        """The run id the primitives receive, or ``InvalidJobState``. Run ids are UUIDs,
        taken in any spelling :class:`uuid.UUID` parses and handed on in its canonical
        text. A store whose ids have another shape overrides this check."""
        return str(validate_run_id(run_id))
