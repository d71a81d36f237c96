"""What the job pages show of a django.tasks task besides its summary and timeline
(:mod:`jobstate.admin.job_page`, :mod:`jobstate.admin.timeline`): the task column of the
jobs list and the "Arguments" section of a task's page, args and kwargs once each.

The arguments are the job's ``input`` and are shown through the page's redactor
(``ADMIN_REDACTED_KEYS``), like every other JSON of the page.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy

from jobstate.admin.common import ReadOnlyAdmin, json_block
from jobstate.core.bidi import isolated
from jobstate.core.states import UNIQUE_STATE_BITS
from jobstate.models import Job

__all__ = [
    "TASK_FIELDS",
    "Fieldset",
    "TaskFieldsAdmin",
    "concurrency_text",
    "policy_text",
    "unique_text",
]

#: One section of an admin page: its title and its options (``{"fields": ...}``).
Fieldset = tuple[Any, Any]

#: The "Arguments" section of a task's page (its path, queue, priority and attempts are
#: in the page's summary).
TASK_FIELDS = ("task_args", "task_kwargs")


def policy_text(job: Job) -> str | None:
    """What the task's stored policy changes from its backend's ``OPTIONS``, in a line
    (``None`` when nothing): its timeout, backoff, the errors it retries or discards, and
    whether it is atomic."""
    stored = job.policy if isinstance(job.policy, dict) else {}
    parts = []
    if "timeout" in stored:
        timeout = stored["timeout"]
        parts.append(
            str(gettext_lazy("no timeout"))
            if timeout is None
            else f"{gettext_lazy('timeout')} {_seconds(timeout)}"
        )
    if stored.get("retry_backoff") is not None:
        parts.append(f"{gettext_lazy('backoff')} {_seconds(stored['retry_backoff'])}")
    if stored.get("retry_on") is not None:
        names = ", ".join(_short(path) for path in stored["retry_on"]) or "—"
        parts.append(f"{gettext_lazy('retries only')} {names}")
    if stored.get("discard_on"):
        names = ", ".join(_short(path) for path in stored["discard_on"])
        parts.append(f"{gettext_lazy('never retries')} {names}")
    if stored.get("atomic") is True:
        parts.append(str(gettext_lazy("atomic")))
    return " · ".join(parts) or None


def unique_text(job: Job) -> str | None:
    """A unique task's key and the states it holds it in, or ``None``."""
    stored = job.policy if isinstance(job.policy, dict) else {}
    key = stored.get("unique_key")
    if job.unique_digest is None or not isinstance(key, str):
        return None
    states = [name for name, bit in UNIQUE_STATE_BITS.items() if (job.unique_states or 0) & bit]
    return f"{isolated(key)} ({gettext_lazy('held while')} {', '.join(states)})"


def concurrency_text(job: Job) -> str | None:
    """The key a task runs under and its limit, or ``None``."""
    stored = job.policy if isinstance(job.policy, dict) else {}
    key = stored.get("concurrency_key")
    if job.concurrency_digest is None or not isinstance(key, str):
        return None
    limit = job.concurrency_limit or 1
    return f"{isolated(key)} ({gettext_lazy('at most')} {limit} {gettext_lazy('at once')})"


def _seconds(value: Any) -> str:
    if not isinstance(value, int | float):
        return str(value)
    return str(timedelta(seconds=value))


def _short(path: Any) -> str:
    return str(path).rsplit(".", 1)[-1]


class TaskFieldsAdmin(ReadOnlyAdmin):
    """The task's fields of :class:`~jobstate.admin.jobs.JobAdmin`, its base: a column,
    the page section (on tasks only) and its read-only values."""

    def task_fieldset(self, request: HttpRequest, obj: Job | None) -> list[Fieldset]:
        """The "Arguments" section, for a task's page; none for any other job."""
        if obj is None or obj.task_path is None:
            return []
        return [(gettext_lazy("Arguments"), {"fields": TASK_FIELDS})]

    @admin.display(description=gettext_lazy("task"), ordering="task_path")
    def task_display(self, job: Job) -> str:
        if job.task_path is None:
            return "—"
        name = job.task_path.rsplit(".", 1)[-1]
        return f"{name} · {job.queue_name}" if job.queue_name else name

    @admin.display(description=gettext_lazy("args"))
    def task_args(self, job: Job) -> SafeString | str:
        payload = job.input if isinstance(job.input, dict) else {}
        return json_block(payload.get("args", []), self.redactor_for(job))

    @admin.display(description=gettext_lazy("kwargs"))
    def task_kwargs(self, job: Job) -> SafeString | str:
        payload = job.input if isinstance(job.input, dict) else {}
        return json_block(payload.get("kwargs", {}), self.redactor_for(job))
