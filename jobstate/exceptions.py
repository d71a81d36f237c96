"""Exceptions raised by jobstate.

Every error the package raises on purpose derives from :class:`JobStateError`, so a host
can catch the whole family at once. Bad input errors also derive from ``ValueError`` or
``TypeError`` so generic validation code keeps working, and store failures
(:class:`StoreError` and its subclasses) from Django's ``DatabaseError`` so generic
database error handling does. Do not raise ``JobStateError`` directly; raise the subclass
that names the failure.
"""

from __future__ import annotations

from typing import ClassVar

from django.db import DatabaseError


class JobStateError(Exception):
    """Base class of every jobstate error. Do not raise directly."""


class InvalidPayload(JobStateError, ValueError):
    """A value handed to a store cannot be stored as strict JSON (NaN, cycles, objects,
    non-string keys, NUL characters) or is too large. Nothing was written."""


class InvalidJobState(JobStateError, ValueError):
    """An argument names a status, duration or instant the operation cannot accept."""


class StoreError(JobStateError, DatabaseError):
    """The store failed for a reason other than a documented conflict (connection lost,
    serialization failure, unexpected constraint). The original error is the cause.

    The database stores raise one of the subclasses below when the cause is known, and
    this class itself for anything else (an unexpected constraint, a data error, a
    programming error); ``retryable`` says whether trying again can help. It also derives
    from Django's ``DatabaseError``, so host code that already handles database errors
    around store calls keeps working. The message names the operation, the kind of
    failure and the SQLSTATE, never the values involved; the driver's own message is on
    the chained cause. ``sqlstate`` is the five-character code, when the driver gave one.
    """

    retryable: ClassVar[bool] = False
    """Whether trying the operation again can succeed without changing anything."""

    def __init__(self, message: str, *, sqlstate: str | None = None) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class StoreUnavailable(StoreError):
    """The database could not be reached or the connection was lost: refused or failed
    connection (SQLSTATE class 08), the server shutting down or starting up (57P01,
    57P02, 57P03), too many connections (53300), a session killed for idling (25P03,
    57P05), or a closed connection.

    Whatever the call was writing was not committed unless its commit reached the
    server just before the connection died; its transitions are conditional, so trying
    again is safe and answers from the current state. Outside a transaction the store
    has already dropped the dead connection, so the next call on the same thread
    reconnects. Inside the host's ``transaction.atomic()`` block the whole block is lost:
    it rolls back, and Django drops the connection when the block ends."""

    retryable = True


class StoreConflict(StoreError):
    """The database aborted the transaction to resolve a conflict with a concurrent one:
    a deadlock (40P01) or a serialization failure (40001) under REPEATABLE READ or
    SERIALIZABLE isolation. Nothing of the transaction was written; retry the whole
    transaction (the host's ``atomic()`` block when the call ran inside one)."""

    retryable = True


class StoreTimeout(StoreError):
    """The statement ran out of time: ``statement_timeout`` cancelled it (57014) or a lock
    could not be taken within ``lock_timeout`` or ``NOWAIT`` (55P03); on SQLite, the
    database stayed locked for the whole busy timeout. Nothing was written; retry later,
    when the lock holder or the load is gone."""

    retryable = True


class UnsupportedStoreOperation(JobStateError, NotImplementedError):
    """The store does not offer this optional operation: its ``supports_*`` flag for it
    is off (see :class:`~jobstate.stores.base.StateStore`). Raised before anything is
    checked or written. It is also a ``NotImplementedError``, which is what such a call
    raised before stores declared their capabilities."""


class UnknownOperationsJob(JobStateError, LookupError):
    """No operations job is registered under that key."""


class OperationsJobInputError(JobStateError, ValueError):
    """The input given to an operations job was rejected before anything was written."""


class ImproperlyConfiguredStore(JobStateError):
    """The ``JOBSTATE`` settings name a store that cannot be loaded."""


class InvalidOperationsJob(JobStateError, ValueError):
    """An operations job definition is malformed (body, overlap policy, timeout or input
    schema). Raised when the job is registered, so a bad definition fails at start-up."""


class InvalidJobKey(InvalidOperationsJob):
    """An operations job key is not shaped ``domain.action``: lower-case letters, digits
    and hyphens on both sides of one dot, at most 100 characters."""


class DuplicateJobKey(InvalidOperationsJob):
    """Two different operations jobs claim the same key."""


class InvalidRunnerConfiguration(JobStateError, ValueError):
    """A ``JobRunner`` option (or the ``JOBSTATE`` setting it defaults to) is out of range,
    for example a liveness budget shorter than two heartbeat intervals."""


class TransactionNotAllowed(JobStateError, RuntimeError):
    """The call must run outside a database transaction: its work is seen by other
    connections (heartbeats, other processes) only once committed."""


class DuplicateRequestId(JobStateError):
    """``create_job`` was given a ``request_id`` that an existing job already has.
    Nothing was written; ``request_id`` names the key."""

    def __init__(self, message: str, *, request_id: str) -> None:
        super().__init__(message)
        self.request_id = request_id


class IdempotencyConflict(JobStateError):
    """``enqueue`` was given a ``request_id`` that an existing job has, with a different
    payload. Nothing was written; ``fields`` names the fields that differ."""

    def __init__(self, message: str, *, request_id: str, fields: tuple[str, ...]) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.fields = fields


