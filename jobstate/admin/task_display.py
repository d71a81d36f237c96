"""What the job pages show of a django.tasks task: the task column of the jobs list, the
"Task" section of a task's page (path, queue, priority, attempts, arguments) and the
rows of its attempt log, each with its worker and traceback.

The arguments are the job's ``input`` and are shown through the page's redactor
(``ADMIN_REDACTED_KEYS``), like every other JSON of the page; tracebacks go through it
too, so a secret quoted in an exception's message is masked as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from jobstate.admin.common import ReadOnlyAdmin, json_block, text_block
from jobstate.admin.display import worker_link
from jobstate.admin.redaction import Redactor
from jobstate.admin.timeline import left_out_text
from jobstate.core.attempt_log import LeftOut, attempt_history
from jobstate.models import Job

__all__ = [
    "TASK_FIELDS",
    "AttemptRow",
    "Fieldset",
    "LeftOutRow",
    "TaskFieldsAdmin",
    "attempt_rows",
]

#: One section of an admin page: its title and its options (``{"fields": ...}``).
Fieldset = tuple[Any, Any]

#: The "Task" section of a task's page.
TASK_FIELDS = (
    "task_path",
    "queue_name",
    "priority",
    "attempts_of_max",
    "task_args",
    "task_kwargs",
)


@dataclass(frozen=True)
class AttemptRow:
    """One ended attempt as the job page lists it."""

    number: int
    worker_id: str
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    failed: bool
    error: str
    traceback: SafeString | str

    @property
    def worker(self) -> SafeString | str:
        """The attempt's worker, linked to its page."""
        return worker_link(self.worker_id)


@dataclass(frozen=True)
class LeftOutRow:
    """Attempts a long attempt log left out, as the job page lists them in their place."""

    left_out: str


def attempt_rows(job: Job, redactor: Redactor) -> list[AttemptRow | LeftOutRow]:
    """The ended attempts of ``job``, first first, and the attempts a long log left out
    where they were (none for a job that is no task)."""
    rows: list[AttemptRow | LeftOutRow] = []
    number = 1
    for attempt in attempt_history(job.attempt_log):
        if isinstance(attempt, LeftOut):
            rows.append(LeftOutRow(left_out_text(attempt)))
            number += attempt.count
            continue
        error = attempt.exception_class_path
        if attempt.message:
            error = f"{error}: {attempt.message}"
        rows.append(
            AttemptRow(
                number=number,
                worker_id=attempt.worker_id,
                started_at=attempt.started_at,
                finished_at=attempt.finished_at,
                outcome=attempt.outcome.value,
                failed=attempt.failed,
                error=redactor.text(error) if attempt.failed else "",
                traceback=text_block(attempt.traceback, redactor) if attempt.failed else "",
            )
        )
        number += 1
    return rows


class TaskFieldsAdmin(ReadOnlyAdmin):
    """The task's fields of :class:`~jobstate.admin.jobs.JobAdmin`, its base: a column,
    the page section (on tasks only) and its read-only values."""

    def task_fieldset(self, request: HttpRequest, obj: Job | None) -> list[Fieldset]:
        """The "Task" section, for a task's page; none for any other job."""
        if obj is None or obj.task_path is None:
            return []
        return [(gettext_lazy("Task"), {"fields": TASK_FIELDS})]

    @admin.display(description=gettext_lazy("task"), ordering="task_path")
    def task_display(self, job: Job) -> str:
        if job.task_path is None:
            return "—"
        name = job.task_path.rsplit(".", 1)[-1]
        return f"{name} · {job.queue_name}" if job.queue_name else name

    @admin.display(description=gettext_lazy("attempts"))
    def attempts_of_max(self, job: Job) -> str:
        return _("%(attempts)d of %(max)d") % {
            "attempts": job.attempts,
            "max": job.max_attempts or 1,
        }

    @admin.display(description=gettext_lazy("args"))
    def task_args(self, job: Job) -> SafeString | str:
        payload = job.input if isinstance(job.input, dict) else {}
        return json_block(payload.get("args", []), self.redactor_for(job))

    @admin.display(description=gettext_lazy("kwargs"))
    def task_kwargs(self, job: Job) -> SafeString | str:
        payload = job.input if isinstance(job.input, dict) else {}
        return json_block(payload.get("kwargs", {}), self.redactor_for(job))
