"""Running task attempts in threads.

An :class:`ExecutionPool` keeps ``size`` threads; each takes the next :class:`Attempt`
handed to it, runs the task, and hands the :class:`Outcome` back through a callback.

An attempt that runs past its timeout is *interrupted*: the worker raises
:class:`~jobstate.exceptions.TaskTimeLimitExceeded` inside the task's thread
(``PyThreadState_SetAsyncExc``, as dramatiq's time limits do). The exception lands the
next time the thread runs Python code, so a task blocked in a C call (a socket read, a
sleep) gets it when that call returns. The attempt ends, as timed out, only once its
thread has left the task's code: until then it keeps its slot and its lease, so its
next attempt cannot start anywhere while this one still runs. A worker whose
interrupted task does not stop at all gives up on it (:meth:`Attempt.abandon`) and
exits (see :mod:`.loop`). An attempt whose task an operator cancelled is interrupted
the same way, with :class:`~jobstate.exceptions.TaskCancelled` (see :mod:`.cancellation`).

Which of "the task ended", "the worker interrupted it" and "the worker gave up on it"
happened first is decided under the attempt's lock, so an attempt is settled exactly
once and is interrupted at most once. An atomic task's body runs in a transaction with
its report (:mod:`.atomic`), which :meth:`Attempt.seal` closes to interrupts first.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from asgiref.sync import iscoroutinefunction
from django.db import connections
from django.utils import timezone

from jobstate.core.attempt_log import (
    AttemptOutcome,
    AttemptSettlement,
    TaskAttempt,
    exception_message,
    exception_traceback,
    storable_class_path,
)
from jobstate.core.jsonvalues import ensure_json
from jobstate.exceptions import (
    InvalidPayload,
    TaskCancelled,
    TaskReturnValueNotJSON,
    TaskTimedOut,
    TaskTimeLimitExceeded,
)
from jobstate.tasks.compat import TaskContext, normalize_json, task_started
from jobstate.tasks.policies import StoredPolicy
from jobstate.tasks.results import task_of, task_result
from jobstate.tasks.worker.task_connections import release_task_connections

if TYPE_CHECKING:
    from jobstate.models import Job
    from jobstate.stores.base import CompletionResult

__all__ = [
    "AtomicRun",
    "Attempt",
    "ExecutionPool",
    "Outcome",
    "cancelled",
    "class_path",
    "ended_by_worker",
    "timed_out",
]

#: What the worker raises in a task's thread to stop it: past its timeout, or cancelled.
_INTERRUPTS = (TaskTimeLimitExceeded, TaskCancelled)

logger = logging.getLogger("jobstate.worker")

#: Runs an atomic task's body (the callable) in one transaction with the attempt's
#: success report, and returns the success's log entry and value (see :mod:`.atomic`).
AtomicRun = Callable[["Attempt", Callable[[], Any]], tuple[TaskAttempt, Any]]


class _State(enum.Enum):
    CLAIMED = "claimed"
    RUNNING = "running"
    #: Past its timeout or cancelled: the interrupt was raised in its thread, which has
    #: not left the task's code yet.
    INTERRUPTED = "interrupted"
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
    """What the task raised, for ``task_finished`` (dropped once the signal is sent)."""
    #: A retry of this attempt is not due before this long from its report: its thread
    #: may still run until the worker's process has exited.
    retry_hold: timedelta | None = None
    #: The task fails for good, whatever attempts remain.
    final: bool = False


@dataclass(eq=False)
class Attempt:
    """One claimed task on its way through this worker."""

    job: Job
    alias: str
    worker_id: str
    sender: type
    #: What the job's stored policy and the backend's ``OPTIONS`` say together.
    policy: StoredPolicy
    #: When a thread started the attempt (monotonic), for its timeout.
    started_at: float | None = None
    #: The task, once the attempt has loaded it (``None``: not yet, or it did not import).
    task: Any = None
    #: Set when a lease renewal found the claim gone (the task was recovered elsewhere).
    claim_lost: bool = False
    #: The ``ImportError`` of loading the task's dotted path: not the task's failure,
    #: this worker's code lacks the task (the loop hands it back).
    unloadable: ImportError | None = None
    #: When the worker interrupted the attempt (monotonic), past its timeout or cancelled.
    interrupted_at: float | None = None
    #: Cancelled by an operator (its job was rejected and its claim revoked).
    cancelled: bool = False
    #: Runs the body of a task whose policy is atomic (``None``: this worker has none).
    atomic: AtomicRun | None = field(default=None, repr=False)
    #: What the report written in an atomic task's committed transaction did, or whether
    #: its claim was gone (the transaction rolled back): the worker sends no other.
    settled: tuple[AttemptSettlement, CompletionResult] | None = None
    _thread_id: int | None = None
    _state: _State = _State.CLAIMED
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def timeout(self) -> timedelta | None:
        """How long the attempt may run (``None``: for ever)."""
        return self.policy.timeout

    @property
    def deadline(self) -> float | None:
        """The monotonic instant past which the attempt times out (once started)."""
        if self.policy.timeout is None or self.started_at is None:
            return None
        return self.started_at + self.policy.timeout.total_seconds()

    @property
    def running(self) -> bool:
        return self._state is _State.RUNNING

    @property
    def ended(self) -> bool:
        """Its thread has left the task's code: only its report is left to write."""
        return self._state is _State.ENDED

    @property
    def interrupted(self) -> bool:
        """Interrupted past its timeout, and its thread has not stopped yet."""
        return self._state is _State.INTERRUPTED

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
                self._thread_id = threading.get_ident()
            return True

    def hand_back(self) -> bool:
        """Take back an attempt no thread has started; ``False`` once one has."""
        return self._move((_State.CLAIMED,), _State.HANDED_BACK)

    @property
    def interruptible(self) -> bool:
        """Whether the interrupt reaches the task's code: not for an ``async def`` task,
        whose coroutine runs in an event loop of another thread (``async_to_sync``)
        and would go on there."""
        return self.task is None or not iscoroutinefunction(self.task.func)

    def interrupt(self, error: type[BaseException] = TaskTimeLimitExceeded) -> bool:
        """Mark the running attempt interrupted and raise ``error`` in its thread (when
        :attr:`interruptible`): :class:`~jobstate.exceptions.TaskTimeLimitExceeded` past
        its timeout, :class:`~jobstate.exceptions.TaskCancelled` when cancelled.
        ``False`` (and nothing done) when it is not running any more or was interrupted
        already."""
        with self._lock:
            if self._state is not _State.RUNNING or self._thread_id is None:
                return False
            self._state = _State.INTERRUPTED
            self.interrupted_at = time.monotonic()
            self.cancelled = error is TaskCancelled
            if self.interruptible:
                _raise_in_thread(self._thread_id, error)
            return True

    def seal(self) -> bool:
        """End a running attempt before its atomic transaction writes the report, so no
        interrupt can land in the report or the commit. ``False`` (an interrupt still
        pending dropped: the caller rolls back and raises its own) when it was
        interrupted or given up on first."""
        with self._lock:
            if self._state is _State.RUNNING:
                self._state = _State.ENDED
                return True
            if self.interrupted_at is not None:
                _raise_in_thread(threading.get_ident(), None)
            return False

    def abandon(self) -> bool:
        """Give up on a running (or interrupted) attempt whose thread goes on: the
        worker settles it; ``False`` when it has already ended."""
        return self._move((_State.RUNNING, _State.INTERRUPTED), _State.ABANDONED)

    def execute(self) -> Outcome | None:
        """Run the task in the calling thread; ``None`` when the attempt was handed
        back before it started or abandoned while it ran. An attempt interrupted past
        its :attr:`timeout` ends as timed out."""
        if not self._move((_State.CLAIMED,), _State.RUNNING):
            return None
        started = time.monotonic()
        ended: tuple[TaskAttempt, Any, BaseException | None] | None = None
        called = False
        # The interrupt is raised once at most, wherever the thread is: in the task (the
        # task's failure, caught in _call) or, when the task had just returned, here.
        # Every step until _end has cleared it is retried past it.
        while True:
            try:
                if not called:
                    called = True
                    ended = self._run_guarded()
                state = self._end()
                break
            except _INTERRUPTS:
                continue
        duration = time.monotonic() - started
        if state is _State.ABANDONED:
            return None
        if state is _State.INTERRUPTED and self.cancelled:
            return Outcome(self, cancelled(self), duration=duration)
        if state is _State.INTERRUPTED:
            record = timed_out(self, None if ended is None else ended[:2])
            return Outcome(self, record, duration=duration)
        assert ended is not None
        record, value, error = ended
        return Outcome(self, record, value, duration, error)

    def _run_guarded(self) -> tuple[TaskAttempt, Any, BaseException | None]:
        try:
            return self._call()
        except _INTERRUPTS:
            # The interrupt landed past the task's own code: execute() settles it as
            # timed out (or cancelled).
            raise
        # Whatever else escapes running the task (giving back its connections, say)
        # fails the attempt: a thread never ends with its attempt unsettled.
        except BaseException as exc:
            return failure(self.worker_id, self.job.claimed_at, exc), None, exc

    def _end(self) -> _State:
        """Mark the attempt ended (when the worker has not given up on it) and drop an
        interrupt still pending for this thread; the state it ended from."""
        with self._lock:
            if self.interrupted_at is not None:
                _raise_in_thread(threading.get_ident(), None)
            state = self._state
            if state in (_State.RUNNING, _State.INTERRUPTED):
                self._state = _State.ENDED
            return state

    def fail_unsettled(self, exc: BaseException) -> Outcome | None:
        """The outcome of an attempt whose thread failed outside the task (which
        :meth:`execute` already guards): failed, naming ``exc``'s class only, as
        nothing of it is trusted; ``None`` when it was settled elsewhere."""
        if not self._move((_State.CLAIMED, _State.RUNNING, _State.INTERRUPTED), _State.ENDED):
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
            try:
                task = self.task = task_of(job, self.alias)
            except ImportError as exc:
                # Its module or function is missing here (older code than the
                # enqueuer's): not the task's failure; the loop hands it back.
                self.unloadable = exc
                return failure(self.worker_id, started_at, exc), None, exc
            result = task_result(job, self.alias, task)
            task_started.send(self.sender, task_result=result)
            args, kwargs = list(result.args), result.kwargs
            if task.takes_context:
                args.insert(0, TaskContext(task_result=result))
            if self.policy.atomic and self.atomic is not None:
                done, stored = self.atomic(self, lambda: _storable(task.call(*args, **kwargs)))
                return done, stored, None
            stored = _storable(task.call(*args, **kwargs))
        # The task is the host's code: whatever it raises (SystemExit included, which in
        # a thread would end it silently) is that attempt's failure, as in Django's own
        # ImmediateBackend.
        except BaseException as exc:
            return failure(self.worker_id, started_at, exc), None, exc
        finally:
            # What a request's end does to the task's connections (and an open block).
            left_open = release_task_connections()
        if left_open is not None:
            return failure(self.worker_id, started_at, left_open), None, left_open
        record = TaskAttempt(
            worker_id=self.worker_id,
            started_at=started_at,
            finished_at=timezone.now(),
            outcome=AttemptOutcome.SUCCESSFUL,
        )
        return record, stored, None


