"""Text every database can keep.

PostgreSQL's text columns cannot hold a NUL character (SQLite's can, so without a check
the backends would disagree), and a lone surrogate cannot be encoded at all. Values a
caller gives are refused when they hold either (:func:`text_problem`); text jobstate
writes on its own, such as an exception's message, is repaired (:func:`storable_text`).
"""

from __future__ import annotations

__all__ = ["storable_text", "text_problem"]


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored in a text column of every backend, or ``None``."""
    if "\x00" in value:
        return "contains a NUL character, which cannot be stored"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (it holds a lone surrogate)"
    return None


def storable_text(text: str) -> str:
    """``text`` as every store can keep it: NUL characters and lone surrogates become
    U+FFFD (a surrogate pair becomes the character it encodes)."""
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text
