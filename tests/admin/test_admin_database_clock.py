"""The jobs and locks admins judge leases and lock expiries on the database's clock, the
clock that wrote them, however far the application server's clock is off."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db.models import F
from django.test import Client

from jobstate.models import Job
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import JOBS, SKEW, act, logged_in, operator, running_job

LOCKS = "/admin/jobstate/runtimelock/"


def row_of(page: str, label: str) -> str:
    """The changelist row that shows ``label`` (a request id or lock key)."""
    row = page[page.index(f">{label}<") :]
    return row[: row.index("</tr>")]


def test_a_live_lease_is_not_shown_expired_when_the_app_clock_runs_ahead(
    admin_client: Client, store: DatabaseStateStore, skew_app_clock: Any
) -> None:
    running_job(store, "live", expired=False)
    skew_app_clock(SKEW)
    cell = row_of(admin_client.get(JOBS).content.decode(), "live")
    assert "expired" not in cell
    assert "ends in" in cell


def test_a_lost_lease_is_shown_expired_when_the_app_clock_runs_behind(
    admin_client: Client, store: DatabaseStateStore, skew_app_clock: Any
) -> None:
    lost = running_job(store, "lost", expired=False)
    # The lease ran out an hour ago on the database's clock.
    Job.objects.filter(id=lost.id).update(lease_until=F("claimed_at") - timedelta(hours=1))
    skew_app_clock(-SKEW)
    assert "expired 1.0 h ago" in row_of(admin_client.get(JOBS).content.decode(), "lost")


def test_requeue_skips_a_live_lease_whatever_the_app_clock_says(
    django_user_model: Any, store: DatabaseStateStore, skew_app_clock: Any
) -> None:
    live = running_job(store, "live", expired=False)
    skew_app_clock(SKEW)
    client = logged_in(operator(django_user_model, "rita", "view_job", "requeue_job"))
    page = act(client, JOBS, "requeue_jobs", [live.id]).content.decode()
    skipped = page[page.index('id="jobstate-skipped"') :]
    assert "lease has not expired" in skipped


def test_a_held_lock_is_not_shown_expired_when_the_app_clock_runs_ahead(
    admin_client: Client, store: DatabaseStateStore, skew_app_clock: Any
) -> None:
    store.acquire_runtime_lock("serial:1", "worker-1", timedelta(minutes=5))
    skew_app_clock(SKEW)
    cell = row_of(admin_client.get(LOCKS).content.decode(), "serial:1")
    assert "expired" not in cell
    assert "held, ends in" in cell
