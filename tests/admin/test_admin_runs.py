"""The runs admin judges a heartbeat's age on the database's clock, the clock that wrote
it, however far the application server's clock is off."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import connection
from django.db.models import F
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobstate.models import AuditEntry, JobRun
from jobstate.stores.base import JobRunStatus, Trigger
from jobstate.stores.database import DatabaseJobRunStore
from tests.support.admin_kit import SKEW, act, logged_in, operator, shown_messages

RUNS = "/admin/jobstate/jobrun/"
STALE_CELL = ", stale</strong>"


def claimed(runs: DatabaseJobRunStore, key: str, *, heartbeat_age: timedelta | None) -> str:
    """A RUNNING run; with ``heartbeat_age`` its last beat is that long ago on the
    database's clock (a dead runner), otherwise it has just beaten."""
    run_id = runs.claim(
        job_key="billing.close-day",
        overlap_key=key,
        trigger=Trigger("CLI", "ops"),
        input=None,
        started_at=timezone.now(),
    )
    assert run_id is not None
    if heartbeat_age is not None:
        JobRun.objects.filter(id=run_id).update(heartbeat_at=F("heartbeat_at") - heartbeat_age)
    return run_id


def heartbeat_cell(page: str, key: str) -> str:
    """The heartbeat column of the changelist row showing overlap key ``key``."""
    row = page[page.index(f">{key}<") :]
    return row[: row.index("</tr>")]


def test_a_fresh_run_is_not_flagged_stale_when_the_app_clock_runs_ahead(
    admin_client: Client, runs: DatabaseJobRunStore, skew_app_clock: Any
) -> None:
    claimed(runs, "fresh-key", heartbeat_age=None)
    skew_app_clock(SKEW)
    cell = heartbeat_cell(admin_client.get(RUNS).content.decode(), "fresh-key")
    assert STALE_CELL not in cell
    assert " s ago" in cell  # seconds old, not hours


def test_a_dead_run_is_flagged_stale_when_the_app_clock_runs_behind(
    admin_client: Client, runs: DatabaseJobRunStore, skew_app_clock: Any
) -> None:
    claimed(runs, "dead-key", heartbeat_age=timedelta(hours=1))
    skew_app_clock(-SKEW)
    cell = heartbeat_cell(admin_client.get(RUNS).content.decode(), "dead-key")
    assert STALE_CELL in cell
    assert "1.0 h ago" in cell


def test_the_list_reads_the_database_clock_without_a_query_per_row(
    admin_client: Client, runs: DatabaseJobRunStore
) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            admin_client.get(RUNS)
        return len(captured)

    claimed(runs, "key-0", heartbeat_age=timedelta(hours=1))
    one = queries()
    for n in range(1, 10):
        claimed(runs, f"key-{n}", heartbeat_age=None if n % 2 else timedelta(hours=1))
    assert queries() == one


def test_the_reap_action_reaps_a_dead_run_when_the_app_clock_runs_behind(
    django_user_model: Any, runs: DatabaseJobRunStore, skew_app_clock: Any
) -> None:
    dead = claimed(runs, "dead-key", heartbeat_age=timedelta(hours=1))
    skew_app_clock(-SKEW)
    client = logged_in(operator(django_user_model, "rhea", "view_jobrun", "reap_runs"))
    confirmation = act(client, RUNS, "reap_stale_runs", [dead]).content.decode()
    assert "1 job run will change" in confirmation
    assert "heartbeat is fresh" not in confirmation

    response = act(client, RUNS, "reap_stale_runs", [dead], confirm=True)
    assert "Reaped 1 run." in shown_messages(response)
    assert JobRun.objects.get(id=dead).status == JobRunStatus.TIMED_OUT
    assert AuditEntry.objects.get(event="run_reaped").detail["run_id"] == dead


def test_the_reap_action_skips_a_fresh_run_when_the_app_clock_runs_ahead(
    django_user_model: Any, runs: DatabaseJobRunStore, skew_app_clock: Any
) -> None:
    fresh = claimed(runs, "fresh-key", heartbeat_age=None)
    skew_app_clock(SKEW)
    client = logged_in(operator(django_user_model, "rhea", "view_jobrun", "reap_runs"))
    confirmation = act(client, RUNS, "reap_stale_runs", [fresh]).content.decode()
    assert "1 job run will be skipped" in confirmation
    assert "heartbeat is fresh" in confirmation

    act(client, RUNS, "reap_stale_runs", [fresh], confirm=True)
    assert JobRun.objects.get(id=fresh).status == JobRunStatus.RUNNING
    assert not AuditEntry.objects.filter(event="run_reaped").exists()
