"""django-jobstate: durable, concurrency-safe state for background work.

Importing this package never imports models, so it is safe in settings modules and
in ``AppConfig`` code. Models live in :mod:`jobstate.models`, stores in
:mod:`jobstate.stores`.
"""

from importlib.metadata import PackageNotFoundError, version

from jobstate import moved
from jobstate.exceptions import (
    DuplicateRequestId,
    IdempotencyConflict,
    ImmutableField,
    InvalidJobState,
    InvalidPatch,
    InvalidPayload,
    JobStateError,
    LockHeld,
    StoreConflict,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
    ThreadQuotaExceeded,
    UnknownOperationsJob,
)
from jobstate.stores.base import (
    CompletionOutcome,
    JobRunStatus,
    JobRunStore,
    JobStatus,
    StateStore,
    Trigger,
    runtime_lock,
)

# Old module paths keep importing for one release (see jobstate.moved).
moved.install()

try:
    __version__ = version("django-jobstate")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CompletionOutcome",
    "DuplicateRequestId",
    "IdempotencyConflict",
    "ImmutableField",
    "InvalidJobState",
    "InvalidPatch",
    "InvalidPayload",
    "JobRunStatus",
    "JobRunStore",
    "JobStateError",
    "JobStatus",
    "LockHeld",
    "StateStore",
    "StoreConflict",
    "StoreError",
    "StoreTimeout",
    "StoreUnavailable",
    "ThreadQuotaExceeded",
    "Trigger",
    "UnknownOperationsJob",
    "__version__",
    "runtime_lock",
]
