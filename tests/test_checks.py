"""The settings check: a bad ``JOBSTATE`` value stops ``manage.py check`` (and so
``runserver`` and ``migrate``) at start-up, naming the setting."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.checks import ERROR
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections

from jobstate.checks import check_database_guarantees, check_settings


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


# --- what each database guarantees --------------------------------------------------------


@pytest.mark.mysql
@pytest.mark.django_db
def test_the_test_database_gives_every_guarantee() -> None:
    assert check_database_guarantees(databases=["default"]) == []


def _options(alias: str = "default") -> dict[str, Any]:
    return connections[alias].settings_dict.setdefault("OPTIONS", {})


@pytest.mark.only_on("sqlite")
@pytest.mark.django_db
def test_sqlite_without_immediate_transactions_fails_the_check_until_accepted(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(_options(), "transaction_mode")

    [message] = check_database_guarantees(databases=["default"])

    assert message.id == "jobstate.E040" and message.level == ERROR
    assert "IMMEDIATE" in message.msg and "SILENCED_SYSTEM_CHECKS" in (message.hint or "")
    with pytest.raises(SystemCheckError, match=r"jobstate\.E040"):
        call_command("check", databases=["default"])
    settings.SILENCED_SYSTEM_CHECKS = ["jobstate.E040"]
    call_command("check", databases=["default"])


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db
@pytest.mark.parametrize("level", ["repeatable read", "serializable", None])
def test_mariadb_away_from_read_committed_fails_the_check(
    monkeypatch: pytest.MonkeyPatch, level: str | None
) -> None:
    monkeypatch.setitem(_options(), "isolation_level", level)

    [message] = check_database_guarantees(databases=["default"])

    assert message.id == "jobstate.E043" and message.level == ERROR
    assert repr(level) in message.msg and "per-thread gate" in message.msg


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.django_db
def test_mariadb_at_read_committed_spelled_by_the_host_passes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(_options(), "isolation_level", "READ COMMITTED")

    assert check_database_guarantees(databases=["default"]) == []
