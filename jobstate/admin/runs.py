"""Runs of operations jobs: read-only history, and reaping stale runs on demand."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext_lazy

from jobstate.admin.common import (
    ActionRow,
    ActionSpec,
    ReadOnlyAdmin,
    choice_badge,
    confirmed_action,
    counted,
    database_now,
    exact_search,
    permission_check,
    redacted_field,
    relative_time,
    with_database_now,
)
from jobstate.admin.filters import OfferedChoicesFilter, RunLivenessFilter, TriggerFilter
from jobstate.admin.links import schedule_link, scheduled_run_key
from jobstate.admin.list_cells import breakable, cut_middle, one_line, with_sub
from jobstate.admin.page_bases import moment_field
from jobstate.core.conf import jobstate_settings
from jobstate.models import JobRun, JobRunStatus
from jobstate.stores import get_run_store, get_state_store
from jobstate.stores.contracts.audit import AuditSeverity, AuditStage

__all__ = ["JobRunAdmin"]

# The annotation carrying the database's clock on every run the admin loads.
_JOB_RUN_FIELDS: tuple[str, ...] = (
    "id",
    "job_key",
    "status_display",
    "overlap_key",
    "trigger_source",
    "triggered_by_display",
    "service_revision",
    "started_at",
    "heartbeat_at",
    "finished_at",
    "duration_display",
    "input_json",
    "summary_json",
    "error_text",
)


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdmin):
    """Runs are history: never edited here. The one action reaps stale RUNNING runs
    through the run store (the atomic reap of obligation S4), freeing their overlap
    keys, and audits it with the operator's name."""

    # A running run's heartbeat and a finished run's duration share a column.
    list_display = [
        "job_key_cell",
        "status_display",
        "overlap_cell",
        "started",
        "heartbeat_or_duration",
        "trigger_cell",
    ]
    phone_hidden_columns = ("overlap_cell", "trigger_cell")
    empty_list_text = gettext_lazy(
        "No job runs. A run is recorded each time an operations job starts (from a "
        "schedule, a command, a Celery task or the console), with its heartbeat while it "
        "runs and its outcome when it ends."
    )

    started = moment_field("started_at", gettext_lazy("started"))

    @admin.display(description=gettext_lazy("job key"), ordering="job_key")
    def job_key_cell(self, run: JobRun) -> SafeString:
        # A job key is a function's dotted path: its long name may wrap at underscores.
        return breakable(run.job_key, "._-:/")

    @admin.display(description=gettext_lazy("heartbeat / duration"), ordering="duration_ms")
    def heartbeat_or_duration(self, run: JobRun) -> SafeString | str:
        if run.status == JobRunStatus.RUNNING:
            return self.heartbeat_age(run)
        return self.duration_display(run)

    @admin.display(description=gettext_lazy("trigger"), ordering="trigger_source")
    def trigger_cell(self, run: JobRun) -> SafeString | str:
        if not run.triggered_by:
            return run.trigger_source
        return with_sub(
            run.trigger_source, one_line(self.triggered_by_display(run), run.triggered_by)
        )

    @admin.display(description=gettext_lazy("overlap key"), ordering="overlap_key")
    def overlap_cell(self, run: JobRun) -> SafeString | str:
        # One line, cut in the middle (keys share their job's prefix), whole in the tooltip.
        if not run.overlap_key:
            return "—"
        return one_line(cut_middle(run.overlap_key, 8), run.overlap_key)

    list_filter = [("status", OfferedChoicesFilter), TriggerFilter, RunLivenessFilter]
    search_fields = ["job_key"]
    search_help_text = gettext_lazy("An exact run id, job key or overlap key.")
    # Served by the jobstate_run_started_idx index.
    ordering = ["-started_at"]
    actions = ["reap_stale_runs"]
    fields = _JOB_RUN_FIELDS
    readonly_fields = _JOB_RUN_FIELDS
    redaction_sources = ("input", "summary")

    def get_queryset(self, request: HttpRequest) -> QuerySet[JobRun]:
        # heartbeat_at is written on the database's clock, so a run's age is measured on
        # it too: the app server's clock may be skewed. The reading rides on the SELECT
        # that loads the runs (the list's page, an action's selection): no extra query.
        return with_database_now(super().get_queryset(request))

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        return exact_search(
            queryset, term, uuid_fields=["id"], text_fields=["job_key", "overlap_key"]
        )

    @admin.display(description=gettext_lazy("status"), ordering="status")
    def status_display(self, run: JobRun) -> SafeString:
        return choice_badge(run.status, JobRunStatus(run.status).label)

    @admin.display(description=gettext_lazy("heartbeat"), ordering="heartbeat_at")
    def heartbeat_age(self, run: JobRun) -> SafeString | str:
        if run.status != JobRunStatus.RUNNING:
            return "—"
        now = database_now(run)
        text = relative_time(run.heartbeat_at, now)
        if run.heartbeat_at <= now - jobstate_settings.STALE_RUN_AFTER:
            return format_html(
                '<strong style="color:#cf222e">{}</strong>', _("%(age)s, stale") % {"age": text}
            )
        return text

    @admin.display(description=gettext_lazy("duration"), ordering="duration_ms")
    def duration_display(self, run: JobRun) -> str:
        if run.duration_ms is None:
            return "—"
        seconds = run.duration_ms / 1000
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"

    @admin.display(description=gettext_lazy("trigger"), ordering="trigger_source")
    def trigger_display(self, run: JobRun) -> SafeString | str:
        if run.triggered_by:
            return format_html("{} ({})", run.trigger_source, self.triggered_by_display(run))
        return run.trigger_source

    @admin.display(description=gettext_lazy("triggered by"))
    def triggered_by_display(self, run: JobRun) -> SafeString | str:
        """Who triggered the run; a schedule's key (``"<key> @ <slot>"``) links its page."""
        key = scheduled_run_key(run.trigger_source, run.triggered_by)
        if key is None:
            return run.triggered_by or "—"
        slot = (run.triggered_by or "")[len(key) :]
        return format_html("{}{}", schedule_link(key, site=self.admin_site.name), slot)

    input_json = redacted_field("input", gettext_lazy("input"))
    summary_json = redacted_field("summary", gettext_lazy("summary"))
    error_text = redacted_field("error", gettext_lazy("error"), text=True)

    has_reap_runs_permission = permission_check("reap_runs")

    reap_stale_runs = confirmed_action(
        "reap_spec",
        description=gettext_lazy("Reap selected stale runs now…"),
        permission="reap_runs",
    )

    def reap_spec(self, request: HttpRequest) -> ActionSpec:
        stale_after = jobstate_settings.STALE_RUN_AFTER
        by = self.operator(request)

        def row(run: JobRun) -> ActionRow:
            now = database_now(run)
            why: str | None = None
            if run.status != JobRunStatus.RUNNING:
                why = _("already %(status)s") % {"status": JobRunStatus(run.status).label}
            elif run.heartbeat_at > now - stale_after:
                why = _("heartbeat is fresh (%(age)s)") % {
                    "age": relative_time(run.heartbeat_at, now)
                }
            detail = _("%(status)s · key %(key)s · heartbeat %(age)s") % {
                "status": JobRunStatus(run.status).label,
                "key": run.overlap_key or "—",
                "age": relative_time(run.heartbeat_at, now),
            }
            return ActionRow(run, f"{run.job_key} {str(run.pk)[:8]}", detail, why)

        def perform(request: HttpRequest, run: JobRun, inputs: dict[str, Any]) -> str | None:
            with transaction.atomic():
                # Holding the run's row keeps it the RUNNING holder of its overlap key
                # (at most one per key, S1) until the reap below, so the reap scoped to
                # that key moves this run and no other.
                holder = (
                    JobRun.objects.select_for_update()
                    .filter(pk=run.pk, status=JobRunStatus.RUNNING)
                    .values_list("job_key", "overlap_key")
                    .first()
                )
                if holder is None:
                    return _("finished meanwhile")
                job_key, overlap_key = holder
                moved = get_run_store().reap_stale(
                    stale_after=stale_after, job_key=job_key, overlap_key=overlap_key, limit=1
                )
                if not moved:
                    return _("heartbeat is fresh again")
                get_state_store().append_audit(
                    event="run_reaped",
                    stage=AuditStage.RECOVERY,
                    severity=AuditSeverity.WARNING,
                    title="Run reaped",
                    summary=f"{job_key} run {run.pk} (key {overlap_key}) reaped by {by}",
                    detail={
                        "run_id": str(run.pk),
                        "job_key": job_key,
                        "overlap_key": overlap_key,
                        "by": by,
                        "via": "admin",
                        "stale_after_seconds": stale_after.total_seconds(),
                    },
                )
            return None

        return ActionSpec(
            title=_("Reap stale runs"),
            intro=_(
                "RUNNING runs whose heartbeat is older than %(stale)s are assumed dead: they "
                "become TIMED_OUT and free their overlap key, so the next run can start. A "
                "run that heartbeats or finishes before you confirm is left alone. Each "
                "reap gets a “run_reaped” audit entry naming you."
            )
            % {"stale": stale_after},
            confirm_label=_("Yes, reap"),
            done=counted(ngettext_lazy("Reaped %(count)d run.", "Reaped %(count)d runs.", "count")),
            row=row,
            perform=perform,
        )
