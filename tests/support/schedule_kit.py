"""What the schedule tests share: declaring schedules in a test and in the processes it
starts, and reading back what was enqueued."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings

from jobstate.models import Job, Schedule, ScheduleOccurrence
from tests.support.processes import database_url
from tests.support.tasks_kit import FAST

#: A Sunday noon in UTC; the tests' schedules start from instants around it.
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

#: The environment variable :mod:`tests.support.schedule_settings` reads the schedules from.
SCHEDULES_ENV = "JOBSTATE_TEST_SCHEDULES"


def declare(settings: Any, *, limit: int | None = None, **schedules: dict[str, Any]) -> None:
    """Make ``schedules`` this test's ``JOBSTATE["SCHEDULES"]`` (and the catch-up cap)."""
    jobstate: dict[str, Any] = {"SCHEDULES": schedules}
    if limit is not None:
        jobstate["SCHEDULE_CATCH_UP_LIMIT"] = limit
    settings.JOBSTATE = jobstate


def schedules_env(**schedules: dict[str, Any]) -> dict[str, str]:
    """The environment of a child process on the test database with these schedules."""
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": "tests.support.schedule_settings",
        "JOBSTATE_TEST_TASK_OPTIONS": json.dumps(FAST),
        SCHEDULES_ENV: json.dumps(schedules),
        "PYTHONUNBUFFERED": "1",
    }


def slots_of(key: str) -> list[datetime]:
    """The cron slots enqueued for schedule ``key``, in order."""
    return list(
        ScheduleOccurrence.objects.filter(schedule__key=key, trigger="cron")
        .order_by("slot")
        .values_list("slot", flat=True)
    )


def jobs_of(key: str) -> list[Job]:
    """The jobs schedule ``key``'s occurrences enqueued, in slot order."""
    ids = list(
        ScheduleOccurrence.objects.filter(schedule__key=key)
        .order_by("slot")
        .values_list("result_id", flat=True)
    )
    jobs = {job.id: job for job in Job.objects.filter(id__in=ids)}
    return [jobs[job_id] for job_id in ids]


def row(key: str) -> Schedule:
    return Schedule.objects.get(key=key)


def utc(*fields: int) -> datetime:
    return datetime(*fields, tzinfo=UTC)  # type: ignore[misc]


def manage(
    *args: str, schedules: dict[str, Any], timeout: float = 120, env: dict[str, str] | None = None
) -> Any:
    """``manage.py *args`` as a process on the test database with ``schedules`` (and
    ``env`` over the environment)."""
    base = Path(django_settings.BASE_DIR)
    return subprocess.run(
        [sys.executable, str(base / "manage.py"), *args],
        cwd=base,
        env={**schedules_env(**schedules), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
