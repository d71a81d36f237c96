"""Argument checks shared by every store implementation (ours, the in-memory reference
stores and a host's), so each one rejects bad input with the same clear error before it
writes anything."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.db import models

from jobstate.core.jsonvalues import ensure_json
from jobstate.core.states import (
    RELEASE_JOB_STATUSES,
    TERMINAL_RUN_STATUSES,
    JobRunStatus,
    JobStatus,
    Trigger,
)
from jobstate.exceptions import (
    IdempotencyConflict,
    ImmutableField,
    InvalidJobState,
    InvalidPatch,
    InvalidRunnerConfiguration,
)

_Choice = TypeVar("_Choice", bound=models.TextChoices)


def validate_terminal_status(status: str) -> JobRunStatus:
    """Return ``status`` as a terminal :class:`JobRunStatus` or raise ``InvalidJobState``."""

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


#: Longest duration a store accepts. The database adds durations to its clock, and an
#: instant past the year 9999 can be neither computed by every backend nor read back
#: into a Python ``datetime``.
DURATION_LIMIT = timedelta(days=365 * 1000)


#: Largest count or size a store passes to the database (a signed 64-bit ``LIMIT``).
BIGINT_MAX = 2**63 - 1


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored in a text column of every backend, or ``None``.

    PostgreSQL text cannot hold NUL characters (SQLite can, so without this check the
    two backends would disagree), and a lone surrogate cannot be encoded at all."""

    if "\x00" in value:
        return "contains a NUL character, which cannot be stored"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (it holds a lone surrogate)"
    return None


def validate_instant(value: datetime, *, field: str) -> datetime:
    """Recorded instants must be aware datetimes: a naive one is ambiguous across hosts.

    Returns the same instant in UTC, which is what a store must write: PostgreSQL
    refuses offsets beyond 15:59:59 or finer than a second, which Python allows. The
    instant must lie within the years 1-9999 in UTC, where every backend stores it."""

    if not isinstance(value, datetime):
        raise InvalidJobState(f"{field} must be a datetime, got {type(value).__name__}.")
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidJobState(f"{field} must be an aware datetime (it has no time zone).")
    try:
        return value.astimezone(UTC)
    except OverflowError as exc:
        raise InvalidJobState(
            f"{field} ({value.isoformat()}) is outside the years 1-9999 in UTC."
        ) from exc


def validate_duration(value: timedelta, *, field: str, allow_zero: bool = True) -> timedelta:
    """A non-negative (or, without ``allow_zero``, positive) ``timedelta`` of at most
    :data:`DURATION_LIMIT`."""

    if not isinstance(value, timedelta):
        raise InvalidJobState(f"{field} must be a datetime.timedelta, got {type(value).__name__}.")
    if value < timedelta(0) or (not allow_zero and value == timedelta(0)):
        bound = "zero or positive" if allow_zero else "positive"
        raise InvalidJobState(f"{field} must be {bound}, got {value}.")
    if value > DURATION_LIMIT:
        raise InvalidJobState(f"{field} must be at most {DURATION_LIMIT.days} days, got {value}.")
    return value


def validate_claim_arguments(
    *,
    job_key: str,
    overlap_key: str | None,
    trigger: Trigger,
    service_revision: str | None = None,
) -> None:
    """Shared argument checks of ``claim`` and ``record_skipped``."""

    require_text(job_key, field="job_key", max_length=None)
    if overlap_key is not None:
        require_text(overlap_key, field="overlap_key", max_length=None)
    if not isinstance(trigger, Trigger):
        raise InvalidJobState(f"trigger must be a jobstate Trigger, got {type(trigger).__name__}.")
    for name, value in (
        ("trigger_source", trigger.source),
        ("triggered_by", trigger.triggered_by),
        ("service_revision", service_revision),
    ):
        if value is None and name != "trigger_source":
            continue
        if not isinstance(value, str):
            raise InvalidJobState(f"{name} must be a string, got {type(value).__name__}.")
        problem = text_problem(value)
        if problem:
            raise InvalidJobState(f"{name} {problem}.")


def optional_key(value: str | None, *, field: str) -> str | None:
    """An optional narrowing key (``reap_stale``'s ``job_key`` / ``overlap_key``):
    ``None`` or a non-empty string a text column can hold."""

    return None if value is None else require_text(value, field=field, max_length=None)


def validate_run_id(run_id: str | uuid.UUID) -> uuid.UUID:
    """Run ids are UUIDs, given as ``uuid.UUID`` or in any string form ``uuid.UUID`` parses."""
    return parse_uuid(run_id, field="run_id")


