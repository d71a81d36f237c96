"""The demo project's own templates (the top-level ``templates/``): the console says what
it is on every admin page, and the app's own admin templates still render beneath it."""

from __future__ import annotations

import re

from django.test import Client

from jobstate.testing.factories import JobFactory

BRAND = "jobstate console"


def branded(page: str) -> bool:
    """The header's site name and the window title both name the console."""
    header = re.search(r'<div id="site-name"><a href="/admin/">([^<]*)</a></div>', page)
    title = re.search(r"<title>([^<]*)</title>", page)
    return bool(header and title) and header[1] == BRAND and title[1].endswith(f"| {BRAND}")


def test_the_admin_index_and_login_page_name_the_console(admin_client: Client) -> None:
    page = admin_client.get("/admin/").content.decode()
    assert branded(page), page[:2000]
    assert "Django administration" not in page
    login = Client().get("/admin/login/").content.decode()
    assert branded(login), login[:2000]


def test_the_apps_own_templates_render_under_the_branding(admin_client: Client) -> None:
    JobFactory(request_id="order-7", target="mail", failed=True, error="HTTP 500")

    jobs = admin_client.get("/admin/jobstate/job/")
    page = jobs.content.decode()
    assert jobs.status_code == 200 and branded(page)
    assert "order-7" in page
    assert "admin/jobstate/job/change_list.html" in [t.name for t in jobs.templates]

    overview = admin_client.get("/admin/jobstate/job/overview/")
    page = overview.content.decode()
    assert overview.status_code == 200 and branded(page)
    assert 'id="jobstate-status-cards"' in page
    assert "admin/jobstate/overview.html" in [t.name for t in overview.templates]
