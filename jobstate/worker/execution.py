"""Running task attempts in threads.

An :class:`ExecutionPool` keeps ``size`` threads; each takes the next :class:`Attempt`
handed to it, runs the task, and hands the :class:`Outcome` back through a callback.
A thread cannot be stopped from outside, so an attempt that runs past its timeout is
*abandoned*: the worker settles it as timed out, a fresh thread takes the abandoned
one's place, and the old thread drops whatever the task returns once it ends (its
claim was released, so a report would be refused anyway).

Which of "the task ended" and "the worker gave up on it" happened first is decided once,
under the attempt's lock, so an attempt is settled exactly once.
"""

from __future__ import annotations

import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections, connections
from django.utils import timezone

from jobstate.exceptions import InvalidPayload, TaskReturnValueNotJSON
from jobstate.jsonvalues import ensure_json
from jobstate.task_log import (
    AttemptOutcome,
    TaskAttempt,
    exception_message,
    exception_traceback,
    storable_class_path,
)
from jobstate.task_results import task_of, task_result
from jobstate.tasks_compat import TaskContext, normalize_json, task_started

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = ["Attempt", "ExecutionPool", "Outcome", "class_path"]

logger = logging.getLogger("jobstate.worker")


class _State(enum.Enum):
    CLAIMED = "claimed"
    RUNNING = "running"
    ENDED = "ended"
    ABANDONED = "abandoned"
    HANDED_BACK = "handed back"


@dataclass(eq=False)
class Outcome:
    """How one attempt ended: the attempt as its log will keep it, the (JSON) return
    value of a success, how long it ran and, for a task that raised, the exception (for
    ``task_finished``; the report drops it once sent, with the frames it holds)."""

    attempt: Attempt
    record: TaskAttempt
    return_value: Any = None
    duration: float = 0.0
    exception: BaseException | None = field(default=None, repr=False)


@dataclass(eq=False)
class Attempt:
    """One claimed task on its way through this worker."""

    job: Job
    alias: str
    worker_id: str
    sender: type
    timeout: float | None
    #: When a thread started the attempt (monotonic), for its timeout.
    started_at: float | None = None
    #: The task, once the attempt has loaded it (``None``: not yet, or it did not import).
    task: Any = None
    #: Set when a lease renewal found the claim gone (the task was recovered elsewhere).
    claim_lost: bool = False
    _state: _State = _State.CLAIMED
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def deadline(self) -> float | None:
        """The monotonic instant past which the attempt times out (once started)."""
        if self.timeout is None or self.started_at is None:
            return None
        return self.started_at + self.timeout

    @property
    def running(self) -> bool:
        return self._state is _State.RUNNING

    @property
    def settled_elsewhere(self) -> bool:
        """Abandoned or handed back: the worker settled it, not its thread."""
        return self._state in (_State.ABANDONED, _State.HANDED_BACK)

    def _move(self, allowed: tuple[_State, ...], to: _State) -> bool:
        with self._lock:
            if self._state not in allowed:
                return False
            self._state = to
            if to is _State.RUNNING:
                self.started_at = time.monotonic()
            return True

    def hand_back(self) -> bool:
        """Take back an attempt no thread has started; ``False`` once one has."""
        return self._move((_State.CLAIMED,), _State.HANDED_BACK)

    def abandon(self) -> bool:
        """Give up on a running attempt; ``False`` when it has already ended."""
        return self._move((_State.RUNNING,), _State.ABANDONED)

    def execute(self) -> Outcome | None:
        """Run the task in the calling thread; ``None`` when the attempt was handed
        back before it started or abandoned while it ran."""
        if not self._move((_State.CLAIMED,), _State.RUNNING):
            return None
        started = time.monotonic()
        try:
            record, value, error = self._call()
        # Whatever escapes running the task (giving back its connections, say) fails
        # the attempt: a thread never ends with its attempt unsettled.
        except BaseException as exc:
            record, value, error = failure(self.worker_id, self.job.claimed_at, exc), None, exc
        outcome = Outcome(self, record, value, time.monotonic() - started, error)
        return outcome if self._move((_State.RUNNING,), _State.ENDED) else None

    def fail_unsettled(self, exc: BaseException) -> Outcome | None:
        """The outcome of an attempt whose thread failed outside the task (which
        :meth:`execute` already guards): failed, naming ``exc``'s class only, as
        nothing of it is trusted; ``None`` when it was settled elsewhere."""
        if not self._move((_State.CLAIMED, _State.RUNNING), _State.ENDED):
            return None
        path = storable_class_path(type(exc))
        record = TaskAttempt(
            worker_id=self.worker_id,
            started_at=self.job.claimed_at,
            finished_at=timezone.now(),
            outcome=AttemptOutcome.FAILED,
            exception_class_path=path,
            traceback=f"{path} (raised while the worker ran the attempt)\n",
        )
        return Outcome(self, record)

    def _call(self) -> tuple[TaskAttempt, Any, BaseException | None]:
        job = self.job
        started_at = job.claimed_at
        try:
            task = self.task = task_of(job, self.alias)
            result = task_result(job, self.alias, task)
            task_started.send(self.sender, task_result=result)
            args, kwargs = result.args, result.kwargs
            if task.takes_context:
                value = task.call(TaskContext(task_result=result), *args, **kwargs)
            else:
                value = task.call(*args, **kwargs)
            stored = _storable(value)
        # The task is the host's code: whatever it raises (SystemExit included, which in
        # a thread would end it silently) is that attempt's failure, as in Django's own
        # ImmediateBackend.
        except BaseException as exc:
            return failure(self.worker_id, started_at, exc), None, exc
        finally:
            # What a request's end does: give back the connections the task used, or
            # drop them when CONN_MAX_AGE says so or they broke.
            close_old_connections()
        record = TaskAttempt(
            worker_id=self.worker_id,
            started_at=started_at,
            finished_at=timezone.now(),
            outcome=AttemptOutcome.SUCCESSFUL,
        )
        return record, stored, None


