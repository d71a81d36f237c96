"""Checks of the plain values every store method takes: text, ids, instants, durations,
counts, statuses and target lists."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any, TypeVar

from django.apps import apps
from django.db import models

from jobstate.core.clock import DURATION_LIMIT
from jobstate.core.states import JobStatus
from jobstate.core.storable import text_problem
from jobstate.exceptions import InvalidJobState

__all__ = [
    "BIGINT_MAX",
    "CLAIM_TARGET_LIMIT",
    "DURATION_LIMIT",
    "column_limit",
    "optional_text",
    "parse_batch_limit",
    "parse_choice",
    "parse_claim_targets",
    "parse_limit",
    "parse_statuses",
    "parse_targets",
    "parse_thread_id",
    "parse_uuid",
    "require_text",
    "resolve_lease",
    "text_problem",
    "validate_audit_text",
    "validate_duration",
    "validate_instant",
    "validate_positive_int",
]

_Choice = TypeVar("_Choice", bound=models.TextChoices)


#: Largest count or size a store passes to the database (a signed 64-bit ``LIMIT``).
BIGINT_MAX = 2**63 - 1


@cache
def column_limit(model: str, field: str) -> int | None:
    """The ``max_length`` of ``field`` of jobstate's ``model`` (``None`` for a text
    column without one): the longest value a store may write there. Read from the model
    when first asked, because the store contracts load before the app registry."""
    column = apps.get_model("jobstate", model)._meta.get_field(field)
    if not isinstance(column, models.Field):
        raise TypeError(f"{model}.{field} is not a concrete field.")
    return column.max_length


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


def optional_text(value: Any, *, field: str, limit: int) -> None:
    """A free-text argument that may be empty: a string of at most ``limit`` characters
    a text column can hold."""
    if not isinstance(value, str):
        raise InvalidJobState(f"{field} must be a string, got {type(value).__name__}.")
    if len(value) > limit:
        raise InvalidJobState(f"{field} must be at most {limit} characters.")
    problem = text_problem(value)
    if problem:
        raise InvalidJobState(f"{field} {problem}.")


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


def resolve_lease(lease: timedelta | None, default: timedelta) -> timedelta:
    """``lease`` (or ``default`` when ``None``) as a positive duration."""
    return validate_duration(default if lease is None else lease, field="lease", allow_zero=False)


def validate_positive_int(value: int, *, field: str) -> int:
    """A positive ``int`` (``bool`` is not one): a batch size, a cap, an attempt limit."""

    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidJobState(f"{field} must be a positive int, got {value!r}.")
    return value


def parse_limit(limit: int | None, *, default: int) -> int:
    """A positive 64-bit ``limit``, or ``default`` when ``None``."""

    if limit is None:
        return default
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BIGINT_MAX:
        raise InvalidJobState(f"limit must be a positive 64-bit int or None, got {limit!r}.")
    return limit


def parse_batch_limit(limit: int) -> int:
    """The ``limit`` of a batch claim: a positive 64-bit int, never ``None``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= BIGINT_MAX:
        raise InvalidJobState(f"limit must be a positive 64-bit int, got {limit!r}.")
    return limit


def parse_thread_id(value: Any) -> int:
    """A thread id: an ``int`` that fits in 64 bits."""

    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJobState(f"thread_id must be an int, got {value!r}.")
    if not -BIGINT_MAX - 1 <= value <= BIGINT_MAX:
        raise InvalidJobState(f"thread_id must fit in 64 bits, got {value}.")
    return value


def parse_choice(choices: type[_Choice], value: Any, *, field: str) -> _Choice:
    """``value`` as a member of ``choices``, or ``InvalidJobState`` naming them."""

    try:
        return choices(value)
    except ValueError as exc:
        raise InvalidJobState(
            f"{value!r} is not a valid {field}; expected one of {', '.join(choices.values)}."
        ) from exc


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


#: The most distinct targets one claim may name.
CLAIM_TARGET_LIMIT = 1000


def parse_claim_targets(targets: Iterable[str]) -> list[str]:
    """The targets of a claim, as :func:`parse_targets` reads them, except that ``None``
    is refused: a claim names what it may take (an empty list takes nothing)."""

    parsed = parse_targets(targets)
    if parsed is None:
        raise InvalidJobState("targets must be a list of target names, got None.")
    # Each target is a parameter of the claim's statement, which takes at most 65,535 on
    # PostgreSQL and MySQL; a claim over so many is a mistake, not a queue.
    unique = list(dict.fromkeys(parsed))
    if len(unique) > CLAIM_TARGET_LIMIT:
        raise InvalidJobState(
            f"a claim names at most {CLAIM_TARGET_LIMIT:,} targets, got {len(unique):,}."
        )
    return unique
