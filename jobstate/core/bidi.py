"""Right-to-left text inside the console's own sentences.

A value a job carries (a request id, a target, a task argument, an error) may hold
right-to-left letters or the explicit direction marks of Unicode (U+202A to U+202E,
U+2066 to U+2069). Put into a sentence as it is, an override such as U+202E reverses
everything after it up to the end of the paragraph: the job's id in a breadcrumb, the
words of the console's own text. :func:`isolated` wraps such a value in a first-strong
isolate (U+2068 ... U+2069), which ends whatever the value opened and keeps its
direction from leaking into its surroundings, as ``<bdi>`` does in HTML. Text without
right-to-left letters or marks comes back unchanged, so ordinary names and logs carry
no invisible characters.
"""

from __future__ import annotations

import unicodedata

__all__ = ["isolated", "isolated_parts"]

#: Bidirectional classes that can change how the text around a value is ordered:
#: right-to-left letters, and the embeddings, overrides and isolates with their ends.
_DIRECTIONAL = frozenset({"R", "AL", "LRE", "RLE", "LRO", "RLO", "PDF", "LRI", "RLI", "FSI", "PDI"})
_OPENS_ISOLATE = frozenset({"LRI", "RLI", "FSI"})
_FIRST_STRONG_ISOLATE = "\u2068"
_POP_DIRECTIONAL_ISOLATE = "\u2069"


def isolated(text: str) -> str:
    """``text`` wrapped in a first-strong isolate when it holds right-to-left letters or
    direction marks; otherwise ``text`` itself. Its own isolates are balanced first (see
    :func:`_balanced`), so nothing in it can end the wrapper early."""
    if text.isascii() or not any(unicodedata.bidirectional(c) in _DIRECTIONAL for c in text):
        return text
    return f"{_FIRST_STRONG_ISOLATE}{_balanced(text)}{_POP_DIRECTIONAL_ISOLATE}"


def isolated_parts(text: str, separator: str) -> str:
    """``text`` with each of its parts between ``separator`` isolated on its own (an
    audit summary's ``key: value`` pairs): an override in one value then reverses
    nothing of the pairs after it."""
    return separator.join(isolated(part) for part in text.split(separator))


def _balanced(text: str) -> str:
    """``text`` with each pop-directional-isolate that closes nothing of its own left
    out, and each isolate it opens and leaves open closed at its end. A stray U+2069
    would otherwise close the wrapper, and an override after it reverse the sentence
    around the value; an unclosed isolate would take the wrapper's closing mark.
    (Embeddings and overrides need nothing: the isolate's end closes them.)"""
    kept: list[str] = []
    depth = 0
    for char in text:
        kind = unicodedata.bidirectional(char)
        if kind in _OPENS_ISOLATE:
            depth += 1
        elif kind == "PDI":
            if not depth:
                continue
            depth -= 1
        kept.append(char)
    return "".join(kept) + _POP_DIRECTIONAL_ISOLATE * depth
