"""List filters that never read a whole table to build their choices.

Django's default filter for a field without ``choices`` lists its values with
``SELECT DISTINCT`` over the table, which takes seconds at millions of rows. These
filters have fixed choices, or take them from a bounded slice of the newest rows
through the table's recency index; any other value still filters when it is given in
the URL (for example from a link on the dashboard).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from jobstate.admin.list_cells import breakable
from jobstate.admin.status_words import shared_status_label
from jobstate.console.job_search import SearchError, apply_job_filter, shortened
from jobstate.core.conf import jobstate_settings
from jobstate.models import BulkOperation, Job
from jobstate.stores.base import JobRunStatus
from jobstate.stores.contracts.audit import AUDIT_EVENTS

__all__ = [
    "ADMIN_AUDIT_EVENTS",
    "AuditEventFilter",
    "BulkOperationFilter",
    "ChannelFilter",
    "DelayedFilter",
    "ExpiredLeaseFilter",
    "JobStatusFilter",
    "LockStateFilter",
    "OfferedChoicesFilter",
    "QueueFilter",
    "RunLivenessFilter",
    "SourceFilter",
    "TargetFilter",
    "TaskFilter",
    "TriggerFilter",
    "offered_value",
]

#: Audit events the admin's own actions write (besides the store's ``rerun``,
#: ``rejected``, ``approved`` and ``dlq_resend_ok``).
ADMIN_AUDIT_EVENTS = (
    "lock_force_released",
    "run_reaped",
    "schedule_run_now",
    "schedule_paused",
    "schedule_resumed",
)

#: How many of the newest jobs the target, source, task and queue filters look at for
#: choices.
RECENT_JOBS_SAMPLE = 1000


class FixedChoicesFilter(admin.SimpleListFilter):
    """Filters ``field`` by the parameter's value, which need not be one of the listed
    choices; the current value is always listed so the sidebar shows it selected."""

    field = ""

    def choices_for(self, request: HttpRequest) -> Sequence[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        values = list(dict.fromkeys(self.choices_for(request)))
        current = self.value()
        if current and current not in values:
            values.append(current)
        # A dotted path or a queue name wraps after its dots, dashes and colons in the
        # narrow sidebar, not in the middle of a word.
        return [(value, breakable(value)) for value in values]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value:
            return queryset.filter(**{self.field: value})
        return queryset


def job_filter(queryset: QuerySet[Any], parameter: str, value: str | None) -> QuerySet[Any]:
    """The jobs list narrowed by one of its filters through :mod:`jobstate.console.job_search`;
    a value it cannot read is the list's "incorrect lookup" (Django drops the filters
    and says so), not a server error."""
    if not value:
        return queryset
    try:
        return apply_job_filter(queryset, parameter, value)
    except SearchError as exc:
        raise IncorrectLookupParameters(exc) from exc


def offered_value(list_filter: admin.SimpleListFilter, offered: Iterable[str]) -> str | None:
    """The value of a filter whose values are only those it offers (a state, a
    liveness): ``None`` when none is given; another value is the list's "incorrect
    lookup" (the whole list, and a message naming it), as a jobs list filter's is, rather
    than the list unfiltered without a word."""
    value = list_filter.value()
    if not value:
        return None
    if value not in offered:
        raise IncorrectLookupParameters(
            f"Unknown {list_filter.title} filter {shortened(str(value))!r}."
        )
    return str(value)


class OfferedChoicesFilter(admin.ChoicesFieldListFilter):
    """A model field's choices filter (``?status__exact=``) that names a value outside
    the field's choices as the list's "incorrect lookup" (see :func:`offered_value`),
    where Django's filters by it and shows an empty list without a word."""

    def expected_parameters(self) -> list[str | None]:
        # The field itself (``?status=queued``, as links give it) is read here too, so a
        # value outside the choices is named there as well; Django applied it as a bare
        # lookup and listed nothing without a word.
        return [*super().expected_parameters(), self.field_path]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        offered = {str(value) for value, _title in self.field.flatchoices}
        for name in (self.lookup_kwarg, self.field_path):
            given = self.used_parameters.get(name, ())
            for value in given if isinstance(given, list | tuple) else [given]:
                if str(value) not in offered:
                    raise IncorrectLookupParameters(
                        f"Unknown {self.title} filter {shortened(str(value))!r}."
                    )
        narrowed = super().queryset(request, queryset)
        return queryset if narrowed is None else narrowed


class JobStatusFilter(OfferedChoicesFilter):
    """The jobs list's status filter. One value covers tasks and other jobs, which name
    it differently: each choice names both where they differ ("Done (SUCCESSFUL)"); the
    values in the URL (``?status__exact=done``) are the field's."""

    def choices(self, changelist: Any) -> Iterator[Any]:
        shown = super().choices(changelist)
        yield next(shown)  # "All"
        for (value, title), choice in zip(self.field.flatchoices, shown, strict=False):
            # Past the title, a facet's count ("Done (3)") when the list shows them.
            rest = str(choice["display"])[len(str(title)) :]
            yield {**choice, "display": shared_status_label(str(value)) + rest}


class JobChoicesFilter(FixedChoicesFilter):
    """A jobs list filter that narrows exactly as :mod:`jobstate.console.job_search` does (and
    so as a bulk operation over the list's filter does)."""

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return job_filter(queryset, str(self.parameter_name), value)


