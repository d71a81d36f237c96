"""One broken schedule stops only itself: the other schedules fire, every task runs,
the maintenance commands and workers start, each evaluation logs the broken one as an
error and the console marks it. Workers and commands are real processes."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from jobstate.models import JobRun, Schedule
from jobstate.schedules import ScheduleFailures, enqueue_due, evaluate_schedules, sync_schedules
from jobstate.tasks.compat import TaskResultStatus
from tests.support.admin_kit import logged_in, operator
from tests.support.schedule_kit import declare, jobs_of, schedules_env, slots_of
from tests.support.task_functions import add, echo

pytestmark = [pytest.mark.django_db(transaction=True)]

ADD = "tests.support.task_functions.add"
# Yearly, and declared more than a year ago: exactly one slot (this year's) is due.
YEARLY = {"task": ADD, "cron": "0 0 1 1 *", "args": [2, 3]}
REPORT = {"operations_job": "demo.report-build", "cron": "0 0 1 1 *", "kwargs": {"rows": 4}}
#: A schedule whose task was renamed in the code but not in settings.
RENAMED = {"task": "tests.support.task_functions.renamed_away", "cron": "0 0 1 1 *"}
#: A schedule whose task's module raises at import (not an ImportError).
RAISES = {"task": "tests.support.raises_at_import.task", "cron": "0 0 1 1 *"}
#: Arguments PostgreSQL's jsonb cannot hold (NUL) and no database can (a lone surrogate).
NUL = {"task": ADD, "cron": "0 0 1 1 *", "kwargs": {"a": "\x00", "b": 1}}
SURROGATE = {"task": ADD, "cron": "0 0 1 1 *", "kwargs": {"a": "\ud800", "b": 1}}


def manage(
    *args: str, schedules: dict[str, Any], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``manage.py *args`` on the test database with ``schedules`` (and ``env`` over the
    environment that gives)."""
    base = Path(django_settings.BASE_DIR)
    return subprocess.run(
        [sys.executable, str(base / "manage.py"), *args],
        cwd=base,
        env={**schedules_env(**schedules), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def declared_a_while_ago(settings: Any, **schedules: dict[str, Any]) -> None:
    declare(settings, **schedules)
    sync_schedules(now=timezone.now() - timedelta(days=400))


@pytest.mark.slow
def test_a_broken_schedule_s_line_has_the_time_and_level_of_the_worker_s_own(
    settings: Any, tmp_path: Path
) -> None:
    """In a project that configures no logging (a fresh ``startproject``) the worker's own
    lines had a time and level and the schedules' came bare."""
    declared_a_while_ago(settings, renamed=RENAMED)
    (tmp_path / "plain_logging.py").write_text(
        "from tests.support.schedule_settings import *\n"
        "LOGGING = {'version': 1, 'disable_existing_loggers': False}\n"
    )
    base = Path(django_settings.BASE_DIR)
    env = {
        "DJANGO_SETTINGS_MODULE": "plain_logging",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(base)]),
    }
    worker = manage("jobstate_worker", "--batch", schedules={"renamed": RENAMED}, env=env)
    assert worker.returncode == 0, worker.stderr
    stamped = r"^\d{4}-\d\d-\d\d [\d:,]+ (INFO|WARNING|ERROR) "
    assert re.search(stamped + "jobstate_worker ", worker.stderr, re.M), worker.stderr
    assert re.search(stamped + "Schedule renamed ", worker.stderr, re.M), worker.stderr


def test_a_renamed_task_stops_only_its_own_schedule(settings: Any, django_user_model: Any) -> None:
    schedules = {"yearly": YEARLY, "report": REPORT, "renamed": RENAMED, "raises": RAISES}
    declared_a_while_ago(settings, **schedules)
    direct = echo.enqueue("not scheduled")

    worker = manage("jobstate_worker", "--batch", "--worker-id", "w-1", schedules=schedules)

    assert worker.returncode == 0, worker.stderr
    (job,) = jobs_of("yearly")
    assert add.get_result(str(job.id)).return_value == 5
    assert JobRun.objects.get().status == "SUCCEEDED"  # the operations job's schedule
    assert echo.get_result(direct.id).status == TaskResultStatus.SUCCESSFUL
    assert slots_of("renamed") == []
    assert "Schedule renamed was not enqueued" in worker.stderr
    assert "tests.support.task_functions.renamed_away" in worker.stderr
    # A module that raised at import crashed every worker ("stopped (error)").
    assert slots_of("raises") == []
    assert "RuntimeError: this module fails at import on purpose" in worker.stderr
    assert "SystemCheckError" not in worker.stderr and "Traceback" not in worker.stderr
    # The checks name both as E031, with no traceback.
    check = manage("check", schedules=schedules)
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr
    assert check.stderr.count("jobstate.E031") == 2, check.stderr
    # Django's migrate runs the checks too: the hint says how to migrate meanwhile.
    assert "'manage.py migrate --skip-checks' migrates" in check.stderr
    assert manage("migrate", "--skip-checks", schedules=schedules).returncode == 0
    for command in (
        ["reap_stale"],
        ["prune_jobstate"],
        ["jobstate_worker", "--batch", "--no-schedules"],
    ):
        done = manage(*command, schedules=schedules)
        assert done.returncode == 0, (command, done.stderr)
    # The console marks it, and only it, broken.
    viewer = operator(django_user_model, "viewer", "view_schedule")
    text = logged_in(viewer).get("/admin/jobstate/schedule/").content.decode()
    assert text.count("jobstate-broken") == 2