def timed_out(
    attempt: Attempt,
    ended: tuple[TaskAttempt, Any] | None = None,
    *,
    note: str = "",
) -> TaskAttempt:
    """The log entry of an attempt that ran past its timeout: a
    :class:`~jobstate.exceptions.TaskTimedOut`, with the traceback of the interrupt
    (where the task was) when the task raised it (``ended``), and ``note``."""
    message = f"the task ran longer than its timeout of {attempt.timeout}"
    if note:
        message = f"{message}; {note}"
    trace = ""
    if ended is not None and ended[0].exception_class_path == class_path(TaskTimeLimitExceeded):
        trace = f"{ended[0].traceback}\n"
    return ended_by_worker(attempt, AttemptOutcome.TIMED_OUT, TaskTimedOut, message, before=trace)


def cancelled(attempt: Attempt) -> TaskAttempt:
    """The log entry of an attempt stopped because its task was cancelled. The store
    logged the cancel already and refuses this report (the claim is revoked); the worker
    keeps it for its own log and ``task_finished`` is not sent."""
    return ended_by_worker(
        attempt, AttemptOutcome.CANCELLED, TaskCancelled, "the task was cancelled"
    )


def ended_by_worker(
    attempt: Attempt,
    outcome: AttemptOutcome,
    error: type[BaseException],
    message: str,
    *,
    before: str = "",
) -> TaskAttempt:
    """The log entry of an attempt the worker ended (timed out, given up on, failed
    for good) with ``error`` and ``message``; ``before`` goes ahead of the error's line
    in the traceback."""
    path = class_path(error)
    return TaskAttempt(
        worker_id=attempt.worker_id,
        started_at=attempt.job.claimed_at,
        finished_at=timezone.now(),
        outcome=outcome,
        exception_class_path=path,
        traceback=f"{before}{path}: {message}\n",
        message=message,
    )


