"""The job page's head and what it leaves out: the title (a task's by its task path), the
compact summary at the top, which fields the sections below show (a task's page hides the
hub's fields; every page hides empty ones), and an audit entry's data as ``key: value``
lines.

The summary holds what an operator reads first (status, where the job runs, how many
attempts, when it was enqueued, started and finished, by which worker), so the timeline
can follow it at once; the sections below keep the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from jobstate.admin.display import (
    FOLD_CHARS,
    choice_badge,
    json_block,
    moment,
    shortened_id,
    worker_link,
)
from jobstate.admin.links import job_schedule
from jobstate.admin.status_words import status_name
from jobstate.admin.task_display import concurrency_text, policy_text, unique_text
from jobstate.console.redaction import Redactor
from jobstate.core.attempt_log import LeftOut, attempt_history
from jobstate.core.bidi import isolated
from jobstate.core.states import (
    CLAIMED_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobStatus,
)
from jobstate.models import Job
from jobstate.stores.contracts.audit import default_audit_summary

__all__ = [
    "HUB_ONLY_FIELDS",
    "SUMMARY_FIELDS",
    "SummaryItem",
    "audit_data",
    "audit_summary",
    "job_name",
    "job_status_badge",
    "page_heading",
    "shown_fieldsets",
    "summary_items",
]

#: Fields of a hub job a task never has (or has in another form): its page leaves
#: them out. The worker of a task is in the summary, linked; its arguments are the
#: "Arguments" section; its error is on the failed attempt in the timeline.
HUB_ONLY_FIELDS = frozenset(
    {
        "source",
        "thread_id",
        "session_id",
        "callback_url",
        "dispatched_at_moment",
        "executor_display",
        "input_preview_text",
        "input_json",
        "report_json",
        "usage_json",
        "error_text",
    }
)

#: Fields the summary shows, left out of the sections below it.
SUMMARY_FIELDS = frozenset(
    {
        "id",
        "status_display",
        "target",
        "source",
        "thread_id",
        "attempts",
        "created_at_moment",
        "claimed_at_moment",
        "executor_display",
        "lease",
    }
)

#: The job's field behind each of the page's fields that shows it differently, for
#: telling an empty one.
_SOURCE_FIELDS = {
    "input_json": "input",
    "result_json": "result",
    "report_json": "report",
    "usage_json": "usage",
    "metadata_json": "metadata",
    "input_preview_text": "input_preview",
    "error_text": "error",
    "lease": "lease_until",
    "executor_display": "executor_id",
}


def _source(name: str) -> str:
    if name.endswith("_moment"):
        return name.removesuffix("_moment")
    return _SOURCE_FIELDS.get(name, name)


def _is_empty(job: Job, name: str) -> bool:
    """Whether ``name`` shows nothing on ``job``'s page; a field this module does not
    know (an admin method added later) is never judged empty."""
    if name == "started_by":
        # Only a job a schedule enqueued was started by something the console knows.
        return job_schedule(job) is None
    field = _source(name)
    if not hasattr(job, field) or field in ("task_args", "task_kwargs"):
        return False
    value = getattr(job, field)
    return value is None or value == "" or value == [] or value == {}


def shown_fieldsets(job: Job | None, fieldsets: Iterable[Any]) -> list[Any]:
    """``fieldsets`` as ``job``'s page shows them: without the summary's fields, a
    task's without the hub's, and without empty fields and sections."""
    if job is None:
        return list(fieldsets)
    task = job.task_path is not None
    shown = []
    for title, options in fieldsets:
        names = [
            name
            for name in options["fields"]
            if name not in SUMMARY_FIELDS
            and not (task and name in HUB_ONLY_FIELDS)
            and not (name == "request_id" and not task)  # a hub job's page title
            and not _is_empty(job, name)
        ]
        if names:
            shown.append((title, {**options, "fields": names}))
    return shown


# --- the title, the status and the summary ------------------------------------------------


def job_name(job: Job) -> str:
    """How a job is named where it is listed (a confirmation page, a message): a task by
    its task path and its short id, any other job by its request id."""
    if job.task_path is None:
        return job.request_id
    return f"{job.task_path} ({shortened_id(job.id)})"


def job_status_badge(job: Job) -> SafeString:
    """The status badge; a task's says its ``TaskResultStatus`` name."""
    return choice_badge(job.status, status_name(job))


