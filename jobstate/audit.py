"""The audit ledger's vocabulary: stages, severities, known events and how
``append_audit`` fills the fields a caller leaves out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _

from jobstate.exceptions import InvalidJobState
from jobstate.jsonvalues import ensure_json
from jobstate.stores.base import JobStatus
from jobstate.stores.validation import parse_choice, require_text, validate_audit_text


class AuditStage(models.TextChoices):
    LAUNCH = "launch", _("Launch")
    CONTEXT = "context", _("Context")
    EXECUTION = "execution", _("Execution")
    TOOL = "tool", _("Tool")
    APPROVAL = "approval", _("Approval")
    DELIVERY = "delivery", _("Delivery")
    SUMMARY = "summary", _("Summary")
    RECOVERY = "recovery", _("Recovery")
    CHANNEL = "channel", _("Channel")
    CONFIG = "config", _("Configuration")
    SYSTEM = "system", _("System")


class AuditSeverity(models.TextChoices):
    INFO = "info", _("Info")
    WARNING = "warning", _("Warning")
    ERROR = "error", _("Error")


@dataclass(frozen=True)
class AuditEventDefaults:
    """What ``append_audit`` fills in for a known event when the caller leaves it out."""

    stage: AuditStage
    severity: AuditSeverity
    title: str


#: Known audit events. An unknown event is stored as stage ``system``, severity ``info``
#: and its own name as the title.
AUDIT_EVENTS: dict[str, AuditEventDefaults] = {
    "received": AuditEventDefaults(AuditStage.LAUNCH, AuditSeverity.INFO, "Request received"),
    "started": AuditEventDefaults(AuditStage.EXECUTION, AuditSeverity.INFO, "Started"),
    "finished": AuditEventDefaults(AuditStage.SUMMARY, AuditSeverity.INFO, "Finished"),
    "rejected": AuditEventDefaults(AuditStage.LAUNCH, AuditSeverity.WARNING, "Rejected"),
    "recovered": AuditEventDefaults(AuditStage.RECOVERY, AuditSeverity.WARNING, "Recovered"),
    "rerun": AuditEventDefaults(AuditStage.RECOVERY, AuditSeverity.INFO, "Rerun requested"),
    "retry_scheduled": AuditEventDefaults(
        AuditStage.RECOVERY, AuditSeverity.WARNING, "Retry scheduled"
    ),
    "expired": AuditEventDefaults(AuditStage.RECOVERY, AuditSeverity.WARNING, "Expired"),
    "tool_result": AuditEventDefaults(AuditStage.TOOL, AuditSeverity.INFO, "Tool result"),
    "tool_approved": AuditEventDefaults(AuditStage.APPROVAL, AuditSeverity.INFO, "Tool approved"),
    "tool_approved_external": AuditEventDefaults(
        AuditStage.APPROVAL, AuditSeverity.INFO, "Tool approved externally"
    ),
    "tool_denied": AuditEventDefaults(AuditStage.APPROVAL, AuditSeverity.WARNING, "Tool denied"),
    "tool_denied_external": AuditEventDefaults(
        AuditStage.APPROVAL, AuditSeverity.WARNING, "Tool denied externally"
    ),
    "delivery_queued": AuditEventDefaults(
        AuditStage.DELIVERY, AuditSeverity.INFO, "Delivery queued"
    ),
    "delivery_skipped": AuditEventDefaults(
        AuditStage.DELIVERY, AuditSeverity.INFO, "Delivery skipped"
    ),
    "delivery_error": AuditEventDefaults(
        AuditStage.DELIVERY, AuditSeverity.ERROR, "Delivery failed"
    ),
    "dlq_resend_ok": AuditEventDefaults(
        AuditStage.DELIVERY, AuditSeverity.INFO, "Dead letter resent"
    ),
    "dlq_resend_failed": AuditEventDefaults(
        AuditStage.DELIVERY, AuditSeverity.ERROR, "Dead letter resend failed"
    ),
    "channel_delivered": AuditEventDefaults(
        AuditStage.CHANNEL, AuditSeverity.INFO, "Delivered to channel"
    ),
    "channel_delivery_error": AuditEventDefaults(
        AuditStage.CHANNEL, AuditSeverity.ERROR, "Channel delivery failed"
    ),
    "channel_delivery_skipped": AuditEventDefaults(
        AuditStage.CHANNEL, AuditSeverity.INFO, "Channel delivery skipped"
    ),
    "ledger_error": AuditEventDefaults(AuditStage.SYSTEM, AuditSeverity.ERROR, "Ledger error"),
}


AUDIT_SUMMARY_LIMIT = 500

#: Joins the ``key: value`` pairs of a summary built from ``detail``.
AUDIT_SUMMARY_SEPARATOR = " · "


AUDIT_TITLE_LIMIT = 200


@dataclass(frozen=True)
class AuditFields:
    """The trace fields of an audit entry after ``complete_audit_fields``."""

    stage: AuditStage
    severity: AuditSeverity
    title: str
    summary: str
    detail: dict[str, Any]


def default_audit_summary(detail: dict[str, Any]) -> str:
    """The summary an entry gets when its writer gives none: the scalar members of
    ``detail`` as ``key: value`` pairs joined by :data:`AUDIT_SUMMARY_SEPARATOR`, in
    order, cut to :data:`AUDIT_SUMMARY_LIMIT`. The admin masks the pairs whose key it
    redacts (see ``jobstate.admin.redaction``), so keep this format in step with it."""
    summary = AUDIT_SUMMARY_SEPARATOR.join(
        f"{key}: {value}"
        for key, value in detail.items()
        if isinstance(value, str | int | float | bool)
    )
    return summary[:AUDIT_SUMMARY_LIMIT]


def complete_audit_fields(
    *,
    event: str,
    stage: str | None,
    severity: str | None,
    title: str,
    summary: str,
    detail: dict[str, Any] | None,
) -> AuditFields:
    """Validate an audit entry and fill what the caller left out from :data:`AUDIT_EVENTS`.

    Given values always win. ``finished`` takes its severity from ``detail["status"]``
    (``error`` -> error, ``rejected`` -> warning). The default summary lists the scalar
    values of ``detail`` as ``key: value`` pairs.
    """

    event = require_text(event, field="event", max_length=100)
    validate_audit_text(title=title, summary=summary)
    if detail is None:
        detail = {}
    if not isinstance(detail, dict):
        raise InvalidJobState(f"detail must be a dict, got {type(detail).__name__}.")
    ensure_json(detail, field="detail")
    known = AUDIT_EVENTS.get(event)
    if stage is None:
        stage_value = known.stage if known else AuditStage.SYSTEM
    else:
        stage_value = parse_choice(AuditStage, stage, field="stage")
    if severity is None:
        severity_value = known.severity if known else AuditSeverity.INFO
        if event == "finished":
            severity_value = {
                JobStatus.ERROR.value: AuditSeverity.ERROR,
                JobStatus.REJECTED.value: AuditSeverity.WARNING,
            }.get(str(detail.get("status")), severity_value)
    else:
        severity_value = parse_choice(AuditSeverity, severity, field="severity")
    for name, value in (("title", title), ("summary", summary)):
        if not isinstance(value, str):
            raise InvalidJobState(f"{name} must be a string, got {type(value).__name__}.")
    if not title:
        title = known.title if known else event
    if not summary:
        summary = default_audit_summary(detail)
    return AuditFields(
        stage=stage_value,
        severity=severity_value,
        title=title[:AUDIT_TITLE_LIMIT],
        summary=summary[:AUDIT_SUMMARY_LIMIT],
        detail=detail,
    )
