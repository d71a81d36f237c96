"""The operational metrics snapshot every store's figures make
(:func:`operational_metrics`)."""

from __future__ import annotations

from datetime import timedelta

from jobstate.core.states import TERMINAL_JOB_STATUSES, JobOperationalMetrics, JobStatus

__all__ = ["operational_metrics"]

_TERMINAL_KEYS = sorted(status.value for status in TERMINAL_JOB_STATUSES)


def operational_metrics(
    *,
    by_status: dict[str, int],
    terminal: dict[str, int],
    oldest_queued_age: timedelta | None,
    delayed: int,
    expired: int,
    blocked: int,
    estimated: dict[str, int] | None = None,
) -> JobOperationalMetrics:
    """The snapshot a store's counts make: every status and terminal status present,
    every figure clamped to ``>= 0``, and ``estimated`` (counts of finished jobs read
    from statistics instead of counted) named in ``estimated_statuses``."""
    statuses = dict.fromkeys(JobStatus.values, 0) | by_status | (estimated or {})
    finished = dict.fromkeys(_TERMINAL_KEYS, 0) | terminal
    age = 0.0 if oldest_queued_age is None else oldest_queued_age.total_seconds()
    return JobOperationalMetrics(
        by_status={status: max(0, count) for status, count in statuses.items()},
        terminal_last_15m={status: max(0, count) for status, count in finished.items()},
        oldest_queued_age_seconds=max(0.0, age),
        delayed_queued_jobs=max(0, delayed),
        expired_leases=max(0, expired),
        blocked_threads=max(0, blocked),
        estimated_statuses=tuple(sorted(estimated)) if estimated is not None else (),
    )
