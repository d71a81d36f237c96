"""Every instant on every console page shows one way: with seconds, in a ``<time>``
element the console's script turns into the viewer's zone — never Django's default
"Dec. 2, 2026, 4:49 p.m." that a model field shown as it is would get."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client
from django.urls import reverse

from jobstate.models import BulkOperation, JobRun, JobRunStatus, Notification, RuntimeLock, Schedule
from jobstate.schedules.definitions import parse_declaration
from jobstate.stores.database import DatabaseStateStore

pytestmark = pytest.mark.django_db

#: Django's default rendering of a datetime in English: "Dec. 2, 2026, 4:49 p.m.".
DJANGO_DEFAULT = re.compile(r"\b\d{4}, \d{1,2}(:\d\d)? (a\.m\.|p\.m\.)|\b(midnight|noon)\b")
INSTANT = re.compile(
    r'<time class="jobstate-moment" datetime="[^"]+"[^>]*>\d{4}-\d\d-\d\d \d\d:\d\d:\d\d'
)


def _rows() -> dict[str, object]:
    now = datetime.now(UTC)
    store = DatabaseStateStore()
    job = store.create_job(request_id="instants", target="billing")
    definition = parse_declaration(
        "nightly", {"task": "tests.support.task_functions.add", "cron": "30 2 * * *"}
    )
    return {
        "jobrun": JobRun.objects.create(
            job_key="nightly",
            status=JobRunStatus.SUCCEEDED,
            trigger_source="CLI",
            started_at=now - timedelta(minutes=1),
            finished_at=now,
            duration_ms=60_000,
        ),
        "notification": Notification.objects.create(
            job=job,
            channel="webhook",
            destination="https://hooks.example.com/",
            idempotency_key="instants",
            delivered_at=now,
        ),
        "runtimelock": RuntimeLock.objects.create(
            lock_key="instants", owner="w-1", expires_at=now + timedelta(minutes=5)
        ),
        "schedule": Schedule.objects.create(
            key=definition.key,
            kind=definition.kind,
            target=definition.target,
            cron=definition.cron,
            timezone="UTC",
            catch_up=definition.catch_up,
            definition=definition.as_json(),
            effective_from=now - timedelta(days=1),
            last_slot=now - timedelta(hours=1),
            paused=True,
            paused_at=now,
        ),
        "bulkoperation": BulkOperation.objects.create(
            action="requeue", operator="ada", cutoff=now, finished_at=now, state="done"
        ),
        "job": job,
    }


def test_no_console_page_shows_an_instant_in_django_s_default_format(admin_client: Client) -> None:
    rows = _rows()
    for name, row in rows.items():
        for url in (
            reverse(f"admin:jobstate_{name}_changelist"),
            reverse(f"admin:jobstate_{name}_change", args=[row.pk]),  # type: ignore[attr-defined]
        ):
            page = admin_client.get(url)
            assert page.status_code == 200, url
            html = page.content.decode()
            assert not DJANGO_DEFAULT.search(html), (url, DJANGO_DEFAULT.search(html))
        # Each row's page shows its instants the console's way.
        assert INSTANT.search(html), url


def test_an_instant_shown_on_a_page_keeps_its_field_s_label_and_help_text(
    admin_client: Client,
) -> None:
    schedule = _rows()["schedule"]
    html = admin_client.get(
        reverse("admin:jobstate_schedule_change", args=[schedule.pk])  # type: ignore[attr-defined]
    ).content.decode()
    effective = html.split("Effective from", 1)[1].split('<div class="form-row', 1)[0]
    assert INSTANT.search(effective)
    assert "Slots at or before this instant are never enqueued" in effective
