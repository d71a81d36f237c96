"""Store contracts.

A store is to jobstate what a session backend is to ``django.contrib.sessions``: a class
whose docstrings state the guarantees, loaded by dotted path from ``settings.JOBSTATE``.
The database stores in :mod:`jobstate.stores.database` implement them with the Django
ORM; :mod:`jobstate.testing` ships in-memory reference stores and contract test cases
that any implementation (ours or a host's) must pass.
"""

from __future__ import annotations

import enum
import uuid
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import models
from django.utils.translation import gettext_lazy as _

if TYPE_CHECKING:
    from jobstate.models import AuditEntry, Job

#: A job id as callers hand it in: a UUID or its string form.
JobId = uuid.UUID | str

_Choice = TypeVar("_Choice", bound=models.TextChoices)


@dataclass(frozen=True)
class Trigger:
    """Who or what started a run. ``source`` is an open set; the listed values are
    conventions: ``"SCHEDULER"``, ``"CLI"``, ``"ADMIN"``, ``"CELERY"``."""

    source: str
    triggered_by: str | None = None


class JobRunStatus(models.TextChoices):
    RUNNING = "RUNNING", _("Running")
    """Claimed and executing; holds its overlap key."""
    SUCCEEDED = "SUCCEEDED", _("Succeeded")
    """The body finished and did not report ``ok: False``."""
    FAILED = "FAILED", _("Failed")
    """The body raised, reported ``ok: False``, or was aborted."""
    TIMED_OUT = "TIMED_OUT", _("Timed out")
    """Hit its deadline, or was reaped because its heartbeat went stale."""
    SKIPPED = "SKIPPED", _("Skipped")
    """Never executed because another run held the overlap key."""


TERMINAL_RUN_STATUSES = frozenset(
    {JobRunStatus.SUCCEEDED, JobRunStatus.FAILED, JobRunStatus.TIMED_OUT, JobRunStatus.SKIPPED}
)

REAPED_RUN_ERROR = "heartbeat stale: the running instance is assumed gone"


