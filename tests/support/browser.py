"""Headless Chromium (Debian's package) driven by Playwright, and the staff user the
browser tests log in as."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission

if TYPE_CHECKING:
    from playwright.sync_api import Page

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
