"""Checks of the run store's arguments (:mod:`jobstate.stores.contracts.run_store`): run
ids, triggers, settlements, reaping bounds and the liveness budget of a run."""

from __future__ import annotations

import uuid
from datetime import timedelta

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import TERMINAL_RUN_STATUSES, JobRunStatus, Trigger
from jobstate.exceptions import InvalidJobState, InvalidRunnerConfiguration
from jobstate.stores.contracts.validation.values import (
    BIGINT_MAX,
    parse_uuid,
    require_text,
    text_problem,
    validate_duration,
)

__all__ = [
    "optional_key",
    "validate_claim_arguments",
    "validate_duration_ms",
    "validate_error_text",
    "validate_reap_limit",
    "validate_run_id",
    "validate_skip_reason",
    "validate_stale_run_after",
    "validate_terminal_status",
]


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
    """A run's duration in milliseconds: a non-negative 64-bit int."""

    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= BIGINT_MAX:
        raise InvalidJobState(f"duration_ms must be a non-negative 64-bit int, got {value!r}.")
    return value


def validate_reap_limit(limit: int | None) -> int | None:
    """The cap of one ``reap_stale`` call: a positive 64-bit int, or ``None`` for none."""

    if limit is not None and (
        isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BIGINT_MAX
    ):
        raise InvalidJobState(f"limit must be a positive 64-bit int or None, got {limit!r}.")
    return limit


def validate_error_text(error: str | None) -> str | None:
    """Error text is stored cut to ``JOBSTATE["ERROR_TEXT_LIMIT"]`` characters; it must
    be a string without NUL characters (which PostgreSQL text columns cannot hold) or
    lone surrogates."""

    if error is None:
        return None
    if not isinstance(error, str):
        raise InvalidJobState(f"error must be a string or None, got {type(error).__name__}.")
    problem = text_problem(error)
    if problem:
        raise InvalidJobState(f"error {problem}.")
    return error[: jobstate_settings.ERROR_TEXT_LIMIT]


def validate_skip_reason(reason: str) -> str:
    """Why a run was skipped: a non-empty string a text column can hold."""

    return require_text(reason, field="reason", max_length=None)


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
