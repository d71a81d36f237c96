"""Values put into the console's sentences keep their direction to themselves."""

from __future__ import annotations

import pytest

from jobstate.core.bidi import isolated
from jobstate.models import Job


@pytest.mark.parametrize("text", ["", "send_welcome_email", "café ✓", "tasks:default/emails"])
def test_left_to_right_text_comes_back_unchanged(text: str) -> None:
    assert isolated(text) == text


@pytest.mark.parametrize(
    "text",
    ["\u202egpj.exe", "\u202bembedded", "\u2067isolate\u2069", "שלום", "مرحبا", "a\u202cb"],
    ids=["override", "embedding", "closed isolate", "hebrew", "arabic", "pop"],
)
def test_right_to_left_text_and_direction_marks_are_isolated(text: str) -> None:
    assert isolated(text) == f"\u2068{text}\u2069"


@pytest.mark.parametrize(
    ("text", "wrapped"),
    [
        # A stray end of isolate closed the wrapper, and the override after it reversed
        # the console's own text (found by an outside pass).
        ("x\u2069\u202eexe.txt", "x\u202eexe.txt"),
        ("\u2069\u2069\u202e", "\u202e"),
        # An isolate left open took the wrapper's closing mark.
        ("\u2067open", "\u2067open\u2069"),
        ("\u2066a\u2067b\u2069", "\u2066a\u2067b\u2069\u2069"),
    ],
)
def test_a_value_s_own_isolates_cannot_end_the_wrapper(text: str, wrapped: str) -> None:
    assert isolated(text) == f"\u2068{wrapped}\u2069"


@pytest.mark.backend
def test_a_job_s_name_isolates_its_request_id_from_its_id() -> None:
    job = Job(request_id="\u202eevil")
    assert str(job) == f"\u2068\u202eevil\u2069 ({job.id})"
    assert str(Job(request_id="plain")).startswith("plain (")
