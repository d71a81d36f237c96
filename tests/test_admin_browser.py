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
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

from jobstate.models import AuditEntry, Job, JobStatus
from jobstate.stores.database import DatabaseStateStore

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.postgres]

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
SCREENSHOT = ARTIFACTS / "admin-e2e.png"
FAILURE_SCREENSHOT = ARTIFACTS / "admin-e2e-failure.png"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Playwright waits this long for a page or an element before failing the test.
TIMEOUT_MS = 15_000

USERNAME = "operator-ada"
PASSWORD = "correct horse battery staple"


@contextmanager
def chromium_page() -> Iterator[Page]:
    """A page in a fresh headless Chromium profile; fails (never skips) without one."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the admin's browser test needs Debian's Chromium. "
            "Install it with scripts/ensure-chromium (apt-get install -y chromium).",
            pytrace=False,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        pytest.fail(
            f"Playwright for Python is missing ({exc}); install the dev dependency group "
            "(pip install --group dev -e .).",
            pytrace=False,
        )
    with (
        tempfile.TemporaryDirectory(prefix="jobstate-chromium-") as profile,
        sync_playwright() as playwright,
    ):
        context = playwright.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 900},
        )
        context.set_default_timeout(TIMEOUT_MS)
        try:
            yield context.new_page()
        finally:
            context.close()


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
    filters.get_by_role("link", name="Error", exact=True).click()
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

    filters.get_by_role("link", name="Queued", exact=True).click()
    queued_row = page.locator("#result_list tbody tr").filter(has_text="invoice-4711")
    expect(queued_row).to_contain_text("Queued")
    queued_row.get_by_role("link", name="invoice-4711").click()

    trail = page.get_by_role("row").filter(has_text="rerun").filter(has_text=USERNAME)
    expect(trail).to_have_count(1)
    expect(trail).to_be_visible()
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
