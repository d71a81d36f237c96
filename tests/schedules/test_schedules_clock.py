"""Schedules on the real clock, with no ``now=`` handed in: the row's ``effective_from``
is written by the database's clock and every conditional update on it must still match
the row it read, on SQLite (which stores instants as text) as on the server databases.
The test that waits for a real minute boundary waits for one only, for both of its callers."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import pytest
from django.db import transaction
from django.utils import timezone

from jobstate.models import Schedule
from jobstate.schedules import enqueue_due
from jobstate.stores.database.backends import instant_filter
from tests.support.processes import database_url
from tests.support.schedule_kit import declare, jobs_of, manage, row, slots_of
from tests.support.tasks_kit import sleep_past

pytestmark = [pytest.mark.mysql, pytest.mark.slow]

EVERY_MINUTE = {"task": "tests.support.task_functions.add", "cron": "* * * * *", "args": [1, 2]}


def next_minute(instant: datetime) -> datetime:
    return instant.replace(second=0, microsecond=0) + timedelta(minutes=1)


def start_well_before_a_minute_boundary(margin: float = 15.0) -> None:
    """Sleep into the next minute when fewer than ``margin`` seconds are left of this
    one: what a test does before the boundary it waits for (a command in a process of
    its own, slow on a loaded machine) must end before that boundary."""
    now = timezone.now()
    if 60 - (now.second + now.microsecond / 1_000_000) < margin:
        sleep_past(next_minute(now), margin=0.3)


@pytest.mark.django_db
def test_the_first_evaluation_shows_the_next_slot(settings: Any) -> None:
    declare(settings, minutely=EVERY_MINUTE)
    assert enqueue_due() == []
    schedule = row("minutely")
    # The display of the next run is a conditional update on the effective_from read.
    assert schedule.next_slot == next_minute(schedule.effective_from)
    assert Schedule.objects.filter(
        instant_filter("default", "effective_from", "exact", schedule.effective_from)
    ).exists()


@pytest.mark.django_db(transaction=True)
def test_an_every_minute_schedule_fires_at_the_next_minute_in_process_and_by_command(
    settings: Any,
) -> None:
    # One real minute boundary serves both callers: an evaluation inside a transaction
    # held open across the boundary (rolled back), then the command that cron runs,
    # whose second run after the boundary enqueues the slot the first run started from.
    declare(settings, minutely=EVERY_MINUTE)
    schedules = {"minutely": EVERY_MINUTE}
    start_well_before_a_minute_boundary()
    first = manage("enqueue_due_schedules", schedules=schedules)
    assert (first.returncode, first.stdout, first.stderr) == (0, "", "")
    slot = next_minute(row("minutely").effective_from)

    with transaction.atomic():
        assert enqueue_due() == []
        sleep_past(slot, margin=0.3)
        (item,) = enqueue_due()
        assert (item.schedule, item.slot) == ("minutely", slot)
        assert slots_of("minutely") == [slot]
        assert enqueue_due() == []
        assert row("minutely").next_slot == slot + timedelta(minutes=1)
        transaction.set_rollback(True)
    assert slots_of("minutely") == []

    second = manage("enqueue_due_schedules", "-v", "2", schedules=schedules)
    assert second.returncode == 0, second.stderr
    (job,) = jobs_of("minutely")
    assert second.stdout == f"Enqueued minutely for {slot.isoformat()} as {job.id}\n"
    assert slots_of("minutely") == [slot]


@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_server_whose_time_zone_is_not_utc_writes_the_real_instant(settings: Any) -> None:
    # A MariaDB or MySQL server whose time zone is the machine's (SYSTEM) answers NOW()
    # in local wall time, where Django writes and reads UTC: the schedule would start
    # hours off and its slots fire hours late (or a delayed job run hours early).
    declare(settings, minutely=EVERY_MINUTE)
    local = "?init_command=" + quote("SET time_zone = '+05:00'")
    before = timezone.now()
    done = manage(
        "enqueue_due_schedules",
        schedules={"minutely": EVERY_MINUTE},
        env={"DATABASE_URL": database_url() + local},
    )
    assert (done.returncode, done.stderr) == (0, "")
    started = row("minutely").effective_from
    assert before - timedelta(seconds=1) <= started <= timezone.now() + timedelta(seconds=1)
