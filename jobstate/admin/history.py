"""Read-only ledgers: the audit trail, approval decisions and dead-letter replays."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import admin
from django.contrib.admin.views.main import ChangeList
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext_lazy

from jobstate.admin.common import (
    REDACTOR_ATTRIBUTE,
    ReadOnlyAdmin,
    admin_change_url,
    choice_badge,
    exact_search,
    redacted_field,
)
from jobstate.admin.display import short_id
from jobstate.admin.filters import (
    AuditEventFilter,
    AuditStageFilter,
    BulkOperationFilter,
    OfferedChoicesFilter,
)
from jobstate.admin.list_cells import breakable, cut_middle, one_line, with_sub
from jobstate.admin.page_bases import moment_field
from jobstate.console.redaction import Redactor
from jobstate.core.bidi import isolated_parts
from jobstate.core.states import AUDIT_SUMMARY_SEPARATOR
from jobstate.models import ApprovalDecision, AuditEntry, DeliveryReplay, Job, Notification
from jobstate.stores.contracts.audit import AuditSeverity

__all__ = ["ApprovalDecisionAdmin", "AuditEntryAdmin", "DeliveryReplayAdmin"]


class LedgerAdmin(ReadOnlyAdmin):
    """A read-only ledger whose rows name jobs or notifications by id."""

    def link(self, model: type[Job] | type[Notification], pk: Any, text: str = "") -> Any:
        """A link to a row by id without loading it (the row may have been pruned: the
        ledgers keep ids without a database constraint)."""
        if pk is None:
            return "—"
        url = admin_change_url(model, pk, self.admin_site.name)
        if text:
            return format_html('<a href="{}">{}</a>', url, text)
        # Shortened in the middle: time-ordered ids share their first characters.
        return short_id(pk, url)


def _notification_id(entry: AuditEntry) -> str | None:
    """The notification an entry is about, as the outbox's entries name it."""
    detail = entry.detail if isinstance(entry.detail, dict) else {}
    named = detail.get("notification_id")
    return named if isinstance(named, str) else None


def notification_payloads(entries: list[AuditEntry]) -> dict[str, Any]:
    """The payloads of the notifications ``entries`` name, by id (one query, none when
    no entry names one; a pruned notification is simply absent)."""
    named = {pk for pk in map(_notification_id, entries) if pk is not None}
    valid = []
    for pk in named:
        try:
            valid.append(uuid.UUID(pk))
        except ValueError:
            continue  # a host's own entry may use the key for something else
    if not valid:
        return {}
    rows = Notification.objects.filter(id__in=valid).values_list("id", "payload")
    return {str(pk): payload for pk, payload in rows}


_AUDIT_ENTRY_FIELDS: tuple[str, ...] = (
    "id",
    "ts",
    "job_link",
    "request_id",
    "event",
    "stage",
    "severity_display",
    "title_text",
    "summary_text",
    "detail_json",
)