def validate_duration_ms(value: int) -> int:

    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= BIGINT_MAX:
        raise InvalidJobState(f"duration_ms must be a non-negative 64-bit int, got {value!r}.")
    return value


def validate_reap_limit(limit: int | None) -> int | None:

    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BIGINT_MAX
    ):
        raise InvalidJobState(f"limit must be a positive 64-bit int or None, got {limit!r}.")
    return limit


def validate_error_text(error: str | None) -> str | None:
    """Error text is stored as given; it must be a string without NUL characters (which
    PostgreSQL text columns cannot hold)."""

    if error is None:
        return None
    if not isinstance(error, str):
        raise InvalidJobState(f"error must be a string or None, got {type(error).__name__}.")
    problem = text_problem(error)
    if problem:
        raise InvalidJobState(f"error {problem}.")
    return error


def validate_skip_reason(reason: str) -> str:

    return require_text(reason, field="reason", max_length=None)


def validate_audit_text(*, title: str, summary: str) -> None:
    """The free-text fields of an audit entry: strings a text column can hold (longer
    ones are cut to their column by
    :func:`~jobstate.stores.contracts.audit.complete_audit_fields`)."""

    for name, value in (("title", title), ("summary", summary)):
        if not isinstance(value, str):
            raise InvalidJobState(f"{name} must be a string, got {type(value).__name__}.")
        problem = text_problem(value)
        if problem:
            raise InvalidJobState(f"{name} {problem}.")


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
        # django.tasks (see jobstate.core.attempt_log): what a task is, and its attempt log.
        "task_path",
        "queue_name",
        "priority",
        "max_attempts",
        "attempt_log",
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
    "priority": 0,
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
    "task_path": 300,
    "queue_name": 100,
}


_JOB_JSON_FIELDS = frozenset({"input", "result", "report", "usage", "metadata", "attempt_log"})


_JOB_INSTANT_FIELDS = frozenset({"run_after", "claimed_at", "lease_until", "dispatched_at"})


_POSITIVE_INT_MAX = 2**31 - 1

