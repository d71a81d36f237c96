"""Store contracts.

A store is to jobstate what a session backend is to ``django.contrib.sessions``: a class
whose docstrings state the guarantees, loaded by dotted path from ``settings.JOBSTATE``.
The database stores in :mod:`jobstate.stores.database` implement them with the Django
ORM; :mod:`jobstate.testing` ships in-memory reference stores and contract test cases
that any implementation (ours or a host's) must pass.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _


@dataclass(frozen=True)
class Trigger:
    """Who or what started a run. ``source`` is an open set; the listed values are
    conventions: ``"SCHEDULER"``, ``"CLI"``, ``"ADMIN"``, ``"CELERY"``."""

    source: str
    triggered_by: str | None = None


class JobRunStatus(models.TextChoices):
    RUNNING = "RUNNING", _("Running")
    """Claimed and executing; holds its overlap key."""
    SUCCEEDED = "SUCCEEDED", _("Succeeded")
    """The body finished and did not report ``ok: False``."""
    FAILED = "FAILED", _("Failed")
    """The body raised, reported ``ok: False``, or was aborted."""
    TIMED_OUT = "TIMED_OUT", _("Timed out")
    """Hit its deadline, or was reaped because its heartbeat went stale."""
    SKIPPED = "SKIPPED", _("Skipped")
    """Never executed because another run held the overlap key."""


TERMINAL_RUN_STATUSES = frozenset(
    {JobRunStatus.SUCCEEDED, JobRunStatus.FAILED, JobRunStatus.TIMED_OUT, JobRunStatus.SKIPPED}
)

REAPED_RUN_ERROR = "heartbeat stale: the running instance is assumed gone"


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


def validate_terminal_status(status: str) -> JobRunStatus:
    """Return ``status`` as a terminal :class:`JobRunStatus` or raise ``InvalidJobState``."""
    from jobstate.exceptions import InvalidJobState

    try:
        parsed = JobRunStatus(status)
    except ValueError as exc:
        raise InvalidJobState(
            f"{status!r} is not a job run status; expected one of "
            f"{', '.join(s.value for s in TERMINAL_RUN_STATUSES)}."
        ) from exc
    if parsed not in TERMINAL_RUN_STATUSES:
        raise InvalidJobState(f"complete() needs a terminal status, not {parsed.value}.")
    return parsed


def validate_instant(value: datetime, *, field: str) -> datetime:
    """Recorded instants must be aware datetimes: a naive one is ambiguous across hosts."""
    from jobstate.exceptions import InvalidJobState

    if not isinstance(value, datetime):
        raise InvalidJobState(f"{field} must be a datetime, got {type(value).__name__}.")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJobState(f"{field} must be an aware datetime (it has no time zone).")
    return value


def validate_duration(value: timedelta, *, field: str, allow_zero: bool = True) -> timedelta:
    from jobstate.exceptions import InvalidJobState

    if not isinstance(value, timedelta):
        raise InvalidJobState(f"{field} must be a datetime.timedelta, got {type(value).__name__}.")
    if value < timedelta(0) or (not allow_zero and value == timedelta(0)):
        bound = "zero or positive" if allow_zero else "positive"
        raise InvalidJobState(f"{field} must be {bound}, got {value}.")
    return value


def validate_claim_arguments(*, job_key: str, overlap_key: str | None, trigger: Trigger) -> None:
    """Shared argument checks of ``claim`` and ``record_skipped``."""
    from jobstate.exceptions import InvalidJobState

    if not isinstance(job_key, str) or not job_key.strip():
        raise InvalidJobState(f"job_key must be a non-empty string, got {job_key!r}.")
    if overlap_key is not None and (not isinstance(overlap_key, str) or not overlap_key.strip()):
        raise InvalidJobState(f"overlap_key must be a non-empty string, got {overlap_key!r}.")
    if not isinstance(trigger, Trigger):
        raise InvalidJobState(f"trigger must be a jobstate Trigger, got {type(trigger).__name__}.")
