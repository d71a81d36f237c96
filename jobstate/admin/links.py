"""Links between the console's pages that cost no query where they are drawn: a
schedule named by its key, the schedule a run or a job came from, and the run a
scheduled operations job started.

A schedule link goes through the page that finds a schedule by key
(``jobstate_schedule_find``), as a worker's goes through ``jobstate_worker_find``
(:func:`~jobstate.admin.display.worker_link`), so a list links every row for free.
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import urlencode

from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from jobstate.admin.page_bases import admin_change_url
from jobstate.models import Job, JobRun, ScheduleOccurrence

__all__ = [
    "SCHEDULED_RUN_SOURCE",
    "job_schedule",
    "schedule_link",
    "scheduled_run",
    "scheduled_run_key",
]

#: The trigger source of the runs a schedule starts, and how their ``triggered_by``
#: names the schedule: ``"<key> @ <slot>"`` (``jobstate.schedules.operations_task``).
SCHEDULED_RUN_SOURCE = "SCHEDULER"
_KEY_SEPARATOR = " @ "
#: The task a schedule of an operations job enqueues (``jobstate.schedules.targets``).
_OPERATIONS_TASK = "jobstate.schedules.operations_task.run_scheduled_operations_job"


def schedule_link(key: str, text: Any = None, site: str = "admin") -> SafeString | str:
    """``text`` (default: the key) linked to schedule ``key``'s page; the bare text when
    the Schedules page is not registered."""
    shown = key if text is None else text
    try:
        url = reverse(f"{site}:jobstate_schedule_find")
    except NoReverseMatch:
        return format_html("{}", shown)
    return format_html('<a href="{}?{}">{}</a>', url, urlencode({"key": key}), shown)


def scheduled_run_key(trigger_source: str, triggered_by: str | None) -> str | None:
    """The key of the schedule that started a run, from its trigger; ``None`` for a run
    something else started."""
    if trigger_source != SCHEDULED_RUN_SOURCE or not triggered_by:
        return None
    key, separator, _slot = triggered_by.rpartition(_KEY_SEPARATOR)
    return key if separator and key else None


def job_schedule(job: Job) -> ScheduleOccurrence | None:
    """The occurrence (with its schedule) that enqueued ``job``, or ``None``: one query
    on the occurrences' ``result_id`` index, kept on the job for the page's other use."""
    if not hasattr(job, _OCCURRENCE_ATTRIBUTE):
        occurrence = (
            ScheduleOccurrence.objects.filter(result_id=job.pk)
            .select_related("schedule")
            .order_by("-id")
            .first()
        )
        setattr(job, _OCCURRENCE_ATTRIBUTE, occurrence)
    found: ScheduleOccurrence | None = getattr(job, _OCCURRENCE_ATTRIBUTE)
    return found


#: Where :func:`job_schedule` keeps what it found on the job object.
_OCCURRENCE_ATTRIBUTE = "_jobstate_schedule_occurrence"


def scheduled_run(job: Job, site: str = "admin") -> SafeString | None:
    """A link to the run that ``job`` (a schedule's operations job) started, read from
    its result (no query); ``None`` for any other job or before the run is known."""
    if job.task_path != _OPERATIONS_TASK or not isinstance(job.result, dict):
        return None
    run_id = job.result.get("run_id")
    try:
        pk = uuid.UUID(str(run_id))
    except ValueError:
        return None
    return format_html('<a href="{}">{}</a>', admin_change_url(JobRun, pk, site), pk)
