"""The audit ledger's vocabulary: stages, severities, known events and how
``append_audit`` fills the fields a caller leaves out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobstate.core.jsonvalues import ensure_json

# The ledger's vocabulary lives in jobstate.core.states; it is importable from here too.
from jobstate.core.states import (
    AUDIT_EVENTS,
    AUDIT_SUMMARY_LIMIT,
    AUDIT_SUMMARY_SEPARATOR,
    AUDIT_TITLE_LIMIT,
    AuditEventDefaults,
    AuditSeverity,
    AuditStage,
    JobStatus,
)
from jobstate.exceptions import InvalidJobState
from jobstate.stores.contracts.validation import (
    column_limit,
    parse_choice,
    require_text,
    validate_audit_text,
)

__all__ = [
    "AUDIT_EVENTS",
    "AUDIT_SUMMARY_LIMIT",
    "AUDIT_SUMMARY_SEPARATOR",
    "AUDIT_TITLE_LIMIT",
    "AuditEventDefaults",
    "AuditFields",
    "AuditSeverity",
    "AuditStage",
    "complete_audit_fields",
    "default_audit_summary",
]


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
    redacts (see ``jobstate.console.redaction``), so keep this format in step with it."""
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

    event = require_text(event, field="event", max_length=column_limit("AuditEntry", "event"))
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
