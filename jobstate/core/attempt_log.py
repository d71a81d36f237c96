"""The attempt log of a django.tasks task, and how one attempt settles its job.

A task is a ``Job`` whose ``attempts`` column counts the attempts that started (a task
claim adds one) and whose ``attempt_log`` holds one entry per attempt that ended: the
worker, when it started and ended, the outcome and, for a failure, the exception's class
path and traceback. ``TaskResult.worker_ids`` and ``TaskResult.errors`` are read from it.

Whoever ends an attempt (the worker that ran it, or a sweep that finds its worker gone)
settles the job with :func:`settle_attempt`, so an attempt is recorded the same way
whichever path ends it. The values here are plain JSON; this module sits beside the
vocabulary and imports no model or store.

The log is bounded by construction, so no task can make its own reports (or the recovery
of its lost attempts) too large to store: each attempt keeps at most
:data:`MESSAGE_LIMIT` bytes of message and :data:`TRACEBACK_LIMIT` of traceback (less
when ``JOBSTATE['MAX_PAYLOAD_BYTES']`` is low), with NUL characters and lone surrogates
replaced; past :data:`KEPT_FIRST` + :data:`KEPT_LATEST` attempts the log keeps the
first and the latest ones and one entry counting those left out. The job's ``attempts``
column stays the exact count.
"""

from __future__ import annotations

import enum
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from jobstate.core.conf import jobstate_settings
from jobstate.core.jsonvalues import json_size
from jobstate.core.states import JobStatus
from jobstate.core.storable import storable_text
from jobstate.exceptions import TaskReportRefused

__all__ = [
    "KEPT_FIRST",
    "KEPT_LATEST",
    "MESSAGE_LIMIT",
    "TRACEBACK_LIMIT",
    "AttemptOutcome",
    "AttemptSettlement",
    "LeftOut",
    "TaskAttempt",
    "attempt_history",
    "error_summary",
    "exception_message",
    "exception_traceback",
    "numbered_attempts",
    "read_attempt_log",
    "refused_settlement",
    "settle_attempt",
    "storable_class_path",
]

#: Longest traceback an attempt keeps, in bytes of JSON. A longer one keeps its start
#: and its end (where the exception is), so a deep recursion cannot fill the row.
TRACEBACK_LIMIT = 20_000

#: Longest message (``str()`` of the exception) an attempt keeps, in bytes of JSON.
MESSAGE_LIMIT = 2_000

#: Longest ``error`` summary a task's job keeps (the first line of the last failure).
ERROR_SUMMARY_LIMIT = 1_000

#: A log longer than ``KEPT_FIRST + KEPT_LATEST`` attempts keeps its first
#: ``KEPT_FIRST`` and its latest ``KEPT_LATEST`` ones, and counts those between.
KEPT_FIRST = 1
KEPT_LATEST = 19

#: Longest worker id and class path an entry keeps, in characters (a worker id is at
#: most 200; a class path longer than this is not one that imports).
_NAME_LIMIT = 300

#: Room kept in every log for its brackets and the entry counting left-out attempts.
_LOG_RESERVE = 64

_TRACEBACK_CUT = "\n[... traceback shortened ...]\n"
_MESSAGE_CUT = " [... message shortened ...]"


