"""How an error message repeats a value it refuses: whole when it is short, else its
start and its length. A value of 100 kB (a file pasted by mistake) would otherwise make
one line of a terminal, a log, a cron mail or ``manage.py check`` that long."""

from __future__ import annotations

__all__ = ["SHOWN_LIMIT", "shown"]

#: The most characters of a refused value a message repeats.
SHOWN_LIMIT = 80


def shown(text: str) -> str:
    """``text`` (a value's ``repr``, or its ``str`` for a number) as a message repeats
    it: cut after :data:`SHOWN_LIMIT` characters, with the length of the whole."""
    if len(text) <= SHOWN_LIMIT:
        return text
    return f"{text[:SHOWN_LIMIT]}... ({len(text)} characters)"
