"""The words a job's status reads in the console, in one place.

A task's status reads as Django's ``TaskResultStatus`` names it (READY, RUNNING,
SUCCESSFUL, FAILED), any other job's by its own label (Queued, Done, Error…), on every
page that shows one job: the list's badge, the job page, the timeline, a worker's page,
an action's confirmation and its messages. What counts tasks and other jobs together
under one status (the status filter, the Overview's cards) names both where they
differ: "Done (SUCCESSFUL)".
"""

from __future__ import annotations

from jobstate.core.states import TASK_RESULT_STATUS_NAMES, JobStatus
from jobstate.models import Job

__all__ = ["shared_status_label", "status_name", "status_word"]


def status_word(status: str, *, task: bool) -> str:
    """The status ``status`` as the console names it for a task (``task``) or any other
    job."""
    if task:
        return TASK_RESULT_STATUS_NAMES[status]
    return str(JobStatus(status).label)


def status_name(job: Job) -> str:
    """A job's status as the console names it: a task's as Django's ``TaskResultStatus``
    does (SUCCESSFUL, FAILED, READY, RUNNING), any other job's by its own label."""
    return status_word(job.status, task=job.task_path is not None)


def shared_status_label(status: str) -> str:
    """The status ``status`` where tasks and other jobs are counted together: the job's
    label, then the task's name in brackets where it reads otherwise ("Done
    (SUCCESSFUL)", "Running")."""
    label = status_word(status, task=False)
    name = status_word(status, task=True)
    return label if label.upper() == name else f"{label} ({name})"
