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
    ["\u202egpj.exe", "\u202bembedded", "\u2067isolate", "שלום", "مرحبا", "a\u202cb"],
    ids=["override", "embedding", "isolate", "hebrew", "arabic", "pop"],
)
def test_right_to_left_text_and_direction_marks_are_isolated(text: str) -> None:
    assert isolated(text) == f"\u2068{text}\u2069"


@pytest.mark.backend
def test_a_job_s_name_isolates_its_request_id_from_its_id() -> None:
    job = Job(request_id="\u202eevil")
    assert str(job) == f"\u2068\u202eevil\u2069 ({job.id})"
    assert str(Job(request_id="plain")).startswith("plain (")
