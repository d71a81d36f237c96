"""The jobs changelist, the job page and the operator actions on jobs, plus the
Operations page (registered on the job admin's URLs)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from jobstate.admin.bulk_actions import bulk_links, bulk_urls
from jobstate.admin.common import (
    REDACTOR_ATTRIBUTE,
    ActionRow,
    ActionSpec,
    RejectForm,
    choice_badge,
    database_now,
    json_block,
    relative_time,
    run_confirmed_action,
    text_block,
    with_database_now,
)
from jobstate.admin.dashboard import (
    cards,
    finished_per_hour,
    finished_per_minute,
    queue_depth_by_target,
)
from jobstate.admin.filters import (
    DelayedFilter,
    ExpiredLeaseFilter,
    QueueFilter,
    SourceFilter,
    TargetFilter,
    TaskFilter,
)
from jobstate.admin.task_display import TASK_FIELDS, TaskFieldsAdmin, attempt_rows
from jobstate.admin.timeline import job_timeline
from jobstate.console.job_search import SEARCH_FIELDS, SearchError, parse_search
from jobstate.models import ApprovalDecision, AuditEntry, Job, Notification
from jobstate.stores import get_state_store
from jobstate.stores.base import (
    CLAIMED_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    ApprovalRequeueOutcome,
    JobStatus,
)
from jobstate.stores.contracts.validation import APPROVAL_COMMENT_LIMIT

__all__ = ["JobAdmin"]

#: The ``via`` of the audit entries the admin's requeues write.
ADMIN_VIA = "admin"

#: How many audit entries and notifications the job page shows.
TRAIL_LIMIT = 200
NOTIFICATIONS_LIMIT = 50


class ApproveForm(forms.Form):
    comment = forms.CharField(
        label=gettext_lazy("Comment"),
        required=False,
        max_length=APPROVAL_COMMENT_LIMIT,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text=gettext_lazy("Kept on the approval decision and in the audit entry."),
    )


#: The job page: every field, read-only, JSON pretty-printed.
_JOB_PAGE: list[tuple[Any, tuple[str, ...]]] = [
    (
        None,
        (
            "id",
            "request_id",
            "status_display",
            "target",
            "source",
            "thread_id",
            "session_id",
            "attempts",
            "callback_url",
        ),
    ),
    (
        gettext_lazy("Timing and claim"),
        (
            "created_at",
            "updated_at",
            "run_after",
            "claimed_at",
            "dispatched_at",
            "lease_until",
            "lease",
            "executor_id",
            "claim_token",
        ),
    ),
    (gettext_lazy("Input"), ("input_preview_text", "input_json")),
    (
        gettext_lazy("Outcome"),
        ("result_json", "report_json", "usage_json", "error_text", "metadata_json"),
    ),
]


def _job_label(job: Job) -> str:
    return job.request_id


def _now_status(job: Job) -> str:
    """Why a store call found nothing to do: the job's status as it is now."""
    status = Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()
    if status is None:
        return _("no longer exists")
    return _("now %(status)s") % {"status": JobStatus(status).label}


def _lease_text(job: Job, now: Any) -> str:
    if job.status in CLAIMED_JOB_STATUSES:
        if job.lease_until is None:
            return _("no lease")
        if job.lease_until < now:
            return _("expired %(when)s") % {"when": relative_time(job.lease_until, now)}
        return _("ends %(when)s") % {"when": relative_time(job.lease_until, now)}
    if job.status == JobStatus.QUEUED and job.run_after is not None and job.run_after > now:
        return _("runs %(when)s") % {"when": relative_time(job.run_after, now)}
    return ""


def _describe(job: Job, now: Any) -> str:
    parts = [str(JobStatus(job.status).label), job.target or "—"]
    lease = _lease_text(job, now)
    if lease:
        parts.append(lease)
    return " · ".join(parts)


