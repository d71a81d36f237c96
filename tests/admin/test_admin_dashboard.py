"""The Overview page: metric cards, the finished-per-minute and queue-depth charts
drawn server-side, who may see it, what it costs, and where it is linked from."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from jobstate.admin.dashboard import DEPTH_TARGETS, finished_per_minute, queue_depth_by_target
from jobstate.models import Job
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import failed_job, logged_in, operator, running_job

PAGE = "/admin/jobstate/job/overview/"


def finished_at(store: DatabaseStateStore, request_id: str, status: str, when: datetime) -> None:
    job = store.create_job(request_id=request_id, target="mail", status=status)
    # Back-date the last transition: the chart buckets jobs by it.
    Job.objects.filter(id=job.id).update(updated_at=when)


def card(page: str, label: str) -> str:
    match = re.search(
        rf'jobstate-card-label">{re.escape(label)}</div><div class="jobstate-card-value">([^<]*)<',
        page,
    )
    assert match, f"no card {label!r}"
    return match.group(1)


def test_the_page_has_a_stable_url_name(db: None) -> None:
    assert reverse("admin:jobstate_dashboard") == PAGE


def test_cards_show_the_metrics_snapshot(admin_client: Client, store: DatabaseStateStore) -> None:
    for n in range(3):
        store.create_job(request_id=f"waiting-{n}", target="mail")
    store.create_job(
        request_id="later", target="sms", run_after=datetime.now(UTC) + timedelta(hours=1)
    )
    running_job(store, "lost", expired=True)
    failed_job(store, "broken", target="reports")
    response = admin_client.get(PAGE)
    assert response.status_code == 200
    page = response.content.decode()
    assert card(page, "Queued (READY)") == "4"
    assert card(page, "Running") == "1"
    assert card(page, "Error (FAILED)") == "1"
    assert card(page, "Done (SUCCESSFUL)") == "0"
    assert card(page, "Delayed queued jobs") == "1"
    assert card(page, "Expired leases") == "1"
    assert "Error (FAILED) 1" in card(page, "Finished in the last 15 min")
    # Cards lead to the jobs they count, and a problem is highlighted.
    assert 'href="/admin/jobstate/job/?lease=expired"' in page
    assert 'href="/admin/jobstate/job/?status__exact=queued"' in page
    assert 'jobstate-card jobstate-alert" href="/admin/jobstate/job/?lease=expired"' in page


def test_finished_chart_counts_each_minute_by_status(store: DatabaseStateStore) -> None:
    now = datetime(2031, 5, 1, 12, 30, 20, tzinfo=UTC)
    finished_at(store, "a", "done", now - timedelta(minutes=5, seconds=5))
    finished_at(store, "b", "done", now - timedelta(minutes=5, seconds=15))
    finished_at(store, "c", "error", now - timedelta(minutes=5, seconds=20))
    finished_at(store, "d", "rejected", now - timedelta(minutes=59))
    finished_at(store, "old", "done", now - timedelta(minutes=61))
    finished_at(store, "live", "running", now - timedelta(minutes=1))
    chart = finished_per_minute(now)
    rows = dict(chart.rows)
    assert rows["12:25"] == {"done": 2, "error": 1, "rejected": 0}
    assert rows["11:31"] == {"done": 0, "error": 0, "rejected": 1}
    assert len(rows) == 2  # the older job and the running one are not counted
    assert (chart.total, chart.peak) == (4, 3)
    # The busiest minute's stack fills the plot's height; the others scale down.
    tallest = [bar for bar in chart.bars if bar.title.startswith("12:25")]
    assert sum(bar.height for bar in tallest) == pytest.approx(chart.height)
    assert len(chart.bars) == 3
    assert [label for _x, label in chart.ticks][:2] == ["11:31", "11:41"]
    # Jobs are counted whole: the guides are whole numbers (not 1.5), each at its height.
    assert chart.gridlines == [
        (0.0, "3"),
        (pytest.approx(chart.height * 2 / 3, abs=0.01), "1"),
        (float(chart.height), "0"),
    ]


def test_finished_chart_is_drawn_as_inline_svg_with_a_data_table(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    finished_at(store, "a", "done", datetime.now(UTC) - timedelta(minutes=2))
    finished_at(store, "b", "error", datetime.now(UTC) - timedelta(minutes=2))
    page = admin_client.get(PAGE).content.decode()
    svg = page[page.index('<svg class="jobstate-chart" id="jobstate-finished-chart"') :]
    svg = svg[: svg.index("</svg>")]
    assert svg.count("<rect") == 2 and "#1a7f37" in svg and "#cf222e" in svg
    assert "Done: 1</title>" in svg and "Error: 1</title>" in svg
    assert 'id="jobstate-finished-data"' in page
    # Drawn on the server: nothing is fetched from elsewhere.
    assert not re.search(r'(src|href)="(https?:)?//', page)


def test_queue_depth_by_target_splits_ready_and_delayed(
    admin_client: Client, store: DatabaseStateStore
) -> None:
    failed_job(store, "broken", target="mail")
    for n in range(3):
        store.create_job(request_id=f"mail-{n}", target="mail")
    store.create_job(
        request_id="sms-later", target="sms", run_after=datetime.now(UTC) + timedelta(hours=1)
    )
    chart = queue_depth_by_target()
    assert [(row.target, row.ready, row.delayed) for row in chart.rows] == [
        ("mail", 3, 0),
        ("sms", 0, 1),
    ]
    assert chart.total == 4
    assert chart.rows[0].ready_width == chart.width  # the deepest target fills the bar
    page = admin_client.get(PAGE).content.decode()
    table = page[page.index('id="jobstate-depth"') :]
    assert "?status__exact=queued&amp;target=mail" in table
    assert 'aria-label="sms: 1"' in table


def test_queue_depth_sums_the_shallow_targets(store: DatabaseStateStore) -> None:
    for n in range(DEPTH_TARGETS + 3):
        for m in range(DEPTH_TARGETS + 3 - n):
            store.create_job(request_id=f"t{n}-{m}", target=f"t{n:02d}")
    chart = queue_depth_by_target()
    assert len(chart.rows) == DEPTH_TARGETS + 1
    assert chart.rows[0].target == "t00"
    others = chart.rows[-1]
    assert others.target == "3 other targets" and others.ready == 3 + 2 + 1
    assert others.link == ""


def test_an_empty_queue_says_so(admin_client: Client, db: None) -> None:
    page = admin_client.get(PAGE).content.decode()
    assert "The queue is empty." in page and "No job finished in the last hour." in page


def test_the_page_needs_the_view_permission_on_jobs(
    client: Client, django_user_model: Any, db: None
) -> None:
    response = client.get(PAGE)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert logged_in(operator(django_user_model, "vera", "view_job")).get(PAGE).status_code == 200
    stranger = logged_in(operator(django_user_model, "sam", "view_jobrun"))
    assert stranger.get(PAGE).status_code == 403


def test_the_page_costs_a_fixed_number_of_queries(
    admin_client: Client, store: DatabaseStateStore, django_assert_max_num_queries: Any
) -> None:
    for n in range(40):
        store.create_job(request_id=f"w{n}", target=f"t{n % 5}")
        finished_at(store, f"f{n}", "done", datetime.now(UTC) - timedelta(minutes=n))
    # Session, user, the snapshot's (at most) eight small statements, the three charts
    # (finished per minute, per hour over a day, queue depth).
    with django_assert_max_num_queries(13):
        assert admin_client.get(PAGE).status_code == 200


def test_linked_from_the_app_index_and_the_jobs_list(
    admin_client: Client, django_user_model: Any, db: None
) -> None:
    app_index = admin_client.get("/admin/jobstate/").content.decode()
    assert f'<a href="{PAGE}" id="jobstate-dashboard-link">Overview page</a>' in app_index
    # The site's index lists it with the app's models (its entry leads to the page).
    site_index = admin_client.get("/admin/").content.decode()
    assert ">Overview</a>" in site_index
    entry = admin_client.get("/admin/jobstate/overview/")
    assert entry.status_code == 302 and entry["Location"] == PAGE
    jobs = admin_client.get("/admin/jobstate/job/").content.decode()
    assert f'href="{PAGE}" id="jobstate-overview-tool"' in jobs
    runs_only = logged_in(operator(django_user_model, "sam", "view_jobrun"))
    assert "Overview" not in runs_only.get("/admin/jobstate/").content.decode()