@admin.register(AuditEntry)
class AuditEntryAdmin(LedgerAdmin):
    # The stage under the event, the summary under the title, the request id under the
    # job's id.
    list_display = ["when", "severity_display", "event_cell", "what", "job_cell"]
    list_filter = [
        ("stage", AuditStageFilter),
        ("severity", OfferedChoicesFilter),
        AuditEventFilter,
        BulkOperationFilter,
    ]
    phone_hidden_columns = ("event_cell",)
    empty_list_text = gettext_lazy(
        "No audit entries. Every transition of a job (created, claimed, finished, "
        "requeued by an operator…), every delivery and every console action appends one "
        "entry here, naming who or what did it. Entries stay until they are pruned."
    )
    search_fields = ["request_id"]
    search_help_text = gettext_lazy("An exact job id, request id or event.")
    # Served by the jobstate_audit_recent_idx index, exactly.
    ordering = ["-ts", "-id"]
    fields = _AUDIT_ENTRY_FIELDS
    readonly_fields = _AUDIT_ENTRY_FIELDS
    redaction_sources = ("detail",)

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        return exact_search(
            queryset, term, uuid_fields=["job_id"], text_fields=["request_id", "event"]
        )

    def build_redactor(self, obj: Any) -> Redactor:
        """An entry about a notification (a delivery error, a replay) also hides the
        values under redacted keys of that notification's payload: a channel's error
        text, kept in ``detail``, may quote them."""
        return super().build_redactor(obj).including(*notification_payloads([obj]).values())

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The list's page of entries, each with its redactor: the payloads of the
        notifications the page names are read in one query, not one per row."""
        changelist = super().get_changelist_instance(request)
        entries = list(changelist.result_list)
        payloads = notification_payloads(entries)
        for entry in entries:
            named = _notification_id(entry)
            own = [payloads[named]] if named in payloads else []
            setattr(entry, REDACTOR_ATTRIBUTE, super().build_redactor(entry).including(*own))
        changelist.result_list = entries
        return changelist

    when = moment_field("ts", gettext_lazy("time"))

    @admin.display(description=gettext_lazy("event / stage"), ordering="event")
    def event_cell(self, entry: AuditEntry) -> SafeString | str:
        # An event is one name of words joined by underscores: it wraps between them
        # ("retry_/scheduled") rather than inside one ("retry_sched/uled").
        return with_sub(breakable(entry.event, "._-:/"), entry.get_stage_display())

    @admin.display(description=gettext_lazy("what happened"))
    def what(self, entry: AuditEntry) -> SafeString | str:
        return with_sub(
            self.title_text(entry),
            format_html('<span class="jobstate-summary">{}</span>', self.summary_short(entry)),
        )

    @admin.display(description=gettext_lazy("job / request id"))
    def job_cell(self, entry: AuditEntry) -> SafeString | str:
        if entry.job_id is None:
            return entry.request_id or "—"
        request_id = entry.request_id or ""
        return with_sub(self.link(Job, entry.job_id), one_line(cut_middle(request_id), request_id))

    @admin.display(description=gettext_lazy("severity"), ordering="severity")
    def severity_display(self, entry: AuditEntry) -> SafeString:
        return choice_badge(entry.severity, AuditSeverity(entry.severity).label)

    @admin.display(description=gettext_lazy("title"))
    def title_text(self, entry: AuditEntry) -> str:
        return self.redactor_for(entry).text(entry.title)

    @admin.display(description=gettext_lazy("summary"))
    def summary_short(self, entry: AuditEntry) -> str:
        shown = Truncator(self.redactor_for(entry).summary(entry.summary, entry.detail)).chars(120)
        return isolated_parts(shown, AUDIT_SUMMARY_SEPARATOR)

    @admin.display(description=gettext_lazy("summary"))
    def summary_text(self, entry: AuditEntry) -> str:
        shown = self.redactor_for(entry).summary(entry.summary, entry.detail)
        return isolated_parts(shown, AUDIT_SUMMARY_SEPARATOR)

    @admin.display(description=gettext_lazy("job"))
    def job_link(self, entry: AuditEntry) -> Any:
        return self.link(Job, entry.job_id)

    detail_json = redacted_field("detail", gettext_lazy("detail"))


_APPROVAL_DECISION_FIELDS: tuple[str, ...] = (
    "decision_id",
    "job_link",
    "approver",
    "comment_text",
    "created_at",
)


@admin.register(ApprovalDecision)
class ApprovalDecisionAdmin(LedgerAdmin):
    list_display = ["decision_id", "job_link", "approver", "comment_short", "created"]
    phone_hidden_columns = ("comment_short",)
    empty_list_text = gettext_lazy(
        "No approval decisions. A decision is recorded when an operator approves and "
        "requeues a job (the jobs list's action, or the job's page), with the approver's "
        "name and comment."
    )
    created = moment_field("created_at", gettext_lazy("created"))
    search_fields = ["decision_id"]
    search_help_text = gettext_lazy("An exact decision id, approver or job id.")
    ordering = ["-created_at"]
    fields = _APPROVAL_DECISION_FIELDS
    readonly_fields = _APPROVAL_DECISION_FIELDS

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        return exact_search(
            queryset, term, uuid_fields=["job_id"], text_fields=["decision_id", "approver"]
        )

    @admin.display(description=gettext_lazy("job"))
    def job_link(self, decision: ApprovalDecision) -> Any:
        return self.link(Job, decision.job_id)

    @admin.display(description=gettext_lazy("comment"))
    def comment_short(self, decision: ApprovalDecision) -> str:
        return Truncator(self.comment_text(decision)).chars(80)

    @admin.display(description=gettext_lazy("comment"))
    def comment_text(self, decision: ApprovalDecision) -> str:
        return self.redactor_for(decision).text(decision.comment)


_DELIVERY_REPLAY_FIELDS: tuple[str, ...] = (
    "dlq_key",
    "notification_link",
    "requested_by",
    "created_at",
)


@admin.register(DeliveryReplay)
class DeliveryReplayAdmin(LedgerAdmin):
    list_display = ["dlq_key", "notification_link", "requested_by", "created"]
    empty_list_text = gettext_lazy(
        "No delivery replays. A replay is recorded when an operator replays a dead "
        "letter (a notification whose delivery gave up) from the notifications list; "
        "each dead letter is replayed once."
    )
    created = moment_field("created_at", gettext_lazy("created"))
    search_fields = ["dlq_key"]
    search_help_text = gettext_lazy("An exact dead-letter key, requester or notification id.")
    ordering = ["-created_at"]
    fields = _DELIVERY_REPLAY_FIELDS
    readonly_fields = _DELIVERY_REPLAY_FIELDS

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        return exact_search(
            queryset,
            term,
            uuid_fields=["notification_id"],
            text_fields=["dlq_key", "requested_by"],
        )

    @admin.display(description=gettext_lazy("notification"))
    def notification_link(self, replay: DeliveryReplay) -> Any:
        return self.link(Notification, replay.notification_id)
