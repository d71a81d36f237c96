"""The attempt log of a django.tasks task, and how one attempt settles its job.

A task is a ``Job`` whose ``attempts`` column counts the attempts that started (a task
claim adds one) and whose ``attempt_log`` holds one entry per attempt that ended: the
worker, when it started and ended, the outcome and, for a failure, the exception's class
path and traceback. ``TaskResult.worker_ids`` and ``TaskResult.errors`` are read from it.

Whoever ends an attempt (the worker that ran it, or a sweep that finds its worker gone)
settles the job with :func:`settle_attempt`, so an attempt is recorded the same way
whichever path ends it. The values here are plain JSON; this module sits beside the
vocabulary and imports no model or store.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from jobstate.states import JobStatus

__all__ = [
    "TRACEBACK_LIMIT",
    "AttemptOutcome",
    "Settlement",
    "TaskAttempt",
    "error_summary",
    "read_attempt_log",
    "settle_attempt",
]

#: Longest traceback an attempt keeps, in characters. A longer one keeps its start and
#: its end (where the exception is), so a deep recursion cannot fill the row.
TRACEBACK_LIMIT = 20_000

#: Longest ``error`` summary a task's job keeps (the first line of the last failure).
ERROR_SUMMARY_LIMIT = 1_000


class AttemptOutcome(enum.StrEnum):
    SUCCESSFUL = "successful"
    """The task returned a value that was stored."""
    FAILED = "failed"
    """The task raised, or returned a value that cannot be stored."""
    TIMED_OUT = "timed out"
    """The task ran past its backend's ``TIMEOUT``."""
    WORKER_LOST = "worker lost"
    """The worker stopped renewing the attempt's lease and a sweep recovered it."""


@dataclass(frozen=True)
class TaskAttempt:
    """One ended attempt of a task, as its ``attempt_log`` keeps it."""

    worker_id: str
    started_at: datetime | None
    finished_at: datetime | None
    outcome: AttemptOutcome
    exception_class_path: str = ""
    traceback: str = ""
    message: str = ""
    """``str()`` of the exception, for the one-line ``error`` summary."""

    @property
    def failed(self) -> bool:
        return self.outcome is not AttemptOutcome.SUCCESSFUL

    def as_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "worker_id": self.worker_id,
            "started_at": _instant(self.started_at),
            "finished_at": _instant(self.finished_at),
            "outcome": self.outcome.value,
        }
        if self.failed:
            entry["exception_class_path"] = self.exception_class_path
            entry["message"] = self.message[:ERROR_SUMMARY_LIMIT]
            entry["traceback"] = clip_traceback(self.traceback)
        return entry

    @classmethod
    def from_json(cls, entry: Any) -> TaskAttempt:
        """An entry as stored; anything unreadable in it (a log edited by hand) reads as
        empty rather than breaking every reader of the task."""
        value = entry if isinstance(entry, dict) else {}
        try:
            outcome = AttemptOutcome(str(value.get("outcome")))
        except ValueError:
            outcome = AttemptOutcome.FAILED
        return cls(
            worker_id=str(value.get("worker_id") or ""),
            started_at=_parse_instant(value.get("started_at")),
            finished_at=_parse_instant(value.get("finished_at")),
            outcome=outcome,
            exception_class_path=str(value.get("exception_class_path") or ""),
            traceback=str(value.get("traceback") or ""),
            message=str(value.get("message") or ""),
        )


def read_attempt_log(value: Any) -> list[TaskAttempt]:
    """The attempts of a job's ``attempt_log`` (``None`` for a job that is no task)."""
    if not isinstance(value, list):
        return []
    return [TaskAttempt.from_json(entry) for entry in value]


@dataclass(frozen=True)
class Settlement:
    """How an ended attempt settles its claimed job: the status to report and the patch
    of a fenced report (``complete_claimed_job`` / ``complete_claimed_jobs``)."""

    status: JobStatus
    patch: dict[str, Any]

    @property
    def retrying(self) -> bool:
        return self.status == JobStatus.QUEUED


def settle_attempt(
    *,
    attempt_log: Sequence[Any] | None,
    attempts: int,
    max_attempts: int | None,
    attempt: TaskAttempt,
    return_value: Any = None,
    retry_at: datetime | None = None,
) -> Settlement:
    """The report that ends ``attempt`` of a claimed task whose ``attempts`` (this one
    included) and ``attempt_log`` are as given.

    A success is ``done`` with the return value as ``result``. A failure goes back to
    ``queued`` while ``attempts`` is below ``max_attempts``, due at ``retry_at`` (``None``:
    at once), else it is ``error``. Every outcome appends the attempt to the log; a
    failure also sets ``error`` to a one-line summary, a success clears it."""
    log = [*(attempt_log or ()), attempt.as_json()]
    if not attempt.failed:
        return Settlement(
            JobStatus.DONE, {"attempt_log": log, "result": return_value, "error": None}
        )
    patch: dict[str, Any] = {"attempt_log": log, "error": error_summary(attempt)}
    if attempts < (max_attempts or 1):
        patch["run_after"] = retry_at
        return Settlement(JobStatus.QUEUED, patch)
    return Settlement(JobStatus.ERROR, patch)


def error_summary(attempt: TaskAttempt) -> str:
    """``"<class path>: <first line of the message>"`` of a failed attempt, cut to
    :data:`ERROR_SUMMARY_LIMIT` characters."""
    first_line = next((line for line in attempt.message.splitlines() if line.strip()), "")
    summary = attempt.exception_class_path
    if first_line:
        summary = f"{summary}: {first_line.strip()}"
    return summary[:ERROR_SUMMARY_LIMIT]


def clip_traceback(text: str) -> str:
    """``text`` within :data:`TRACEBACK_LIMIT` characters: its start and its end."""
    if len(text) <= TRACEBACK_LIMIT:
        return text
    marker = "\n[... traceback shortened ...]\n"
    head = TRACEBACK_LIMIT // 4
    tail = TRACEBACK_LIMIT - head - len(marker)
    return text[:head] + marker + text[-tail:]


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_instant(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_datetime(value)
    except ValueError:
        return None