@admin.register(Job)
class JobAdmin(TaskFieldsAdmin):
    """Jobs: browse, inspect, and (with the matching permission) requeue, reject or
    approve them. Every change goes through the state store and is audited with the
    operator's user name."""

    list_display = [
        "request_id_cell",
        "status_display",
        "target",
        "task_display",
        "source",
        "thread_id",
        "attempts",
        "age",
        "lease",
        "executor_cell",
    ]
    list_filter = [
        "status",
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
        '"text", true, false or null; a.b=1 for a nested key), worker:w-1. Quote values '
        'with spaces: error:"timed out".'
    )
    # Served by the jobstate_job_recent_idx index (ties broken by the time-ordered id).
    ordering = ["-created_at"]
    actions = ["requeue_jobs", "reject_jobs", "approve_and_requeue_jobs"]
    fieldsets = [(title, {"fields": names}) for title, names in _JOB_PAGE]
    readonly_fields = [name for _title, names in _JOB_PAGE for name in names] + list(TASK_FIELDS)
    redaction_sources = ("input", "result", "report", "usage", "metadata")

    def get_queryset(self, request: HttpRequest) -> QuerySet[Job]:
        # Leases are judged on the clock that wrote them (see with_database_now).
        return with_database_now(super().get_queryset(request))

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """The list narrowed by the search (:mod:`jobstate.console.job_search`); a search it
        cannot read shows why and lists nothing."""
        if not search_term.strip():
            return queryset, False
        try:
            return parse_search(search_term).apply(queryset), False
        except SearchError as exc:
            fields = ", ".join(f"{name}: ({what})" for name, what in SEARCH_FIELDS.items())
            self.message_user(
                request,
                _("Search not understood: %(error)s Search fields: %(fields)s.")
                % {"error": exc, "fields": fields},
                messages.ERROR,
            )
            return queryset.none(), False

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        context = {**(extra_context or {}), "jobstate_bulk_links": bulk_links(self, request)}
        return super().changelist_view(request, context)

    def get_fieldsets(self, request: HttpRequest, obj: Job | None = None) -> Any:
        # A task's page shows what it runs right after what the job is.
        first, *rest = super().get_fieldsets(request, obj)
        return [first, *self.task_fieldset(request, obj), *rest]

    # --- columns and fields ----------------------------------------------------------

    @admin.display(description=gettext_lazy("request id"), ordering="request_id")
    def request_id_cell(self, job: Job) -> SafeString:
        # One line however long: cut with an ellipsis by the list's CSS, whole in the
        # tooltip and on the job's page.
        return format_html(
            '<span class="jobstate-one-line" title="{}">{}</span>', job.request_id, job.request_id
        )

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_display(self, job: Job) -> SafeString:
        return choice_badge(job.status, JobStatus(job.status).label)

    @admin.display(description=gettext_lazy("executor / worker"), ordering="executor_id")
    def executor_cell(self, job: Job) -> SafeString | str:
        if not job.executor_id:
            return "—"
        return format_html(
            '<span class="jobstate-one-line" title="{}">{}</span>', job.executor_id, job.executor_id
        )

    @admin.display(description=gettext_lazy("age"), ordering="created_at")
    def age(self, job: Job) -> str:
        return relative_time(job.created_at)

    @admin.display(description=gettext_lazy("lease"))
    def lease(self, job: Job) -> SafeString | str:
        now = database_now(job)
        text = _lease_text(job, now)
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

    @admin.display(description=gettext_lazy("input"))
    def input_json(self, job: Job) -> SafeString | str:
        return json_block(job.input, self.redactor_for(job))

    @admin.display(description=gettext_lazy("result"))
    def result_json(self, job: Job) -> SafeString | str:
        return json_block(job.result, self.redactor_for(job))

    @admin.display(description=gettext_lazy("report"))
    def report_json(self, job: Job) -> SafeString | str:
        return json_block(job.report, self.redactor_for(job))

    @admin.display(description=gettext_lazy("usage"))
    def usage_json(self, job: Job) -> SafeString | str:
        return json_block(job.usage, self.redactor_for(job))

    @admin.display(description=gettext_lazy("metadata"))
    def metadata_json(self, job: Job) -> SafeString | str:
        return json_block(job.metadata, self.redactor_for(job))

    @admin.display(description=gettext_lazy("input preview"))
    def input_preview_text(self, job: Job) -> SafeString | str:
        return text_block(job.input_preview, self.redactor_for(job))

    @admin.display(description=gettext_lazy("error"))
    def error_text(self, job: Job) -> SafeString | str:
        return text_block(job.error, self.redactor_for(job))

    # --- permissions -----------------------------------------------------------------

    def has_requeue_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "requeue_job")

    def has_reject_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "reject_job")

    def has_approve_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "approve_job")

    def has_delete_finished_permission(self, request: HttpRequest) -> bool:
        return self.user_can(request, "delete_finished_job")

    # --- actions ---------------------------------------------------------------------

    @admin.action(description=gettext_lazy("Requeue selected jobs…"), permissions=["requeue"])
    def requeue_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return run_confirmed_action(self, request, queryset, self.requeue_spec(request))

    @admin.action(
        description=gettext_lazy("Reject (cancel) selected queued jobs…"), permissions=["reject"]
    )
    def reject_jobs(self, request: HttpRequest, queryset: QuerySet[Job]) -> HttpResponse | None:
        return run_confirmed_action(self, request, queryset, self.reject_spec(request))

    @admin.action(
        description=gettext_lazy("Approve and requeue selected jobs once…"),
        permissions=["approve"],
    )
    def approve_and_requeue_jobs(
        self, request: HttpRequest, queryset: QuerySet[Job]
    ) -> HttpResponse | None:
        return run_confirmed_action(self, request, queryset, self.approve_spec(request))

    def requeue_spec(self, request: HttpRequest) -> ActionSpec:
        by = self.operator(request)

        def row(job: Job) -> ActionRow:
            now = database_now(job)
            why: str | None = None
            if job.status == JobStatus.QUEUED:
                why = _("already queued")
            elif not job.requeueable_at(now):
                why = _("%(status)s and its lease has not expired") % {
                    "status": JobStatus(job.status).label
                }
            return ActionRow(job, _job_label(job), _describe(job, now), why)

        def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
            # The requeue of the bulk operations, for one job in the status it was seen in.
            refired = get_state_store().requeue_jobs([(job.pk, job.status)], by=by, via=ADMIN_VIA)
            return None if refired else _now_status(job)

        return ActionSpec(
            name="requeue_jobs",
            permission="requeue",
            title=_("Requeue jobs"),
            intro=_(
                "Finished jobs (done, error, rejected) and running or dispatched jobs whose "
                "lease has expired go back to the queue: attempts reset, delay, error and "
                "claim cleared. Each gets a “rerun” audit entry naming you. A job that "
                "changes before you confirm is left alone."
            ),
            confirm_label=_("Yes, requeue"),
            done=lambda n: (
                ngettext("Requeued %(count)d job.", "Requeued %(count)d jobs.", n) % {"count": n}
            ),
            row=row,
            perform=perform,
        )

    def reject_spec(self, request: HttpRequest) -> ActionSpec:
        by = self.operator(request)

        def row(job: Job) -> ActionRow:
            now = database_now(job)
            why = None if job.status == JobStatus.QUEUED else _("not queued")
            return ActionRow(job, _job_label(job), _describe(job, now), why)

        def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
            rejected = get_state_store().reject_queued_job(
                job.pk, by=by, reason=inputs.get("reason", "")
            )
            return None if rejected is not None else _now_status(job)

        return ActionSpec(
            name="reject_jobs",
            permission="reject",
            title=_("Reject queued jobs"),
            intro=_(
                "Queued jobs become rejected and are never claimed. Each gets a “rejected” "
                "audit entry naming you and the reason. A job claimed before you confirm "
                "is left alone."
            ),
            confirm_label=_("Yes, reject"),
            done=lambda n: (
                ngettext("Rejected %(count)d job.", "Rejected %(count)d jobs.", n) % {"count": n}
            ),
            row=row,
            perform=perform,
            form_class=RejectForm,
        )

    def approve_spec(self, request: HttpRequest) -> ActionSpec:
        by = self.operator(request)
        reasons = {
            ApprovalRequeueOutcome.ALREADY_REQUEUED: _("this approval already requeued it"),
            ApprovalRequeueOutcome.DECISION_CONFLICT: _("decision id already used"),
            ApprovalRequeueOutcome.JOB_IN_FLIGHT: _("in flight now; it will use the approval"),
            ApprovalRequeueOutcome.NOT_FOUND: _("no longer exists"),
        }

        def row(job: Job) -> ActionRow:
            now = database_now(job)
            why = (
                None
                if job.status in TERMINAL_JOB_STATUSES
                else _("in flight; it will use the approval itself")
            )
            return ActionRow(job, _job_label(job), _describe(job, now), why)

        def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
            # One decision per approval round of the job: two operators confirming the
            # same round at once share the id, so the store requeues only once.
            rounds = ApprovalDecision.objects.filter(job_id=job.pk).count()
            outcome = get_state_store().requeue_approved_job_once(
                job_id=job.pk,
                decision_id=f"admin:{job.pk}:{rounds + 1}",
                approver=by,
                comment=inputs.get("comment", ""),
            )
            return None if outcome is ApprovalRequeueOutcome.REQUEUED else reasons[outcome]

        return ActionSpec(
            name="approve_and_requeue_jobs",
            permission="approve",
            title=_("Approve and requeue jobs"),
            intro=_(
                "Records your approval of each finished job (a permanent decision marker "
                "with your name and comment) and requeues it, exactly once per approval: "
                "confirming twice, or two operators at once, requeues a job only once."
            ),
            confirm_label=_("Yes, approve and requeue"),
            done=lambda n: (
                ngettext(
                    "Approved and requeued %(count)d job.",
                    "Approved and requeued %(count)d jobs.",
                    n,
                )
                % {"count": n}
            ),
            row=row,
            perform=perform,
            form_class=ApproveForm,
        )

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
        buttons = []
        candidates = [
            ("requeue", "requeue_jobs", _("Requeue…"), self.requeue_spec(request)),
            ("reject", "reject_jobs", _("Reject…"), self.reject_spec(request)),
            (
                "approve",
                "approve_and_requeue_jobs",
                _("Approve and requeue…"),
                self.approve_spec(request),
            ),
        ]
        for permission, action, label, spec in candidates:
            allowed = getattr(self, f"has_{permission}_permission")(request)
            if allowed and spec.row(job).skip_reason is None:
                buttons.append({"action": action, "label": label, "return_to": request.path})
        return {
            "jobstate_job_page": True,
            "job_timeline": job_timeline(job, trail, page, database_now(job)),
            "audit_trail": [
                {
                    "entry": entry,
                    "title": page.text(entry.title),
                    "summary": page.summary(entry.summary, entry.detail),
                    "detail": json_block(entry.detail, page) if entry.detail else "",
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
                        (attempt, page.text(attempt.error or ""))
                        for attempt in notification.delivery_attempts.all()
                    ],
                }
                for notification in notifications
            ],
            "task_attempts": attempt_rows(job, page),
            "job_is_task": job.task_path is not None,
            "job_action_buttons": buttons,
            "job_changelist_url": reverse(f"{self.admin_site.name}:jobstate_job_changelist"),
        }

    # --- the Operations page ---------------------------------------------------------

    def get_urls(self) -> list[URLPattern]:
        operations = path(
            "operations/",
            self.admin_site.admin_view(self.operations_view),
            name="jobstate_dashboard",
        )
        return [operations, *bulk_urls(self), *super().get_urls()]

    def operations_view(self, request: HttpRequest) -> HttpResponse:
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
            "title": _("Operations"),
            "subtitle": None,
            "opts": self.opts,
            "status_cards": status_cards,
            "health_cards": health_cards,
            "finished": finished_per_minute(),
            "throughput": finished_per_hour(),
            "depth": queue_depth_by_target(),
            "job_changelist_url": reverse(f"{self.admin_site.name}:jobstate_job_changelist"),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/jobstate/operations.html", context)
