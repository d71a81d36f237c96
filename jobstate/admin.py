"""The operators' console. History tables are read-only: rows change only through stores."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from jobstate.models import JobRun, JobRunStatus

_RUN_STATUS_COLOURS = {
    JobRunStatus.RUNNING: "#1f6feb",
    JobRunStatus.SUCCEEDED: "#1a7f37",
    JobRunStatus.FAILED: "#cf222e",
    JobRunStatus.TIMED_OUT: "#bc4c00",
    JobRunStatus.SKIPPED: "#6e7781",
}


def status_badge(label: str, colour: str) -> SafeString:
    return format_html(
        '<span style="background:{};color:#fff;padding:1px 8px;border-radius:9px;'
        'font-size:11px;font-weight:600">{}</span>',
        colour,
        label,
    )


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable by anyone with the view permission; never added, edited or deleted here."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdmin):
    list_display = [
        "job_key",
        "status_display",
        "overlap_key",
        "started_at",
        "heartbeat_at",
        "duration_display",
        "trigger_source",
        "triggered_by",
    ]
    list_filter = ["status", "trigger_source"]
    search_fields = ["=id", "job_key", "overlap_key"]
    ordering = ["-started_at"]
    date_hierarchy = None
    show_full_result_count = False
    list_per_page = 50

    @admin.display(description=_("status"), ordering="status")
    def status_display(self, run: JobRun) -> SafeString:
        status = JobRunStatus(run.status)
        return status_badge(str(status.label), _RUN_STATUS_COLOURS[status])

    @admin.display(description=_("duration"), ordering="duration_ms")
    def duration_display(self, run: JobRun) -> str:
        if run.duration_ms is None:
            return "—"
        seconds = run.duration_ms / 1000
        return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"