#: The range of the ``priority`` column (django.tasks itself allows -100 to 100).
_PRIORITY_RANGE = (-(2**31), 2**31 - 1)


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

    if value is None:
        if name in JOB_DEFAULTS or name == "request_id":
            raise InvalidPatch(f"{name} is required and cannot be cleared with None.", field=name)
        return None
    if name == "status":
        return parse_choice(JobStatus, value, field="status")
    if name in _JOB_TEXT_LIMITS:
        limit = _JOB_TEXT_LIMITS[name]
        if not isinstance(value, str):
            raise InvalidPatch(f"{name} must be a string, got {type(value).__name__}.", field=name)
        problem = text_problem(value)
        if problem:
            raise InvalidPatch(f"{name} {problem}.", field=name)
        if limit is not None and len(value) > limit:
            raise InvalidPatch(f"{name} is longer than {limit} characters.", field=name)
        if name == "request_id" and not value.strip():
            raise InvalidPatch("request_id must be a non-empty string.", field=name)
        return value
    if name in _JOB_JSON_FIELDS:
        if name == "metadata" and not isinstance(value, dict):
            raise InvalidPatch(f"metadata must be a dict, got {type(value).__name__}.", field=name)
        if name == "attempt_log" and not (
            isinstance(value, list) and all(isinstance(entry, dict) for entry in value)
        ):
            raise InvalidPatch("attempt_log must be a list of dicts.", field=name)
        return ensure_json(value, field=name)
    if name in _JOB_INSTANT_FIELDS:
        return validate_instant(value, field=name)
    if name == "thread_id":
        return parse_thread_id(value)
    if name in ("attempts", "max_attempts", "priority"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidPatch(f"{name} must be an int, got {value!r}.", field=name)
        low, high = _PRIORITY_RANGE if name == "priority" else (0, _POSITIVE_INT_MAX)
        if not low <= value <= high:
            raise InvalidPatch(f"{name} must be between {low} and {high}, got {value}.", field=name)
        return value
    if name == "claim_token":
        return parse_uuid(value, field="claim_token")
    raise InvalidPatch(f"{name!r} is not a job field.", field=name)


def parse_uuid(value: Any, *, field: str) -> uuid.UUID:
    """Return ``value`` as a UUID (a ``uuid.UUID`` or its string form) or raise
    :class:`~jobstate.exceptions.InvalidJobState`."""

    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            pass
    raise InvalidJobState(f"{field} must be a UUID, got {value!r}.")


def parse_thread_id(value: Any) -> int:

    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobState(f"thread_id must be an int, got {value!r}.")
    if not -BIGINT_MAX - 1 <= value <= BIGINT_MAX:
        raise InvalidJobState(f"thread_id must fit in 64 bits, got {value}.")
    return value


def parse_statuses(statuses: Iterable[str]) -> list[JobStatus]:
    """Return the statuses as :class:`JobStatus` members (duplicates dropped, order
    kept). A bare string is refused: it is almost always a forgotten list."""

    if isinstance(statuses, str) or not isinstance(statuses, Iterable):
        raise InvalidJobState(f"statuses must be a list of job statuses, got {statuses!r}.")
    parsed: list[JobStatus] = []
    for status in statuses:
        member = parse_choice(JobStatus, status, field="status")
        if member not in parsed:
            parsed.append(member)
    return parsed


def parse_targets(targets: Iterable[str] | None) -> list[str] | None:
    """Return the targets as a list of non-empty strings; ``None`` stays ``None`` (no
    narrowing). A bare string is refused: it is almost always a forgotten list."""

    if targets is None:
        return None
    if isinstance(targets, str) or not isinstance(targets, Iterable):
        raise InvalidJobState(f"targets must be a list of target names, got {targets!r}.")
    parsed = list(targets)
    for target in parsed:
        if not isinstance(target, str) or not target:
            raise InvalidJobState(f"every target must be a non-empty string, got {target!r}.")
        problem = text_problem(target)
        if problem:
            raise InvalidJobState(f"target {target!r} {problem}.")
    return parsed


def parse_claim_targets(targets: Iterable[str]) -> list[str]:
    """The targets of a claim, as :func:`parse_targets` reads them, except that ``None``
    is refused: a claim names what it may take (an empty list takes nothing)."""

    parsed = parse_targets(targets)
    if parsed is None:
        raise InvalidJobState("targets must be a list of target names, got None.")
    return parsed


def parse_limit(limit: int | None, *, default: int) -> int:

    if limit is None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BIGINT_MAX:
        raise InvalidJobState(f"limit must be a positive 64-bit int or None, got {limit!r}.")
    return limit


def require_text(value: Any, *, field: str, max_length: int | None = 200) -> str:
    """A non-empty string a text column can hold (:func:`text_problem`), of at most
    ``max_length`` characters (``None``: the caller checks the length), or
    ``InvalidJobState``."""

    if not isinstance(value, str) or not value.strip():
        raise InvalidJobState(f"{field} must be a non-empty string, got {value!r}.")
    if max_length is not None and len(value) > max_length:
        raise InvalidJobState(f"{field} must be at most {max_length} characters.")
    problem = text_problem(value)
    if problem:
        raise InvalidJobState(f"{field} {problem}.")
    return value


def parse_choice(choices: type[_Choice], value: Any, *, field: str) -> _Choice:

    try:
        return choices(value)
    except ValueError as exc:
        raise InvalidJobState(
            f"{value!r} is not a valid {field}; expected one of {', '.join(choices.values)}."
        ) from exc


def validate_release_status(status: str) -> JobStatus:
    """A terminal status, or ``queued`` to give a claimed job back; else ``InvalidJobState``."""

    parsed = parse_choice(JobStatus, status, field="status")
    if parsed not in RELEASE_JOB_STATUSES:
        raise InvalidJobState(
            f"a claim holder reports done, error, rejected or queued, not {parsed.value}."
        )
    return parsed


def required_request_id(cleaned: dict[str, Any], *, action: str) -> str:
    """The ``request_id`` of cleaned new-job fields; ``InvalidPatch`` when missing."""

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


def validate_positive_int(value: int, *, field: str) -> int:
    """A positive ``int`` (``bool`` is not one): a batch size, a cap, an attempt limit."""

    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidJobState(f"{field} must be a positive int, got {value!r}.")
    return value


def validate_stale_run_after(
    stale_run_after: timedelta, *, heartbeat_interval: timedelta
) -> timedelta:
    """A run's liveness budget: a positive duration of at least twice
    ``heartbeat_interval``, so one late beat never makes a live run look dead. Raises
    :class:`~jobstate.exceptions.InvalidRunnerConfiguration`."""

    try:
        budget = validate_duration(stale_run_after, field="stale_run_after", allow_zero=False)
        beat = validate_duration(heartbeat_interval, field="heartbeat_interval", allow_zero=False)
    except InvalidJobState as exc:
        raise InvalidRunnerConfiguration(str(exc)) from exc
    if budget < 2 * beat:
        raise InvalidRunnerConfiguration(
            f"stale_run_after ({budget}) must be at least twice heartbeat_interval ({beat}), "
            "or a live run whose heartbeat is a little late would be reaped."
        )
    return budget