def test_each_evaluation_logs_the_broken_schedule_as_an_error_and_runs_the_others(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    declared_a_while_ago(settings, yearly=YEARLY, nul=NUL, surrogate=SURROGATE, renamed=RENAMED)
    caplog.set_level(logging.ERROR, logger="jobstate.schedules")

    first = evaluate_schedules()
    again = evaluate_schedules()

    assert [item.schedule for item in first.enqueued] == ["yearly"] and again.enqueued == []
    assert set(first.failures) == set(again.failures) == {"nul", "surrogate", "renamed"}
    assert "NUL character" in first.failures["nul"]
    assert "not valid Unicode" in first.failures["surrogate"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    for key in ("nul", "surrogate", "renamed"):
        assert sum(f"Schedule {key} " in r.getMessage() for r in errors) == 2, key
    with pytest.raises(ScheduleFailures) as caught:
        enqueue_due()
    assert set(caught.value.failures) == {"nul", "surrogate", "renamed"}


def test_a_broken_schedule_s_key_is_logged_printably(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A key with a NUL reached the log (and a cron job's mail) raw, and a 5,000-character
    key made one line of 5,261 characters."""
    declare(settings, **{"nul\x00key": YEARLY, "k" * 5000: YEARLY})
    caplog.set_level(logging.ERROR, logger="jobstate.schedules")

    evaluate_schedules()

    lines = [
        r.getMessage() for r in caplog.records if "is broken and was skipped" in r.getMessage()
    ]
    assert len(lines) == 2, lines
    assert all("\x00" not in line for line in lines)
    assert any("'nul\\x00key'" in line for line in lines), lines
    assert any("(5002 characters)" in line for line in lines), lines
    assert all(len(line) < 1000 for line in lines), [len(line) for line in lines]


def test_a_broken_declaration_leaves_its_row_as_it_was(settings: Any) -> None:
    declare(settings, yearly=YEARLY, other=YEARLY)
    sync_schedules()
    before = Schedule.objects.get(key="other")
    declare(settings, yearly=YEARLY, other={**YEARLY, "cron": "61 * * * *"})

    sync_schedules()
    result = evaluate_schedules()

    after = Schedule.objects.get(key="other")
    assert (after.removed_at, after.revision, after.cron) == (None, before.revision, "0 0 1 1 *")
    assert "['other']['cron']" in result.failures["other"]


def test_the_console_names_a_broken_schedule_that_has_no_row_yet(
    settings: Any, django_user_model: Any
) -> None:
    declare(settings, yearly=YEARLY, typo={**YEARLY, "timezone": "Europe/Berlinn"})
    sync_schedules()
    viewer = operator(django_user_model, "viewer", "view_schedule")
    text = logged_in(viewer).get("/admin/jobstate/schedule/").content.decode()
    assert "Schedule typo is broken and is skipped" in text and "Europe/Berlinn" in text


def test_the_console_names_a_new_schedule_whose_task_does_not_import(
    settings: Any, django_user_model: Any
) -> None:
    # Declared (say by a deploy of the web servers) before any worker synchronised it:
    # no row yet, and its declaration reads fine, but its task does not import. The page
    # named only broken declarations, so this schedule was not on it at all.
    declare(settings, yearly=YEARLY)
    sync_schedules()
    declare(settings, yearly=YEARLY, renamed=RENAMED)
    viewer = operator(django_user_model, "viewer", "view_schedule")
    text = logged_in(viewer).get("/admin/jobstate/schedule/").content.decode()
    assert "Schedule renamed is broken and is skipped" in text
    assert "tests.support.task_functions.renamed_away" in text
    assert "Schedule yearly" not in text


def test_the_console_gives_a_broken_schedule_no_next_run(
    settings: Any, django_user_model: Any
) -> None:
    # Every evaluation skips a broken schedule: the page said its next run was due all
    # the same ("2027-01-01T00:00:00+00:00 (in 3 weeks)").
    declare(settings, yearly=YEARLY)
    sync_schedules()
    viewer = logged_in(operator(django_user_model, "viewer", "view_schedule"))
    next_slot = timezone.now().replace(microsecond=0) + timedelta(days=20)
    Schedule.objects.filter(key="yearly").update(next_slot=next_slot)  # as an evaluation sets
    assert next_slot.isoformat() in viewer.get("/admin/jobstate/schedule/").content.decode()
    declare(settings, yearly={**YEARLY, "timezone": "Europe/Berlinn"})
    text = viewer.get("/admin/jobstate/schedule/").content.decode()
    assert "jobstate-broken" in text
    assert next_slot.isoformat() not in text
    assert "none while it is broken" in text


@pytest.mark.slow
def test_unstorable_schedule_arguments_stop_neither_workers_nor_the_cron_command(
    settings: Any,
) -> None:
    schedules = {"yearly": YEARLY, "nul": NUL, "surrogate": SURROGATE}
    declared_a_while_ago(settings, yearly=YEARLY)

    cron = manage("enqueue_due_schedules", schedules=schedules)
    worker = manage("jobstate_worker", "--batch", schedules=schedules)

    assert cron.returncode == 1, cron.stderr
    assert "schedule 'nul' is broken" in cron.stderr
    assert "schedule 'surrogate' is broken" in cron.stderr
    assert "Traceback" not in cron.stderr
    assert worker.returncode == 0, worker.stderr
    (job,) = jobs_of("yearly")
    assert add.get_result(str(job.id)).status == TaskResultStatus.SUCCESSFUL
    assert not Schedule.objects.filter(key__in=["nul", "surrogate"]).exists()