class JobRunStore(ABC):
    """Persistence port for runs of operations jobs (the JobRunStore contract).

    Obligations every implementation keeps (checked by
    :func:`jobstate.testing.job_run_store_contract_cases`):

    - **S1 single claimer**: for one ``overlap_key`` at most one RUNNING row exists at
      any instant. ``claim`` is an atomic compare-and-set; the loser gets ``None``. Only
      the overlap uniqueness violation may become ``None``; every other error propagates.
    - **S2 monotonic heartbeat**: ``heartbeat`` moves the liveness watermark to the
      store's own clock, never backwards, and only while the row is RUNNING.
    - **S3 idempotent completion**: ``complete`` writes only on RUNNING -> terminal.
    - **S4 atomic reap**: ``reap_stale`` moves stale RUNNING rows to TIMED_OUT in one
      statement and counts only the rows this call moved; the key is free at once.
    - **S5 unique ids**: ids returned by ``claim`` and ``record_skipped`` never repeat.
    - **S6 clock split**: recorded instants (``started_at``, ``at``, ``finished_at``)
      are stored verbatim; liveness instants come from the store's clock only.
    - **S7 strict JSON**: ``input`` and ``summary`` round-trip through JSON or raise.
    """

    # Methods that subclasses must implement.

    @abstractmethod
    def claim(
        self,
        *,
        job_key: str,
        overlap_key: str,
        trigger: Trigger,
        input: Any,
        started_at: datetime,
        service_revision: str | None = None,
    ) -> str | None:
        """Atomically take ``overlap_key`` and return the new run's id, or ``None`` when
        another RUNNING row holds the key. The liveness watermark starts at the store's
        clock; ``started_at`` is stored verbatim."""

    @abstractmethod
    def heartbeat(self, *, run_id: str, progress: dict[str, Any] | None = None) -> bool:
        """Advance the watermark to the store's clock (never backwards) and store
        ``progress`` as the summary. ``False`` means the run is no longer RUNNING (or
        unknown) and nothing was written."""

    @abstractmethod
    def complete(
        self,
        *,
        run_id: str,
        status: str,
        finished_at: datetime,
        duration_ms: int,
        summary: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> bool:
        """Settle a RUNNING run with a terminal ``status``. ``False`` means the run was
        already settled (or unknown) and its stored outcome is unchanged."""

    @abstractmethod
    def record_skipped(
        self,
        *,
        job_key: str,
        trigger: Trigger,
        input: Any,
        at: datetime,
        reason: str = "overlap",
        service_revision: str | None = None,
    ) -> str:
        """Record a run that never executed and return its id. The row holds no key."""

    @abstractmethod
    def reap_stale(
        self,
        *,
        stale_after: timedelta,
        job_key: str | None = None,
        overlap_key: str | None = None,
        limit: int | None = None,
    ) -> int:
        """Move RUNNING rows whose watermark is at or before ``store now - stale_after``
        to TIMED_OUT, oldest watermark first, at most ``limit`` of them, optionally
        narrowed to ``job_key`` / ``overlap_key``. Returns the rows this call moved."""


def validate_terminal_status(status: str) -> JobRunStatus:
    """Return ``status`` as a terminal :class:`JobRunStatus` or raise ``InvalidJobState``."""
    from jobstate.exceptions import InvalidJobState

    try:
        parsed = JobRunStatus(status)
    except ValueError as exc:
        raise InvalidJobState(
            f"{status!r} is not a job run status; expected one of "
            f"{', '.join(s.value for s in TERMINAL_RUN_STATUSES)}."
        ) from exc
    if parsed not in TERMINAL_RUN_STATUSES:
        raise InvalidJobState(f"complete() needs a terminal status, not {parsed.value}.")
    return parsed


def validate_instant(value: datetime, *, field: str) -> datetime:
    """Recorded instants must be aware datetimes: a naive one is ambiguous across hosts."""
    from jobstate.exceptions import InvalidJobState

    if not isinstance(value, datetime):
        raise InvalidJobState(f"{field} must be a datetime, got {type(value).__name__}.")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJobState(f"{field} must be an aware datetime (it has no time zone).")
    return value


def validate_duration(value: timedelta, *, field: str, allow_zero: bool = True) -> timedelta:
    from jobstate.exceptions import InvalidJobState

    if not isinstance(value, timedelta):
        raise InvalidJobState(f"{field} must be a datetime.timedelta, got {type(value).__name__}.")
    if value < timedelta(0) or (not allow_zero and value == timedelta(0)):
        bound = "zero or positive" if allow_zero else "positive"
        raise InvalidJobState(f"{field} must be {bound}, got {value}.")
    return value


def validate_claim_arguments(*, job_key: str, overlap_key: str | None, trigger: Trigger) -> None:
    """Shared argument checks of ``claim`` and ``record_skipped``."""
    from jobstate.exceptions import InvalidJobState

    if not isinstance(job_key, str) or not job_key.strip():
        raise InvalidJobState(f"job_key must be a non-empty string, got {job_key!r}.")
    if overlap_key is not None and (not isinstance(overlap_key, str) or not overlap_key.strip()):
        raise InvalidJobState(f"overlap_key must be a non-empty string, got {overlap_key!r}.")
    if not isinstance(trigger, Trigger):
        raise InvalidJobState(f"trigger must be a jobstate Trigger, got {type(trigger).__name__}.")


def validate_run_id(run_id: str | uuid.UUID) -> uuid.UUID:
    """Run ids are UUIDs, given as ``uuid.UUID`` or in any string form ``uuid.UUID`` parses."""
    from jobstate.exceptions import InvalidJobState

    if isinstance(run_id, uuid.UUID):
        return run_id
    if not isinstance(run_id, str):
        raise InvalidJobState(f"run_id must be a UUID string, got {type(run_id).__name__}.")
    try:
        return uuid.UUID(run_id)
    except ValueError as exc:
        raise InvalidJobState(f"{run_id!r} is not a run id (a UUID).") from exc


def validate_duration_ms(value: int) -> int:
    from jobstate.exceptions import InvalidJobState

    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidJobState(f"duration_ms must be a non-negative int, got {value!r}.")
    return value


def validate_reap_limit(limit: int | None) -> int | None:
    from jobstate.exceptions import InvalidJobState

    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidJobState(f"limit must be a positive int or None, got {limit!r}.")
    return limit


def validate_error_text(error: str | None) -> str | None:
    """Error text is stored as given; it must be a string without NUL characters (which
    PostgreSQL text columns cannot hold)."""
    from jobstate.exceptions import InvalidJobState

    if error is None:
        return None
    if not isinstance(error, str):
        raise InvalidJobState(f"error must be a string or None, got {type(error).__name__}.")
    if "\x00" in error:
        raise InvalidJobState("error contains a NUL character, which cannot be stored.")
    return error


def validate_skip_reason(reason: str) -> str:
    from jobstate.exceptions import InvalidJobState

    if not isinstance(reason, str) or not reason.strip() or "\x00" in reason:
        raise InvalidJobState(f"reason must be a non-empty string, got {reason!r}.")
    return reason


# ---------------------------------------------------------------------------------------
# RuntimeStateStore: the job queue, the audit ledger and runtime locks.
# ---------------------------------------------------------------------------------------


class JobStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    """Waiting to be claimed; claimable once ``run_after`` (if any) has passed."""
    RUNNING = "running", _("Running")
    """Claimed by an in-process worker (``claim_next_inhub_job``); holds a lease."""
    DISPATCHED = "dispatched", _("Dispatched")
    """Claimed by a remote executor (``claim_next_job``); holds a lease the executor
    renews with ``extend_executor_leases``."""
    DONE = "done", _("Done")
    """Finished successfully. Terminal."""
    ERROR = "error", _("Error")
    """Failed, or expired in the queue. Terminal."""
    REJECTED = "rejected", _("Rejected")
    """Refused before or instead of running (policy, kill switch, denied approval). Terminal."""


TERMINAL_JOB_STATUSES = frozenset({JobStatus.DONE, JobStatus.ERROR, JobStatus.REJECTED})

#: Statuses that count as in flight: against per-thread quotas and in the thread gate.
INFLIGHT_JOB_STATUSES = frozenset({JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DISPATCHED})

#: Statuses a claim moves a job into; while one of a thread's jobs is in them the
#: thread's other jobs wait.
CLAIMED_JOB_STATUSES = frozenset({JobStatus.RUNNING, JobStatus.DISPATCHED})

EXPIRED_QUEUED_ERROR = (
    "queue timeout: the job waited longer than its time to live without being claimed "
    "and was expired, so stale work is not replayed in bulk once executors recover"
)


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
AUDIT_TITLE_LIMIT = 200


@dataclass(frozen=True)
class AuditFields:
    """The trace fields of an audit entry after ``complete_audit_fields``."""

    stage: AuditStage
    severity: AuditSeverity
    title: str
    summary: str
    detail: dict[str, Any]


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
    from jobstate.exceptions import InvalidJobState
    from jobstate.jsonvalues import ensure_json

    event = require_text(event, field="event", max_length=100)
    if detail is None:
        detail = {}
    if not isinstance(detail, dict):
        raise InvalidJobState(f"detail must be a dict, got {type(detail).__name__}.")
    ensure_json(detail, field="detail")
    known = AUDIT_EVENTS.get(event)
    if stage is None:
        stage_value = known.stage if known else AuditStage.SYSTEM
    else:
        stage_value = _parse_choice(AuditStage, stage, field="stage")
    if severity is None:
        severity_value = known.severity if known else AuditSeverity.INFO
        if event == "finished":
            severity_value = {
                JobStatus.ERROR.value: AuditSeverity.ERROR,
                JobStatus.REJECTED.value: AuditSeverity.WARNING,
            }.get(str(detail.get("status")), severity_value)
    else:
        severity_value = _parse_choice(AuditSeverity, severity, field="severity")
    for name, value in (("title", title), ("summary", summary)):
        if not isinstance(value, str):
            raise InvalidJobState(f"{name} must be a string, got {type(value).__name__}.")
    if not title:
        title = known.title if known else event
    if not summary:
        summary = " · ".join(
            f"{key}: {value}"
            for key, value in detail.items()
            if isinstance(value, str | int | float | bool)
        )
    return AuditFields(
        stage=stage_value,
        severity=severity_value,
        title=title[:AUDIT_TITLE_LIMIT],
        summary=summary[:AUDIT_SUMMARY_LIMIT],
        detail=detail,
    )


# --- job fields: one whitelist shared by every implementation ------------------------

#: Fields ``update_job`` / ``update_job_if_status`` may write.
JOB_PATCH_FIELDS = frozenset(
    {
        "status",
        "target",
        "source",
        "thread_id",
        "session_id",
        "input",
        "input_preview",
        "result",
        "report",
        "usage",
        "error",
        "metadata",
        "callback_url",
        "attempts",
        "run_after",
        "claimed_at",
        "lease_until",
        "executor_id",
        "dispatched_at",
        "claim_token",
    }
)

#: Fields no patch may name: set once at creation (``request_id``) or by the store.
JOB_IDENTITY_FIELDS = frozenset({"id", "request_id", "created_at", "updated_at"})

#: Fields a claim sets and every release (requeue, terminal completion) clears.
JOB_CLAIM_FIELDS = ("executor_id", "claimed_at", "lease_until", "dispatched_at", "claim_token")

#: Fields ``enqueue`` accepts besides ``request_id``: a new job is always queued and unclaimed.
ENQUEUE_FIELDS = frozenset(
    {
        "target",
        "source",
        "thread_id",
        "session_id",
        "input",
        "input_preview",
        "metadata",
        "callback_url",
        "attempts",
        "run_after",
    }
)

#: What "the same request" means for ``enqueue``: these stored values must equal the
#: given ones (an absent field counts as its default). Fields the job's own life changes
#: (status, attempts, session, metadata, run_after) are not compared.
ENQUEUE_PAYLOAD_FIELDS = ("target", "source", "thread_id", "input", "callback_url")

#: Values of the non-nullable fields when a new job leaves them out. Every other field
#: defaults to ``None``.
JOB_DEFAULTS: dict[str, Any] = {
    "status": "queued",
    "source": "",
    "input_preview": "",
    "attempts": 0,
    "metadata": {},
}

_JOB_TEXT_LIMITS: dict[str, int | None] = {
    "request_id": 200,
    "target": 200,
    "source": 100,
    "session_id": 200,
    "executor_id": 200,
    "callback_url": 2000,
    "input_preview": None,
    "error": None,
}
_JOB_JSON_FIELDS = frozenset({"input", "result", "report", "usage", "metadata"})
_JOB_INSTANT_FIELDS = frozenset({"run_after", "claimed_at", "lease_until", "dispatched_at"})
_BIGINT_MAX = 2**63 - 1
_POSITIVE_INT_MAX = 2**31 - 1


def clean_job_fields(
    fields: dict[str, Any], *, allowed: frozenset[str], action: str
) -> dict[str, Any]:
    """Check the fields of a patch or a new job and return them normalised.

    Raises :class:`~jobstate.exceptions.ImmutableField` for an identity field,
    :class:`~jobstate.exceptions.InvalidPatch` for an unknown or disallowed field, a
    ``None`` for a required field or a value of the wrong type,
    :class:`~jobstate.exceptions.InvalidJobState` for a bad status or a naive instant and
    :class:`~jobstate.exceptions.InvalidPayload` for a value that is not strict JSON.
    ``claim_token`` comes back as a :class:`uuid.UUID`.
    """
    from jobstate.exceptions import ImmutableField, InvalidPatch

    for name in fields:
        if name in JOB_IDENTITY_FIELDS and name not in allowed:
            raise ImmutableField(
                f"{name} identifies the job and cannot be changed by {action}.", field=name
            )
        if name not in allowed:
            known = name in JOB_PATCH_FIELDS
            reason = "is not accepted by" if known else "is not a job field; rejected by"
            raise InvalidPatch(f"{name!r} {reason} {action}.", field=name)
    return {name: clean_job_value(name, value) for name, value in fields.items()}


def clean_job_value(name: str, value: Any) -> Any:
    """Validate one job field value; see :func:`clean_job_fields`."""
    from jobstate.exceptions import InvalidPatch
    from jobstate.jsonvalues import ensure_json

    if value is None:
        if name in JOB_DEFAULTS or name == "request_id":
            raise InvalidPatch(f"{name} is required and cannot be cleared with None.", field=name)
        return None
    if name == "status":
        return _parse_choice(JobStatus, value, field="status")
    if name in _JOB_TEXT_LIMITS:
        limit = _JOB_TEXT_LIMITS[name]
        if not isinstance(value, str):
            raise InvalidPatch(f"{name} must be a string, got {type(value).__name__}.", field=name)
        if "\x00" in value:
            raise InvalidPatch(f"{name} contains a NUL character.", field=name)
        if limit is not None and len(value) > limit:
            raise InvalidPatch(f"{name} is longer than {limit} characters.", field=name)
        if name == "request_id" and not value.strip():
            raise InvalidPatch("request_id must be a non-empty string.", field=name)
        return value
    if name in _JOB_JSON_FIELDS:
        if name == "metadata" and not isinstance(value, dict):
            raise InvalidPatch(f"metadata must be a dict, got {type(value).__name__}.", field=name)
        return ensure_json(value, field=name)
    if name in _JOB_INSTANT_FIELDS:
        return validate_instant(value, field=name)
    if name == "thread_id":
        return parse_thread_id(value)
    if name == "attempts":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidPatch(f"attempts must be an int, got {value!r}.", field=name)
        if not 0 <= value <= _POSITIVE_INT_MAX:
            raise InvalidPatch(f"attempts must be between 0 and 2**31-1, got {value}.", field=name)
        return value
    if name == "claim_token":
        return parse_uuid(value, field="claim_token")
    raise InvalidPatch(f"{name!r} is not a job field.", field=name)


def parse_uuid(value: Any, *, field: str) -> uuid.UUID:
    """Return ``value`` as a UUID (a ``uuid.UUID`` or its string form) or raise
    :class:`~jobstate.exceptions.InvalidJobState`."""
    from jobstate.exceptions import InvalidJobState

    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise InvalidJobState(f"{field} must be a UUID, got {value!r}.")


def parse_thread_id(value: Any) -> int:
    from jobstate.exceptions import InvalidJobState

    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobState(f"thread_id must be an int, got {value!r}.")
    if not -_BIGINT_MAX - 1 <= value <= _BIGINT_MAX:
        raise InvalidJobState(f"thread_id must fit in 64 bits, got {value}.")
    return value


def parse_statuses(statuses: Iterable[str]) -> list[JobStatus]:
    """Return the statuses as :class:`JobStatus` members (duplicates dropped, order
    kept). A bare string is refused: it is almost always a forgotten list."""
    from jobstate.exceptions import InvalidJobState

    if isinstance(statuses, str) or not isinstance(statuses, Iterable):
        raise InvalidJobState(f"statuses must be a list of job statuses, got {statuses!r}.")
    parsed: list[JobStatus] = []
    for status in statuses:
        member = _parse_choice(JobStatus, status, field="status")
        if member not in parsed:
            parsed.append(member)
    return parsed


def parse_targets(targets: Iterable[str] | None) -> list[str] | None:
    """Return the targets as a list of non-empty strings; ``None`` stays ``None`` (no
    narrowing). A bare string is refused: it is almost always a forgotten list."""
    from jobstate.exceptions import InvalidJobState

    if targets is None:
        return None
    if isinstance(targets, str) or not isinstance(targets, Iterable):
        raise InvalidJobState(f"targets must be a list of target names, got {targets!r}.")
    parsed = list(targets)
    for target in parsed:
        if not isinstance(target, str) or not target:
            raise InvalidJobState(f"every target must be a non-empty string, got {target!r}.")
    return parsed


def parse_limit(limit: int | None, *, default: int) -> int:
    from jobstate.exceptions import InvalidJobState

    if limit is None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidJobState(f"limit must be a positive int or None, got {limit!r}.")
    return limit


def require_text(value: Any, *, field: str, max_length: int = 200) -> str:
    """A non-empty string of at most ``max_length`` characters, or ``InvalidJobState``."""
    from jobstate.exceptions import InvalidJobState

    if not isinstance(value, str) or not value.strip():
        raise InvalidJobState(f"{field} must be a non-empty string, got {value!r}.")
    if len(value) > max_length or "\x00" in value:
        raise InvalidJobState(f"{field} must be at most {max_length} characters, without NUL.")
    return value


def _parse_choice(choices: type[_Choice], value: Any, *, field: str) -> _Choice:
    from jobstate.exceptions import InvalidJobState

    try:
        return choices(value)
    except ValueError as exc:
        raise InvalidJobState(
            f"{value!r} is not a valid {field}; expected one of {', '.join(choices.values)}."
        ) from exc


class CompletionOutcome(enum.Enum):
    """What a fenced report (``complete_claimed_job``) did."""

    COMPLETED = "completed"
    """The claim was current; the new status and patch were written."""
    STALE_CLAIM = "stale_claim"
    """The job is no longer held by that claim (requeued, claimed again, finished by
    someone else, or the token never matched). Nothing was written."""
    NOT_FOUND = "not_found"
    """No job has that id. Nothing was written."""


@dataclass(frozen=True)
class CompletionResult:
    """The outcome of a fenced report and the job as stored afterwards (``None`` only
    for ``NOT_FOUND``)."""

    outcome: CompletionOutcome
    job: Job | None

    @property
    def completed(self) -> bool:
        return self.outcome is CompletionOutcome.COMPLETED


class StateStore(ABC):
    """Persistence port for the job queue, the audit ledger and runtime locks (the job
    part of the RuntimeStateStore contract).

    Guarantees every implementation keeps (checked by
    :func:`jobstate.testing.state_contract.state_store_contract_cases`):

    - **Idempotent intake**: ``request_id`` is unique; ``create_job`` refuses a duplicate
      with :class:`~jobstate.exceptions.DuplicateRequestId`, ``enqueue`` returns the
      existing job for the same request and refuses a different payload.
    - **Whitelisted patches**: updates write only the fields they are given, from
      :data:`JOB_PATCH_FIELDS`; ``None`` clears a nullable field; identity fields cannot be
      patched; ``updated_at`` moves to the store's clock on every write.
    - **Atomic claims**: a queued job is claimed by at most one caller; a claim takes the
      oldest ready job of the given targets, skips jobs whose ``run_after`` is in the
      future, and never starts a job of a thread that has running or dispatched work or
      an earlier ready queued job (per-thread FIFO). Each claim gets a fresh
      ``claim_token``; ``claimed_at`` and ``lease_until`` come from the store's clock.
    - **Fenced reports**: ``complete_claimed_job`` and ``extend_claim_lease`` write only
      while the caller's ``claim_token`` is the job's current one.
    - **Conditional maintenance**: requeue and expiry move only rows that still qualify
      when they are written, and count only those.
    - **Runtime locks**: at most one owner holds a lock key until it expires or is
      released; the owner may renew; a non-owner's release does nothing.

    Instants handed in (``run_after``, ``lease_until``, an audit ``at``) are stored
    verbatim and must be aware; durations are :class:`datetime.timedelta`. Bad input
    raises before anything is written.
    """

    # --- jobs ------------------------------------------------------------------------

    @abstractmethod
    def find_by_request_id(self, request_id: str) -> Job | None:
        """The job with that ``request_id``, or ``None``."""

    @abstractmethod
    def get_job(self, job_id: JobId) -> Job | None:
        """The job with that id, or ``None``. A malformed id raises ``InvalidJobState``."""

    @abstractmethod
    def create_job(self, **fields: Any) -> Job:
        """Insert a job and return it as stored. ``request_id`` is required; the other
        fields come from :data:`JOB_PATCH_FIELDS` (``status`` defaults to queued). An
        existing ``request_id`` raises :class:`~jobstate.exceptions.DuplicateRequestId`
        and writes nothing."""

    @abstractmethod
    def enqueue(self, **fields: Any) -> tuple[Job, bool]:
        """Queue a new job, idempotently by ``request_id``: return ``(job, True)`` when it
        was created, ``(existing, False)`` when the same request (see
        :data:`ENQUEUE_PAYLOAD_FIELDS`) was queued before, and raise
        :class:`~jobstate.exceptions.IdempotencyConflict` for a different payload under the
        same ``request_id``. A new job in a thread that already has
        ``JOBSTATE['THREAD_INFLIGHT_QUOTA']`` in-flight jobs raises
        :class:`~jobstate.exceptions.ThreadQuotaExceeded`. Accepts :data:`ENQUEUE_FIELDS`."""

    @abstractmethod
    def update_job(self, job_id: JobId, **patch: Any) -> Job | None:
        """Write ``patch`` (see :func:`clean_job_fields`) and ``updated_at``; return the job
        re-read, or ``None`` when no job has that id."""

    @abstractmethod
    def update_job_if_status(
        self, job_id: JobId, expected_statuses: Iterable[str], **patch: Any
    ) -> Job | None:
        """Like :meth:`update_job`, but only while the job's status is one of
        ``expected_statuses`` (one atomic conditional write). ``None`` means the job is
        missing or another caller moved it on; nothing was written. An empty
        ``expected_statuses`` writes nothing and returns ``None``."""

    # --- claims ----------------------------------------------------------------------

    @abstractmethod
    def claim_next_job(
        self, targets: Sequence[str], executor_id: str, lease: timedelta | None = None
    ) -> Job | None:
        """Claim the oldest ready queued job of ``targets`` for a remote executor: it
        becomes ``dispatched`` with ``executor_id``, ``claimed_at`` and ``dispatched_at``
        set to the store's clock, ``lease_until`` = clock + ``lease`` (default
        ``JOBSTATE['EXECUTOR_LEASE']``), a fresh ``claim_token`` and ``run_after`` cleared.
        ``None`` when nothing is claimable or ``targets`` is empty."""

    @abstractmethod
    def claim_next_inhub_job(
        self, targets: Sequence[str], worker_id: str, lease: timedelta | None = None
    ) -> Job | None:
        """As :meth:`claim_next_job` for an in-process worker: the job becomes ``running``
        with ``executor_id = worker_id`` and no ``dispatched_at``; ``lease`` defaults to
        ``JOBSTATE['WORKER_LEASE']``."""

    @abstractmethod
    def complete_claimed_job(
        self, job_id: JobId, claim_token: uuid.UUID | str, status: str, **patch: Any
    ) -> CompletionResult:
        """Fenced report of a claim holder. ``status`` is terminal (done / error /
        rejected) or ``queued`` (give the job back, e.g. for a retry with ``run_after``
        and ``attempts`` in ``patch``). Writes only while the job is running or
        dispatched under ``claim_token``; then it clears the claim fields
        (:data:`JOB_CLAIM_FIELDS`). A stale token, or a job requeued meanwhile, writes
        nothing and answers ``STALE_CLAIM``."""

    @abstractmethod
    def extend_claim_lease(
        self, job_id: JobId, claim_token: uuid.UUID | str, lease: timedelta | None = None
    ) -> bool:
        """Move one claimed job's ``lease_until`` to the store's clock + ``lease``
        (default: the worker or executor lease for its status) while ``claim_token`` is
        current. ``False`` means the claim is gone and nothing was written."""

    # --- leases and maintenance ------------------------------------------------------

    @abstractmethod
    def extend_executor_leases(self, executor_id: str, lease: timedelta | None = None) -> int:
        """Renew every ``dispatched`` job of ``executor_id`` to clock + ``lease`` (default
        ``JOBSTATE['EXECUTOR_LEASE']``); return how many were renewed."""

    @abstractmethod
    def requeue_stale_dispatched(
        self,
        dead_after: timedelta | None = None,
        hard_cap: timedelta | None = None,
        *,
        targets: Sequence[str] | None = None,
    ) -> int:
        """Move ``dispatched`` jobs back to ``queued`` with their claim fields cleared when
        their lease has expired, when they have no lease and were last written more than
        ``dead_after`` ago, or when they were dispatched more than ``hard_cap`` ago
        (defaults: ``EXECUTOR_DEAD_AFTER``, ``EXECUTOR_HARD_CAP``). ``targets`` narrows
        the sweep. Returns the jobs this call moved."""

    @abstractmethod
    def list_expired_leases(
        self,
        statuses: Iterable[str],
        fallback_older_than: timedelta,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs in ``statuses`` whose lease has expired, or that have no lease and were
        last written more than ``fallback_older_than`` ago; oldest first, at most ``limit``
        (default ``JOBSTATE['LIST_LIMIT']``). Empty ``statuses`` -> ``[]``."""

    @abstractmethod
    def list_jobs_by_status(
        self,
        statuses: Iterable[str],
        older_than: timedelta | None = None,
        *,
        targets: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Job]:
        """Jobs in ``statuses`` (last written more than ``older_than`` ago when given),
        oldest first, at most ``limit`` (default ``JOBSTATE['LIST_LIMIT']``). Empty
        ``statuses`` -> ``[]``."""

    @abstractmethod
    def expire_stale_queued(
        self, ttl: timedelta | None = None, *, targets: Sequence[str] | None = None
    ) -> int:
        """Move ``queued`` jobs created more than ``ttl`` ago (default
        ``JOBSTATE['QUEUED_TTL']``) to ``error`` with :data:`EXPIRED_QUEUED_ERROR`; a job
        claimed meanwhile is left alone. Returns the jobs this call moved."""

    @abstractmethod
    def count_inflight_by_thread(self, thread_id: int) -> int:
        """How many jobs of the thread are queued, running or dispatched."""

    # --- audit ledger ----------------------------------------------------------------

    @abstractmethod
    def append_audit(
        self,
        *,
        job: Job | JobId | None = None,
        request_id: str = "",
        event: str,
        stage: str | None = None,
        severity: str | None = None,
        title: str = "",
        summary: str = "",
        detail: dict[str, Any] | None = None,
        at: datetime | None = None,
    ) -> AuditEntry:
        """Append one entry and return it. Stage, severity, title and summary left out are
        filled from the event (:func:`complete_audit_fields`); ``request_id`` defaults to
        the job's. ``at`` is stored verbatim; without it the store's clock stamps the
        entry."""

    @abstractmethod
    def list_audit(
        self,
        *,
        job: Job | JobId | None = None,
        request_id: str | None = None,
        limit: int | None = None,
    ) -> list[AuditEntry]:
        """Entries of one job and/or request id, oldest first, at most ``limit``
        (default ``JOBSTATE['LIST_LIMIT']``)."""

    @abstractmethod
    def prune_audit_older_than(self, cutoff: datetime, *, batch_size: int | None = None) -> int:
        """Delete entries stamped before ``cutoff`` in batches of ``batch_size`` (default
        ``JOBSTATE['AUDIT_PRUNE_BATCH_SIZE']``), each its own short transaction, and
        return how many were deleted."""

    # --- runtime locks ---------------------------------------------------------------

    @abstractmethod
    def acquire_runtime_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        """Take or renew ``lock_key`` for ``owner`` until clock + ``ttl``. ``True`` when
        the lock was free, expired or already ``owner``'s; ``False`` while another owner
        holds it. Atomic: of concurrent callers for a free key exactly one wins."""

    @abstractmethod
    def release_runtime_lock(self, lock_key: str, owner: str) -> None:
        """Release ``lock_key`` if ``owner`` holds it; otherwise do nothing."""


@contextmanager
def runtime_lock(store: StateStore, lock_key: str, owner: str, ttl: timedelta) -> Iterator[None]:
    """Hold a runtime lock for the ``with`` block and release it afterwards.

    Raises :class:`~jobstate.exceptions.LockHeld` (and runs nothing) when another owner
    holds the key. The lock is not renewed while the block runs: pick a ``ttl`` longer
    than the block, or renew with ``acquire_runtime_lock`` from inside it.
    """
    from jobstate.exceptions import LockHeld

    if not store.acquire_runtime_lock(lock_key, owner, ttl):
        raise LockHeld(f"runtime lock {lock_key!r} is held by another owner.", lock_key=lock_key)
    try:
        yield
    finally:
        store.release_runtime_lock(lock_key, owner)


#: Statuses a claim holder may report through ``complete_claimed_job``.
RELEASE_JOB_STATUSES = TERMINAL_JOB_STATUSES | {JobStatus.QUEUED}


def validate_release_status(status: str) -> JobStatus:
    """A terminal status, or ``queued`` to give a claimed job back; else ``InvalidJobState``."""
    from jobstate.exceptions import InvalidJobState

    parsed = _parse_choice(JobStatus, status, field="status")
    if parsed not in RELEASE_JOB_STATUSES:
        raise InvalidJobState(
            f"a claim holder reports done, error, rejected or queued, not {parsed.value}."
        )
    return parsed


def required_request_id(cleaned: dict[str, Any], *, action: str) -> str:
    """The ``request_id`` of cleaned new-job fields; ``InvalidPatch`` when missing."""
    from jobstate.exceptions import InvalidPatch

    request_id = cleaned.get("request_id")
    if request_id is None:
        raise InvalidPatch(f"{action} needs a request_id.", field="request_id")
    return str(request_id)


def resolve_lease(lease: timedelta | None, default: timedelta) -> timedelta:
    """``lease`` (or ``default`` when ``None``) as a positive duration."""
    return validate_duration(default if lease is None else lease, field="lease", allow_zero=False)


def check_same_request(request_id: str, stored: dict[str, Any], given: dict[str, Any]) -> None:
    """Raise :class:`~jobstate.exceptions.IdempotencyConflict` unless the
    :data:`ENQUEUE_PAYLOAD_FIELDS` of ``given`` (absent ones at their defaults) equal the
    ``stored`` ones. Values compare as canonical JSON, which tells ``1``, ``1.0`` and
    ``true`` apart and ignores key order."""
    import json

    from jobstate.exceptions import IdempotencyConflict

    differing = tuple(
        name
        for name in ENQUEUE_PAYLOAD_FIELDS
        if json.dumps(stored.get(name), sort_keys=True)
        != json.dumps(given.get(name, JOB_DEFAULTS.get(name)), sort_keys=True)
    )
    if differing:
        raise IdempotencyConflict(
            f"request_id {request_id!r} was queued before with a different "
            f"{', '.join(differing)}; a request id names one request.",
            request_id=request_id,
            fields=differing,
        )
