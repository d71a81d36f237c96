"""The jobs changelist, the job page and the operator actions on jobs, plus the
Overview page (registered on the job admin's URLs)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from jobstate.admin.bulk_actions import bulk_links, bulk_urls
from jobstate.admin.common import (
    REDACTOR_ATTRIBUTE,
    ActionSpec,
    confirmed_action,
    database_now,
    json_block,
    permission_check,
    redacted_field,
    with_database_now,
)
from jobstate.admin.dashboard import (
    cards,
    endpoint_links,
    finished_per_hour,
    finished_per_minute,
    queue_depth_by_target,
)
from jobstate.admin.display import delivery_attempts_text, moment, short_id, worker_link
from jobstate.admin.filters import (
    DelayedFilter,
    ExpiredLeaseFilter,
    JobStatusFilter,
    QueueFilter,
    SourceFilter,
    TargetFilter,
    TaskFilter,
)
from jobstate.admin.job_actions import (
    approve_spec,
    cancel_spec,
    discard_spec,
    job_buttons,
    lease_text,
    reject_spec,
    requeue_spec,
    retry_now_spec,
)
from jobstate.admin.job_page import (
    audit_data,
    audit_summary,
    job_status_badge,
    page_heading,
    shown_fieldsets,
    summary_items,
)
from jobstate.admin.links import job_schedule, schedule_link, scheduled_run
from jobstate.admin.list_cells import age_cell, cut_middle, one_line, with_sub
from jobstate.admin.page_bases import moment_field, search_refused
from jobstate.admin.task_display import TASK_FIELDS, TaskFieldsAdmin
from jobstate.admin.timeline import job_timeline
from jobstate.console.job_search import SEARCH_FIELDS, SearchError, parse_search
from jobstate.models import AuditEntry, Job, Notification
from jobstate.stores import get_state_store
from jobstate.stores.base import (
    CLAIMED_JOB_STATUSES,
)

__all__ = ["JobAdmin"]

#: How many audit entries and notifications the job page shows.
TRAIL_LIMIT = 200
NOTIFICATIONS_LIMIT = 50


#: The job page's sections under its summary and timeline: every field, read-only, JSON
#: pretty-printed, times with seconds. A page leaves out what its summary shows, what is
#: empty and, on a task's page, the hub's fields (:mod:`jobstate.admin.job_page`).
_JOB_PAGE: list[tuple[Any, tuple[str, ...]]] = [
    (gettext_lazy("Input"), ("input_preview_text", "input_json")),
    (
        gettext_lazy("Outcome"),
        ("result_json", "report_json", "usage_json", "error_text", "metadata_json"),
    ),
    (
        gettext_lazy("Details"),
        (
            "id",
            "request_id",
            "status_display",
            "target",
            "source",
            "started_by",
            "thread_id",
            "session_id",
            "attempts",
            "callback_url",
        ),
    ),
    (
        gettext_lazy("Timing and claim"),
        (
            "created_at_moment",
            "updated_at_moment",
            "run_after_moment",
            "claimed_at_moment",
            "dispatched_at_moment",
            "lease_until_moment",
            "lease",
            "executor_display",
            "claim_token",
        ),
    ),
]


@admin.register(Job)
class JobAdmin(TaskFieldsAdmin):
    """Jobs: browse, inspect, and (with the matching permission) requeue, cancel, reject,
    approve them, or retry now or discard a task (:mod:`jobstate.admin.job_actions`).
    Every change goes through the state store and is audited with the operator's user
    name."""

    # What an operator scans, fitting a 1440 px screen beside the filters: the queue
    # sits under the task, the lease under the age; the source and the thread are on
    # the job's page (and the source is a filter).
    list_display = [
        "request_id_cell",
        "status_display",
        "task_or_target",
        "attempts",
        "age",
        "executor_cell",
    ]
    phone_hidden_columns = ("attempts", "executor_cell")
    empty_list_text = gettext_lazy(
        "No jobs. A job appears here when the application enqueues one: a django.tasks "
        "task sent to the jobstate backend, or a job created through the state store. "
        "Finished jobs stay until prune_jobstate removes them."
    )
    list_filter = [
        ("status", JobStatusFilter),
        TargetFilter,
        TaskFilter,
        QueueFilter,
        SourceFilter,
        ExpiredLeaseFilter,
        DelayedFilter,
    ]
    # Enables the search box; the search itself is jobstate.console.job_search (see ``search``).
    search_fields = ["request_id"]
    search_help_text = gettext_lazy(
        "An exact job id, request id or thread number, and/or field:value terms "
        "(all must match): task:app.tasks.send (or a prefix: task:app.tasks.*), "
        "queue:emails, error:TimeoutError, input:customer=42 (one JSON value: a number, "
        '"text", true, false or null; a.b=1 for a nested key), worker:w-1, key:customer:7 '
        '(a task\'s uniqueness or concurrency key). Quote values with spaces: error:"timed out".'
    )
    # Served by the jobstate_job_recent_idx index (ties broken by the time-ordered id).
    ordering = ["-created_at"]
    actions = [
        "requeue_jobs",
        "cancel_jobs",
        "retry_now_jobs",
        "discard_jobs",
        "reject_jobs",
        "approve_and_requeue_jobs",
    ]
    fieldsets = [(title, {"fields": names}) for title, names in _JOB_PAGE]
    readonly_fields = [name for _title, names in _JOB_PAGE for name in names] + list(TASK_FIELDS)
    redaction_sources = ("input", "result", "report", "usage", "metadata")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # Leases are judged on the clock that wrote them (see with_database_now).
        return with_database_now(super().get_queryset(request))

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        """The list narrowed by the search (:mod:`jobstate.console.job_search`);
        :class:`SearchError` for one it cannot read."""
        return parse_search(term).apply(queryset) if term else queryset

    def search_refusal(self, exc: SearchError) -> str:
        fields = ", ".join(f"{name}: ({what})" for name, what in SEARCH_FIELDS.items())
        return _("Search not understood: %(error)s Search fields: %(fields)s.") % {
            "error": exc,
            "fields": fields,
        }

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {**(extra_context or {}), "jobstate_bulk_links": bulk_links(self, request)}
        response = super().changelist_view(request, context)
        if search_refused(request) and isinstance(response, TemplateResponse):
            # The list refused its search and lists nothing: a bulk link would carry the
            # search to a page that acts on the jobs without it.
            response.context_data = {**(response.context_data or {}), "jobstate_bulk_links": []}
        return response

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        # A task's arguments come first, once; the summary above holds the rest of what
        # the job is.
        sections = [*self.task_fieldset(request, obj), *super().get_fieldsets(request, obj)]
        return shown_fieldsets(obj, sections)

    # --- columns and fields ----------------------------------------------------------

    @admin.display(description=gettext_lazy("id / request id"), ordering="request_id")
    def request_id_cell(self, job: Job) -> SafeString:
        # A task by its id: what enqueue's result and the worker's lines name (its own
        # request id, "task-…", is named nowhere else). Any other job by its request
        # id. Cut in the middle: ids sharing a prefix (a time, a tenant) stay distinct;
        # whole in the tooltip and on the job's page.
        name = str(job.id) if job.task_path is not None else job.request_id
        return one_line(cut_middle(name, 8), name)

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_display(self, job: Job) -> SafeString:
        # A task's as Django names it (SUCCESSFUL, FAILED), as on its page.
        return job_status_badge(job)

    @admin.display(description=gettext_lazy("task / target"), ordering="target")
    def task_or_target(self, job: Job) -> SafeString | str:
        """A task's name (its path in the tooltip) over its queue; another job's target
        over its source."""
        if job.task_path is not None:
            name = job.task_path.rsplit(".", 1)[-1]
            return with_sub(one_line(name, job.task_path), job.queue_name)
        target = job.target or "—"
        return with_sub(one_line(target, target), job.source)

    @admin.display(description=gettext_lazy("executor / worker"))
    def executor_display(self, job: Job) -> SafeString | str:
        return worker_link(job.executor_id)

    @admin.display(description=gettext_lazy("started by"))
    def started_by(self, job: Job) -> SafeString | str:
        """The schedule that enqueued the job (and, for an operations job, its run)."""
        occurrence = job_schedule(job)
        if occurrence is None:
            return "—"
        site = self.admin_site.name
        shown = format_html(
            "{} {} ({})",
            _("schedule"),
            schedule_link(occurrence.schedule.key, site=site),
            occurrence.get_trigger_display(),
        )
        run = scheduled_run(job, site)
        return format_html("{} · {} {}", shown, _("run"), run) if run else shown

    @admin.display(description=gettext_lazy("age / lease"), ordering="created_at")
    def age(self, job: Job) -> SafeString | str:
        """Since the job was created; under it, when its lease ends (red once it has
        expired) or when a delayed job runs."""
        now = database_now(job)
        text = lease_text(job, now)
        if not text:
            return age_cell(job.created_at, now)
        expired = (
            job.status in CLAIMED_JOB_STATUSES
            and job.lease_until is not None
            and job.lease_until < now
        )
        lease = format_html(
            '<span class="{}">{} {}</span>',
            "jobstate-alert-text" if expired else "",
            _("lease") if job.status in CLAIMED_JOB_STATUSES else "",
            text,
        )
        return with_sub(age_cell(job.created_at, now), lease)

    @admin.display(description=gettext_lazy("lease"))
    def lease(self, job: Job) -> SafeString | str:
        now = database_now(job)
        text = lease_text(job, now)
        if not text:
            return "—"
        expired = (
            job.status in CLAIMED_JOB_STATUSES
            and job.lease_until is not None
            and job.lease_until < now
        )
        if expired:
            return format_html('<strong style="color:#cf222e">{}</strong>', text)
        return text

    created_at_moment = moment_field("created_at", gettext_lazy("created at"))
    updated_at_moment = moment_field("updated_at", gettext_lazy("updated at"))
    run_after_moment = moment_field("run_after", gettext_lazy("run after"))
    claimed_at_moment = moment_field("claimed_at", gettext_lazy("claimed at"))
    dispatched_at_moment = moment_field("dispatched_at", gettext_lazy("dispatched at"))
    lease_until_moment = moment_field("lease_until", gettext_lazy("lease until"))

    @admin.display(description=gettext_lazy("worker"), ordering="executor_id")
    def executor_cell(self, job: Job) -> SafeString | str:
        if not job.executor_id:
            return "—"
        return one_line(worker_link(job.executor_id), job.executor_id)

    input_json = redacted_field("input", gettext_lazy("input"))
    result_json = redacted_field("result", gettext_lazy("result"))
    report_json = redacted_field("report", gettext_lazy("report"))
    usage_json = redacted_field("usage", gettext_lazy("usage"))
    metadata_json = redacted_field("metadata", gettext_lazy("metadata"))
    input_preview_text = redacted_field("input_preview", gettext_lazy("input preview"), text=True)
    error_text = redacted_field("error", gettext_lazy("error"), text=True)

    # --- permissions -----------------------------------------------------------------

    has_requeue_permission = permission_check("requeue_job")
    has_reject_permission = permission_check("reject_job")
    has_approve_permission = permission_check("approve_job")
    has_delete_finished_permission = permission_check("delete_finished_job")
    has_cancel_permission = permission_check("cancel_job")
    has_retry_now_permission = permission_check("retry_job_now")
    has_discard_permission = permission_check("discard_job")

    # --- actions ---------------------------------------------------------------------

    requeue_jobs = confirmed_action(
        "requeue_spec",
        description=gettext_lazy("Requeue selected jobs…"),
        permission="requeue",
    )
    reject_jobs = confirmed_action(
        "reject_spec",
        description=gettext_lazy("Reject (cancel) selected queued jobs…"),
        permission="reject",
    )
    cancel_jobs = confirmed_action(
        "cancel_spec",
        description=gettext_lazy("Cancel selected jobs…"),
        permission="cancel",
    )
    retry_now_jobs = confirmed_action(
        "retry_now_spec",
        description=gettext_lazy("Retry selected tasks now…"),
        permission="retry_now",
    )
    discard_jobs = confirmed_action(
        "discard_spec",
        description=gettext_lazy("Discard selected queued tasks…"),
        permission="discard",
    )
    approve_and_requeue_jobs = confirmed_action(
        "approve_spec",
        description=gettext_lazy("Approve and requeue selected jobs once…"),
        permission="approve",
    )

    def requeue_spec(self, request: HttpRequest) -> ActionSpec:
        return requeue_spec(self.operator(request))

    def reject_spec(self, request: HttpRequest) -> ActionSpec:
        return reject_spec(self.operator(request))

    def approve_spec(self, request: HttpRequest) -> ActionSpec:
        return approve_spec(self.operator(request))

    def cancel_spec(self, request: HttpRequest) -> ActionSpec:
        return cancel_spec(self.operator(request))

    def retry_now_spec(self, request: HttpRequest) -> ActionSpec:
        return retry_now_spec(self.operator(request))

    def discard_spec(self, request: HttpRequest) -> ActionSpec:
        return discard_spec(self.operator(request))

    # --- the job page ----------------------------------------------------------------

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Job | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context.update(self.job_page_context(request, obj))
            context["title"], context["subtitle"] = page_heading(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)

    def job_page_context(self, request: HttpRequest, job: Job) -> dict[str, Any]:
        """The audit trail, the notifications with their attempts, and the action
        buttons the operator may use on this job.

        The whole page shares one redactor: the job's own JSON, its notifications'
        payloads and its audit details, so a value hidden in one (a token in a
        payload) is masked where another quotes it (a delivery error)."""
        newest = list(
            AuditEntry.objects.filter(job_id=job.pk).order_by("-ts", "-id")[: TRAIL_LIMIT + 1]
        )
        trail = list(reversed(newest[:TRAIL_LIMIT]))
        notifications = list(
            Notification.objects.filter(job_id=job.pk)
            .order_by("created_at")
            .prefetch_related("delivery_attempts")[:NOTIFICATIONS_LIMIT]
        )
        page = self.build_redactor(job).including(
            *(notification.payload for notification in notifications),
            *(entry.detail for entry in trail),
        )
        setattr(job, REDACTOR_ATTRIBUTE, page)
        return {
            "jobstate_job_page": True,
            "job_summary": summary_items(job, self.lease(job)),
            "job_status_badge": job_status_badge(job),
            "job_short_id": short_id(job.pk),
            "job_timeline": job_timeline(job, trail, page, database_now(job)),
            "audit_trail": [
                {
                    "entry": entry,
                    "ts": moment(entry.ts),
                    "title": page.text(entry.title),
                    "summary": page.summary(
                        audit_summary(entry.summary, entry.detail), entry.detail
                    ),
                    "detail": audit_data(entry.detail, page),
                }
                for entry in trail
            ],
            "audit_trail_truncated": len(newest) > TRAIL_LIMIT,
            "audit_changelist_url": reverse(
                f"{self.admin_site.name}:jobstate_auditentry_changelist"
            )
            + f"?q={job.pk}",
            "job_notifications": [
                {
                    "notification": notification,
                    "payload": json_block(notification.payload, page),
                    "last_error": page.text(notification.last_error or ""),
                    "attempts": [
                        (attempt, page.text(attempt.error or ""), moment(attempt.started_at))
                        for attempt in notification.delivery_attempts.all()
                    ],
                    "attempts_text": delivery_attempts_text(
                        notification.attempts, len(notification.delivery_attempts.all())
                    ),
                }
                for notification in notifications
            ],
            "job_is_task": job.task_path is not None,
            "job_executor_link": worker_link(job.executor_id),
            "job_action_buttons": job_buttons(self, request, job),
            "job_changelist_url": reverse(f"{self.admin_site.name}:jobstate_job_changelist"),
        }

    # --- the Overview page ---------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        overview = path(
            "overview/",
            self.admin_site.admin_view(self.overview_view),
            name="jobstate_dashboard",
        )
        return [overview, *bulk_urls(self), *super().get_urls()]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        """The metrics snapshot as cards, jobs finished per minute over the last hour
        and the queue's depth by target. Needs the view permission on jobs; answers
        only ``GET`` and ``HEAD`` (it changes nothing, so it takes no form)."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        snapshot = get_state_store().operational_metrics_snapshot()
        status_cards, health_cards = cards(snapshot)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Overview"),
            "subtitle": None,
            "opts": self.opts,
            "status_cards": status_cards,
            "health_cards": health_cards,
            "finished": finished_per_minute(),
            "throughput": finished_per_hour(),
            "depth": queue_depth_by_target(),
            "endpoint_links": endpoint_links(),
            "job_changelist_url": reverse(f"{self.admin_site.name}:jobstate_job_changelist"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/jobstate/overview.html", context)
