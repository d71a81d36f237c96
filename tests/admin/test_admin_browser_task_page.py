"""A failed task's page in a real browser (headless Chromium driven by Playwright) on a
laptop screen (1440x900) and a phone's (390x844): the attempts open on the first screen,
under the summary, and each attempt's traceback is on the page once, folded until it is
opened. Screenshots of both are kept in ``artifacts/screenshots/``.

Database work happens before the browser starts: Playwright's sync API runs an event
loop in this thread, where Django refuses ORM calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.support.admin_kit import JOBS, thrice_failed_task
from tests.support.browser import ARTIFACTS, chromium_page, log_in, make_operator

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [pytest.mark.browser, pytest.mark.postgres, pytest.mark.slow]

SCREENSHOTS = ARTIFACTS / "screenshots"

SCREENS = {"desktop": (1440, 900), "phone": (390, 844)}


@pytest.mark.django_db(transaction=True)
def test_a_failed_tasks_attempts_open_on_the_first_screen_each_traceback_once(
    live_server: object,
) -> None:
    task = thrice_failed_task()
    make_operator("view_job", "view_auditentry", "view_worker")
    base = str(live_server).rstrip("/")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with chromium_page() as page:
        log_in(page, base)
        for name, (width, height) in SCREENS.items():
            page.set_viewport_size({"width": width, "height": height})
            page.goto(f"{base}{JOBS}{task.id}/change/")
            try:
                _check_the_task_page(page, height)
            finally:
                page.screenshot(path=str(SCREENSHOTS / f"task-page-{name}.png"), full_page=True)


def _check_the_task_page(page: Page, height: int) -> None:
    from playwright.sync_api import expect

    expect(page.get_by_role("heading", name="tests.support.task_functions.echo")).to_be_visible()
    timeline = page.locator("#jobstate-timeline")
    box = timeline.bounding_box()
    assert box is not None and box["y"] < height, box
    assert page.locator("details.jobstate-traceback").count() == 3
    for attempt in (1, 2, 3):
        line = f"line {100 + attempt}, in send_invoice"
        assert page.get_by_text(line).count() == 1, attempt
        item = timeline.locator("li", has_text=f"Attempt {attempt} on")
        expect(item).to_have_count(1)
        expect(item.get_by_role("link", name=f"w-{attempt}")).to_be_visible()
        # Folded: the traceback shows once its summary is clicked.
        expect(item.get_by_text(line)).to_be_hidden()
        item.locator("details summary").click()
        expect(item.get_by_text(line)).to_be_visible()
    expect(
        page.get_by_text("builtins.ConnectionRefusedError: SMTP refused attempt 3")
    ).to_be_visible()