class AttemptOutcome(enum.StrEnum):
    SUCCESSFUL = "successful"
    """The task returned a value that was stored."""
    FAILED = "failed"
    """The task raised, or returned a value that cannot be stored."""
    TIMED_OUT = "timed out"
    """The task ran past its backend's ``TIMEOUT``."""
    WORKER_LOST = "worker lost"
    """The worker stopped renewing the attempt's lease and a sweep recovered it."""
    CANCELLED = "cancelled"
    """An operator cancelled the task while the attempt ran (``StateStore.cancel_job``)."""


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

    def as_json(self, *, budget: int | None = None) -> dict[str, Any]:
        """The entry as the log keeps it: storable text only, and at most ``budget``
        bytes of JSON when the names alone leave room for it (``None``: the default
        caps, :data:`MESSAGE_LIMIT` and :data:`TRACEBACK_LIMIT`)."""
        entry: dict[str, Any] = {
            "worker_id": storable_text(self.worker_id)[:_NAME_LIMIT],
            "started_at": _instant(self.started_at),
            "finished_at": _instant(self.finished_at),
            "outcome": self.outcome.value,
        }
        if not self.failed:
            return entry
        entry["exception_class_path"] = storable_text(self.exception_class_path)[:_NAME_LIMIT]
        entry["message"] = entry["traceback"] = ""
        room = TRACEBACK_LIMIT + MESSAGE_LIMIT
        if budget is not None:
            room = min(room, budget - json_size(entry))
        message = clip_text(storable_text(self.message), min(MESSAGE_LIMIT, room // 4))
        room -= _text_size(message)
        entry["message"] = message
        entry["traceback"] = clip_text(
            storable_text(self.traceback), min(TRACEBACK_LIMIT, room), keep_end=True
        )
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


@dataclass(frozen=True)
class LeftOut:
    """Attempts a long log left out: ``count`` of them, numbered from ``first``."""

    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1

    def describe(self) -> str:
        """What ``TaskResult.errors`` says in their place."""
        which = f"attempt {self.first}" if self.count == 1 else f"attempts {self.first}-{self.last}"
        return (
            f"{which} ({self.count} in all) were left out of the attempt log, which keeps "
            f"the first {KEPT_FIRST} and the latest {KEPT_LATEST} attempts of a task; "
            "the task's attempt count includes them.\n"
        )


def _left_out_count(entry: Any) -> int | None:
    """The count of an entry standing for left-out attempts; ``None`` for an attempt."""
    if not isinstance(entry, dict) or "outcome" in entry:
        return None
    count = entry.get("left_out")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        return None
    return count


def attempt_history(value: Any) -> list[TaskAttempt | LeftOut]:
    """The attempts of a job's ``attempt_log`` in order, with the attempts a long log
    left out as one :class:`LeftOut` where they were (none for a job that is no task)."""
    if not isinstance(value, list):
        return []
    history: list[TaskAttempt | LeftOut] = []
    number = 1
    for entry in value:
        count = _left_out_count(entry)
        if count is None:
            history.append(TaskAttempt.from_json(entry))
            number += 1
        elif count:
            history.append(LeftOut(first=number, count=count))
            number += count
    return history


def numbered_attempts(value: Any) -> Iterator[tuple[int, TaskAttempt]]:
    """The attempts a job's ``attempt_log`` keeps, each with its attempt number."""
    number = 1
    for item in attempt_history(value):
        if isinstance(item, LeftOut):
            number += item.count
        else:
            yield number, item
            number += 1


def read_attempt_log(value: Any) -> list[TaskAttempt]:
    """The attempts a job's ``attempt_log`` keeps (``None`` for a job that is no task)."""
    return [attempt for _number, attempt in numbered_attempts(value)]


def bounded_log(
    history: Sequence[TaskAttempt | LeftOut], *, limit: int | None = None
) -> list[dict[str, Any]]:
    """``history`` as an ``attempt_log`` of at most ``limit`` bytes of JSON (default
    ``JOBSTATE['MAX_PAYLOAD_BYTES']``): the first :data:`KEPT_FIRST` and the latest
    :data:`KEPT_LATEST` attempts, each within its share of ``limit``, and one entry
    counting the rest. Should a share be too small for an entry's names (a tiny
    ``limit``), more attempts are left out, the newest kept longest."""
    limit = jobstate_settings.MAX_PAYLOAD_BYTES if limit is None else limit
    head: list[TaskAttempt] = []
    for item in history:
        if not isinstance(item, TaskAttempt) or len(head) == KEPT_FIRST:
            break
        head.append(item)
    tail: list[TaskAttempt] = []
    for item in reversed(history[len(head) :]):
        if not isinstance(item, TaskAttempt) or len(tail) == KEPT_LATEST:
            break
        tail.insert(0, item)
    between = history[len(head) : len(history) - len(tail)]
    left_out = sum(item.count if isinstance(item, LeftOut) else 1 for item in between)
    # Each kept entry gets an equal share of the limit, less its ", " separator.
    share = (limit - _LOG_RESERVE) // (KEPT_FIRST + KEPT_LATEST) - 2
    first = [attempt.as_json(budget=share) for attempt in head]
    latest = [attempt.as_json(budget=share) for attempt in tail]
    while True:
        gap = [{"left_out": left_out}] if left_out else []
        log = [*first, *gap, *latest]
        if json_size(log) <= limit or not log:
            return log
        # Only a share too small for an entry's names gets here: leave out the oldest
        # entry, the newest last, and as a last resort keep nothing but the count.
        if len(latest) > 1 or (latest and not first):
            latest.pop(0)
        elif first:
            first.pop(0)
        elif latest:
            latest.pop(0)
        else:
            return []
        left_out += 1


@dataclass(frozen=True)
class AttemptSettlement:
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
    limit: int | None = None,
) -> AttemptSettlement:
    """The report that ends ``attempt`` of a claimed task whose ``attempts`` (this one
    included) and ``attempt_log`` are as given.

    A success is ``done`` with the return value as ``result``. A failure goes back to
    ``queued`` while ``attempts`` is below ``max_attempts``, due at ``retry_at`` (``None``:
    at once), else it is ``error``. Every outcome appends the attempt to the log, which
    stays within ``limit`` bytes (default ``JOBSTATE['MAX_PAYLOAD_BYTES']``, see
    :func:`bounded_log`) whatever the log held before; a failure also sets ``error`` to a
    one-line summary, a success clears it."""
    log = bounded_log([*attempt_history(list(attempt_log or ())), attempt], limit=limit)
    if not attempt.failed:
        return AttemptSettlement(
            JobStatus.DONE, {"attempt_log": log, "result": return_value, "error": None}
        )
    patch: dict[str, Any] = {"attempt_log": log, "error": error_summary(attempt)}
    if attempts < (max_attempts or 1):
        patch["run_after"] = retry_at
        return AttemptSettlement(JobStatus.QUEUED, patch)
    return AttemptSettlement(JobStatus.ERROR, patch)


def refused_settlement(
    *,
    attempt_log: Sequence[Any] | None,
    attempt: TaskAttempt,
    refusal: BaseException,
    what: str,
    with_log: bool = True,
) -> tuple[TaskAttempt, AttemptSettlement]:
    """How to settle a task whose report of ``attempt`` the store refused (``what``:
    "report" or "recovery"): ``error`` whatever attempts it had left, the attempt logged
    as failed with :class:`~jobstate.exceptions.TaskReportRefused` naming the refusal.
    ``with_log=False``: the ``error`` alone, the log left as it was."""
    ended = attempt.outcome.value
    if attempt.failed and attempt.exception_class_path:
        ended = f"{ended}, {attempt.exception_class_path}"
    message = (
        f"the store refused the {what} of this attempt ({ended}): "
        f"{storable_class_path(type(refusal))}: {exception_message(refusal)}"
    )
    path = storable_class_path(TaskReportRefused)
    record = TaskAttempt(
        worker_id=attempt.worker_id,
        started_at=attempt.started_at,
        finished_at=attempt.finished_at,
        outcome=AttemptOutcome.FAILED,
        exception_class_path=path,
        traceback=f"{path}: {message}\n",
        message=message,
    )
    patch: dict[str, Any] = {"error": error_summary(record)}
    if with_log:
        patch["attempt_log"] = bounded_log([*attempt_history(list(attempt_log or ())), record])
    return record, AttemptSettlement(JobStatus.ERROR, patch)


def error_summary(attempt: TaskAttempt) -> str:
    """``"<class path>: <first line of the message>"`` of a failed attempt, cut to
    :data:`ERROR_SUMMARY_LIMIT` characters, storable text only."""
    message = storable_text(attempt.message[: ERROR_SUMMARY_LIMIT * 4])
    first_line = next((line for line in message.splitlines() if line.strip()), "")
    summary = storable_text(attempt.exception_class_path)[:_NAME_LIMIT]
    if first_line:
        summary = f"{summary}: {first_line.strip()}"
    return summary[:ERROR_SUMMARY_LIMIT]


# --- exceptions as storable text ----------------------------------------------------------


def storable_class_path(cls: type) -> str:
    """``module.QualifiedName`` of ``cls``, exactly; for a class whose path no store
    could keep (a NUL or lone surrogate in its name, or longer than any importable one),
    the path of its nearest base class that has a storable one."""
    for base in cls.__mro__:
        path = f"{getattr(base, '__module__', '')}.{getattr(base, '__qualname__', '')}"
        if len(path) <= _NAME_LIMIT and storable_text(path) == path:
            return path
    return "builtins.BaseException"


def exception_message(exc: BaseException) -> str:
    """``str(exc)`` as storable text; the class name when ``str()`` fails or returns
    something that is not text."""
    try:
        # str() passes on what __str__ returns when it is an instance of a str
        # subclass, whose own methods may raise: its plain text is read instead.
        message = str.__str__(str(exc))
    # The exception is the task's: its __str__ may raise anything, SystemExit included.
    except BaseException:
        return storable_text(type(exc).__name__)
    return storable_text(message)


def exception_traceback(exc: BaseException) -> str:
    """The formatted traceback of ``exc`` as storable text; the class path and message
    alone when formatting it fails."""
    try:
        text = "".join(traceback.format_exception(exc))
    # As for exception_message: formatting calls the task's own code.
    except BaseException:
        text = f"{storable_class_path(type(exc))}: {exception_message(exc)}\n"
    return storable_text(text)


# --- clipping text to a size in bytes of JSON ---------------------------------------------


def _text_size(text: str) -> int:
    """The bytes ``text`` adds to a log's JSON, its quotes left out."""
    return json_size(text) - 2


def clip_text(text: str, budget: int, *, keep_end: bool = False) -> str:
    """``text`` (storable) within ``budget`` bytes of JSON: its start (and, with
    ``keep_end``, its end) and a mark of the cut."""
    budget = max(budget, 0)
    # No character takes more than six bytes of JSON (a \uXXXX escape).
    if len(text) * 6 <= budget or _text_size(text) <= budget:
        return text
    cut = _TRACEBACK_CUT if keep_end else _MESSAGE_CUT
    room = budget - _text_size(cut)
    if room <= 0:
        return text[: _fitting(text, budget)]
    if not keep_end:
        return text[: _fitting(text, room)] + cut
    head = text[: _fitting(text, room // 4)]
    tail_room = room - _text_size(head)
    reversed_tail = text[::-1][: _fitting(text[::-1], tail_room)]
    return head + cut + reversed_tail[::-1]


def clip_traceback(text: str) -> str:
    """``text`` within :data:`TRACEBACK_LIMIT` bytes of JSON: its start and its end."""
    return clip_text(storable_text(text), TRACEBACK_LIMIT, keep_end=True)


def _fitting(text: str, budget: int) -> int:
    """The most leading characters of ``text`` that take at most ``budget`` bytes."""
    low, high = 0, min(len(text), max(budget, 0))
    while low < high:
        middle = (low + high + 1) // 2
        if _text_size(text[:middle]) <= budget:
            low = middle
        else:
            high = middle - 1
    return low


def _instant(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _parse_instant(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return parse_datetime(value)
    except ValueError:
        return None
