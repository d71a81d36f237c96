"""The django.tasks task a schedule of an operations job enqueues.

A schedule that names ``operations_job`` enqueues this task on its backend (with its
queue and priority); a ``jobstate_worker`` runs it, and it runs the operations job
through :class:`~jobstate.operations.job_runner.JobRunner`, so the job's overlap guard, heartbeats,
deadline and run record are what they are for any other start. The run's trigger is
``SCHEDULER``, triggered by the schedule's key and slot.

Imported only when a schedule of an operations job is enqueued or run: on Django 5.2 it
needs the django-tasks backport.
"""

from __future__ import annotations

from typing import Any

from jobstate.operations.job_runner import JobRunner
from jobstate.stores.base import Trigger
from jobstate.tasks.compat import task

__all__ = ["SCHEDULER_SOURCE", "run_scheduled_operations_job"]

#: The trigger source of the runs a schedule starts.
SCHEDULER_SOURCE = "SCHEDULER"


@task
def run_scheduled_operations_job(
    job_key: str, input: Any, schedule: str, slot: str
) -> dict[str, Any]:
    """Run operations job ``job_key`` with ``input`` for ``schedule``'s occurrence at
    ``slot`` and return the run's result as a dict.

    A run that fails, times out or is skipped (another run holds the job's overlap key)
    is recorded by the runner and returned, not raised: the task succeeded in starting
    it, and a retry behind the runner's back would start it again."""
    runner = JobRunner()
    result = runner.execute(job_key, input, Trigger(SCHEDULER_SOURCE, f"{schedule} @ {slot}"))
    return result.as_dict()
