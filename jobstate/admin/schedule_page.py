"""What the Schedules pages show beyond a schedule's row: when it runs next (from its
cron when no evaluation has recorded it yet), the runs a schedule of an operations job
started, and the operator's buttons on a schedule's own page."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from jobstate.admin.display import choice_badge, moment, relative_time
from jobstate.admin.links import SCHEDULED_RUN_SOURCE
from jobstate.admin.list_cells import with_sub
from jobstate.admin.page_bases import admin_change_url
from jobstate.exceptions import ScheduleError
from jobstate.models import JobRun, JobRunStatus, Schedule
from jobstate.models.schedules import ScheduleKind
from jobstate.schedules import row_definition

__all__ = ["RUNS_SHOWN", "next_fire_time", "recent_runs_table", "schedule_buttons"]

#: How many of the runs a schedule of an operations job started its page lists.
RUNS_SHOWN = 20


def next_fire_time(schedule: Schedule, now: datetime) -> datetime | None:
    """When an active schedule is next enqueued: the slot the last evaluation recorded,
    or else (never evaluated since it was declared, resumed or changed) the first slot
    of its cron after ``now`` and after the slots already enqueued. ``None`` when its
    cron names none in the next 50 years or cannot be read."""
    if schedule.next_slot is not None:
        return schedule.next_slot
    start = max(now, schedule.effective_from, schedule.last_slot or schedule.effective_from)
    try:
        return row_definition(schedule).slots().next_after(start)
    except (ScheduleError, ValueError):
        return None


def next_run_text(schedule: Schedule, now: datetime) -> SafeString | str:
    upcoming = next_fire_time(schedule, now)
    if upcoming is None:
        return _("none in the next 50 years")
    if upcoming <= now:
        # A slot already due: the next evaluation (a worker's pass) enqueues it.
        return format_html("{} ({})", moment(upcoming, now), _("due, at the next evaluation"))
    return with_sub(moment(upcoming, now), relative_time(upcoming, now))


def recent_runs_table(schedule: Schedule, site: str = "admin") -> SafeString | str:
    """The latest runs a schedule of an operations job started, linked: the runs of its
    job whose trigger names the schedule (served by the runs' ``job_key, started_at``
    index)."""
    if schedule.kind != ScheduleKind.OPERATIONS_JOB:
        return "—"
    runs = list(
        JobRun.objects.filter(
            job_key=schedule.target,
            trigger_source=SCHEDULED_RUN_SOURCE,
            triggered_by__startswith=f"{schedule.key} @ ",
        )
        .order_by("-started_at")
        .only("id", "status", "started_at", "triggered_by")[:RUNS_SHOWN]
    )
    if not runs:
        return "—"
    rows = format_html_join(
        "",
        '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td></tr>',
        (
            (
                admin_change_url(JobRun, run.pk, site),
                moment(run.started_at),
                choice_badge(run.status, JobRunStatus(run.status).label),
                run.triggered_by,
            )
            for run in runs
        ),
    )
    return format_html(
        '<table class="jobstate-occurrences"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
        "</tr></thead><tbody>{}</tbody></table>",
        _("run started"),
        _("status"),
        _("triggered by"),
        rows,
    )


def schedule_buttons(model_admin: Any, request: Any, schedule: Schedule) -> list[dict[str, str]]:
    """The buttons of a schedule's page: run now, pause or resume, each shown to an
    operator with its permission when it applies; each posts the list action of the same
    name, so it has the same confirmation page and audit entry."""
    candidates = [
        ("run", "run_schedules_now", _("Run now…"), model_admin.run_spec(request)),
        ("pause", "pause_schedules", _("Pause…"), model_admin.pause_spec(request)),
        ("pause", "resume_schedules", _("Resume…"), model_admin.resume_spec(request)),
    ]
    buttons = []
    for permission, action, label, spec in candidates:
        allowed = getattr(model_admin, f"has_{permission}_permission")(request)
        if allowed and spec.row(schedule).skip_reason is None:
            buttons.append({"action": action, "label": label, "return_to": request.path})
    return buttons
