"""The settings check: a bad ``JOBSTATE`` value stops ``manage.py check`` (and so
``runserver`` and ``migrate``) at start-up, naming the setting."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from jobstate.checks import check_settings


def test_the_default_settings_pass() -> None:
    assert check_settings() == []


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"OBSERVABILITY_TOKEN": ""}, "OBSERVABILITY_TOKEN"),
        ({"WORKER_LEASE": timedelta(0)}, "WORKER_LEASE"),
        ({"NO_SUCH_SETTING": 1}, "NO_SUCH_SETTING"),
        ({"PREPARED_STATEMENTS": "off"}, "PREPARED_STATEMENTS"),
        ({"PREPARED_STATEMENTS": 0}, "PREPARED_STATEMENTS"),
    ],
)
def test_a_bad_setting_fails_the_check_at_start_up(
    settings: Any, value: dict[str, Any], named: str
) -> None:
    settings.JOBSTATE = value

    [message] = check_settings()

    assert message.id == "jobstate.E001" and named in message.msg
    with pytest.raises(SystemCheckError, match=named):
        call_command("check")
