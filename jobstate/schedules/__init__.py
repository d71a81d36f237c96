"""Periodic schedules kept in the database: each slot enqueued exactly once, however
many schedulers run.

Declare schedules in settings::

    JOBSTATE = {"SCHEDULES": {
        "nightly-close": {"task": "billing.tasks.close_books", "cron": "30 2 * * *",
                          "timezone": "Europe/Berlin"},
        "reap": {"operations_job": "ops.reap-stale", "cron": "*/5 * * * *"},
    }}

and let every ``jobstate_worker`` (or ``manage.py enqueue_due_schedules`` from cron, or
the beat entry) call :func:`enqueue_due`. The declarations are checked by ``manage.py
check`` (``jobstate.E030``, ``jobstate.E031``); a broken one is skipped by every
evaluation, which logs why, while the others run. Each schedule has a row
(:class:`~jobstate.models.Schedule`) kept in step with settings by
:func:`sync_schedules`, and each enqueue an occurrence row whose unique key makes a slot
enqueued once. See ``docs/schedules.md``.
"""

from jobstate.schedules.control import pause_schedule, resume_schedule, run_schedule_now
from jobstate.schedules.definitions import ScheduleDefinition
from jobstate.schedules.health import schedule_problem
from jobstate.schedules.service import (
    EnqueuedOccurrence,
    ScheduleFailures,
    SchedulePass,
    SyncReport,
    declared_schedules,
    enqueue_due,
    evaluate_schedules,
    row_definition,
    schedule_declarations,
    schedule_problems,
    sync_schedules,
)
from jobstate.schedules.targets import target_problems
from jobstate.schedules.worker_pass import WorkerSchedulePass

__all__ = [
    "EnqueuedOccurrence",
    "ScheduleDefinition",
    "ScheduleFailures",
    "SchedulePass",
    "SyncReport",
    "WorkerSchedulePass",
    "declared_schedules",
    "enqueue_due",
    "evaluate_schedules",
    "pause_schedule",
    "resume_schedule",
    "row_definition",
    "run_schedule_now",
    "schedule_declarations",
    "schedule_problem",
    "schedule_problems",
    "sync_schedules",
    "target_problems",
]
