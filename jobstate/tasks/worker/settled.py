"""What settling an attempt did (:class:`SettledAttempt`), and how the worker holds an
attempt until then: by its claim (:func:`held`), since a worker frozen past its lease
can claim its own recovered task again while the first attempt's thread still runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any

from jobstate.core.attempt_log import AttemptOutcome, AttemptSettlement
from jobstate.core.states import JobStatus
from jobstate.exceptions import WorkerLost
from jobstate.stores.base import CompletionResult
from jobstate.tasks.worker.config import WorkerSummary
from jobstate.tasks.worker.execution import Attempt, Outcome, ended_by_worker, timed_out

__all__ = ["SettledAttempt", "abandoned", "held", "interrupted", "note_cancel"]


@dataclass(frozen=True)
class SettledAttempt:
    """What settling one attempt did."""

    outcome: Outcome
    settlement: AttemptSettlement
    written: bool
    """``False``: the claim was gone, nothing was written."""
    reply_lost: bool = False
    """An earlier report was written though its reply was lost with the connection."""

    def count_in(self, summary: WorkerSummary) -> None:
        """Add this attempt to the worker's ``summary``."""
        if not self.written and self.outcome.attempt.cancelled:
            summary.cancelled += 1
        elif not self.written:
            summary.lost += 1
        elif self.settlement.retrying:
            summary.retrying += 1
        elif self.outcome.record.failed:
            summary.failed += 1
        else:
            summary.succeeded += 1


def note_cancel(attempt: Attempt, refused: CompletionResult) -> None:
    """Mark ``attempt`` cancelled when the row that ``refused`` its report is rejected:
    cancelled after its thread ended, which the cancel watch does not ask about (see
    :mod:`.cancellation`)."""
    if refused.job is not None and refused.job.status == JobStatus.REJECTED:
        attempt.cancelled = True


def interrupted(attempt: Attempt, why: str) -> Outcome:
    """The outcome of an attempt the worker stopped waiting for (``why``): counted as
    an attempt whose worker was lost, since the task may have done part of its work,
    after as long as it ran until then."""
    record = ended_by_worker(attempt, AttemptOutcome.WORKER_LOST, WorkerLost, why)
    ran = 0.0 if attempt.started_at is None else time.monotonic() - attempt.started_at
    return Outcome(attempt, record, duration=ran)


def abandoned(attempt: Attempt, why: str, *, hold: timedelta) -> Outcome:
    """The outcome of an attempt still running when the worker stops for good (``why``):
    :func:`interrupted`, or timed out when it had been interrupted already. Its thread
    ends with the process, so its retry is held back by ``hold`` (a lease), as after a
    crash: it cannot start while this attempt still runs."""
    if attempt.interrupted_at is None:
        return replace(interrupted(attempt, why), retry_hold=hold)
    note = "its thread did not stop after the interrupt; the worker exited"
    ran = time.monotonic() - (attempt.started_at or time.monotonic())
    return Outcome(attempt, timed_out(attempt, note=note), duration=ran, retry_hold=hold)


def held(attempt: Attempt) -> tuple[Any, Any]:
    """How the worker holds ``attempt``: its job's id and the claim's token."""
    return attempt.job.id, attempt.job.claim_token
