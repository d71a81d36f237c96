"""Statement texts kept per shape, in bounded memory.

The hot statements are built once per shape (which columns, how many rows, how many
tasks a claim takes) and their text is kept, so the database sees the same text again
and can keep its plan. A worker uses a handful of shapes; :func:`kept` drops every kept
text once a cache holds :data:`KEPT_SHAPES`, so an unusual mix of shapes does not grow
it for ever.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["KEPT_SHAPES", "kept"]

#: How many shapes one cache keeps before it starts again.
KEPT_SHAPES = 256

T = TypeVar("T")


def kept(cache: dict[Any, T], key: Any, build: Callable[..., T], *args: Any) -> T:
    """The text ``cache`` keeps for ``key``, built as ``build(*args)`` the first time.
    (The arguments are passed rather than closed over, so a call that finds the text
    makes no function object.)"""
    text = cache.get(key)
    if text is None:
        if len(cache) >= KEPT_SHAPES:
            cache.clear()
        text = cache[key] = build(*args)
    return text
