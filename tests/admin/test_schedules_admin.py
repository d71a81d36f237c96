"""The console's Schedules page: what it shows of each schedule, and the run now,
pause and resume actions with their permissions, confirmations and audit entries."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from jobstate.models import AuditEntry, Schedule, ScheduleOccurrence
from jobstate.schedules import enqueue_due, sync_schedules
from tests.support.admin_kit import (
    act,
    confirm_page,
    logged_in,
    operator,
    seen_fields,
    shown_messages,
)
from tests.support.schedule_kit import T0, declare

pytestmark = pytest.mark.django_db

SCHEDULES = "/admin/jobstate/schedule/"
ADD = "tests.support.task_functions.add"
NIGHTLY = {"task": ADD, "cron": "30 2 * * *", "timezone": "Europe/Berlin", "args": [1, 1]}
FIVE = {"task": ADD, "cron": "*/5 * * * *", "args": [2, 2]}


@pytest.fixture
def schedules(settings: Any) -> dict[str, Schedule]:
    """Three schedules: one that has run, one never run, one removed from settings."""
    declare(settings, nightly=NIGHTLY, five=FIVE, old=FIVE)
    sync_schedules(now=T0)
    enqueue_due(now=T0 + timedelta(minutes=5))
    declare(settings, nightly=NIGHTLY, five=FIVE)
    sync_schedules(now=T0 + timedelta(minutes=6))
    return {row.key: row for row in Schedule.objects.all()}


def test_the_page_lists_each_schedule_with_its_cron_next_and_last_run(
    schedules: dict[str, Schedule], django_user_model: Any
) -> None:
    viewer = operator(django_user_model, "viewer", "view_schedule")
    page = logged_in(viewer).get(SCHEDULES)
    assert page.status_code == 200
    text = page.content.decode()
    for expected in ("nightly", "five", "old", "30 2 * * *", "Europe/Berlin", "At 02:30 every day"):
        assert expected in text, expected
    assert "removed" in text and "active" in text
    five = ScheduleOccurrence.objects.get(schedule__key="five")
    assert f"/admin/jobstate/job/{five.result_id}/change/" in text
    # The viewer may look, not act: no action is offered.
    assert 'name="action"' not in text
    removed = logged_in(viewer).get(f"{SCHEDULES}?state=removed").content.decode()
    assert "old" in removed and "nightly" not in removed


def test_a_schedules_page_shows_its_definition_and_latest_occurrences(
    schedules: dict[str, Schedule], django_user_model: Any
) -> None:
    viewer = operator(django_user_model, "viewer", "view_schedule")
    page = logged_in(viewer).get(f"{SCHEDULES}{schedules['five'].pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "jobstate-occurrences" in text and (T0 + timedelta(minutes=5)).isoformat() in text
    assert "Every fifth minute" in text
    assert logged_in(viewer).get(f"{SCHEDULES}add/").status_code == 403


def test_run_now_needs_its_permission_and_is_audited_with_the_user(
    schedules: dict[str, Schedule], django_user_model: Any
) -> None:
    pauser = logged_in(operator(django_user_model, "pauser", "view_schedule", "pause_schedule"))
    refused = act(pauser, SCHEDULES, "run_schedules_now", [schedules["nightly"].pk], confirm=True)
    assert any("You may not run the action" in m for m in shown_messages(refused))
    assert not ScheduleOccurrence.objects.filter(trigger="manual").exists()

    runner = logged_in(operator(django_user_model, "rita", "view_schedule", "run_schedule"))
    confirmation = confirm_page(runner, SCHEDULES, "run_schedules_now", [schedules["nightly"].pk])
    assert confirmation.status_code == 200 and b"Yes, run now" in confirmation.content
    assert not ScheduleOccurrence.objects.filter(trigger="manual").exists()
    selected = [schedules["nightly"].pk, schedules["old"].pk]
    shown = seen_fields(
        confirm_page(runner, SCHEDULES, "run_schedules_now", selected).content.decode()
    )
    done = act(runner, SCHEDULES, "run_schedules_now", selected, confirm=True, **shown)
    messages = shown_messages(done)
    assert "Enqueued a job of 1 schedule." in messages
    assert any("old (removed from settings)" in m for m in messages)
    occurrence = ScheduleOccurrence.objects.get(trigger="manual")
    assert (occurrence.schedule.key, occurrence.enqueued_by) == ("nightly", "rita")
    entry = AuditEntry.objects.get(event="schedule_run_now")
    assert entry.summary == "nightly run now by rita" and str(entry.job_id) == str(
        occurrence.result_id
    )


def test_a_run_now_confirmed_twice_runs_once(
    schedules: dict[str, Schedule], django_user_model: Any
) -> None:
    """Sending the confirmation again (a double click, the back button) ran the schedule
    a second time; every other action's second confirmation changes nothing."""
    runner = logged_in(operator(django_user_model, "rita", "view_schedule", "run_schedule"))
    selected = [schedules["nightly"].pk]
    page = confirm_page(runner, SCHEDULES, "run_schedules_now", selected).content.decode()
    first = act(runner, SCHEDULES, "run_schedules_now", selected, confirm=True, **seen_fields(page))
    again = act(runner, SCHEDULES, "run_schedules_now", selected, confirm=True, **seen_fields(page))

    assert "Enqueued a job of 1 schedule." in shown_messages(first)
    [skipped] = shown_messages(again)
    assert "Skipped 1 schedule: nightly (changed since the confirmation:" in skipped
    assert "last run now" in skipped
    assert ScheduleOccurrence.objects.filter(trigger="manual").count() == 1
    # A new confirmation names the run and runs again.
    page = confirm_page(runner, SCHEDULES, "run_schedules_now", selected).content.decode()
    assert "last run now" in page
    act(runner, SCHEDULES, "run_schedules_now", selected, confirm=True, **seen_fields(page))
    assert ScheduleOccurrence.objects.filter(trigger="manual").count() == 2


def test_pause_and_resume_need_their_permission_and_are_audited(
    schedules: dict[str, Schedule], django_user_model: Any
) -> None:
    runner = logged_in(operator(django_user_model, "rita", "view_schedule", "run_schedule"))
    refused = act(runner, SCHEDULES, "pause_schedules", [schedules["five"].pk], confirm=True)
    assert any("You may not run the action" in m for m in shown_messages(refused))
    assert not Schedule.objects.get(key="five").paused

    pauser = logged_in(operator(django_user_model, "paul", "view_schedule", "pause_schedule"))
    done = act(pauser, SCHEDULES, "pause_schedules", [schedules["five"].pk], confirm=True)
    assert "Paused 1 schedule." in shown_messages(done)
    paused = Schedule.objects.get(key="five")
    assert paused.paused and paused.paused_by == "paul"
    again = act(pauser, SCHEDULES, "pause_schedules", [schedules["five"].pk], confirm=True)
    assert any("five (paused)" in m for m in shown_messages(again))
    assert "paused" in pauser.get(SCHEDULES).content.decode()

    resumed = act(pauser, SCHEDULES, "resume_schedules", [schedules["five"].pk], confirm=True)
    assert "Resumed 1 schedule." in shown_messages(resumed)
    assert not Schedule.objects.get(key="five").paused
    assert list(AuditEntry.objects.order_by("id").values_list("event", "summary")) == [
        ("schedule_paused", "five paused by paul"),
        ("schedule_resumed", "five resumed by paul"),
    ]