def _recent_job_values(request: HttpRequest, field: str) -> list[str]:
    """Distinct non-empty ``field`` values among the newest jobs, sorted. One query per
    request serves the target, source, task and queue filters."""
    cache: dict[str, list[str]] | None = getattr(request, "_jobstate_recent_values", None)
    if cache is None:
        fields = ("target", "source", "task_path", "queue_name")
        recent = list(Job.objects.order_by("-created_at").values_list(*fields)[:RECENT_JOBS_SAMPLE])
        cache = {
            name: sorted({row[index] for row in recent if row[index]})
            for index, name in enumerate(fields)
        }
        request._jobstate_recent_values = cache  # type: ignore[attr-defined]
    return cache[field]


class RecentJobValuesFilter(JobChoicesFilter):
    """A jobs list filter offering the values of its ``field`` among the newest jobs."""

    def choices_for(self, request: HttpRequest) -> Sequence[str]:
        return _recent_job_values(request, self.field)


class TargetFilter(RecentJobValuesFilter):
    title = _("target")
    parameter_name = "target"
    field = "target"


class SourceFilter(RecentJobValuesFilter):
    title = _("source")
    parameter_name = "source"
    field = "source"


class TaskFilter(RecentJobValuesFilter):
    """django.tasks tasks by their dotted path."""

    title = _("task")
    parameter_name = "task"
    field = "task_path"


class QueueFilter(RecentJobValuesFilter):
    """django.tasks tasks by their queue."""

    title = _("queue")
    parameter_name = "queue"
    field = "queue_name"


class ExpiredLeaseFilter(admin.SimpleListFilter):
    title = _("lease")
    parameter_name = "lease"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("expired", _("Expired")), ("held", _("Held"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return job_filter(queryset, str(self.parameter_name), value)


class DelayedFilter(admin.SimpleListFilter):
    title = _("delay")
    parameter_name = "delayed"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("yes", _("Delayed (run after is ahead)")), ("no", _("Ready"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        return job_filter(queryset, str(self.parameter_name), value)


class TriggerFilter(FixedChoicesFilter):
    title = _("trigger")
    parameter_name = "trigger"
    field = "trigger_source"

    def choices_for(self, request: HttpRequest) -> Sequence[str]:
        return ["SCHEDULER", "CLI", "ADMIN", "CELERY"]


class RunLivenessFilter(admin.SimpleListFilter):
    title = _("heartbeat")
    parameter_name = "heartbeat"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("stale", _("Stale (reapable)")), ("fresh", _("Fresh"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        cutoff = Now() - jobstate_settings.STALE_RUN_AFTER
        running = queryset.filter(status=JobRunStatus.RUNNING)
        value = offered_value(self, ("stale", "fresh"))
        if value == "stale":
            return running.filter(heartbeat_at__lte=cutoff)
        if value == "fresh":
            return running.filter(heartbeat_at__gt=cutoff)
        return queryset


class LockStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("held", _("Held")), ("expired", _("Expired"))]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = offered_value(self, ("held", "expired"))
        if value == "held":
            return queryset.filter(expires_at__gt=Now())
        if value == "expired":
            return queryset.filter(expires_at__lte=Now())
        return queryset


class ChannelFilter(FixedChoicesFilter):
    title = _("channel")
    parameter_name = "channel"
    field = "channel"

    def choices_for(self, request: HttpRequest) -> Sequence[str]:
        return sorted(jobstate_settings.CHANNELS)


class AuditEventFilter(FixedChoicesFilter):
    title = _("event")
    parameter_name = "event"
    field = "event"

    def choices_for(self, request: HttpRequest) -> Sequence[str]:
        return sorted({*AUDIT_EVENTS, "approved", *ADMIN_AUDIT_EVENTS})


class AuditStageFilter(admin.ChoicesFieldListFilter):
    """The audit list's stage filter, with a sentence under its heading saying what a
    stage is (the part of a job's life an entry belongs to)."""

    template = "admin/jobstate/filter_with_help.html"
    help_text = _(
        "The part of a job's life an entry belongs to: launch (created, claimed), "
        "context and tool (what a running job reports it read or called), execution "
        "(ran, finished), approval, delivery (notifications), recovery (reaped, "
        "requeued), and channel, configuration and system events."
    )


class BulkOperationFilter(admin.SimpleListFilter):
    """``?bulk=<id>``: the audit entries a bulk operation wrote (``via`` ``bulk:<id>``),
    what its page links to. Read from the operation's start on (the ``ts`` index), so
    the JSON test of ``detail`` looks at that span only. Shown only while applied."""

    title = _("bulk operation")
    parameter_name = "bulk"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        if value is None:
            return []
        return [(value, _("bulk operation #%(id)s") % {"id": value})]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value is None:
            return queryset
        # ASCII digits only (str.isdigit() takes "²", which int() refuses), and short
        # enough for int() (it refuses more than 4,300 digits).
        if not (value.isascii() and value.isdigit() and len(value) <= 19) or int(value) >= 2**63:
            raise IncorrectLookupParameters(f"Unknown bulk operation {shortened(value)!r}.")
        operation = BulkOperation.objects.filter(pk=int(value)).first()
        if operation is None:
            # Its entries are read from its start on: without it, none can be told.
            raise IncorrectLookupParameters(f"There is no bulk operation #{int(value)}.")
        return queryset.filter(ts__gte=operation.created_at, detail__via=f"bulk:{operation.pk}")
