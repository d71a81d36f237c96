"""Hypothesis strategies shared by the property tests of the stores: values a store must
keep exactly, and every kind of malformed argument it must refuse before writing; and
the check that a refused call raised a clear error and wrote nothing.

The JSON strategies stay small: the property tests lower ``MAX_PAYLOAD_BYTES`` to
:data:`PAYLOAD_LIMIT`, so the valid values fit under it and an oversized one costs a few
kilobytes, not a megabyte.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps
from django.db import DatabaseError
from hypothesis import strategies as st

from jobstate.exceptions import JobStateError
from jobstate.stores.contracts.validation import BIGINT_MAX, DURATION_LIMIT

#: ``JOBSTATE['MAX_PAYLOAD_BYTES']`` while the property tests run.
PAYLOAD_LIMIT = 4096

# --- text ---------------------------------------------------------------------------------


def storable_text(*, min_size: int = 0, max_size: int = 20) -> st.SearchStrategy[str]:
    """Text every backend's text columns hold: no NUL, no lone surrogate."""
    return st.text(
        st.characters(codec="utf-8", exclude_characters="\x00"),
        min_size=min_size,
        max_size=max_size,
    )


def names(*, max_size: int = 40) -> st.SearchStrategy[str]:
    """Non-blank storable text: ids, keys, owners, worker ids."""
    return storable_text(min_size=1, max_size=max_size).filter(lambda text: bool(text.strip()))


def _spliced(piece: str) -> st.SearchStrategy[str]:
    return st.builds(lambda head, tail: f"{head}{piece}{tail}", storable_text(), storable_text())


#: Text with a NUL character somewhere: SQLite stores it, PostgreSQL refuses it.
nul_text = _spliced("\x00")

#: Text with a lone surrogate, which no database can encode.
surrogate_text = st.integers(0xD800, 0xDFFF).flatmap(lambda code: _spliced(chr(code)))

#: Text that no text column may receive.
unstorable_text = st.one_of(nul_text, surrogate_text)

#: Blank text: refused wherever a name is required.
blank_text = st.sampled_from(["", " ", "\t", "\n  "])


def bad_names(*, max_length: int | None = 200) -> st.SearchStrategy[Any]:
    """Everything a required name (id, key, owner) may not be; longer than
    ``max_length`` too, unless it is ``None``."""
    choices: list[st.SearchStrategy[Any]] = [
        unstorable_text,
        blank_text,
        st.integers(),
        st.booleans(),
        st.none(),
        st.binary(min_size=1, max_size=5),
    ]
    if max_length is not None:
        limit = max_length
        choices.append(st.integers(1, 50).map(lambda extra: "k" * (limit + extra)))
    return st.one_of(choices)


# --- JSON ---------------------------------------------------------------------------------

#: Floats PostgreSQL's ``jsonb`` gives back unchanged: finite, below 1e16 in magnitude
#: (larger ones come back as integers) and not negative zero (it loses its sign).
json_floats = st.floats(
    min_value=-9.999999999999998e15, max_value=9.999999999999998e15, allow_nan=False
).filter(lambda value: not (value == 0 and str(value).startswith("-")))

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), json_floats, storable_text(max_size=30)
)

json_keys = storable_text(max_size=12)

#: Arbitrary strict JSON: what a store must give back equal to what it was given.
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(json_keys, children, max_size=4)
    ),
    max_leaves=12,
)

json_objects = st.dictionaries(json_keys, json_values, max_size=5)


def _cyclic_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


def _cyclic_dict() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    value["self"] = value
    return value


class _Opaque:
    """An object JSON has no encoding for."""


