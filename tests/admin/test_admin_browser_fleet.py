"""The Workers and Queues pages and the live refresh in a real browser (headless
Chromium, as in :mod:`tests.admin.test_admin_browser`), against a live server and real
``jobstate_worker`` processes:

- an operator pauses a queue on the Queues page, a running worker stops claiming it
  while it goes on with its other queue, and after the resume it claims it again;
- the Workers page shows a live worker and a SIGKILLed one as lost;
- the live refresh updates a count without reloading the page, and stops when the
  operator switches it off.

Screenshots of the pages are kept in ``artifacts/`` (CI keeps them). Playwright's sync
API runs an event loop in the test's thread, where Django refuses ORM calls, so the
database work while the browser is open runs in a thread of its own (:func:`off_loop`).
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from django.db import connections

from jobstate.admin.workers import worker_state
from jobstate.core.states import JobStatus
from jobstate.models import AuditEntry, Job, Worker
from jobstate.stores import get_state_store
from tests.support.browser import ARTIFACTS, USERNAME, chromium_page, log_in, make_operator
from tests.support.task_functions import add
from tests.support.tasks_kit import start_worker, stop, use_options, wait_for

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

T = TypeVar("T")


def off_loop(work: Callable[[], T]) -> T:
    """Run ``work`` (ORM calls) in a thread of its own and return what it returned."""
    result: list[Any] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            result.append(work())
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the database work hung"
    if errors:
        raise errors[0]
    return result[0]  # type: ignore[no-any-return]


def drive(page: Page, name: str, steps: Callable[[], None]) -> None:
    try:
        steps()
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{name}-failure.png"), full_page=True)
        raise
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def status_of(job_id: Any) -> str:
    return str(Job.objects.get(id=job_id).status)


def test_pausing_a_queue_stops_a_worker_claiming_it_and_resuming_starts_it_again(
    live_server: Any, settings: Any
) -> None:
    options = use_options(settings, LEASE=5.0)
    make_operator("view_queuepause", "pause_queue", "view_job", "view_worker")
    first = add.using(queue_name="emails").enqueue(1, 1)
    worker = start_worker(
        "--worker-id",
        "browser-w",
        "--queue-name",
        "default,emails",
        "--interval",
        "0.2",
        options=options,
    )
    base = str(live_server).rstrip("/")
    try:
        wait_for(lambda: status_of(first.id) == JobStatus.DONE, what="the first task")
        with chromium_page() as page:

            def steps() -> None:
                from playwright.sync_api import expect

                log_in(page, base)
                page.goto(f"{base}/admin/jobstate/queuepause/")
                expect(page.get_by_role("heading", name="Queues")).to_be_visible()
                emails = page.locator('#jobstate-queues tr[data-queue="emails"]')
                expect(emails).to_contain_text("active")
                emails.get_by_role("button", name="Pause tasks:default / emails").click()
                expect(page.get_by_role("heading", name="Pause a queue")).to_be_visible()
                page.get_by_role("button", name="Yes, pause").click()
                expect(page.locator("ul.messagelist")).to_contain_text(
                    "Paused tasks:default / emails."
                )
                expect(emails).to_contain_text("paused")

                held, free = off_loop(
                    lambda: (
                        add.using(queue_name="emails").enqueue(2, 2),
                        add.using(queue_name="default").enqueue(3, 3),
                    )
                )
                off_loop(
                    lambda: wait_for(
                        lambda: status_of(free.id) == JobStatus.DONE, what="the default task"
                    )
                )
                time.sleep(1.0)  # five polls of the worker
                assert off_loop(lambda: status_of(held.id)) == JobStatus.QUEUED
                page.reload()
                expect(emails.locator(".jobstate-ready")).to_have_text("1")

                emails.get_by_role("button", name="Resume tasks:default / emails").click()
                page.get_by_role("button", name="Yes, resume").click()
                expect(page.locator("ul.messagelist")).to_contain_text(
                    "Resumed tasks:default / emails."
                )
                off_loop(
                    lambda: wait_for(
                        lambda: status_of(held.id) == JobStatus.DONE, what="the resumed task"
                    )
                )
                page.reload()
                expect(emails).to_contain_text("active")
                expect(emails.locator(".jobstate-ready")).to_have_text("0")

            drive(page, "admin-queues-pause", steps)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)
        stop(worker)
    entries = AuditEntry.objects.filter(event__in=["queue_paused", "queue_resumed"])
    assert [(entry.event, entry.detail["by"]) for entry in entries.order_by("id")] == [
        ("queue_paused", USERNAME),
        ("queue_resumed", USERNAME),
    ]


def test_the_workers_page_shows_a_live_and_a_lost_worker(live_server: Any, settings: Any) -> None:
    # Long enough that a loaded machine does not make the live worker miss its lease.
    options = use_options(settings, LEASE=5.0)
    make_operator("view_worker", "view_job")
    alive = start_worker("--worker-id", "browser-live", options=options)
    doomed = start_worker("--worker-id", "browser-doomed", options=options)
    base = str(live_server).rstrip("/")

    def state(worker_id: str) -> str | None:
        row = Worker.objects.filter(worker_id=worker_id).annotate(state=worker_state()).first()
        return None if row is None else str(row.state)

    try:
        wait_for(lambda: state("browser-live") == "live", what="the live worker")
        wait_for(lambda: state("browser-doomed") == "live", what="the other worker")
        doomed.send_signal(signal.SIGKILL)
        doomed.wait(timeout=30)
        wait_for(lambda: state("browser-doomed") == "lost", timeout=30, what="the lost one")
        with chromium_page() as page:

            def steps() -> None:
                from playwright.sync_api import expect

                log_in(page, base)
                page.get_by_role("link", name="Workers", exact=True).first.click()
                expect(page.get_by_role("heading", name="Select worker to view")).to_be_visible()
                rows = page.locator("#result_list tbody tr")
                live_row = rows.filter(has_text="browser-live")
                lost_row = rows.filter(has_text="browser-doomed")
                expect(live_row.locator(".jobstate-badge")).to_have_text("live")
                expect(lost_row.locator(".jobstate-badge")).to_have_text("lost")
                page.get_by_role("link", name="lost", exact=True).click()
                expect(page).to_have_url(re.compile(r"[?&]state=lost"))
                expect(page.locator("#result_list tbody tr")).to_have_count(1)
                expect(rows.filter(has_text="browser-live")).to_have_count(0)
                # Back to both, for the screenshot.
                page.get_by_role("link", name="All", exact=True).first.click()
                expect(rows).to_have_count(2)

            drive(page, "admin-workers", steps)
    finally:
        alive.send_signal(signal.SIGTERM)
        alive.wait(timeout=30)
        stop(alive)
        stop(doomed)


def test_the_live_refresh_updates_a_count_in_place_and_stops_when_told(live_server: Any) -> None:
    make_operator("view_queuepause", "view_job")
    store = get_state_store()
    store.create_job(request_id="billing-0", target="billing")
    base = str(live_server).rstrip("/")
    with chromium_page() as page:

        def steps() -> None:
            from playwright.sync_api import expect

            log_in(page, base)
            page.goto(f"{base}/admin/jobstate/queuepause/")
            ready = page.locator('#jobstate-queues tr[data-target="billing"] .jobstate-ready')
            expect(ready).to_have_text("1")
            toggle = page.get_by_role("button", name="Stop live updates")
            expect(toggle).to_be_visible()
            # A mark on this document: a reload would drop it.
            page.evaluate("window.jobstateMark = 'still here'")

            off_loop(
                lambda: [
                    store.create_job(request_id=f"billing-{n}", target="billing") for n in (1, 2)
                ]
            )
            expect(ready).to_have_text("3", timeout=15_000)
            assert page.evaluate("window.jobstateMark") == "still here"
            expect(page.locator("#jobstate-live-status")).to_contain_text("updated at")

            toggle.click()
            expect(page.get_by_role("button", name="Start live updates")).to_have_attribute(
                "aria-pressed", "false"
            )
            off_loop(lambda: store.create_job(request_id="billing-3", target="billing"))
            time.sleep(7)  # more than one refresh interval
            expect(ready).to_have_text("3")
            assert page.evaluate("window.jobstateMark") == "still here"

            page.get_by_role("button", name="Start live updates").click()
            expect(ready).to_have_text("4", timeout=15_000)

        drive(page, "admin-live-refresh", steps)


def test_the_pages_work_without_the_script(live_server: Any) -> None:
    """Progressive enhancement: with JavaScript off the pages render their figures and
    the live control stays hidden."""
    make_operator("view_queuepause", "view_job", "view_worker")
    get_state_store().create_job(request_id="plain", target="billing")
    base = str(live_server).rstrip("/")
    with chromium_page() as page:

        def steps() -> None:
            from playwright.sync_api import expect

            log_in(page, base)
            page.context.route("**/live.js", lambda route: route.abort())
            page.goto(f"{base}/admin/jobstate/queuepause/")
            expect(
                page.locator('#jobstate-queues tr[data-target="billing"] .jobstate-ready')
            ).to_have_text("1")
            expect(page.locator("#jobstate-live")).to_be_hidden()
            page.goto(f"{base}/admin/jobstate/job/overview/")
            expect(page.locator("#jobstate-throughput-chart")).to_be_visible()
            expect(page.locator("#jobstate-live")).to_be_hidden()

        drive(page, "admin-no-script", steps)
