"""Links around schedules and bulk operations: a job and a run link the schedule that
started them, a schedule's page shows its next fire time, its runs and its run now /
pause / resume buttons (permissioned, confirmed, audited), and a bulk operation links
the jobs list with its filter and the audit entries it wrote."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlencode, urlsplit
from zoneinfo import ZoneInfo

import pytest
from django.test import Client

from jobstate.console.bulk import advance_bulk_operation, start_bulk_operation
from jobstate.models import AuditEntry, BulkAction, Job, JobRun, Schedule, ScheduleOccurrence
from jobstate.schedules import enqueue_due, sync_schedules
from jobstate.stores.base import Trigger
from jobstate.stores.database import DatabaseJobRunStore, DatabaseStateStore
from tests.support.admin_kit import (
    JOBS,
    failed_job,
    logged_in,
    operator,
    seen_fields,
    shown_messages,
)
from tests.support.schedule_kit import T0, declare

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

SCHEDULES = "/admin/jobstate/schedule/"
RUNS = "/admin/jobstate/jobrun/"
ADD = "tests.support.task_functions.add"
NIGHTLY = {"task": ADD, "cron": "30 2 * * *", "timezone": "Europe/Berlin", "args": [1, 1]}
FIVE = {"task": ADD, "cron": "*/5 * * * *", "args": [2, 2]}


def find_url(key: str) -> str:
    return f"{SCHEDULES}find/?{urlencode({'key': key})}"


@pytest.fixture
def schedules(settings: Any) -> dict[str, Schedule]:
    declare(settings, nightly=NIGHTLY, five=FIVE)
    sync_schedules(now=T0)
    enqueue_due(now=T0 + timedelta(minutes=5))
    return {row.key: row for row in Schedule.objects.all()}


def test_a_scheduled_job_links_its_schedule(
    schedules: dict[str, Schedule], admin_client: Client
) -> None:
    occurrence = ScheduleOccurrence.objects.get(schedule__key="five")
    page = admin_client.get(f"{JOBS}{occurrence.result_id}/change/").content.decode()
    assert f'href="{find_url("five")}"' in page
    followed = admin_client.get(find_url("five"))
    assert followed.status_code == 302
    assert followed["Location"] == f"{SCHEDULES}{schedules['five'].pk}/change/"
    assert "Started by:" in page
    # A job no schedule enqueued leaves the field out, as its page leaves out every
    # empty field (docs/console.md), rather than "Started by: —".
    other = DatabaseStateStore().create_job(request_id="by-hand", target="mail")
    plain = admin_client.get(f"{JOBS}{other.pk}/change/").content.decode()
    assert find_url("five") not in plain
    assert "Started by" not in plain and "started by" not in plain.lower(), plain


def test_an_unknown_schedule_key_leads_to_the_schedules_list(admin_client: Client) -> None:
    followed = admin_client.get(find_url("never"), follow=True)
    assert urlsplit(followed.redirect_chain[-1][0]).path == SCHEDULES
    assert "No schedule has the key never." in shown_messages(followed)


def test_a_run_links_its_schedule_and_the_schedule_lists_its_runs(
    admin_client: Client, runs: DatabaseJobRunStore
) -> None:
    close = Schedule.objects.create(
        key="close",
        kind="operations_job",
        target="billing.close-day",
        cron="0 1 * * *",
        timezone="UTC",
        catch_up="latest",
        definition={"operations_job": "billing.close-day", "cron": "0 1 * * *"},
        effective_from=T0,
    )
    scheduled = runs.claim(
        job_key="billing.close-day",
        overlap_key="a",
        trigger=Trigger("SCHEDULER", "close @ 2026-03-02T01:00:00+00:00"),
        input=None,
        started_at=datetime.now(UTC),
    )
    by_hand = runs.claim(
        job_key="billing.close-day",
        overlap_key="b",
        trigger=Trigger("CLI", "ops"),
        input=None,
        started_at=datetime.now(UTC),
    )
    assert scheduled is not None and by_hand is not None
    run_page = admin_client.get(f"{RUNS}{scheduled}/change/").content.decode()
    assert f'href="{find_url("close")}"' in run_page
    listed = admin_client.get(RUNS).content.decode()
    assert listed.count(f"{SCHEDULES}find/") == 1
    schedule_page = admin_client.get(f"{SCHEDULES}{close.pk}/change/").content.decode()
    assert f"{RUNS}{scheduled}/change/" in schedule_page
    assert f"{RUNS}{by_hand}/change/" not in schedule_page
    assert JobRun.objects.count() == 2


def test_a_schedule_not_evaluated_yet_shows_its_next_fire_time(
    schedules: dict[str, Schedule], admin_client: Client
) -> None:
    Schedule.objects.filter(key="nightly").update(next_slot=None)
    berlin = datetime.now(ZoneInfo("Europe/Berlin"))
    upcoming = berlin.replace(hour=2, minute=30, second=0, microsecond=0)
    if upcoming <= berlin:
        upcoming = (berlin + timedelta(days=1)).replace(hour=2, minute=30, second=0, microsecond=0)
    expected = upcoming.astimezone(UTC)
    for url in (SCHEDULES, f"{SCHEDULES}{schedules['nightly'].pk}/change/"):
        text = admin_client.get(url).content.decode()
        assert f'datetime="{expected.isoformat()}"' in text, url
    own = admin_client.get(f"{SCHEDULES}{schedules['nightly'].pk}/change/").content.decode()
    assert "at the next evaluation" not in own


def test_the_schedule_page_offers_the_buttons_the_operator_may_use(
    schedules: dict[str, Schedule], django_user_model: Any
) -> None:
    page = f"{SCHEDULES}{schedules['nightly'].pk}/change/"
    viewer = logged_in(operator(django_user_model, "viewer", "view_schedule"))
    assert 'name="jobstate_action"' not in viewer.get(page).content.decode()
    runner = logged_in(operator(django_user_model, "rita", "view_schedule", "run_schedule"))
    offered = runner.get(page).content.decode()
    assert 'value="run_schedules_now"' in offered and 'value="pause_schedules"' not in offered
    pauser = logged_in(
        operator(django_user_model, "paul", "view_schedule", "run_schedule", "pause_schedule")
    )
    both = pauser.get(page).content.decode()
    assert 'value="pause_schedules"' in both and 'value="resume_schedules"' not in both


def test_the_schedule_pages_pause_resume_and_run_now_are_confirmed_and_audited(
    schedules: dict[str, Schedule], django_user_model: Any
) -> None:
    nightly = schedules["nightly"]
    page = f"{SCHEDULES}{nightly.pk}/change/"
    client = logged_in(
        operator(django_user_model, "paul", "view_schedule", "run_schedule", "pause_schedule")
    )
    button = {"_selected_action": [str(nightly.pk)], "_return_to": page}

    asked = client.post(SCHEDULES, {"action": "pause_schedules", **button})
    assert asked.status_code == 200 and b"Yes, pause" in asked.content
    assert not Schedule.objects.get(pk=nightly.pk).paused
    done = client.post(SCHEDULES, {"action": "pause_schedules", "post": "yes", **button})
    assert done.status_code == 302 and done["Location"] == page
    assert Schedule.objects.get(pk=nightly.pk).paused
    paused_page = client.get(page).content.decode()
    assert (
        'value="resume_schedules"' in paused_page and 'value="pause_schedules"' not in paused_page
    )

    client.post(SCHEDULES, {"action": "resume_schedules", "post": "yes", **button})
    assert not Schedule.objects.get(pk=nightly.pk).paused
    asked = client.post(SCHEDULES, {"action": "run_schedules_now", **button})
    shown = seen_fields(asked.content.decode())
    client.post(SCHEDULES, {"action": "run_schedules_now", "post": "yes", **button, **shown})
    manual = ScheduleOccurrence.objects.get(schedule=nightly, trigger="manual")
    assert Job.objects.filter(id=manual.result_id).exists()
    events = list(
        AuditEntry.objects.filter(
            event__in=["schedule_paused", "schedule_resumed", "schedule_run_now"]
        )
        .order_by("ts", "id")
        .values_list("event", "detail__by")
    )
    assert events == [
        ("schedule_paused", "paul"),
        ("schedule_resumed", "paul"),
        ("schedule_run_now", "paul"),
    ]


def test_a_bulk_operation_links_its_jobs_and_its_audit_entries(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    for name in ("a", "b"):
        failed_job(store, f"bulk-{name}")
    untouched = failed_job(store, "other", target="sms")
    operation = start_bulk_operation(
        action=BulkAction.REQUEUE, filters={"target": "mail"}, search="", operator="admin"
    )
    advance_bulk_operation(operation.pk)
    page = admin_client.get(f"{JOBS}bulk-operation/{operation.pk}/").content.decode()
    assert f'href="{JOBS}?target=mail"' in page
    audit_url = f"/admin/jobstate/auditentry/?bulk={operation.pk}"
    assert f'href="{audit_url}"' in page
    entries = admin_client.get(audit_url)
    listed = {entry.request_id for entry in entries.context["cl"].result_list}
    assert listed == {"bulk-a", "bulk-b"}
    assert untouched.request_id not in listed


def test_a_schedules_operations_job_links_the_run_it_started(
    schedules: dict[str, Schedule], admin_client: Client, runs: DatabaseJobRunStore
) -> None:
    run_id = runs.claim(
        job_key="billing.close-day",
        overlap_key="c",
        trigger=Trigger("SCHEDULER", "five @ 2026-03-01T12:05:00+00:00"),
        input=None,
        started_at=datetime.now(UTC),
    )
    job = Job.objects.create(
        request_id="ops-run",
        status="done",
        task_path="jobstate.schedules.operations_task.run_scheduled_operations_job",
        result={"run_id": str(run_id), "job_key": "billing.close-day", "status": "SUCCEEDED"},
    )
    ScheduleOccurrence.objects.create(
        schedule=schedules["five"], slot=T0, trigger="manual", result_id=job.pk
    )
    page = admin_client.get(f"{JOBS}{job.pk}/change/").content.decode()
    assert f'href="{RUNS}{run_id}/change/"' in page
    assert f'href="{find_url("five")}"' in page
