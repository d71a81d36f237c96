"""Argument checks of the state store's public methods, on top of the field checks in
:mod:`jobstate.stores.contracts.validation`.

:class:`~jobstate.stores.base.StateStore` runs them once, before it calls a backend's
primitives, so every store refuses bad input with the same error before it writes
anything. The few errors a backend raises from inside its own atomic step (a taken
``request_id``, a full thread) are built here too, so their text is the same everywhere.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from jobstate.core.conf import jobstate_settings
from jobstate.core.jsonvalues import ensure_json
from jobstate.core.states import (
    TASK_TARGET_PREFIX,
    ClaimReport,
    JobStatus,
    NewTask,
    NotificationRequest,
)
from jobstate.exceptions import (
    DuplicateNotification,
    DuplicateRequestId,
    InvalidJobState,
    InvalidNotification,
    InvalidPatch,
    InvalidPayload,
    ThreadQuotaExceeded,
)
from jobstate.stores.contracts.validation import (
    BIGINT_MAX,
    ENQUEUE_FIELDS,
    JOB_CLAIM_FIELDS,
    JOB_PATCH_FIELDS,
    clean_job_fields,
    parse_statuses,
    parse_uuid,
    require_text,
    text_problem,
    validate_release_status,
)

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = [
    "APPROVAL_COMMENT_LIMIT",
    "CLEARED_CLAIM",
    "JOB_COMPLETION_FIELDS",
    "JOB_CREATE_FIELDS",
    "JOB_ENQUEUE_FIELDS",
    "JOB_REPORT_FIELDS",
    "REJECT_REASON_LIMIT",
    "ParsedReport",
    "check_thread_quota",
    "default_idempotency_key",
    "duplicate_request",
    "parse_batch_limit",
    "parse_claim_pairs",
    "parse_claim_reports",
    "task_job_fields",
    "validate_approval_arguments",
    "validate_notification_requests",
    "validate_reject_arguments",
    "validate_requeue_arguments",
]

#: Fields ``create_job`` accepts.
JOB_CREATE_FIELDS = JOB_PATCH_FIELDS | {"request_id"}

#: Fields ``enqueue`` accepts.
JOB_ENQUEUE_FIELDS = ENQUEUE_FIELDS | {"request_id"}

#: Fields a claim holder's report may patch: the status is its own argument, and the
#: claim fields are cleared by the report itself.
JOB_REPORT_FIELDS = JOB_PATCH_FIELDS - {"status", *JOB_CLAIM_FIELDS}

#: Fields the ``patch`` of ``complete_job_with_notifications`` may name.
JOB_COMPLETION_FIELDS = JOB_PATCH_FIELDS - set(JOB_CLAIM_FIELDS)

#: The claim fields as every release (requeue, report, terminal transition) writes them.
CLEARED_CLAIM: dict[str, Any] = dict.fromkeys(JOB_CLAIM_FIELDS)

#: Longest reason ``reject_queued_job`` accepts (it becomes the job's ``error``).
REJECT_REASON_LIMIT = 2000

#: Longest approval comment accepted (it is kept on the decision marker and the audit).
APPROVAL_COMMENT_LIMIT = 2000

_VIA_LIMIT = 250
_DESTINATION_LIMIT = 2000
_KEY_LIMIT = 200

#: A validated report: job id, claim token, release status, cleaned patch.
ParsedReport = tuple[uuid.UUID, uuid.UUID, JobStatus, dict[str, Any]]


# --- intake ----------------------------------------------------------------------------


def duplicate_request(request_id: str) -> DuplicateRequestId:
    """The error ``create_job`` raises for a ``request_id`` that is taken."""
    return DuplicateRequestId(
        f"a job with request_id {request_id!r} already exists.", request_id=request_id
    )


def check_thread_quota(thread_id: int, inflight: int, quota: int) -> None:
    """Raise :class:`ThreadQuotaExceeded` when a thread with ``inflight`` in-flight jobs
    may not take another one. A store calls it inside the atomic step that counts the
    thread's jobs and inserts the new one."""
    if inflight >= quota:
        raise ThreadQuotaExceeded(
            f"thread {thread_id} already has {inflight} jobs in flight; "
            f"the quota is {quota} (JOBSTATE['THREAD_INFLIGHT_QUOTA']).",
            thread_id=thread_id,
            inflight=inflight,
            quota=quota,
        )


# --- claims and reports ----------------------------------------------------------------


