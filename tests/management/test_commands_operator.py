"""What jobstate's commands tell an operator when the deployment is not right: an
unmigrated database, an unknown ``--backend``, a module of ``OPERATIONS_JOB_MODULES``
that does not import, a worker on queues with nothing ready while another queue's tasks
wait, a probe that is not ready. Commands run as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from tests.support.processes import database_url
from tests.support.schedule_kit import schedules_env
from tests.support.task_functions import add
from tests.support.tasks_kit import FAST

BASE = Path(django_settings.BASE_DIR)


def manage(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(BASE / "manage.py"), *args],
        cwd=BASE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def never_migrated(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'never-migrated.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }


UNMIGRATED_COMMANDS = [
    ["reap_stale"],
    ["prune_jobstate"],
    ["deliver_notifications"],
    ["jobstate_metrics"],
    ["enqueue_due_schedules"],
    ["jobstate_worker", "--batch"],
    ["run_operations_job", "demo.report-build"],
    ["run_bulk_operation", "1"],
    ["jobstate_ready"],
]


@pytest.mark.slow
@pytest.mark.parametrize("command", UNMIGRATED_COMMANDS, ids=lambda command: command[0])
def test_every_command_on_an_unmigrated_database_says_to_migrate(
    command: list[str], tmp_path: Path
) -> None:
    done = manage(*command, env=never_migrated(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "run manage.py migrate" in done.stderr
    assert "Traceback" not in done.stderr and "OperationalError" not in done.stderr
    assert done.stdout == ""


@pytest.mark.slow
def test_jobstate_ready_says_why_once(tmp_path: Path) -> None:
    done = manage("jobstate_ready", env=never_migrated(tmp_path))
    assert done.returncode == 1
    assert done.stderr.count("unapplied jobstate migrations") == 1, done.stderr


@pytest.mark.slow
def test_an_unknown_backend_lists_the_tasks_aliases(tmp_path: Path) -> None:
    done = manage("jobstate_worker", "--backend", "nope", env=never_migrated(tmp_path))
    assert done.returncode == 2
    assert "--backend 'nope' is not in settings.TASKS (known: default)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_setting_the_checks_refuse_stops_the_worker_with_status_2_in_djangos_words(
    tmp_path: Path,
) -> None:
    """It printed "CommandError: SystemCheckError: System check identified ..."."""
    (tmp_path / "refused_settings.py").write_text(
        "from project.settings import *\nJOBSTATE = {'LIST_LIMIT': 0}\n"
    )
    env = {
        **never_migrated(tmp_path),
        "DJANGO_SETTINGS_MODULE": "refused_settings",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(BASE)]),
    }
    done = manage("jobstate_worker", "--batch", env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("SystemCheckError: System check identified some issues:")
    assert "jobstate.E001" in done.stderr and "CommandError" not in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("arguments", [["--list"], ["--list", "--json"], ["demo.report-build"]])
@pytest.mark.parametrize(
    ("module", "why"),
    [
        ("billing.operations", "ModuleNotFoundError"),
        # Imports, and raises on a key its declaration gets wrong: a traceback before.
        ("tests.support.bad_operations", "InvalidJobKey: Operations job key 'ops.<b>bold</b>'"),
    ],
    ids=["missing", "declared-wrongly"],
)
def test_an_operations_module_that_does_not_import_exits_2_naming_it(
    arguments: list[str], module: str, why: str, tmp_path: Path
) -> None:
    env = {
        **never_migrated(tmp_path),
        "DJANGO_SETTINGS_MODULE": "tests.support.operations_settings",
        "JOBSTATE_TEST_OPERATIONS_MODULES": json.dumps([module]),
    }
    done = manage("run_operations_job", *arguments, env=env)
    assert done.returncode == 2, done.stderr
    assert f"JOBSTATE['OPERATIONS_JOB_MODULES'] names {module!r}" in done.stderr
    assert why in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    checked = manage("check", env=env)
    assert checked.returncode == 1 and "jobstate.E002" in checked.stderr


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_jobstate_ready_is_not_ready_while_a_check_error_stands() -> None:
    good = manage("jobstate_ready", env=schedules_env())
    assert good.returncode == 0, good.stderr
    renamed = {"task": "tests.support.task_functions.renamed_away", "cron": "0 0 1 1 *"}
    done = manage("jobstate_ready", env=schedules_env(renamed=renamed))
    assert done.returncode == 1
    assert "jobstate.E031" in done.stderr and "renamed_away" in done.stderr
    as_json = manage("jobstate_ready", "--json", env=schedules_env(renamed=renamed))
    assert json.loads(as_json.stdout)["ready"] is False


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_says_when_ready_tasks_wait_in_a_queue_no_worker_serves(
    settings: Any,
) -> None:
    emails = add.using(queue_name="emails")
    first, second = emails.enqueue(1, 1), emails.enqueue(2, 2)
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.support.worker_settings",
        "JOBSTATE_TEST_TASK_OPTIONS": json.dumps(FAST),
    }

    idle = manage("jobstate_worker", "--batch", "--queue-name", "default", env=env)

    assert idle.returncode == 0, idle.stderr
    assert "'emails' (2 ready)" in idle.stderr and "--queue-name emails" in idle.stderr
    # A worker that serves the queue says nothing of the kind, and runs them.
    served = manage("jobstate_worker", "--batch", "--queue-name", "default,emails", env=env)
    assert served.returncode == 0, served.stderr
    assert "no live worker serves" not in served.stderr
    assert add.get_result(first.id).return_value == 2
    assert add.get_result(second.id).return_value == 4


@pytest.mark.slow
@pytest.mark.backend
@pytest.mark.parametrize(
    "command",
    [
        ("jobstate_worker", "--batch"),
        ("run_operations_job", "demo.report-build"),
        ("run_bulk_operation", "99999"),
    ],
)
@pytest.mark.parametrize(
    ("option", "says"),
    [
        (
            "isolation_level=garbage",
            "Invalid transaction isolation level garbage specified. Use one of the "
            "psycopg.IsolationLevel values.",
        ),
        # The driver's ProgrammingError: the worker called it a rejected statement.
        ("connect_timeout=x", "bad value for connect_timeout: 'x'"),
    ],
)
def test_a_database_option_the_driver_refuses_is_one_line_and_status_2(
    command: tuple[str, ...], option: str, says: str
) -> None:
    """The worker, run_operations_job and run_bulk_operation printed Django's
    ImproperlyConfigured as a traceback (status 1); a setting no wait cures is a usage
    error."""
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/jobstate?{option}",
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }
    done = manage(*command, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        f"CommandError: database 'default' cannot be connected to as configured: {says}\n"
    )