def _raise_in_thread(thread_id: int, exc_type: type[BaseException] | None) -> None:
    """Raise ``exc_type`` in the thread ``thread_id`` the next time it runs Python code;
    ``None`` drops one still pending."""
    exc = None if exc_type is None else ctypes.py_object(exc_type)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), exc)


def failure(worker_id: str, started_at: Any, exc: BaseException) -> TaskAttempt:
    """The log entry of an attempt that raised ``exc``. Its text is made storable here,
    and an exception whose ``__str__`` raises still gets one (see
    :func:`~jobstate.core.attempt_log.exception_message`)."""
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
    except (TypeError, ValueError, RecursionError) as exc:
        if isinstance(exc, RecursionError):  # Django's normalize_json recurses
            reason = "it is nested too deeply (or holds a cycle)"
        else:
            reason = str(exc) if isinstance(exc, InvalidPayload) else f"it is not JSON ({exc})"
        kind = type(value).__name__
        raise TaskReturnValueNotJSON(
            f"the task returned a value of type {kind!r} that cannot be stored: {reason}"
        ) from exc


class ExecutionPool:
    """``size`` threads running attempts; see the module docstring."""

    def __init__(
        self,
        size: int,
        on_done: Callable[[Outcome], None],
        *,
        name: str,
    ) -> None:
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
                    # Abandoned: the worker is stopping.
                    return
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())
            connections.close_all()
