"""What a job body sees of its run, and the state its three threads share.

A run executes in three threads: the caller's (waiting for the body or the deadline),
the body's and the heartbeat's. :class:`RunExecution` holds what they share and orders
the three decisions that race under one lock: the body finishing, the run being given up
(an abort), and the runner settling the run, after which nothing else is written.
:class:`RunContext` is the body's view of it.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from jobstate.core.jsonvalues import ensure_json
from jobstate.operations.outcomes import RunReason
from jobstate.stores.base import JobRunStore, Trigger
from jobstate.stores.errors import discard_broken_connection

__all__ = ["RunContext", "RunExecution", "RunSettlement", "discard_connection"]

# The runner's one logger, whichever of its modules writes: hosts route and silence the
# runner's warnings by this name.
logger = logging.getLogger("jobstate.runner")


class RunContext:
    """What a job body receives besides its input.

    - ``run_id``, ``job_key``, ``trigger``; ``deadline_at`` (runner clock).
    - ``cancelled``: a :class:`threading.Event` set when the run is given up (deadline,
      lost claim, unverifiable heartbeat, interrupt). A long body should check it (or
      wait on it instead of sleeping) and stop; the runner cannot stop it otherwise.
    - ``heartbeat(progress=None)``: see :meth:`heartbeat`.
    - ``logger``: a logger that tags records with ``job_key`` and ``run_id``.
    """

    def __init__(
        self,
        *,
        run_id: str,
        job_key: str,
        trigger: Trigger,
        deadline_at: datetime,
        execution: RunExecution,
    ) -> None:
        self.run_id = run_id
        self.job_key = job_key
        self.trigger = trigger
        self.deadline_at = deadline_at
        self.cancelled: threading.Event = execution.cancelled
        self.logger = logging.LoggerAdapter(
            logging.getLogger(f"jobstate.jobs.{job_key}"),
            {"job_key": job_key, "run_id": run_id},
        )
        self._execution = execution

    def heartbeat(self, progress: dict[str, Any] | None = None) -> bool:
        """Advance the run's liveness watermark now and store ``progress`` (strict
        JSON, else :class:`InvalidPayload`) as its summary.

        Returns ``False`` when the run is over: already recorded, or the store answered
        that the row is no longer RUNNING (the run is then aborted as FAILED and
        ``cancelled`` is set). A store error is logged and answers ``True``: one
        transient failure is not a lost claim.
        """
        if progress is not None:
            ensure_json(progress, field="progress")
        return self._execution.beat(progress)

    def __repr__(self) -> str:
        return f"<RunContext {self.job_key} {self.run_id}>"


@dataclass(frozen=True)
class RunSettlement:
    """What the runner finds when it settles a run (:meth:`RunExecution.settle`)."""

    abort_reason: RunReason | None
    """Why the run was given up, or ``None``."""
    body_first: bool
    """The body finished before any abort, so its own result is the outcome."""
    value: object
    error: BaseException | None


class RunExecution:
    """State shared by the caller's thread, the body's thread and the heartbeat thread
    of one run. ``lock`` orders the three decisions that race: the body finishing, an
    abort, and the runner settling the run (after which nothing else is written)."""

    def __init__(self, *, store: JobRunStore, run_id: str, job_key: str, budget: float) -> None:
        self.store = store
        self.run_id = run_id
        self.job_key = job_key
        self.budget = budget
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.cancelled = threading.Event()
        self.stop_heartbeats = threading.Event()
        self.settled = False
        self.abort_reason: RunReason | None = None
        self.body_first = False
        self.body_value: object = None
        self.body_error: BaseException | None = None
        self.last_ok_beat = time.monotonic()

    @property
    def log_extra(self) -> dict[str, str]:
        return {"job_key": self.job_key, "run_id": self.run_id}

    def abort(self, reason: RunReason) -> None:
        """Give the run up for ``reason`` (the first abort wins) and wake the caller."""
        with self.lock:
            if self.settled or self.abort_reason is not None:
                return
            self.abort_reason = reason
        self.cancelled.set()
        self.wake.set()

    def body_finished(self, *, value: object = None, error: BaseException | None = None) -> None:
        """Record what the body returned or raised and wake the caller. The result counts
        only if no abort came first. The order in which the two took the lock decides, not
        a clock reading: on a clock too coarse to tell them apart, a body that returns the
        moment it is cancelled would otherwise turn a given-up run into a success."""
        with self.lock:
            self.body_first = self.abort_reason is None
            self.body_value = value
            self.body_error = error
            late = self.settled
        self.wake.set()
        if late:
            # After an interrupt the body is expected to end late (asked to stop, it
            # returns when it next looks): not worth a warning on the operator's screen.
            interrupted = self.abort_reason is RunReason.INTERRUPTED
            logger.log(
                logging.INFO if interrupted else logging.WARNING,
                "job body settled after the run was recorded: %s (run %s); its result is "
                "not written",
                self.job_key,
                self.run_id,
                extra=self.log_extra,
            )

    def settle(self) -> RunSettlement:
        """Close the run to the body and to aborts; what each had recorded by now is the
        whole outcome, so nothing later can change it."""
        with self.lock:
            self.settled = True
            return RunSettlement(
                abort_reason=self.abort_reason,
                body_first=self.body_first,
                value=self.body_value,
                error=self.body_error,
            )

    def beat(self, progress: dict[str, Any] | None) -> bool:
        """Write one heartbeat; ``False`` when the run is over (see
        :meth:`RunContext.heartbeat`)."""
        with self.lock:
            if self.settled:
                return False
        try:
            accepted = self.store.heartbeat(run_id=self.run_id, progress=progress)
        # The store is pluggable and a failed beat is tolerated whatever its cause, until
        # the liveness budget runs out.
        except Exception:
            logger.warning(
                "job heartbeat write failed: %s (run %s)",
                self.job_key,
                self.run_id,
                exc_info=True,
                extra=self.log_extra,
            )
            # Django keeps a dead connection until told otherwise: drop it so the next
            # beat from this thread reconnects.
            discard_connection(self.store)
            if time.monotonic() - self.last_ok_beat >= self.budget:
                logger.warning(
                    "job heartbeat unverifiable for the full liveness budget: aborting %s (run %s)",
                    self.job_key,
                    self.run_id,
                    extra=self.log_extra,
                )
                self.abort(RunReason.HEARTBEAT_UNVERIFIABLE)
                return False
            return True
        if accepted:
            self.last_ok_beat = time.monotonic()
            return True
        with self.lock:
            settled = self.settled
        if not settled:
            logger.warning(
                "job heartbeat rejected: claim lost: %s (run %s)",
                self.job_key,
                self.run_id,
                extra=self.log_extra,
            )
            self.abort(RunReason.CLAIM_LOST)
        return False


def discard_connection(store: JobRunStore) -> None:
    """Drop this thread's connection to the store's database if it no longer works."""
    alias = getattr(store, "using", None)
    if isinstance(alias, str):
        discard_broken_connection(alias)
