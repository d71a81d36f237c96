"""Models: the durable state. States are QuerySet methods; transitions live in the stores.

One module per table family: :mod:`~jobstate.models.runs`, :mod:`~jobstate.models.jobs`,
:mod:`~jobstate.models.ledger` (audit entries, runtime locks) and
:mod:`~jobstate.models.outbox` (notifications, delivery attempts and replays, approval
decisions). Everything is importable from ``jobstate.models``.
"""

from jobstate.models.jobs import (
    JOB_UNIQUE_REQUEST_ID,
    RUNTIME_LOCK_PKEY,
    Job,
    JobQuerySet,
    thread_blockers,
    time_ordered_uuid,
)
from jobstate.models.ledger import AuditEntry, AuditEntryQuerySet, RuntimeLock, RuntimeLockQuerySet
from jobstate.models.outbox import (
    NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY,
    ApprovalDecision,
    DeliveryAttempt,
    DeliveryReplay,
    Notification,
)
from jobstate.models.runs import ONE_RUNNING_PER_OVERLAP_KEY, JobRun, JobRunQuerySet
from jobstate.states import JobRunStatus, JobStatus

__all__ = [
    "JOB_UNIQUE_REQUEST_ID",
    "NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY",
    "ONE_RUNNING_PER_OVERLAP_KEY",
    "RUNTIME_LOCK_PKEY",
    "ApprovalDecision",
    "AuditEntry",
    "AuditEntryQuerySet",
    "DeliveryAttempt",
    "DeliveryReplay",
    "Job",
    "JobQuerySet",
    "JobRun",
    "JobRunQuerySet",
    "JobRunStatus",
    "JobStatus",
    "Notification",
    "RuntimeLock",
    "RuntimeLockQuerySet",
    "thread_blockers",
    "time_ordered_uuid",
]
