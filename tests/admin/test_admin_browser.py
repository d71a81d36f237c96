"""The operators' console in a real browser: headless Chromium (Debian's package) driven
by Playwright against a live server.

An operator with the requeue permission logs in, filters the jobs by status, requeues
a failed job through the confirmation page, sees the success message and finds the
audit entry naming them on the job's page. A full-page screenshot of that page is kept
in ``artifacts/admin-e2e.png``.

The browser is required, never optional: when Chromium or Playwright is missing the
test fails and says how to install them (``scripts/ensure-chromium``).

Database work happens before the browser starts and after it stops: Playwright's sync
API runs an event loop in this thread, where Django refuses ORM calls.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from jobstate.models import AuditEntry, Job, JobStatus
from jobstate.stores.database import DatabaseStateStore
from tests.support.browser import (
    ARTIFACTS,
    PASSWORD,
    USERNAME,
    chromium_page,
    log_in,
    make_operator,
)

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.slow]

SCREENSHOT = ARTIFACTS / "admin-e2e.png"
FAILURE_SCREENSHOT = ARTIFACTS / "admin-e2e-failure.png"


def _operator_with_requeue_permission() -> None:
    operator = get_user_model().objects.create_user(
        USERNAME, "ada@example.com", PASSWORD, is_staff=True
    )
    operator.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="jobstate",
            codename__in=["view_job", "view_auditentry", "requeue_job"],
        )
    )


@pytest.mark.django_db(transaction=True)
def test_operator_requeues_a_failed_job_and_finds_the_audit_entry(live_server: object) -> None:
    store = DatabaseStateStore()
    failed = store.create_job(
        request_id="invoice-4711", target="billing", status=JobStatus.ERROR, error="HTTP 503"
    )
    store.create_job(request_id="invoice-4712", target="billing", status=JobStatus.DONE)
    store.create_job(request_id="report-0815", target="reports")
    _operator_with_requeue_permission()

    with chromium_page() as page:
        try:
            _drive_the_console(page, str(live_server).rstrip("/"))
        except Exception:
            # The page as the operator last saw it is the quickest way to read a failure.
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(FAILURE_SCREENSHOT), full_page=True)
            raise

    requeued = Job.objects.get(id=failed.id)
    assert requeued.status == JobStatus.QUEUED
    entry = AuditEntry.objects.filter(job_id=failed.id).order_by("-id").first()
    assert entry is not None
    assert entry.detail.get("by") == USERNAME


def _drive_the_console(page: Page, base: str) -> None:
    from playwright.sync_api import expect

    page.goto(f"{base}/admin/login/?next=/admin/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()

    page.get_by_role("link", name="Jobs", exact=True).first.click()
    expect(page.get_by_role("heading", name="Select job to view")).to_be_visible()
    # The filter sidebar is a <nav> on Django 5.2 and a <search> landmark on Django 6.
    filters = page.locator("#changelist-filter")
    filters.get_by_role("link", name="Error (FAILED)", exact=True).click()
    expect(page).to_have_url(re.compile(r"[?&]status__exact=error"))
    rows = page.locator("#result_list tbody tr")
    expect(rows).to_have_count(1)
    failed_row = rows.filter(has_text="invoice-4711")
    expect(failed_row).to_contain_text("Error")

    failed_row.locator("input[name=_selected_action]").check()
    page.locator("select[name=action]").select_option(label="Requeue selected jobs…")
    page.locator("button[name=index]").click()

    expect(page.get_by_role("heading", name="Requeue jobs")).to_be_visible()
    expect(page.get_by_text("1 job will change")).to_be_visible()
    confirm = page.locator("form").filter(has=page.locator("input[name=post]"))
    expect(confirm).to_have_count(1)
    expect(page.get_by_role("link", name="invoice-4711")).to_be_visible()
    confirm.get_by_role("button", name="Yes, requeue").click()

    expect(page.locator("ul.messagelist")).to_contain_text("Requeued 1 job.")
    # Back on the error list, which the requeued job has left.
    expect(page.get_by_role("link", name="invoice-4711")).to_have_count(0)

    filters.get_by_role("link", name="Queued (READY)", exact=True).click()
    queued_row = page.locator("#result_list tbody tr").filter(has_text="invoice-4711")
    expect(queued_row).to_contain_text("Queued")
    queued_row.get_by_role("link", name="invoice-4711").click()

    trail = page.get_by_role("row").filter(has_text="rerun").filter(has_text=USERNAME)
    expect(trail).to_have_count(1)
    expect(trail).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)


# --- the console's jobs pages: bulk actions, search, timeline, layout --------------------

BULK_SCREENSHOT = ARTIFACTS / "admin-bulk-requeue.png"
SEARCH_SCREENSHOT = ARTIFACTS / "admin-search-input.png"
TIMELINE_SCREENSHOT = ARTIFACTS / "admin-timeline.png"
LIST_LAYOUT_SCREENSHOT = ARTIFACTS / "admin-list-layout.png"
PAGE_LAYOUT_SCREENSHOT = ARTIFACTS / "admin-job-page-layout.png"

#: The request ids the demo's traffic and tasks make are this long (and longer).
LONG_REQUEST_ID = "demo-3f1c9a52-8d7e-4b0a-9c61-2e5f7a8b9c0d-retry-2026-12-01T21:05:38Z"


def _in_browser(live_server: object, drive: Callable[[Page, str], None], failure: Path) -> None:
    with chromium_page() as page:
        try:
            drive(page, str(live_server).rstrip("/"))
        except Exception:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(failure), full_page=True)
            raise


def _screenshot(page: Page, path: Path) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(path), full_page=True)


def _failed(store: DatabaseStateStore, request_id: str, target: str, **fields: object) -> Job:
    store.create_job(request_id=request_id, target=target, **fields)
    job = store.claim_next_inhub_job([target], "w-browser")
    assert job is not None and job.claim_token is not None
    result = store.complete_claimed_job(job.id, job.claim_token, "error", error="HTTP 503")
    assert result.job is not None
    return result.job


@pytest.mark.django_db(transaction=True)
def test_operator_requeues_every_failed_job_of_a_filter_in_bulk(live_server: object) -> None:
    store = DatabaseStateStore()
    billing = [_failed(store, f"invoice-{n}", "billing") for n in range(30)]
    other = _failed(store, "report-1", "reports")
    make_operator("view_job", "view_bulkoperation", "requeue_job")

    def drive(page: Page, base: str) -> None:
        from playwright.sync_api import expect

        log_in(page, base)
        page.goto(f"{base}/admin/jobstate/job/?status__exact=error&target=billing")
        page.locator("#jobstate-bulk-requeue").click()
        expect(page.locator("#jobstate-bulk-count")).to_have_text("30 matching jobs now")
        expect(page.locator("#jobstate-bulk-filter")).to_contain_text("target = billing")
        expect(page.locator("#jobstate-bulk-filter")).to_contain_text("status = error")
        page.get_by_role("button", name="Yes, start").click()
        # The progress page's script steps on by itself until the operation is done.
        expect(page.locator("#jobstate-bulk-state")).to_have_text("done", timeout=60_000)
        expect(page.locator("#jobstate-bulk-done")).to_have_text("30")
        expect(page.locator("#jobstate-bulk-skipped")).to_have_text("0")
        _screenshot(page, BULK_SCREENSHOT)

    _in_browser(live_server, drive, ARTIFACTS / "admin-bulk-failure.png")
    assert {job.status for job in Job.objects.filter(pk__in=[j.pk for j in billing])} == {
        JobStatus.QUEUED
    }
    assert Job.objects.get(pk=other.pk).status == JobStatus.ERROR
    reruns = AuditEntry.objects.filter(event="rerun", detail__by=USERNAME)
    assert reruns.count() == 30


@pytest.mark.django_db(transaction=True)
def test_operator_finds_jobs_by_a_key_of_their_input(live_server: object) -> None:
    store = DatabaseStateStore()
    store.create_job(request_id="order-1", target="shop", input={"customer": 42, "sku": "A"})
    store.create_job(request_id="order-2", target="shop", input={"customer": 7})
    store.create_job(request_id="order-3", target="shop", input={"customer": "42"})
    make_operator("view_job")

    def drive(page: Page, base: str) -> None:
        from playwright.sync_api import expect

        log_in(page, base)
        page.goto(f"{base}/admin/jobstate/job/")
        expect(page.locator("#searchbar_helptext, .help")).to_contain_text(["input:customer=42"])
        page.locator("#searchbar").fill("input:customer=42")
        page.locator("#searchbar").press("Enter")
        rows = page.locator("#result_list tbody tr")
        expect(rows).to_have_count(1)
        expect(rows).to_contain_text("order-1")
        _screenshot(page, SEARCH_SCREENSHOT)
        page.locator("#searchbar").fill("input:customer")
        page.locator("#searchbar").press("Enter")
        expect(page.locator("ul.messagelist")).to_contain_text("input: takes key=value")

    _in_browser(live_server, drive, ARTIFACTS / "admin-search-failure.png")


@pytest.mark.django_db(transaction=True)
def test_operator_reads_a_retried_tasks_timeline(live_server: object, settings: object) -> None:
    from tests.support.admin_kit import failed_task
    from tests.support.tasks_kit import use_options

    use_options(settings, MAX_ATTEMPTS=3)
    task = failed_task("hunter2-browser-secret")
    make_operator("view_job")

    def drive(page: Page, base: str) -> None:
        from playwright.sync_api import expect

        log_in(page, base)
        page.goto(f"{base}/admin/jobstate/job/{task.id}/change/")
        timeline = page.locator("#jobstate-timeline li")
        expect(timeline.first).to_contain_text("Enqueued")
        first = timeline.filter(has_text="Attempt 1 on w-0")
        expect(first).to_have_count(1)
        expect(first).to_contain_text("worker lost")
        second = timeline.filter(has_text="Attempt 2 on w-1")
        expect(second).to_contain_text("failed")
        expect(second).to_contain_text("builtins.ValueError")
        expect(second).to_contain_text("Traceback")
        expect(page.locator("#jobstate-timeline")).not_to_contain_text("hunter2-browser-secret")
        texts = timeline.all_inner_texts()
        order = [
            next(i for i, text in enumerate(texts) if needle in text)
            for needle in ("Enqueued", "Attempt 1 on", "Attempt 2 on", "Finished: FAILED")
        ]
        assert order == sorted(order), texts
        _screenshot(page, TIMELINE_SCREENSHOT)

    _in_browser(live_server, drive, ARTIFACTS / "admin-timeline-failure.png")


@pytest.mark.django_db(transaction=True)
def test_long_request_ids_stay_on_one_line_and_buttons_clear_the_title(
    live_server: object,
) -> None:
    store = DatabaseStateStore()
    store.create_job(request_id="short", target="mail", executor_id=None)
    long_job = store.create_job(request_id=LONG_REQUEST_ID, target="mail")
    make_operator("view_job", "requeue_job", "reject_job", "approve_job", "delete_finished_job")

    def drive(page: Page, base: str) -> None:
        from playwright.sync_api import expect

        log_in(page, base)
        # A laptop's width, where the demo's ids used to wrap into five lines.
        page.set_viewport_size({"width": 1024, "height": 800})
        page.goto(f"{base}/admin/jobstate/job/")
        # The long id is cut in its middle, whole in the tooltip.
        long_cell = page.locator(
            f'#result_list tbody .field-request_id_cell:has(span[title="{LONG_REQUEST_ID}"])'
        )
        short_cell = page.locator("#result_list tbody tr", has_text="short").locator(
            ".field-request_id_cell"
        )
        expect(long_cell).to_be_visible()
        long_box, short_box = long_cell.bounding_box(), short_cell.bounding_box()
        assert long_box is not None and short_box is not None
        # One line: the long id's cell is no taller than the one-word id's.
        assert long_box["height"] <= short_box["height"] + 1, (long_box, short_box)
        assert long_cell.locator("span").get_attribute("title") == LONG_REQUEST_ID
        _screenshot(page, LIST_LAYOUT_SCREENSHOT)

        page.goto(f"{base}/admin/jobstate/job/{long_job.pk}/change/")
        # Django 5.2 puts the tools in #content-main, Django 6.1 beside the titles.
        tools = page.locator("#content .object-tools").first
        expect(tools.get_by_role("button", name="Reject…")).to_be_visible()
        tools_box = tools.bounding_box()
        assert tools_box is not None
        # The title is the request id; the subtitle the status and the short id.
        title = page.locator("#content h1", has_text="demo-3f1c9a52").first
        subtitle = page.locator("#content h2.jobstate-subtitle").first
        for heading in (title, subtitle):
            box = heading.bounding_box()
            assert box is not None
            overlap = not (
                tools_box["x"] + tools_box["width"] <= box["x"]
                or box["x"] + box["width"] <= tools_box["x"]
                or tools_box["y"] + tools_box["height"] <= box["y"]
                or box["y"] + box["height"] <= tools_box["y"]
            )
            assert not overlap, (heading, box, tools_box)
        _screenshot(page, PAGE_LAYOUT_SCREENSHOT)

    _in_browser(live_server, drive, ARTIFACTS / "admin-layout-failure.png")