_bad_json_leaves = st.one_of(
    st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0]),
    st.floats(min_value=1e16, allow_infinity=False),
    st.floats(max_value=-1e16, allow_infinity=False),
    st.sets(st.integers(), max_size=3),
    st.frozensets(st.integers(), max_size=3),
    st.binary(max_size=5),
    st.builds(_Opaque),
    st.builds(Decimal, st.integers()),
    st.builds(uuid.uuid4),
    st.datetimes(),
    st.complex_numbers(allow_nan=False, allow_infinity=False),
    st.tuples(json_scalars),
    st.tuples(),
    st.dictionaries(
        st.one_of(st.integers(), st.booleans(), st.none(), json_floats), json_scalars, min_size=1
    ),
    st.builds(lambda a, b: {(a, b): 1}, st.integers(), st.integers()),
    st.builds(_cyclic_list),
    st.builds(_cyclic_dict),
    nul_text,
    surrogate_text,
    st.builds(lambda key: {key: 1}, nul_text),
    st.builds(lambda key: {key: 1}, surrogate_text),
)


def _inside(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """``children`` somewhere inside a valid JSON list or object."""
    return st.one_of(
        st.builds(
            lambda items, bad, at: [*items[:at], bad, *items[at:]],
            st.lists(json_scalars, max_size=3),
            children,
            st.integers(0, 3),
        ),
        st.builds(lambda base, key, bad: {**base, key: bad}, json_objects, json_keys, children),
    )


#: Values that are not strict JSON, or would come back changed, at any depth.
non_json_values = st.recursive(_bad_json_leaves, _inside, max_leaves=3)

#: JSON objects that are not strict JSON somewhere inside.
non_json_objects = st.builds(
    lambda base, key, bad: {**base, key: bad}, json_objects, json_keys, non_json_values
)

#: Valid JSON whose encoding is over :data:`PAYLOAD_LIMIT`.
oversized_values = st.one_of(
    st.builds(lambda extra: {"blob": "x" * (PAYLOAD_LIMIT + extra)}, st.integers(0, 2000)),
    st.builds(lambda count: ["0123456789"] * count, st.integers(PAYLOAD_LIMIT // 13, 1000)),
    st.builds(lambda extra: "é" * (PAYLOAD_LIMIT // 2 + extra), st.integers(0, 100)),
)

#: JSON objects whose encoding is over :data:`PAYLOAD_LIMIT`.
oversized_objects = st.builds(
    lambda extra: {"blob": "x" * (PAYLOAD_LIMIT + extra)}, st.integers(0, 2000)
)

#: Everything a JSON field must refuse.
bad_json_values = st.one_of(non_json_values, oversized_values)

#: Everything a JSON-object field (metadata, detail, payload) must refuse.
bad_json_objects = st.one_of(
    non_json_objects,
    oversized_objects,
    st.lists(json_scalars, max_size=2),
    st.integers(),
    storable_text(),
)

# --- instants and durations ----------------------------------------------------------------

#: Fixed UTC offsets: anything Python allows, strictly within a day and down to the
#: microsecond (PostgreSQL itself takes only whole seconds up to 15:59:59).
offsets = st.one_of(
    st.just(UTC),
    st.builds(
        lambda micros: timezone(timedelta(microseconds=micros)),
        st.integers(-86_399_999_999, 86_399_999_999),
    ),
)

#: Aware instants every backend stores: in the years 1-9999 in UTC too.
aware_datetimes = st.datetimes(
    min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=offsets
)

naive_datetimes = st.datetimes()

#: Aware instants no backend can store: outside the years 1-9999 once in UTC.
unstorable_datetimes = st.one_of(
    st.builds(
        lambda hours: datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=hours))),
        st.integers(1, 23),
    ),
    st.builds(
        lambda hours: datetime(9999, 12, 31, 23, tzinfo=timezone(timedelta(hours=-hours))),
        st.integers(1, 23),
    ),
)


def bad_instants() -> st.SearchStrategy[Any]:
    """Everything a recorded instant may not be."""
    return st.one_of(
        naive_datetimes,
        unstorable_datetimes,
        st.dates(),
        storable_text(),
        st.integers(),
        st.floats(allow_nan=False),
    )


#: Durations a store accepts where zero is allowed.
durations = st.timedeltas(min_value=timedelta(0), max_value=DURATION_LIMIT)

#: Durations a store accepts as a lease or a lock's time to live.
positive_durations = st.timedeltas(min_value=timedelta(microseconds=1), max_value=DURATION_LIMIT)


def bad_durations(*, allow_zero: bool = True, allow_none: bool = False) -> st.SearchStrategy[Any]:
    """Negative, too long (past :data:`DURATION_LIMIT`), zero where a positive one is
    needed, and not a ``timedelta`` at all (seconds as numbers, text)."""
    choices: list[st.SearchStrategy[Any]] = [
        st.timedeltas(max_value=timedelta(microseconds=-1)),
        st.timedeltas(min_value=DURATION_LIMIT + timedelta(microseconds=1)),
        st.integers(),
        st.floats(),
        st.booleans(),
        storable_text(),
        naive_datetimes,
    ]
    if not allow_zero:
        choices.append(st.just(timedelta(0)))
    if not allow_none:
        choices.append(st.none())
    return st.one_of(choices)


# --- counts, ids, statuses ---------------------------------------------------------------

#: Everything a positive count (``limit``, ``batch_size``) may not be; ``None`` is not
#: among them, since it means "the default" wherever a count is optional.
bad_counts = st.one_of(
    st.integers(max_value=0),
    st.integers(min_value=BIGINT_MAX + 1),
    st.booleans(),
    st.floats(),
    st.decimals(allow_nan=False),
    storable_text(),
)

#: Everything a job, run or notification id may not be.
bad_ids = st.one_of(
    storable_text(max_size=40).filter(lambda text: not _parses_as_uuid(text)),
    unstorable_text,
    st.integers(),
    st.none(),
    st.binary(min_size=16, max_size=16),
    st.booleans(),
)


def _parses_as_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def unknown_choices(known: set[str]) -> st.SearchStrategy[Any]:
    """A status (or stage, severity) outside ``known``, or not text at all."""
    return st.one_of(
        storable_text().filter(lambda text: text not in known),
        unstorable_text,
        st.sampled_from(sorted(value.swapcase() for value in known)),
        st.integers(),
        st.none(),
        st.lists(st.sampled_from(sorted(known)), min_size=1, max_size=2),
    )


# --- calls --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One call of a store method, built by a strategy and made by a test. ``label`` is
    what a failing example prints."""

    label: str
    make: Callable[..., Any]

    def __call__(self, *args: Any) -> Any:
        return self.make(*args)

    def __repr__(self) -> str:
        return f"Call({self.label})"


def database_snapshot() -> dict[str, list[dict[str, Any]]]:
    """Every row of every jobstate table, in primary-key order."""
    return {
        model._meta.label: list(model._default_manager.order_by("pk").values())
        for model in apps.get_app_config("jobstate").get_models()
    }


def assert_refused(call: Call, args: tuple[Any, ...], snapshot: Callable[[], Any]) -> None:
    """Make ``call`` and check that it raised a clear error and changed nothing.

    Accepted: an error of the package or a plain ``ValueError`` / ``TypeError`` with a
    message. Refused: a return value (malformed input answered as if it were valid), a
    bare ``UnicodeError`` and any database error, including the ``StoreError`` a store
    wraps one in: those mean the database, not the validation, turned the value away."""
    before = snapshot()
    try:
        result = call(*args)
    except (JobStateError, ValueError, TypeError) as exc:
        if isinstance(exc, UnicodeError | DatabaseError):
            pytest.fail(f"{call.label} let the driver refuse it: {type(exc).__name__}: {exc}")
        assert str(exc), f"{call.label} raised {type(exc).__name__} without a message"
    else:
        pytest.fail(f"{call.label} accepted malformed input and returned {result!r}")
    assert snapshot() == before, f"{call.label} raised but wrote"