class UniqueTaskHeld(JobStateError):
    """A requeue would put a unique task back into a state its key covers while another
    job of its backend holds that key (a duplicate enqueued since it finished). Nothing
    was written: finish or cancel the holder first."""


class ThreadQuotaExceeded(JobStateError):
    """``enqueue`` refused a new job because its thread already has
    ``JOBSTATE['THREAD_INFLIGHT_QUOTA']`` queued, running or dispatched jobs. Nothing
    was written; retry once some of them finish."""

    def __init__(self, message: str, *, thread_id: int, inflight: int, quota: int) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.inflight = inflight
        self.quota = quota


class InvalidPatch(JobStateError, ValueError):
    """The fields of a job patch (or of a new job) name an unknown or disallowed field,
    clear a required field with ``None``, or hold a value of the wrong type. Nothing was
    written; ``field`` names the offending field."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class ImmutableField(InvalidPatch):
    """A patch names a field that identifies the job (``id``, ``request_id``,
    ``created_at``) or that the store maintains itself (``updated_at``)."""


class LockHeld(JobStateError):
    """``runtime_lock`` could not take ``lock_key`` because another owner holds it."""

    def __init__(self, message: str, *, lock_key: str) -> None:
        super().__init__(message)
        self.lock_key = lock_key


class InvalidNotification(JobStateError, ValueError):
    """A notification request is malformed: not a ``NotificationRequest``, an unknown
    channel (not in ``JOBSTATE['CHANNELS']``), an empty or over-long destination or key,
    or a payload that is not a strict JSON object. Nothing was written."""


class DuplicateNotification(JobStateError):
    """A notification's ``idempotency_key`` is already in the outbox (or repeated within
    one call). The whole transition was rolled back; ``idempotency_key`` names the key."""

    def __init__(self, message: str, *, idempotency_key: str) -> None:
        super().__init__(message)
        self.idempotency_key = idempotency_key


class DeliveryFailed(JobStateError):
    """A relay channel could not deliver a notification. The relay records the message
    as the attempt's error and retries later, so it must never contain a secret."""


# --- django.tasks ------------------------------------------------------------------------
# The errors below are recorded in a task's ``TaskResult.errors`` by their class
# path, so ``TaskError.exception_class`` resolves to them.


class TaskTimedOut(JobStateError, TimeoutError):
    """A task attempt ran past its backend's ``TIMEOUT``. The worker interrupted it
    (:class:`TaskTimeLimitExceeded`), failed the attempt once its thread had stopped,
    and retries it while attempts remain."""


class TaskTimeLimitExceeded(BaseException):
    """Raised *inside* a task's thread when the attempt runs past ``TIMEOUT``, to stop
    the task's code. It derives from ``BaseException`` (like ``KeyboardInterrupt``), so
    an ``except Exception`` in the task does not swallow it while ``finally`` blocks and
    context managers still run; catch it only to clean up, and raise it again. The
    attempt is recorded as :class:`TaskTimedOut`. A task that keeps running past the
    interrupt makes its worker exit (see the worker's documentation)."""


class TaskCancelled(BaseException):
    """Raised *inside* a running task's thread when an operator cancels the task
    (``StateStore.cancel_job``, the admin's Cancel). Like :class:`TaskTimeLimitExceeded`
    it derives from ``BaseException``, so ``except Exception`` does not swallow it while
    ``finally`` blocks still run; catch it only to clean up, and raise it again. The job
    is already ``rejected`` when the task sees it: nothing the attempt returns or raises
    afterwards is recorded, and it is never retried. Also the class path of the
    cancelled attempt's error in the attempt log."""


class UnknownTask(JobStateError, ImportError):
    """No worker that claimed the task could import its dotted path within the
    backend's ``UNKNOWN_TASK_TIMEOUT`` of its enqueueing: the task failed without
    running. Until then each worker that cannot import it hands it back, uncounted,
    for a worker with newer code."""


class WorkerLost(JobStateError):
    """The worker running a task attempt stopped renewing its lease (it was killed, lost
    its database connection or hung) and the attempt was recovered by a sweep or by
    another worker. The task may have run partly, or even completely."""


class TaskReturnValueNotJSON(JobStateError, TypeError):
    """A task returned a value that cannot be stored as strict JSON, so ``get_result``
    could not give it back unchanged. The attempt failed with this error."""


class TaskReportRefused(JobStateError):
    """The store refused to record how a task attempt ended (the worker's report, or
    the recovery of a lost attempt), for a reason trying again cannot cure. The task was
    settled as failed with this error, whatever attempts it had left, and the worker
    (or the sweep) went on with its other tasks; the refusal is in the traceback."""


class AttemptsLeftOut(JobStateError):
    """Not raised: stands in ``TaskResult.errors`` for the attempts a long attempt log
    left out (it keeps the first and the latest attempts of a task). Its traceback says
    which attempts, and how many."""


class ScheduleError(JobStateError):
    """A schedule could not be evaluated or enqueued: its task or operations job cannot
    be found or refuses its arguments, or its backend cannot hold it. The schedule's
    key is in the message; other schedules are evaluated all the same."""


class UnknownSchedule(JobStateError, LookupError):
    """No schedule has that key (or it was removed from settings)."""
