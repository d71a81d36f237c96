"""Strict JSON checking for values the stores persist.

Django's ``JSONField`` accepts ``NaN`` (which PostgreSQL then rejects, and SQLite stores
as an invalid token), silently turns tuples into lists and integer keys into strings.
The contract says a value that cannot round-trip must raise instead of being changed or
dropped, so every store checks values here before writing anything.
"""

from __future__ import annotations

import json
from typing import Any

from jobstate.conf import jobstate_settings
from jobstate.exceptions import InvalidPayload


def ensure_json(value: Any, *, field: str) -> Any:
    """Return ``value`` unchanged if it survives a strict JSON round trip, else raise
    :class:`InvalidPayload` naming ``field``.

    Rejected: NaN and infinities, cyclic structures, objects JSON cannot encode, values
    that would come back different (tuples, non-string keys), NUL characters (PostgreSQL
    ``jsonb`` cannot hold them) and encodings larger than ``MAX_PAYLOAD_BYTES``.
    """
    try:
        encoded = json.dumps(value, allow_nan=False, ensure_ascii=False)
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidPayload(f"{field} is not strict JSON: {exc}") from exc
    if "\\u0000" in encoded or "\x00" in encoded:
        raise InvalidPayload(f"{field} contains a NUL character, which cannot be stored.")
    limit = jobstate_settings.MAX_PAYLOAD_BYTES
    try:
        size = len(encoded.encode("utf-8"))
    except UnicodeEncodeError as exc:  # a lone surrogate: no database can store it
        raise InvalidPayload(f"{field} contains text that is not valid Unicode: {exc}") from exc
    if size > limit:
        raise InvalidPayload(
            f"{field} is {size} bytes of JSON; the limit is {limit} "
            "(JOBSTATE['MAX_PAYLOAD_BYTES']).",
        )
    if json.loads(encoded) != value:
        raise InvalidPayload(
            f"{field} does not survive a JSON round trip unchanged "
            "(tuples, non-string keys or other values JSON cannot represent exactly)."
        )
    return value
