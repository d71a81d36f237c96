"""The options of :class:`~jobstate.operations.job_runner.JobRunner` that fall back to a
``JOBSTATE`` setting, read and checked once when the runner is built."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import timedelta
from typing import cast

from jobstate.core.conf import REAP_SCOPES, ReapScope, jobstate_settings
from jobstate.exceptions import InvalidJobState, InvalidRunnerConfiguration
from jobstate.stores.contracts.validation import (
    validate_duration,
    validate_reap_limit,
    validate_stale_run_after,
)

__all__ = ["FROM_SETTINGS", "FromSettings", "ReapScope", "RunnerOptions", "runner_options"]


class FromSettings(enum.Enum):
    FROM_SETTINGS = enum.auto()


#: Default of every :class:`JobRunner` option that falls back to a ``JOBSTATE`` setting.
FROM_SETTINGS = FromSettings.FROM_SETTINGS


@dataclass(frozen=True)
class RunnerOptions:
    """The checked options of one runner (see :class:`JobRunner` for each)."""

    heartbeat_interval: timedelta
    stale_run_after: timedelta
    default_timeout: timedelta
    reap_scope: ReapScope
    reap_limit: int | None
    error_text_limit: int
    service_revision: str | None


def runner_options(
    *,
    heartbeat_interval: timedelta | FromSettings,
    stale_run_after: timedelta | FromSettings,
    default_timeout: timedelta | FromSettings,
    reap_scope: ReapScope | FromSettings,
    reap_limit: int | FromSettings | None,
    error_text_limit: int | FromSettings,
    service_revision: str | FromSettings | None,
) -> RunnerOptions:
    """Each option as given, or its ``JOBSTATE`` setting where it is
    :data:`FROM_SETTINGS`; an invalid one raises :class:`InvalidRunnerConfiguration`."""
    s = jobstate_settings
    heartbeat = _positive_duration(
        s.HEARTBEAT_INTERVAL if heartbeat_interval is FROM_SETTINGS else heartbeat_interval,
        "heartbeat_interval",
    )
    stale = validate_stale_run_after(
        s.STALE_RUN_AFTER if stale_run_after is FROM_SETTINGS else stale_run_after,
        heartbeat_interval=heartbeat,
    )
    timeout = _positive_duration(
        s.DEFAULT_JOB_TIMEOUT if default_timeout is FROM_SETTINGS else default_timeout,
        "default_timeout",
    )
    scope = s.REAP_SCOPE if reap_scope is FROM_SETTINGS else reap_scope
    if scope not in REAP_SCOPES:
        raise InvalidRunnerConfiguration(
            f"reap_scope must be 'overlap-key', 'all' or 'off', got {scope!r}."
        )
    limit = s.REAP_LIMIT if reap_limit is FROM_SETTINGS else reap_limit
    try:
        checked_limit = validate_reap_limit(limit)
    except InvalidJobState as exc:
        raise InvalidRunnerConfiguration(f"reap_limit: {exc}") from exc
    text_limit = s.ERROR_TEXT_LIMIT if error_text_limit is FROM_SETTINGS else error_text_limit
    if isinstance(text_limit, bool) or not isinstance(text_limit, int) or text_limit < 1:
        raise InvalidRunnerConfiguration(
            f"error_text_limit must be a positive int, got {text_limit!r}."
        )
    revision = s.SERVICE_REVISION if service_revision is FROM_SETTINGS else service_revision
    if revision is not None and not isinstance(revision, str):
        raise InvalidRunnerConfiguration(
            f"service_revision must be a string or None, got {revision!r}."
        )
    return RunnerOptions(
        heartbeat_interval=heartbeat,
        stale_run_after=stale,
        default_timeout=timeout,
        reap_scope=cast(ReapScope, scope),
        reap_limit=checked_limit,
        error_text_limit=text_limit,
        service_revision=revision,
    )


def _positive_duration(value: object, name: str) -> timedelta:
    try:
        return validate_duration(cast(timedelta, value), field=name, allow_zero=False)
    except InvalidJobState as exc:
        raise InvalidRunnerConfiguration(str(exc)) from exc