def parse_batch_limit(limit: int) -> int:
    """Check the ``limit`` of a batch claim."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BIGINT_MAX:
        raise InvalidJobState(f"limit must be a positive 64-bit int, got {limit!r}.")
    return limit


def parse_claim_reports(reports: Sequence[ClaimReport]) -> list[ParsedReport]:
    """Validate a batch of reports before anything is written. The same job twice in
    one batch is refused: its outcome would depend on the order in which the reports
    are applied."""
    if isinstance(reports, (str, bytes)) or not isinstance(reports, Sequence):
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


# --- django.tasks ----------------------------------------------------------------------


def task_job_fields(task: NewTask) -> dict[str, Any]:
    """The cleaned fields of the job that holds ``task`` (see
    :meth:`~jobstate.stores.contracts.tasks_part.TaskStateStore.enqueue_task`): a request id of
    its own (``task-<uuid>``; a task is found by its job id), the task's target, path,
    queue, priority and attempt limit, and its arguments as the job's input."""
    if not isinstance(task, NewTask):
        raise InvalidJobState(f"task must be a NewTask, got {type(task).__name__}.")
    if not isinstance(task.args, list) or not isinstance(task.kwargs, dict):
        raise InvalidPayload("a task's args must be a list and its kwargs a dict.")
    if not isinstance(task.target, str) or not task.target.startswith(TASK_TARGET_PREFIX):
        raise InvalidJobState(
            f"a task's target starts with {TASK_TARGET_PREFIX!r}, got {task.target!r}."
        )
    if task.max_attempts is None:
        raise InvalidJobState("a task needs max_attempts (1 = no retry).")
    fields: dict[str, Any] = {
        "request_id": f"task-{uuid.uuid4()}",
        "target": task.target,
        "task_path": task.task_path,
        "queue_name": task.queue_name,
        "priority": task.priority,
        "max_attempts": task.max_attempts,
        "input": {"args": task.args, "kwargs": task.kwargs},
        "attempt_log": [],
        "run_after": task.run_after,
    }
    cleaned = clean_job_fields(fields, allowed=JOB_CREATE_FIELDS, action="enqueue_task")
    for name in ("task_path", "queue_name"):
        require_text(cleaned[name], field=name, max_length=None)
    if cleaned["max_attempts"] < 1:
        raise InvalidPatch("max_attempts must be at least 1.", field="max_attempts")
    return cleaned


# --- continuations ---------------------------------------------------------------------


def validate_reject_arguments(by: str, reason: str) -> str:
    """Check the arguments of ``reject_queued_job`` and return the text the job's
    ``error`` gets."""
    require_text(by, field="by")
    _optional_text(reason, field="reason", limit=REJECT_REASON_LIMIT)
    return reason.strip() or f"rejected by {by}"


def validate_requeue_arguments(
    from_statuses: Sequence[str], by: str, via: str, event: str
) -> list[JobStatus]:
    """Check the arguments of ``requeue_job`` and return the statuses parsed."""
    statuses = parse_statuses(from_statuses)
    require_text(by, field="by")
    require_text(via, field="via", max_length=_VIA_LIMIT)
    require_text(event, field="event", max_length=100)
    return statuses


def validate_approval_arguments(decision_id: str, approver: str, comment: str) -> None:
    """Check the arguments of ``requeue_approved_job_once``."""
    require_text(decision_id, field="decision_id")
    require_text(approver, field="approver")
    _optional_text(comment, field="comment", limit=APPROVAL_COMMENT_LIMIT)


def _optional_text(value: Any, *, field: str, limit: int) -> None:
    """A free-text argument that may be empty: a string of at most ``limit`` characters
    a text column can hold."""
    if not isinstance(value, str):
        raise InvalidJobState(f"{field} must be a string, got {type(value).__name__}.")
    if len(value) > limit or text_problem(value):
        raise InvalidJobState(f"{field} must be at most {limit} characters, without NUL.")


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
    if len(key) <= _KEY_LIMIT:
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
        _check_text(destination, field="destination", limit=_DESTINATION_LIMIT)
        if not isinstance(request.payload, dict):
            raise InvalidPayload(
                f"notification payload must be a dict, got {type(request.payload).__name__}."
            )
        ensure_json(request.payload, field="notification payload")
        if key is None:
            key = default_idempotency_key(job, channel, destination)
        _check_text(key, field="idempotency_key", limit=_KEY_LIMIT)
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


def _check_text(value: Any, *, field: str, limit: int) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidNotification(f"{field} must be a non-empty string, got {value!r}.")
    if len(value) > limit or text_problem(value):
        raise InvalidNotification(
            f"{field} must be at most {limit} characters of valid Unicode, without NUL."
        )
