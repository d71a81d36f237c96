"""Store contracts.

A store is to jobstate what a session backend is to ``django.contrib.sessions``: a class
whose docstrings state the guarantees, loaded by dotted path from ``settings.JOBSTATE``.
The database stores in :mod:`jobstate.stores.database` implement them with the Django
ORM; :mod:`jobstate.testing` ships in-memory reference stores and contract test cases
that any implementation (ours or a host's) must pass.

This module is the contracts' public address: the run store's lives in
:mod:`jobstate.stores.contracts.run_store`, the state store's in
:mod:`jobstate.stores.contracts.state_store`
and the vocabulary they speak in :mod:`jobstate.core.states`.
"""

from __future__ import annotations

# The vocabulary lives in jobstate.core.states; hosts import these names from here too.
from jobstate.core.states import (
    CLAIMED_JOB_STATUSES,
    EXPIRED_QUEUED_ERROR,
    INFLIGHT_JOB_STATUSES,
    REAPED_RUN_ERROR,
    RELEASE_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    TERMINAL_RUN_STATUSES,
    ApprovalRequeueOutcome,
    ClaimReport,
    CompletionOutcome,
    DeliveryRequeueOutcome,
    JobId,
    JobOperationalMetrics,
    JobRunStatus,
    JobStatus,
    NotificationRequest,
    NotificationState,
    Readiness,
    Trigger,
)
from jobstate.stores.contracts.run_store import JobRunSettlement, JobRunStore, NewJobRun
from jobstate.stores.contracts.state_store import (
    CompletionResult,
    NotificationOutbox,
    StateStore,
    runtime_lock,
)

__all__ = [
    "CLAIMED_JOB_STATUSES",
    "EXPIRED_QUEUED_ERROR",
    "INFLIGHT_JOB_STATUSES",
    "REAPED_RUN_ERROR",
    "RELEASE_JOB_STATUSES",
    "TERMINAL_JOB_STATUSES",
    "TERMINAL_RUN_STATUSES",
    "ApprovalRequeueOutcome",
    "ClaimReport",
    "CompletionOutcome",
    "CompletionResult",
    "DeliveryRequeueOutcome",
    "JobId",
    "JobOperationalMetrics",
    "JobRunSettlement",
    "JobRunStatus",
    "JobRunStore",
    "JobStatus",
    "NewJobRun",
    "NotificationOutbox",
    "NotificationRequest",
    "NotificationState",
    "Readiness",
    "StateStore",
    "Trigger",
    "runtime_lock",
]
