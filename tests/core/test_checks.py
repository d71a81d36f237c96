"""The settings check: a bad ``JOBSTATE`` value stops ``manage.py check`` (and so
``runserver`` and ``migrate``) at start-up, naming the setting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.checks import ERROR, WARNING
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.db import connections

from jobstate.checks import (
    check_channels,
    check_database_guarantees,
    check_operations_modules,
    check_payload_limit,
    check_pooler_settings,
    check_schedules,
    check_settings,
    check_stores,
)
from jobstate.management.commands.jobstate_ready import check_readiness


def test_the_default_settings_pass() -> None:
    assert check_settings() == []


# The system checks include Django's model checks, and on SQLite Django 6.1's JSONField
# check asks the database once per process whether it supports JSON: a test that runs
# them needs the database (it passed only while an earlier test had asked).
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("value", "named"),
    [
        ({"OBSERVABILITY_TOKEN": ""}, "OBSERVABILITY_TOKEN"),
        ({"WORKER_LEASE": timedelta(0)}, "WORKER_LEASE"),
        # Longer than any instant can be moved by (every claim would be refused).
        ({"WORKER_LEASE": timedelta(days=10**6)}, "at most 365000 days"),
        ({"FINISHED_JOB_RETENTION": timedelta.max}, "FINISHED_JOB_RETENTION"),
        ({"NO_SUCH_SETTING": 1}, "NO_SUCH_SETTING"),
        ({"PREPARED_STATEMENTS": "off"}, "PREPARED_STATEMENTS"),
        ({"PREPARED_STATEMENTS": 0}, "PREPARED_STATEMENTS"),
        ({"CONNECTION_POOLER": "pgbouncer"}, "CONNECTION_POOLER"),
        ({"CONNECTION_POOLER": True}, "CONNECTION_POOLER"),
        ({"STATE_STORE": 5}, "STATE_STORE"),
        ({"RUN_STORE": "DatabaseJobRunStore"}, "RUN_STORE"),
        ({"REAP_SCOPE": "everything"}, "REAP_SCOPE"),
        ({"STALE_RUN_AFTER": timedelta(seconds=10)}, "at least twice"),
        ({"OUTBOX_BACKOFF_BASE": timedelta(hours=2)}, "OUTBOX_BACKOFF_BASE"),
        ({"CHANNELS": "webhook"}, "CHANNELS"),
        ({"CHANNELS": {"webhook": "WebhookChannel"}}, "CHANNELS"),
        ({"CHANNELS": {"": "jobstate.outbox.channels.WebhookChannel"}}, "CHANNELS"),
        # Each passed the check, then failed every operations job or relay pass.
        ({"REAP_LIMIT": "10"}, "REAP_LIMIT"),
        ({"REAP_LIMIT": 0}, "REAP_LIMIT"),
        ({"REAP_LIMIT": 1.5}, "REAP_LIMIT"),
        ({"REAP_LIMIT": True}, "REAP_LIMIT"),
        ({"SWEEP_BATCH_SIZE": 10**30}, "a 64-bit count"),
        ({"SCHEDULE_CATCH_UP_LIMIT": 2**63}, "a 64-bit count"),
        ({"SERVICE_REVISION": 5}, "SERVICE_REVISION"),
        ({"SERVICE_REVISION": ""}, "SERVICE_REVISION"),
        ({"SERVICE_REVISION": "a\x00b"}, "SERVICE_REVISION"),
        ({"SERVICE_REVISION": "\ud800"}, "SERVICE_REVISION"),
        ({"SERVICE_REVISION": "x" * 101}, "at most 100 characters"),
        ({"WEBHOOK_SECRET": 5}, "WEBHOOK_SECRET"),
        ({"WEBHOOK_SECRET": ""}, "WEBHOOK_SECRET"),
        ({"WEBHOOK_SECRET": ["a", "b"]}, "WEBHOOK_SECRET"),
        # Passed the check; then every webhook failed its sends (UnicodeEncodeError).
        ({"WEBHOOK_SECRET": "\ud800"}, "a string that is not valid Unicode"),
        ({"WEBHOOK_SECRET": "a\x00b"}, "a string that contains a NUL character"),
        # Passed the check; then no request could send it (or a 500 for the surrogate).
        ({"OBSERVABILITY_TOKEN": "\ud800"}, "outside printable ASCII"),
        ({"OBSERVABILITY_TOKEN": " padded-token "}, "spaces at an end"),
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


@pytest.mark.parametrize(
    "value",
    [
        {"REAP_LIMIT": None, "SERVICE_REVISION": "v2.3.1", "WEBHOOK_SECRET": b"key"},
        {"REAP_LIMIT": 2**63 - 1, "SERVICE_REVISION": "x" * 100, "WEBHOOK_SECRET": "key"},
    ],
)
def test_the_values_the_settings_reference_allows_pass(
    settings: Any, value: dict[str, Any]
) -> None:
    settings.JOBSTATE = value
    assert check_settings() == []


@pytest.mark.parametrize(
    ("setting", "path", "says"),
    [
        ("STATE_STORE", "os.path", "is a module, not a class"),
        ("RUN_STORE", "os.path", "is a module, not a class"),
        ("RUN_STORE", "nosuch.Store", "Cannot import store 'nosuch.Store'"),
        ("RUN_STORE", "jobstate.stores.database.DatabaseStateStore", "is not a JobRunStore"),
        ("STATE_STORE", "tests.support.raises_at_import.Store", "RuntimeError"),
    ],
)
def test_a_store_setting_that_names_no_store_of_its_kind_fails_the_check(
    settings: Any, setting: str, path: str, says: str
) -> None:
    """``RUN_STORE`` was not checked at all, and a ``STATE_STORE`` naming a module gave
    the check a traceback (``issubclass() arg 1 must be a class``)."""
    settings.JOBSTATE = {setting: path}

    [message] = check_stores()

    assert message.id == "jobstate.E004" and says in message.msg, message.msg


def test_a_payload_limit_below_what_jobstates_own_records_need_fails_the_check(
    settings: Any,
) -> None:
    settings.JOBSTATE = {"MAX_PAYLOAD_BYTES": 4095}
    [message] = check_payload_limit()
    assert message.id == "jobstate.E005"
    assert message.msg.startswith("JOBSTATE['MAX_PAYLOAD_BYTES'] is 4095; it must be at least 4096")
    settings.JOBSTATE = {"MAX_PAYLOAD_BYTES": 4096}
    assert check_payload_limit() == []


def test_a_channel_whose_module_raises_at_import_fails_the_check(settings: Any) -> None:
    """The check gave a traceback: importing a module may raise anything."""
    settings.JOBSTATE = {"CHANNELS": {"webhook": "tests.support.raises_at_import.Channel"}}

    [message] = check_channels()

    assert message.id == "jobstate.E003"
    assert "RuntimeError: this module fails at import on purpose" in message.msg


@pytest.mark.parametrize("setting", ["CHANNELS", "STATE_STORE"])
def test_a_module_whose_error_cannot_be_printed_fails_the_check_by_name(
    settings: Any, setting: str
) -> None:
    """The check printed a traceback: an import error whose ``__str__`` raises made the
    message itself fail."""
    path = "tests.support.unprintable_at_import.Thing"
    settings.JOBSTATE = {setting: {"webhook": path} if setting == "CHANNELS" else path}

    [message] = check_channels() if setting == "CHANNELS" else check_stores()

    assert "Unprintable: Unprintable" in message.msg, message.msg


# --- settings behind a pooler in transaction mode ------------------------------------------


@pytest.mark.postgres
def test_settings_that_contradict_a_transaction_pooler_are_warned_about(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    database = connections["default"].settings_dict
    monkeypatch.delitem(database, "DISABLE_SERVER_SIDE_CURSORS", raising=False)
    settings.JOBSTATE = {"CONNECTION_POOLER": None}
    assert check_pooler_settings() == []

    settings.JOBSTATE = {"CONNECTION_POOLER": "transaction"}
    messages = check_pooler_settings()
    assert [message.id for message in messages] == [
        "jobstate.W050",
        "jobstate.W051",
        "jobstate.W052",
    ]
    assert "PREPARED_STATEMENTS" in messages[0].msg and "LISTEN_NOTIFY" in messages[1].msg
    with pytest.raises(SystemCheckError, match=r"jobstate\.W051"):
        call_command("check", fail_level="WARNING")

    settings.JOBSTATE = {
        "CONNECTION_POOLER": "transaction",
        "PREPARED_STATEMENTS": False,
        "LISTEN_NOTIFY": False,
    }
    monkeypatch.setitem(database, "DISABLE_SERVER_SIDE_CURSORS", True)
    assert check_pooler_settings() == []
    # The host's own prepared statements are as wrong there as jobstate's.
    monkeypatch.setitem(
        database, "OPTIONS", {**database.get("OPTIONS", {}), "prepare_threshold": 5}
    )
    [message] = check_pooler_settings()
    assert message.id == "jobstate.W050" and "prepare_threshold" in message.msg


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
    # The line the tutorial gives, to paste as it is.
    line = "DATABASES['default']['OPTIONS'] = {'transaction_mode': 'IMMEDIATE', 'timeout': 30}"
    assert line in (message.hint or "")
    with pytest.raises(SystemCheckError, match=r"jobstate\.E040"):
        call_command("check", databases=["default"])
    settings.SILENCED_SYSTEM_CHECKS = ["jobstate.E040"]
    call_command("check", databases=["default"])


@pytest.mark.only_on("postgresql")
def test_sqlite_options_left_on_a_postgresql_database_are_warned_about(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The quick start's SQLite OPTIONS, kept when ENGINE was changed: psycopg refuses
    # them at the first connection ('invalid connection option "transaction_mode"').
    monkeypatch.setitem(_options(), "transaction_mode", "IMMEDIATE")
    monkeypatch.setitem(_options(), "timeout", 30)

    [message] = check_database_guarantees(databases=["default"])

    assert message.id == "jobstate.W053" and message.level == WARNING
    assert "'transaction_mode', 'timeout'" in message.msg and "postgresql" in message.msg
    assert "Remove 'transaction_mode' and 'timeout'" in (message.hint or "")


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


# --- every problem at once, and what each is ----------------------------------------------


def test_an_unknown_setting_names_the_setting_it_was_likely_meant_as(settings: Any) -> None:
    settings.JOBSTATE = {"HEARTBEAT_INTERVALL": timedelta(seconds=10)}

    [message] = check_settings()

    assert message.id == "jobstate.E001"
    assert "'HEARTBEAT_INTERVALL'" in message.msg
    assert "did you mean HEARTBEAT_INTERVAL?" in message.msg


@pytest.mark.django_db
def test_check_reports_every_problem_in_one_pass(settings: Any) -> None:
    settings.JOBSTATE = {
        "HEARTBEAT_INTERVALL": timedelta(seconds=10),
        "WORKER_LEASE": timedelta(0),
        "LIST_LIMIT": 0,
    }
    with pytest.raises(SystemCheckError) as caught:
        call_command("check")
    text = str(caught.value)
    for named in ("HEARTBEAT_INTERVALL", "WORKER_LEASE", "LIST_LIMIT"):
        assert named in text
    assert text.count("jobstate.E001") == 3


def test_schedules_report_their_declaration_and_their_target_problems_together(
    settings: Any,
) -> None:
    settings.JOBSTATE = {
        "SCHEDULES": {
            "bad-cron": {"task": "tests.support.task_functions.add", "cron": "61 * * * *"},
            "renamed": {"task": "tests.support.task_functions.renamed_away", "cron": "* * * * *"},
        }
    }
    messages = check_schedules()
    assert sorted(m.id for m in messages) == ["jobstate.E030", "jobstate.E031"]
    assert "['bad-cron']['cron']" in messages[0].msg
    assert "schedule 'renamed'" in messages[1].msg and "renamed_away" in messages[1].msg


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"note": "a\x00b"}, "NUL character"),
        ({"note": "\ud800"}, "not valid Unicode"),
        ({"note\x00": 1}, "NUL character"),
        ({"note": "x" * 2048}, "the limit is 1024"),
    ],
    ids=["nul", "lone-surrogate", "nul-in-a-key", "too-large"],
)
def test_schedule_arguments_the_job_table_cannot_hold_fail_the_check(
    settings: Any, kwargs: dict[str, Any], says: str
) -> None:
    settings.JOBSTATE = {
        "MAX_PAYLOAD_BYTES": 1024,
        "SCHEDULES": {
            "nightly": {
                "task": "tests.support.task_functions.echo",
                "cron": "0 2 * * *",
                "kwargs": kwargs,
            }
        },
    }
    [message] = check_schedules()
    assert message.id == "jobstate.E030"
    assert "['nightly']['kwargs']" in message.msg and says in message.msg


def test_a_cron_of_100_kb_is_shown_cut_to_its_start_and_its_length(settings: Any) -> None:
    # One line of `manage.py check` would otherwise be 100 kB long.
    pasted = "1," * 50_000 + "2 * * * *"
    settings.JOBSTATE = {
        "SCHEDULES": {"pasted": {"task": "project.demo.tasks.send_welcome_email", "cron": pasted}}
    }
    [message] = check_schedules()
    assert message.id == "jobstate.E030"
    assert "['cron'] must be a cron expression, got '1,1,1," in message.msg
    assert f"({len(repr(pasted))} characters)" in message.msg and len(message.msg) < 300


@pytest.mark.django_db
def test_a_channel_that_does_not_import_to_a_class_fails_the_check(settings: Any) -> None:
    # The relay would fail every notification of these channels at its send.
    settings.JOBSTATE = {
        "CHANNELS": {
            "webhook": "jobstate.outbox.channels.WebhookChanel",
            "email": "jobstate.outbox.relay.deliver_notifications",
            "callable": "jobstate.outbox.channels.CallableChannel",
        }
    }

    misspelt, not_a_class = check_channels()

    assert {misspelt.id, not_a_class.id} == {"jobstate.E003"}
    assert "['webhook'] = 'jobstate.outbox.channels.WebhookChanel' does not import" in (
        misspelt.msg
    )
    assert "['email']" in not_a_class.msg and "is a function, not a class" in not_a_class.msg
    with pytest.raises(SystemCheckError, match=r"jobstate\.E003"):
        call_command("check")
    # The readiness probe says so; the maintenance commands do not stop for it.
    readiness = check_readiness("default")
    assert not readiness.ready and "jobstate.E003" in readiness.detail
    call_command("reap_stale", verbosity=0)


@pytest.mark.django_db
def test_an_operations_job_module_that_does_not_import_fails_the_check(settings: Any) -> None:
    settings.JOBSTATE = {"OPERATIONS_JOB_MODULES": ["billing.operations"]}

    [message] = check_operations_modules()

    assert message.id == "jobstate.E002"
    assert "'billing.operations'" in message.msg and "No module named 'billing'" in message.msg
    with pytest.raises(SystemCheckError, match=r"jobstate\.E002"):
        call_command("check")


@pytest.mark.slow
def test_manage_py_check_reports_bad_task_options_on_every_django_version(
    tmp_path: Path,
) -> None:
    """On Django 6, ``django.tasks`` registers its check only when imported, which a
    bare ``manage.py check`` never does; jobstate's own check runs regardless."""
    base = Path(django_settings.BASE_DIR)
    process = subprocess.run(
        [sys.executable, str(base / "manage.py"), "check"],
        cwd=base,
        env={
            **os.environ,
            "DATABASE_URL": f"sqlite:///{tmp_path / 'unused.sqlite3'}",
            "DJANGO_SETTINGS_MODULE": "tests.support.worker_settings",
            "JOBSTATE_TEST_TASK_OPTIONS": json.dumps({"MAX_ATTEMPTS": 0}),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert process.returncode == 1, process.stdout + process.stderr
    assert "(jobstate.E020) TASKS['default']: OPTIONS['MAX_ATTEMPTS']" in process.stderr
    assert process.stderr.count("jobstate.E020") == 1
