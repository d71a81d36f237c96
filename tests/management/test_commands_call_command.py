"""jobstate's commands run from code, ``call_command(name, option=value)``: Django hands
keyword values to the command as they are, past the types argparse would apply, so each
command puts them through those types itself. A wrong value is refused with a
``CommandError`` of status 2 naming the option, as on the command line, never a bare
``AttributeError`` from deep inside; a text or a number the command line would accept
works the same way here."""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command

#: (command, keyword options, what the error must say).
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "jobstate_worker",
        {"interval": -1, "batch": True},
        "argument --interval: must be a positive number of seconds, got -1",
    ),
    ("jobstate_worker", {"concurrency": "x", "batch": True}, "argument --concurrency:"),
    ("jobstate_worker", {"concurrency": 0, "batch": True}, "argument --concurrency:"),
    ("jobstate_worker", {"grace": "soon", "batch": True}, "argument --grace:"),
    ("jobstate_worker", {"max_tasks": -3, "batch": True}, "argument --max-tasks:"),
    ("jobstate_worker", {"queue_name": ",", "batch": True}, "argument --queue-name:"),
    ("reap_stale", {"limit": "many"}, "argument --limit: 'many' is not an integer"),
    ("reap_stale", {"limit": True}, "argument --limit:"),
    ("reap_stale", {"stale_after": float("nan")}, "argument --stale-after:"),
    ("prune_jobstate", {"older_than": 0}, "argument --older-than:"),
    ("prune_jobstate", {"batch_size": 1.5}, "argument --batch-size:"),
    ("deliver_notifications", {"limit": 0}, "argument --limit: must be at least 1, got 0"),
    ("deliver_notifications", {"loop": True, "interval": 1e12}, "argument --interval:"),
    # Read by Python's int() and float(), which take spaces, underscores and the digits
    # of every script.
    ("jobstate_worker", {"concurrency": " 5 ", "batch": True}, "argument --concurrency: ' 5 '"),
    ("jobstate_worker", {"grace": "1_0", "batch": True}, "argument --grace: '1_0' is not"),
    ("reap_stale", {"limit": "\uff15"}, "argument --limit: '\uff15' is not"),
    ("prune_jobstate", {"older_than": "\u0663"}, "argument --older-than: '\u0663' is not"),
]


@pytest.mark.parametrize(("command", "options", "message"), REFUSED)
def test_a_wrong_keyword_value_is_refused_with_status_2_naming_the_option(
    command: str, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(CommandError) as refused:
        call_command(command, **options)
    assert message in str(refused.value)
    assert refused.value.returncode == 2


@pytest.mark.django_db
def test_a_number_or_a_text_is_read_as_the_command_line_reads_it() -> None:
    as_keywords, as_arguments = StringIO(), StringIO()
    call_command("prune_jobstate", older_than=30, dry_run=True, json=True, stdout=as_keywords)
    call_command("prune_jobstate", "--older-than", "30", "--dry-run", "--json", stdout=as_arguments)
    assert as_keywords.getvalue() == as_arguments.getvalue()
    assert '"dry_run": true' in as_keywords.getvalue()


@pytest.mark.django_db
def test_a_float_keyword_is_read_as_its_plain_decimal_form() -> None:
    """``str(0.00001)`` is ``'1e-05'``, which the command line refuses: a float keyword
    is read as the decimal it is."""
    as_keywords, as_arguments = StringIO(), StringIO()
    call_command("prune_jobstate", older_than=1e-5, dry_run=True, json=True, stdout=as_keywords)
    call_command(
        "prune_jobstate", "--older-than", "0.00001", "--dry-run", "--json", stdout=as_arguments
    )
    assert as_keywords.getvalue() == as_arguments.getvalue()


#: A value of 100 kB, as a file pasted by mistake.
PASTED = "9" * 100_000


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("reap_stale", {"limit": PASTED}),
        ("reap_stale", {"stale_after": PASTED}),
        ("reap_stale", {"database": PASTED}),
        ("prune_jobstate", {"older_than": PASTED}),
        ("jobstate_worker", {"concurrency": PASTED, "batch": True}),
        ("jobstate_worker", {"queue_name": f"{PASTED},", "batch": True}),
        ("jobstate_worker", {"backend": PASTED, "batch": True}),
    ],
)
def test_a_refused_value_of_100_kb_is_shown_cut_to_its_start_and_its_length(
    command: str, options: dict[str, Any]
) -> None:
    with pytest.raises(CommandError) as refused:
        call_command(command, **options)
    message = str(refused.value)
    assert len(message) < 400, message[:400]
    assert "99999" in message
    assert "characters)" in message