def page_heading(job: Job) -> tuple[str, str]:
    """The page's title and (plain) subtitle: a task's path, or a job's request id; then
    the status and the short id."""
    return isolated(job.task_path or job.request_id), f"{status_name(job)} · {shortened_id(job.id)}"


@dataclass(frozen=True)
class SummaryItem:
    label: str
    value: SafeString | str


def _started(job: Job) -> datetime | None:
    """When the task's first attempt started: the log's first, else the running one."""
    for attempt in attempt_history(job.attempt_log):
        if not isinstance(attempt, LeftOut):
            return attempt.started_at
        break
    return job.claimed_at if job.status in CLAIMED_JOB_STATUSES else None


def _last_worker(job: Job) -> str | None:
    """The worker of the running attempt, else of the latest ended one."""
    if job.status in CLAIMED_JOB_STATUSES and job.executor_id:
        return job.executor_id
    for attempt in reversed(attempt_history(job.attempt_log)):
        if not isinstance(attempt, LeftOut):
            return attempt.worker_id
    return None


def summary_items(job: Job, lease: str) -> list[SummaryItem]:
    """What the top of the page says of ``job``, empty values left out (its id is in
    the page's subtitle). ``lease``: the lease column's text."""
    finished = job.updated_at if job.status in TERMINAL_JOB_STATUSES else None
    due = job.run_after if job.status == JobStatus.QUEUED else None
    if job.task_path is not None:
        attempts = _("%(n)d of %(max)d") % {"n": job.attempts, "max": job.max_attempts or 1}
        pairs: list[tuple[Any, Any]] = [
            (gettext_lazy("Task"), format_html("<code>{}</code>", job.task_path)),
            (gettext_lazy("Status"), job_status_badge(job)),
            (gettext_lazy("Queue"), job.queue_name),
            (gettext_lazy("Priority"), str(job.priority)),
            (gettext_lazy("Attempt"), attempts),
            (gettext_lazy("Policy"), policy_text(job)),
            (gettext_lazy("Unique key"), unique_text(job)),
            (gettext_lazy("Concurrency key"), concurrency_text(job)),
            (gettext_lazy("Enqueued"), moment(job.created_at)),
            (gettext_lazy("Due"), moment(due) if due else None),
            (gettext_lazy("Started"), moment(_started(job)) if _started(job) else None),
            (gettext_lazy("Finished"), moment(finished) if finished else None),
            (gettext_lazy("Worker"), worker_link(_last_worker(job)) if _last_worker(job) else None),
            (gettext_lazy("Lease"), lease),
        ]
    else:
        pairs = [
            (gettext_lazy("Status"), choice_badge(job.status, status_name(job))),
            (gettext_lazy("Target"), job.target),
            (gettext_lazy("Source"), job.source),
            (gettext_lazy("Thread"), None if job.thread_id is None else str(job.thread_id)),
            (gettext_lazy("Attempts"), str(job.attempts)),
            (gettext_lazy("Created"), moment(job.created_at)),
            (gettext_lazy("Due"), moment(due) if due else None),
            (gettext_lazy("Claimed"), moment(job.claimed_at) if job.claimed_at else None),
            (gettext_lazy("Finished"), moment(finished) if finished else None),
            (
                gettext_lazy("Executor / worker"),
                worker_link(job.executor_id) if job.executor_id else None,
            ),
            (gettext_lazy("Lease"), lease),
        ]
    return [SummaryItem(str(label), value) for label, value in pairs if value and value != "—"]


# --- audit entries ---------------------------------------------------------------------------


def audit_summary(summary: str, detail: Any) -> str:
    """An audit entry's summary, unless it is the default one (its data's scalar
    members as ``key: value`` pairs), which :func:`audit_data` shows already."""
    if isinstance(detail, dict) and summary == default_audit_summary(detail):
        return ""
    return summary


def _value_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


def audit_data(detail: Any, page: Redactor) -> SafeString | str:
    """An audit entry's data, redacted: one ``key: value`` line per member (a nested
    value as compact JSON), or indented JSON folded in a ``<details>`` when that would
    be long. Nothing for empty data."""
    if not detail:
        return ""
    shown = page.json(detail)
    if not isinstance(shown, dict):
        return json_block(shown, page)
    lines = [(str(key), _value_text(value)) for key, value in shown.items()]
    if sum(len(key) + len(value) + 2 for key, value in lines) > FOLD_CHARS:
        return json_block(shown, page)
    return format_html(
        '<dl class="jobstate-data">{}</dl>',
        format_html_join("", "<div><dt>{}</dt><dd>{}</dd></div>", lines),
    )