def failure(worker_id: str, started_at: Any, exc: BaseException) -> TaskAttempt:
    """The log entry of an attempt that raised ``exc``. Its text is made storable here,
    and an exception whose ``__str__`` raises still gets one (see
    :func:`~jobstate.task_log.exception_message`)."""
    return TaskAttempt(
        worker_id=worker_id,
        started_at=started_at,
        finished_at=timezone.now(),
        outcome=AttemptOutcome.FAILED,
        exception_class_path=storable_class_path(type(exc)),
        traceback=exception_traceback(exc),
        message=exception_message(exc),
    )


def class_path(cls: type) -> str:
    """``module.QualifiedName`` of a class, the form ``TaskError`` records."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _storable(value: Any) -> Any:
    """The return value as the job will keep it (JSON: tuples become lists), or
    :class:`~jobstate.exceptions.TaskReturnValueNotJSON` naming why it cannot be."""
    try:
        return ensure_json(normalize_json(value), field="the task's return value")
    except (TypeError, ValueError) as exc:
        reason = str(exc) if isinstance(exc, InvalidPayload) else f"it is not JSON ({exc})"
        raise TaskReturnValueNotJSON(
            f"the task returned a {type(value).__name__} that cannot be stored: {reason}"
        ) from exc


class ExecutionPool:
    """``size`` threads running attempts; see the module docstring."""

    def __init__(self, size: int, on_done: Callable[[Outcome], None], *, name: str) -> None:
        self.size = size
        self._on_done = on_done
        self._name = name
        self._work: queue.SimpleQueue[Attempt | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._serial = 0
        for _ in range(size):
            self._spawn()

    def submit(self, attempt: Attempt) -> None:
        self._work.put(attempt)

    def abandon(self, attempt: Attempt) -> bool:
        """Give up on a running attempt and start a thread in its place; ``False`` (and
        nothing done) when the attempt has already ended."""
        if not attempt.abandon():
            return False
        self._spawn()
        return True

    def stop(self) -> None:
        """Let every thread end once it has no attempt left; abandoned threads end when
        their task returns. Threads are daemons: the process does not wait for them."""
        with self._lock:
            alive = len(self._threads)
        for _ in range(alive):
            self._work.put(None)

    def _spawn(self) -> None:
        with self._lock:
            self._serial += 1
            thread = threading.Thread(
                target=self._serve, name=f"{self._name}-{self._serial}", daemon=True
            )
            self._threads.add(thread)
        thread.start()

    def _serve(self) -> None:
        try:
            while True:
                attempt = self._work.get()
                if attempt is None:
                    return
                try:
                    outcome = attempt.execute()
                # execute() settles whatever the task raises; this is the last guard, so
                # the slot is never lost and the attempt's lease not renewed forever.
                except BaseException as exc:
                    logger.exception("Running task %s failed outside the task", attempt.job.id)
                    outcome = attempt.fail_unsettled(exc)
                if outcome is not None:
                    self._on_done(outcome)
                elif attempt.settled_elsewhere and attempt.started_at is not None:
                    # Abandoned: a fresh thread has taken this one's place.
                    return
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
            connections.close_all()
