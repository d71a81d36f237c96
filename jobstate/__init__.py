"""django-jobstate: durable, concurrency-safe state for background work.

Importing this package never imports models, so it is safe in settings modules and
in ``AppConfig`` code. Models live in :mod:`jobstate.models`, stores in
:mod:`jobstate.stores`.
"""

from importlib.metadata import PackageNotFoundError, version

from jobstate.exceptions import (
    InvalidJobState,
    InvalidPayload,
    JobStateError,
    StoreError,
)
from jobstate.stores.base import JobRunStatus, JobRunStore, Trigger

try:
    __version__ = version("django-jobstate")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "InvalidJobState",
    "InvalidPayload",
    "JobRunStatus",
    "JobRunStore",
    "JobStateError",
    "StoreError",
    "Trigger",
    "__version__",
]
