"""Checks of the arguments of the state store's methods beyond a job's fields: batches
of reports and claims, the refire, reject and approval transitions, and the
notifications of a fenced completion."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from jobstate.core.conf import jobstate_settings
from jobstate.core.jsonvalues import ensure_json
from jobstate.core.states import ClaimReport, JobStatus, NotificationRequest
from jobstate.exceptions import (
    DuplicateNotification,
    InvalidJobState,
    InvalidNotification,
    InvalidPayload,
)
from jobstate.stores.contracts.validation.job_fields import (
    JOB_REPORT_FIELDS,
    clean_job_fields,
    validate_release_status,
)
from jobstate.stores.contracts.validation.values import (
    column_limit,
    optional_text,
    parse_statuses,
    parse_uuid,
    require_text,
    text_problem,
)

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = [
    "APPROVAL_COMMENT_LIMIT",
    "REJECT_REASON_LIMIT",
    "ParsedReport",
    "default_idempotency_key",
    "parse_claim_pairs",
    "parse_claim_reports",
    "validate_approval_arguments",
    "validate_notification_requests",
    "validate_reject_arguments",
    "validate_requeue_arguments",
]

#: Longest reason ``reject_queued_job`` accepts (it becomes the job's ``error``).
REJECT_REASON_LIMIT = 2000

#: Longest approval comment accepted (it is kept on the decision marker and the audit).
APPROVAL_COMMENT_LIMIT = 2000

_VIA_LIMIT = 250

#: A validated report: job id, claim token, release status, cleaned patch.
ParsedReport = tuple[uuid.UUID, uuid.UUID, JobStatus, dict[str, Any]]


# --- claims and reports ----------------------------------------------------------------


def parse_claim_reports(reports: Sequence[ClaimReport]) -> list[ParsedReport]:
    """Validate a batch of reports before anything is written. The same job twice in
    one batch is refused: its outcome would depend on the order in which the reports
    are applied."""
    # A list (what the worker passes) needs no abstract Sequence check, which costs calls.
    if type(reports) is not list and (
        isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence)
    ):
        raise InvalidJobState("reports must be a sequence of ClaimReport.")
    parsed: list[ParsedReport] = []
    seen: set[uuid.UUID] = set()
    for report in reports:
        if not isinstance(report, ClaimReport):
            raise InvalidJobState(f"every report must be a ClaimReport, got {report!r}.")
        pk = parse_uuid(report.job_id, field="job_id")
        if pk in seen:
            raise InvalidJobState(f"job {pk} appears twice in one batch of reports.")
        seen.add(pk)
        token = parse_uuid(report.claim_token, field="claim_token")
        status = validate_release_status(report.status)
        cleaned = clean_job_fields(
            dict(report.patch), allowed=JOB_REPORT_FIELDS, action="complete_claimed_jobs"
        )
        parsed.append((pk, token, status, cleaned))
    return parsed


def parse_claim_pairs(claims: Sequence[tuple[Any, Any]]) -> list[tuple[uuid.UUID, uuid.UUID]]:
    """Validate the ``(job id, claim token)`` pairs of ``extend_claim_leases`` before
    anything is written; the same job twice is refused."""
    if isinstance(claims, (str, bytes)) or not isinstance(claims, Sequence):
        raise InvalidJobState("claims must be a sequence of (job id, claim token) pairs.")
    parsed: list[tuple[uuid.UUID, uuid.UUID]] = []
    seen: set[uuid.UUID] = set()
    for pair in claims:
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise InvalidJobState(
                f"every claim must be a (job id, claim token) pair, got {pair!r}."
            )
        pk = parse_uuid(pair[0], field="job_id")
        if pk in seen:
            raise InvalidJobState(f"job {pk} appears twice in one batch of claims.")
        seen.add(pk)
        parsed.append((pk, parse_uuid(pair[1], field="claim_token")))
    return parsed


# --- continuations ---------------------------------------------------------------------


def validate_reject_arguments(by: str, reason: str, via: str = "") -> str:
    """Check the arguments of ``reject_queued_job`` and return the text the job's
    ``error`` gets."""
    require_text(by, field="by")
    if via != "":
        require_text(via, field="via", max_length=_VIA_LIMIT)
    optional_text(reason, field="reason", limit=REJECT_REASON_LIMIT)
    return reason.strip() or f"rejected by {by}"


def validate_requeue_arguments(
    from_statuses: Sequence[str], by: str, via: str, event: str
) -> list[JobStatus]:
    """Check the arguments of ``requeue_job`` and return the statuses parsed."""
    statuses = parse_statuses(from_statuses)
    require_text(by, field="by")
    require_text(via, field="via", max_length=_VIA_LIMIT)
    require_text(event, field="event", max_length=column_limit("AuditEntry", "event"))
    return statuses


def validate_approval_arguments(decision_id: str, approver: str, comment: str) -> None:
    """Check the arguments of ``requeue_approved_job_once``."""
    require_text(decision_id, field="decision_id")
    require_text(approver, field="approver")
    optional_text(comment, field="comment", limit=APPROVAL_COMMENT_LIMIT)


# --- notifications ---------------------------------------------------------------------


def default_idempotency_key(job: Job, channel: str, destination: str) -> str:
    """``<job id>:<completion>:<channel>:<destination>``: one key per completion of
    ``job`` (the job as the completion read it) and destination.

    ``<completion>`` is the claim the completion ends (its token): a retried completion
    of the same claim gets the same key, so it never notifies twice, while a job an
    operator requeued is claimed anew and its next outcome notifies again. A job
    completed without a claim (a queued job rejected) is told apart by the instant of
    its last change (``updated_at``, as read), which every requeue moves. When the key
    would exceed 200 characters, ``<channel>:<destination>`` is replaced by
    ``sha256:`` and the SHA-256 of both."""
    completion = _completion_marker(job)
    key = f"{job.id}:{completion}:{channel}:{destination}"
    if len(key) <= _key_limit():
        return key
    digest = hashlib.sha256(f"{channel}\0{destination}".encode()).hexdigest()
    return f"{job.id}:{completion}:sha256:{digest}"


def _completion_marker(job: Job) -> str:
    if job.claim_token is not None:
        return str(job.claim_token)
    changed = job.updated_at
    if not isinstance(changed, datetime):
        raise InvalidJobState(
            "an unclaimed job's default idempotency key needs its updated_at as read "
            "from the store; pass an idempotency_key or the job as loaded."
        )
    return changed.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def validate_notification_requests(
    job: Job, notifications: Iterable[NotificationRequest]
) -> list[NotificationRequest]:
    """Check every request (channel registered in ``JOBSTATE['CHANNELS']``, destination
    and key sizes, payload a strict JSON object) and return them with their idempotency
    keys filled in. Raises :class:`InvalidNotification` or :class:`InvalidPayload`, and
    :class:`DuplicateNotification` for a key repeated within the list."""
    if isinstance(notifications, NotificationRequest | str | bytes | dict) or not isinstance(
        notifications, Iterable
    ):
        raise InvalidNotification(
            f"notifications must be a list of NotificationRequest, got {notifications!r}."
        )
    channels = jobstate_settings.CHANNELS
    cleaned: list[NotificationRequest] = []
    seen: set[str] = set()
    for request in notifications:
        if not isinstance(request, NotificationRequest):
            raise InvalidNotification(
                f"every notification must be a NotificationRequest, got {type(request).__name__}."
            )
        channel, destination, key = request.channel, request.destination, request.idempotency_key
        if not isinstance(channel, str) or channel not in channels:
            known = ", ".join(sorted(channels)) or "none"
            raise InvalidNotification(
                f"channel {channel!r} is not in JOBSTATE['CHANNELS'] (known: {known})."
            )
        _check_text(
            destination, field="destination", limit=column_limit("Notification", "destination")
        )
        if not isinstance(request.payload, dict):
            raise InvalidPayload(
                f"notification payload must be a dict, got {type(request.payload).__name__}."
            )
        ensure_json(request.payload, field="notification payload")
        if key is None:
            key = default_idempotency_key(job, channel, destination)
        _check_text(key, field="idempotency_key", limit=_key_limit())
        if key in seen:
            raise DuplicateNotification(
                f"idempotency_key {key!r} appears twice in one completion.", idempotency_key=key
            )
        seen.add(key)
        cleaned.append(
            NotificationRequest(
                channel=channel,
                destination=destination,
                payload=request.payload,
                idempotency_key=key,
            )
        )
    return cleaned


def _key_limit() -> int:
    return column_limit("Notification", "idempotency_key") or 0


def _check_text(value: Any, *, field: str, limit: int | None) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidNotification(f"{field} must be a non-empty string, got {value!r}.")
    if (limit is not None and len(value) > limit) or text_problem(value):
        raise InvalidNotification(
            f"{field} must be at most {limit} characters of valid Unicode, without NUL."
        )
