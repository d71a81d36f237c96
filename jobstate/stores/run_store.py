"""The run store's contract (JobRunStore): overlap-guarded runs of operations jobs."""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime, timedelta
from typing import Any

from jobstate.states import Trigger


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
    """

    # Methods that subclasses must implement.

    @abstractmethod
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

    @abstractmethod
    def heartbeat(self, *, run_id: str, progress: dict[str, Any] | None = None) -> bool:
        """Advance the watermark to the store's clock (never backwards) and store
        ``progress`` as the summary. ``False`` means the run is no longer RUNNING (or
        unknown) and nothing was written."""

    @abstractmethod
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

    @abstractmethod
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

    @abstractmethod
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
