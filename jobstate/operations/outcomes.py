"""How a run of an operations job ends: the reasons, the verdict and the result.

:class:`jobstate.operations.job_runner.JobRunner` settles every run into exactly one
:class:`JobExecutionResult`. The verdict that goes into it is decided here, from what
the body did (returned a value, raised) or from why the run was given up (deadline, lost
claim, unverifiable heartbeat, interrupt); nothing in this module touches a store.
"""

from __future__ import annotations

import enum
import traceback
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any, Literal

from jobstate.core.jsonvalues import ensure_json
from jobstate.core.storable import storable_text
from jobstate.exceptions import InvalidPayload
from jobstate.stores.base import JobRunStatus

__all__ = [
    "JobExecutionResult",
    "Recorded",
    "RunReason",
    "Verdict",
    "abort_verdict",
    "body_verdict",
    "truncate_error_text",
]

#: What happened to a verdict: written, already settled by someone else, or not written.
Recorded = Literal["settled", "superseded", "unrecorded"]

_ERROR_TRUNCATION_MARK = "\n... (truncated)"


class RunReason(enum.StrEnum):
    """Why a run ended the way it did (``JobExecutionResult.reason``)."""

    OVERLAP = "overlap"
    """SKIPPED: another run held the overlap key."""
    ERROR = "error"
    """FAILED: the body raised."""
    REPORTED_NOT_OK = "reported-not-ok"
    """FAILED: the body returned a summary with ``"ok": False``."""
    INVALID_SUMMARY = "invalid-summary"
    """FAILED: the body returned a summary that is not strict JSON."""
    TIMEOUT = "timeout"
    """TIMED_OUT: the deadline passed before the body finished."""
    CLAIM_LOST = "claim-lost"
    """FAILED: a heartbeat found the run no longer RUNNING (reaped or settled elsewhere)."""
    HEARTBEAT_UNVERIFIABLE = "heartbeat-unverifiable"
    """FAILED: no heartbeat could be written for the whole liveness budget."""
    INTERRUPTED = "interrupted"
    """FAILED: the process running ``execute`` was interrupted (Ctrl-C)."""


@dataclass(frozen=True)
class JobExecutionResult:
    """The outcome of one :meth:`JobRunner.execute`.

    ``status`` is the runner's verdict; ``recorded`` says what happened to it:
    ``"settled"`` (written), ``"superseded"`` (the row had already been settled, usually
    by a reaper, and keeps that outcome) or ``"unrecorded"`` (the write failed; the row
    stays RUNNING until a reap). ``error`` is the truncated error text stored on the row.
    """

    run_id: str
    job_key: str
    status: JobRunStatus
    duration_ms: int
    recorded: Recorded
    summary: dict[str, Any] | None = None
    error: str | None = None
    reason: RunReason | None = None

    @property
    def ok(self) -> bool:
        """SUCCEEDED and SKIPPED count as success (CLI exit 0)."""
        return self.status in (JobRunStatus.SUCCEEDED, JobRunStatus.SKIPPED)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (status and reason as plain strings)."""
        data = asdict(self)
        data["status"] = str(self.status.value)
        data["reason"] = None if self.reason is None else str(self.reason.value)
        return data


@dataclass(frozen=True)
class Verdict:
    """What the runner writes for a run that executed: its status, why (``None`` for a
    plain success), the summary to store and the error text (not yet truncated)."""

    status: JobRunStatus
    reason: RunReason | None = None
    summary: dict[str, Any] | None = None
    error: str | None = None


def body_verdict(value: object, error: BaseException | None) -> Verdict:
    """The verdict of a body that finished before its run was given up: FAILED when it
    raised, returned a summary that is not strict JSON or one with ``"ok": False``;
    SUCCEEDED otherwise. Only a ``dict`` return value becomes the summary."""
    if error is not None:
        return Verdict(JobRunStatus.FAILED, RunReason.ERROR, error=_exception_text(error))
    if not isinstance(value, dict):
        return Verdict(JobRunStatus.SUCCEEDED)
    try:
        summary = ensure_json(value, field="summary")
    except InvalidPayload as exc:
        return Verdict(
            JobRunStatus.FAILED,
            RunReason.INVALID_SUMMARY,
            error=f"job returned a summary that cannot be stored: {exc}",
        )
    if summary is not None and summary.get("ok") is False:
        return Verdict(
            JobRunStatus.FAILED,
            RunReason.REPORTED_NOT_OK,
            summary=summary,
            error="job reported ok: False",
        )
    return Verdict(JobRunStatus.SUCCEEDED, summary=summary)


def abort_verdict(reason: RunReason, *, timeout: timedelta, stale_run_after: timedelta) -> Verdict:
    """The verdict of a run given up before its body finished: TIMED_OUT on the deadline,
    FAILED for every other ``reason``."""
    if reason is RunReason.TIMEOUT:
        return Verdict(
            JobRunStatus.TIMED_OUT,
            reason,
            error=f"job timed out: still running after its timeout of {timeout}",
        )
    if reason is RunReason.CLAIM_LOST:
        text = "job run lost its claim: the row is no longer RUNNING (reaped or settled elsewhere)"
    elif reason is RunReason.HEARTBEAT_UNVERIFIABLE:
        text = (
            "job heartbeat unverifiable: no heartbeat could be written for "
            f"{stale_run_after}, the liveness budget"
        )
    else:
        text = "job run was interrupted (Ctrl-C or a stop signal)"
    return Verdict(JobRunStatus.FAILED, reason, error=text)


def truncate_error_text(text: str, limit: int) -> str:
    """``text`` as a run row can hold it: NUL made visible, a lone surrogate (an
    undecodable file name in a message) replaced, at most ``limit`` characters, a cut
    marked at the end."""
    # PostgreSQL text cannot hold NUL; keep the character visible instead of failing.
    # No database holds a lone surrogate: the store would refuse the run's last write.
    text = storable_text(text.replace("\x00", "\\x00"))
    if len(text) <= limit:
        return text
    if limit <= len(_ERROR_TRUNCATION_MARK):
        return text[:limit]
    return text[: limit - len(_ERROR_TRUNCATION_MARK)] + _ERROR_TRUNCATION_MARK


def _exception_text(exc: BaseException) -> str:
    # The message first, so truncation keeps what an operator reads first.
    head = f"{type(exc).__qualname__}: {exc}"
    return head + "\n" + "".join(traceback.format_exception(exc)).rstrip()
