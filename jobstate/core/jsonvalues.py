"""Strict JSON checking for values the stores persist.

Django's ``JSONField`` accepts ``NaN`` (which PostgreSQL then rejects, and SQLite stores
as an invalid token), silently turns tuples into lists and integer keys into strings.
The contract says a value that cannot round-trip must raise instead of being changed or
dropped, so every store checks values here before writing anything.
"""

from __future__ import annotations

import json
import re
from typing import Any

from jobstate.core.conf import jobstate_settings
from jobstate.core.messages import shown
from jobstate.exceptions import InvalidPayload

#: A ``\u0000`` escape in encoded JSON that stands for a NUL character: preceded by an
#: even number of backslashes (none, or escaped backslashes), so the six characters
#: ``\u0000`` inside a string (encoded as ``\\u0000``) do not match.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _exact_float(literal: str) -> float:
    """``parse_float`` of the round trip: refuse the floats PostgreSQL's ``jsonb`` would
    give back changed. ``jsonb`` keeps numbers as decimals and prints them without an
    exponent, so a float Python writes with a positive exponent (magnitude 1e16 or
    more) comes back as an integer, mostly a different one (1e23 -> 10**23), and a
    negative zero comes back as 0.0."""
    value = float(literal)
    if "e+" in literal.lower():
        raise InvalidPayload(
            f"the float {literal} cannot be stored exactly (PostgreSQL returns floats of "
            "magnitude 1e16 or more as integers); store it as an int or a string."
        )
    if value == 0 and literal.startswith("-"):
        raise InvalidPayload(
            "the float -0.0 cannot be stored exactly (PostgreSQL drops the sign of zero)."
        )
    return value


#: The most levels of lists and objects a stored value may have. MariaDB's JSON check
#: (``JSON_VALID``, the ``CHECK`` on every JSON column there) refuses a document nested
#: deeper, which would fail its write inside the database; the limit holds on every
#: database, so a value one of them stores, all of them store.
JSON_DEPTH_LIMIT = 31


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (strict JSON) has more than ``limit`` levels of lists and
    objects, walked without recursion."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                stack.append((child, depth + 1))
    return False


#: What ``json.dumps(value, allow_nan=False, ensure_ascii=False)`` and ``json.loads(text,
#: parse_float=_exact_float)`` do, without building an encoder and a decoder per call
#: (both are stateless between calls; a task's report checks its value and its log).
_encode = json.JSONEncoder(allow_nan=False, ensure_ascii=False).encode
_decode = json.JSONDecoder(parse_float=_exact_float).decode


def json_size(value: Any) -> int:
    """The size in bytes of ``value`` as :func:`ensure_json` measures it against
    ``MAX_PAYLOAD_BYTES``: the UTF-8 of its ``json.dumps`` encoding. ``value`` must be
    JSON holding no lone surrogate."""
    return len(_encode(value).encode("utf-8"))


def _changed_part(original: Any, decoded: Any, path: str) -> str:
    """What of ``original`` JSON gives back as something else (``decoded``), and at
    which ``path`` of keys and indexes, so the message names the one value to change
    instead of listing what might be wrong."""
    what = f"its item {path}" if path else "it"
    if isinstance(original, tuple):
        return f"{what} is a tuple, which comes back as a list"
    if isinstance(original, dict) and isinstance(decoded, dict):
        for key in original:
            if not isinstance(key, str):
                return (
                    f"{what} has the key {shown(repr(key))} ({type(key).__name__}), "
                    "which comes back as a string"
                )
        for key, item in original.items():
            if key in decoded and decoded[key] != item:
                return _changed_part(item, decoded[key], f"{path}[{shown(repr(key))}]")
    if isinstance(original, list) and isinstance(decoded, list):
        for index, (item, back) in enumerate(zip(original, decoded, strict=False)):
            if item != back:
                return _changed_part(item, back, f"{path}[{index}]")
    return f"{what}, {shown(repr(original))}, comes back as {shown(repr(decoded))}"


def ensure_json(value: Any, *, field: str) -> Any:
    """Return ``value`` unchanged if it survives a strict JSON round trip, else raise
    :class:`InvalidPayload` naming ``field``.

    Rejected: NaN and infinities, cyclic structures, objects JSON cannot encode, values
    that would come back different (tuples, non-string keys, floats of magnitude 1e16
    or more and negative zero, which PostgreSQL's ``jsonb`` turns into other numbers),
    NUL characters (PostgreSQL ``jsonb`` cannot hold them), lone surrogates, encodings
    larger than ``MAX_PAYLOAD_BYTES`` and values nested more than
    :data:`JSON_DEPTH_LIMIT` levels deep (MariaDB cannot store them).
    """
    if value is None or value is True or value is False:
        # What most tasks return: nothing to round-trip, only the size to check.
        size = 5 if value is False else 4
        if size > jobstate_settings.MAX_PAYLOAD_BYTES:
            raise _too_large(field, size)
        return value
    try:
        encoded = _encode(value)
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidPayload(f"{field} is not strict JSON: {exc}") from exc
    # With ensure_ascii=False a NUL is still written as the escape \u0000.
    # (The substring test first: the pattern is slow to run over a large value.)
    if "\x00" in encoded or ("\\u0000" in encoded and _NUL_ESCAPE.search(encoded)):
        raise InvalidPayload(f"{field} contains a NUL character, which cannot be stored.")
    limit = jobstate_settings.MAX_PAYLOAD_BYTES
    try:
        size = len(encoded.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate: no database can store it
        surrogate = exc.object[exc.start : exc.end]
        raise InvalidPayload(
            f"{field} contains text that is not valid Unicode: a lone surrogate "
            f"({surrogate!r}), which no database can store."
        ) from exc
    if size > limit:
        raise _too_large(field, size)
    try:
        decoded = _decode(encoded)
    except InvalidPayload as exc:
        raise InvalidPayload(f"{field}: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # e.g. an int past Python's digit limit
        raise InvalidPayload(f"{field} is not strict JSON: {exc}") from exc
    if decoded != value:
        raise InvalidPayload(
            f"{field} does not survive a JSON round trip unchanged: "
            f"{_changed_part(value, decoded, '')}."
        )
    # Only a text with more opening brackets than the limit can nest deeper (counting
    # them is cheap; walking a large value is not).
    if (
        isinstance(value, dict | list)
        and encoded.count("[") + encoded.count("{") > JSON_DEPTH_LIMIT
        and nested_deeper_than(value, JSON_DEPTH_LIMIT)
    ):
        raise InvalidPayload(
            f"{field} is nested more than {JSON_DEPTH_LIMIT} levels deep (lists and "
            "objects): jobstate stores at most that many on every database, MariaDB's limit."
        )
    return value


def _too_large(field: str, size: int) -> InvalidPayload:
    limit = jobstate_settings.MAX_PAYLOAD_BYTES
    return InvalidPayload(
        f"{field} is {size} bytes of JSON; the limit is {limit} (JOBSTATE['MAX_PAYLOAD_BYTES']).",
    )
