"""The columns a list leaves out on a phone, in headless Chromium (as in
:mod:`tests.admin.test_admin_browser_layout`): an operator on a phone can ask for all
of them, the list then scrolls sideways inside its own box (the page never does), and
the choice stays until the operator asks for fewer. On a wide screen every column is
shown and there is no such button.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from jobstate.models import Job
from tests.admin.test_admin_browser_layout import DESKTOP, PHONE
from tests.support.browser import ARTIFACTS, chromium_page, log_in, make_operator

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

JOBS = "/admin/jobstate/job/"


@pytest.fixture
def jobs_list(live_server: Any) -> Iterator[tuple[Page, str]]:
    for n in range(5):
        Job.objects.create(
            request_id=f"order-{n}-" + "x" * 30,
            target="tasks:default",
            task_path="project.billing.tasks.reconcile_customer_invoices",
            queue_name="default",
            executor_id="worker-eu-west-1-production-batch:host-ip-10-24-187-203:31337",
        )
    make_operator("view_job")
    base = str(live_server).rstrip("/")
    with chromium_page() as page:
        log_in(page, base)
        yield page, base


def _attempts_header_shown(page: Page) -> bool:
    return bool(
        page.locator("#result_list thead th.column-attempts").evaluate(
            "e => e.getBoundingClientRect().width > 0"
        )
    )


def test_a_phone_shows_the_columns_it_leaves_out_when_asked(
    jobs_list: tuple[Page, str],
) -> None:
    """The Jobs list hid its attempts and worker columns on a phone, with no way to
    see them there."""
    page, base = jobs_list
    page.set_viewport_size(PHONE)
    page.goto(base + JOBS)
    button = page.locator("#jobstate-columns-toggle")
    assert button.is_visible() and button.inner_text() == "All columns"
    assert not _attempts_header_shown(page)
    button.click()
    assert _attempts_header_shown(page)
    assert page.locator("#result_list tbody td.field-executor_cell").first.is_visible()
    assert button.inner_text() == "Fewer columns"
    (ARTIFACTS / "screenshots").mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "screenshots" / "jobs-all-columns-phone.png"))
    # The list scrolls in its box; the page itself stays as wide as the screen.
    assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]
    # Another page of the console keeps the choice, until the operator changes it.
    page.goto(base + JOBS + "?o=2")
    assert _attempts_header_shown(page)
    page.locator("#jobstate-columns-toggle").click()
    assert not _attempts_header_shown(page)
    page.reload()
    assert not _attempts_header_shown(page)


def test_a_wide_screen_shows_every_column_and_no_button(jobs_list: tuple[Page, str]) -> None:
    page, base = jobs_list
    page.set_viewport_size(DESKTOP)
    page.goto(base + JOBS)
    assert _attempts_header_shown(page)
    assert not page.locator("#jobstate-columns-toggle").is_visible()
