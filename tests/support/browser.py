"""Headless Chromium (Debian's package) driven by Playwright, and the staff user the
browser tests log in as."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Playwright

CHROMIUM = Path("/usr/bin/chromium")

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"

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


class _SharedChromium:
    """One Playwright driver and one headless Chromium per test process, started by the
    first browser test: starting them costs about two seconds of CPU, which every
    browser test paid before. Each test still gets a browser context of its own (its
    own cookies, storage and permissions)."""

    def __init__(self) -> None:
        self._playwright: Playwright | None = None
        self._browser: Browser | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def browser(self) -> Browser:
        self.resume()
        if self._browser is not None and self._browser.is_connected():
            return self._browser
        self.close()
        try:
            from playwright.sync_api import sync_playwright
        except ImportError as exc:
            pytest.fail(
                f"Playwright for Python is missing ({exc}); install the dev dependency group "
                "(pip install --group dev -e .).",
                pytrace=False,
            )
        self._playwright = sync_playwright().start()
        self._browser = self._playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        return self._browser

    def set_aside(self) -> None:
        """Let Django use the database in this thread until Playwright's next call.

        Playwright's synchronous API marks its event loop as running in this thread
        between its calls, for as long as its driver lives, and Django refuses database
        work while a loop runs here (it takes it for an async context): a test's
        teardown, which flushes the database, would fail. The mark is taken off here
        and put back before the next call, which expects it."""
        running = asyncio._get_running_loop()
        if running is not None:
            self._loop = running
            asyncio._set_running_loop(None)

    def resume(self) -> None:
        if self._loop is not None:
            asyncio._set_running_loop(self._loop)
            self._loop = None

    def close(self) -> None:
        self.resume()
        playwright, browser = self._playwright, self._browser
        self._playwright = self._browser = None
        try:
            if browser is not None and browser.is_connected():
                browser.close()
        finally:
            if playwright is not None:
                playwright.stop()


_SHARED = _SharedChromium()


def close_chromium() -> None:
    """Stop the test process's Chromium and Playwright driver, if a test started them."""
    _SHARED.close()


@contextmanager
def chromium_page() -> Iterator[Page]:
    """A page in a fresh context of the shared headless Chromium; fails (never skips)
    without one."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the admin's browser test needs Debian's Chromium. "
            "Install it with scripts/ensure-chromium (apt-get install -y chromium).",
            pytrace=False,
        )
    context = _SHARED.browser().new_context(viewport={"width": 1400, "height": 900})
    context.set_default_timeout(TIMEOUT_MS)
    try:
        yield context.new_page()
    finally:
        try:
            context.close()
        finally:
            _SHARED.set_aside()


def make_operator(*codenames: str) -> None:
    """The staff user the browser tests log in as, with these jobstate permissions."""
    operator = get_user_model().objects.create_user(
        USERNAME, "ada@example.com", PASSWORD, is_staff=True
    )
    operator.user_permissions.add(
        *Permission.objects.filter(content_type__app_label="jobstate", codename__in=codenames)
    )


def log_in(page: Page, base: str) -> None:
    """Log in on the admin's login page as :func:`make_operator`'s user."""
    from playwright.sync_api import expect

    page.goto(f"{base}/admin/login/?next=/admin/")
    page.get_by_label("Username").fill(USERNAME)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("button", name="Log out")).to_be_visible()
