"""Models: the durable state. States are QuerySet methods; transitions live in the stores.

One module per table family: :mod:`~jobstate.models.runs`, :mod:`~jobstate.models.jobs`,
:mod:`~jobstate.models.ledger` (audit entries, runtime locks) and
:mod:`~jobstate.models.outbox` (notifications, delivery attempts and replays, approval
decisions), :mod:`~jobstate.models.bulk_operations` (the console's bulk operations),
:mod:`~jobstate.models.schedules` (periodic schedules and their occurrences) and
:mod:`~jobstate.models.fleet` (registered workers, paused queues) and
:mod:`~jobstate.models.console` (the Overview page's entry among the admin's models, a
proxy without a table). Everything is importable from ``jobstate.models``.
"""

from jobstate.core.states import JobRunStatus, JobStatus
from jobstate.models.bulk_operations import BulkAction, BulkOperation, BulkState
from jobstate.models.console import Overview
from jobstate.models.fleet import (
    NO_QUEUE,
    QUEUE_PAUSE_UNIQUE,
    WORKER_UNIQUE_ID,
    QueuePause,
    Worker,
    WorkerKind,
    WorkerQuerySet,
)
from jobstate.models.job_identity import (
    JOB_UNIQUE_TASK,
    UNIQUE_HOLD_SQL,
    time_ordered_uuid,
    unique_hold,
)
from jobstate.models.jobs import (
    JOB_UNIQUE_REQUEST_ID,
    RUNTIME_LOCK_PKEY,
    TASK_DUE,
    Job,
    JobQuerySet,
    thread_blockers,
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
from jobstate.models.schedules import (
    ONCE_PER_SLOT,
    SCHEDULE_UNIQUE_KEY,
    CatchUp,
    OccurrenceTrigger,
    Schedule,
    ScheduleKind,
    ScheduleOccurrence,
    ScheduleQuerySet,
)

__all__ = [
    "JOB_UNIQUE_REQUEST_ID",
    "JOB_UNIQUE_TASK",
    "NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY",
    "NO_QUEUE",
    "ONCE_PER_SLOT",
    "ONE_RUNNING_PER_OVERLAP_KEY",
    "QUEUE_PAUSE_UNIQUE",
    "RUNTIME_LOCK_PKEY",
    "SCHEDULE_UNIQUE_KEY",
    "TASK_DUE",
    "UNIQUE_HOLD_SQL",
    "WORKER_UNIQUE_ID",
    "ApprovalDecision",
    "AuditEntry",
    "AuditEntryQuerySet",
    "BulkAction",
    "BulkOperation",
    "BulkState",
    "CatchUp",
    "DeliveryAttempt",
    "DeliveryReplay",
    "Job",
    "JobQuerySet",
    "JobRun",
    "JobRunQuerySet",
    "JobRunStatus",
    "JobStatus",
    "Notification",
    "OccurrenceTrigger",
    "Overview",
    "QueuePause",
    "RuntimeLock",
    "RuntimeLockQuerySet",
    "Schedule",
    "ScheduleKind",
    "ScheduleOccurrence",
    "ScheduleQuerySet",
    "Worker",
    "WorkerKind",
    "WorkerQuerySet",
    "thread_blockers",
    "time_ordered_uuid",
    "unique_hold",
]
