"""The console's lists and pages as a newcomer sees them, on a 1440x900 screen, a
1366x768 laptop, a 390x844 phone and a 375x667 one, in headless Chromium (as in
:mod:`tests.admin.test_admin_browser`), measured from the elements' boxes:

- every column header of the jobs, workers, notifications, audit, runs, schedules and
  bulk operations lists is inside the viewport and the list's box (no sideways
  scrolling), with long task paths, long worker ids and time-ordered ids in the rows;
  so is the Queues page's table, with its pause and a paused queue's resume buttons,
  in its box;
- on a phone, "All columns" shows every column of the Workers and Queues pages, each
  wide enough to read;
- the first job's status badge is visible on the phone;
- on a phone every button (row actions, object tools, toggles) is at least 44 px tall;
- the Overview link on the app's page is one line;
- links contrast with what is behind them (WCAG ratio at least 3:1);
- the ids one list shows are distinct;
- the app's own pages have the breadcrumbs of a stock change list, in the running
  Django version's markup;
- instants are shown in the viewer's zone, with seconds, and copy buttons copy;
- a worker's page and a job's page with long names fit a phone, and the Queues page's
  and a confirmation's words break between words, not inside them;
- an audit entry's detail with lines longer than the screen can be read to their end.

Screenshots of every page at both sizes go to ``artifacts/screenshots/``. All rows
are written before the browser starts (Playwright's loop refuses ORM calls).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import pytest

from jobstate.core.states import AuditSeverity, AuditStage, JobRunStatus, JobStatus
from jobstate.models import (
    AuditEntry,
    BulkOperation,
    Job,
    JobRun,
    Notification,
    QueuePause,
    Schedule,
    Worker,
    time_ordered_uuid,
)
from jobstate.schedules.definitions import parse_declaration
from tests.support.browser import ARTIFACTS, chromium_page, log_in, make_operator

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

SCREENSHOTS = ARTIFACTS / "screenshots"
DESKTOP = {"width": 1440, "height": 900}
LAPTOP = {"width": 1366, "height": 768}
PHONE = {"width": 390, "height": 844}
SMALL_PHONE = {"width": 375, "height": 667}
SIZES = {"desktop": DESKTOP, "laptop": LAPTOP, "phone": PHONE, "small-phone": SMALL_PHONE}

LISTS = {
    "jobs": "/admin/jobstate/job/",
    "workers": "/admin/jobstate/worker/",
    "notifications": "/admin/jobstate/notification/",
    "audit": "/admin/jobstate/auditentry/",
    "runs": "/admin/jobstate/jobrun/",
    "schedules": "/admin/jobstate/schedule/",
    "bulk": "/admin/jobstate/bulkoperation/",
}
OTHER_PAGES = {
    "app": "/admin/jobstate/",
    "overview": "/admin/jobstate/job/overview/",
    "queues": "/admin/jobstate/queuepause/",
    "locks": "/admin/jobstate/runtimelock/",
    "approvals": "/admin/jobstate/approvaldecision/",
    "replays": "/admin/jobstate/deliveryreplay/",
}

LONG_TASK = "project.billing.reconciliation.tasks.reconcile_customer_invoices_for_region"
LONG_WORKER = "worker-eu-west-1-production-batch-7f9c2d1e4b6a:host-ip-10-24-187-203:31337"
LONG_DETAIL = "long-detail-entry"


def _bulk_operations(now: datetime) -> None:
    """A running, a finished and a cancelled bulk operation, with counts in the
    thousands."""
    for state in ("running", "done", "cancelled"):
        BulkOperation.objects.create(
            action="requeue",
            state=state,
            operator="operator-ada",
            filters={"target": "tasks:default"},
            cutoff=now,
            total=12_345,
            done=12_000,
            skipped=345,
        )


def _rows() -> None:
    """Rows like a busy site's: time-ordered ids made within the same millisecond or
    so (they share their first characters), long task paths and worker ids."""
    now = datetime.now(UTC)
    statuses = [
        JobStatus.RUNNING,
        JobStatus.QUEUED,
        JobStatus.ERROR,
        JobStatus.DONE,
        JobStatus.DISPATCHED,
    ]
    jobs = []
    for n in range(12):
        status = statuses[n % len(statuses)]
        claimed = status in (JobStatus.RUNNING, JobStatus.DISPATCHED)
        finished = status in (JobStatus.DONE, JobStatus.ERROR)
        # A finished job's attempt by the long-named worker: its page lists the job
        # under "Finished lately", and the job's page shows the attempt.
        attempt = {
            "worker_id": LONG_WORKER,
            "started_at": (now - timedelta(seconds=3)).isoformat(),
            "finished_at": now.isoformat(),
            "outcome": "successful" if status == JobStatus.DONE else "failed",
        }
        if status == JobStatus.ERROR:
            attempt.update(
                exception_class_path="project.billing.errors.InvoiceReconciliationFailed",
                message="invoice INV-2026-000123 does not balance",
                traceback="Traceback (most recent call last):\n  ...",
            )
        # Request ids as hosts make them: a bare time-ordered id, or a prefixed one.
        request_id = str(time_ordered_uuid()) if n % 2 else f"invoice-run-{uuid.uuid4()}"
        jobs.append(
            Job.objects.create(
                request_id=request_id,
                target=f"tasks:{'reports' if n % 2 else 'default'}",
                task_path=LONG_TASK,
                queue_name="invoices-eu-west-1-priority",
                status=status,
                attempts=n % 3,
                executor_id=LONG_WORKER if claimed else None,
                lease_until=now + timedelta(minutes=5) if claimed else None,
                thread_id=9_000_000_000 + n,
                source="billing-reconciliation-service",
                attempt_log=[attempt] if finished else [],
            )
        )
    Worker.objects.create(
        worker_id=LONG_WORKER,
        kind="tasks",
        host="host-ip-10-24-187-203.eu-west-1.compute.internal",
        pid=31337,
        backend="default",
        queues=["invoices-eu-west-1-priority", "reports", "emails"],
        concurrency=16,
        lease=timedelta(minutes=1),
        # Started before the jobs above finished, which its page lists.
        started_at=now - timedelta(hours=2),
    )
    # The newest jobs (first on the list) have notifications.
    for n, job in enumerate(jobs[4:]):
        Notification.objects.create(
            job=job,
            channel="webhook",
            destination=f"https://hooks.example.com/services/T0000/B0000/{'x' * 40}{n}",
            idempotency_key=f"job-{job.pk}-finished",
            state="delivered" if n % 2 else "pending",
            delivered_at=now if n % 2 else None,
        )
    for n, job in enumerate(jobs):
        AuditEntry.objects.create(
            job=job,
            request_id=job.request_id,
            event="job_claimed" if n % 2 else "job_created",
            stage=AuditStage.LAUNCH,
            severity=AuditSeverity.INFO if n % 3 else AuditSeverity.WARNING,
            title="Claimed by a worker of the invoices queue",
            summary="The worker " + LONG_WORKER + " claimed the job for its next attempt " * 3,
        )
    # An entry whose detail has lines longer than the page is wide: a sentence, and a
    # URL with nowhere to break.
    AuditEntry.objects.create(
        request_id=LONG_DETAIL,
        event="rejected",
        detail={
            "by": "operator-ada",
            "reason": "rejected by operator-ada (bulk operation 2): " + "wrong template " * 20,
            "destination": f"https://hooks.example.com/services/{'x' * 240}/end",
            "via": "bulk:2",
        },
    )
    for n in range(5):
        JobRun.objects.create(
            job_key="jobstate.maintenance.prune_finished_jobs_and_their_history",
            overlap_key=f"jobstate.maintenance.prune_finished_jobs_and_their_history:{n}",
            status=JobRunStatus.RUNNING if n == 0 else JobRunStatus.SUCCEEDED,
            trigger_source="SCHEDULER",
            triggered_by=f"nightly-prune-of-finished-jobs @ 2026-12-0{n + 1}T02:30:00+01:00",
            started_at=now - timedelta(minutes=n),
            duration_ms=None if n == 0 else 12_345,
        )
    _bulk_operations(now)
    definition = parse_declaration(
        "nightly-reconciliation-of-customer-invoices",
        {"task": "tests.support.task_functions.add", "cron": "30 2 * * 1-5", "args": [1, 1]},
    )
    Schedule.objects.create(
        key=definition.key,
        kind=definition.kind,
        target=definition.target,
        cron=definition.cron,
        timezone="Europe/Amsterdam",
        catch_up=definition.catch_up,
        definition=definition.as_json(),
        effective_from=now,
        next_slot=now + timedelta(hours=3),
    )


@pytest.fixture
def console(live_server: Any) -> Iterator[tuple[Page, str]]:
    """A superuser-like operator's browser on the console, the rows written, one of
    the queues paused (its row has *Resume…* where the others have *Pause…*)."""
    _rows()
    QueuePause.objects.create(
        target="tasks:default", queue_name="invoices-eu-west-1-priority", paused_by="operator-ada"
    )
    make_operator(
        *[
            f"view_{name}"
            for name in (
                "job",
                "worker",
                "notification",
                "auditentry",
                "jobrun",
                "schedule",
                "queuepause",
                "runtimelock",
                "approvaldecision",
                "deliveryreplay",
                "bulkoperation",
            )
        ],
        "discard_job",
        # The Queues page's pause buttons take a column of their own.
        "pause_queue",
    )
    base = str(live_server).rstrip("/")
    with chromium_page() as page:
        page.context.grant_permissions(["clipboard-read", "clipboard-write"])
        log_in(page, base)
        yield page, base


def _shoot(page: Page, name: str, size: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}-{size}.png"))


def _headers(page: Page) -> list[dict[str, Any]]:
    """The shown column headers of the list with their box and text."""
    return list(
        page.eval_on_selector_all(
            "#result_list thead th",
            """els => els.map(e => {
                const r = e.getBoundingClientRect();
                return {text: e.innerText.trim(), left: r.left, right: r.right,
                        width: r.width, shown: r.width > 0 && r.height > 0};
            })""",
        )
    )


def test_every_list_fits_a_wide_screen_and_a_phone(console: tuple[Page, str]) -> None:
    page, base = console
    for size, viewport in SIZES.items():
        page.set_viewport_size(viewport)
        for name, path in LISTS.items():
            page.goto(base + path)
            _shoot(page, name, size)
            headers = [header for header in _headers(page) if header["shown"]]
            assert len(headers) >= 4, (name, size, headers)
            for header in headers:
                # Inside the page, not behind a sideways scroll of the table.
                assert header["left"] >= 0, (name, size, header)
                assert header["right"] <= viewport["width"], (name, size, header)
            scroll = page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= viewport["width"], (name, size, scroll)
            # Nor is a column hidden behind a sideways scroll inside the list's box.
            inner = page.locator("#changelist-form .results").evaluate(
                "e => [e.scrollWidth, e.clientWidth]"
            )
            assert inner[0] <= inner[1], (name, size, inner)
            # No value spills out of its cell into the next one (an id running into
            # the status badge beside it).
            spilled = page.eval_on_selector_all(
                "#result_list tbody th, #result_list tbody td", _SPILLED_VALUES
            )
            assert spilled == [], (name, size, spilled)
            if name == "bulk":
                # Squeezed to fit, its action and counts read "requeu/e", "1200/0".
                broken = page.eval_on_selector_all(
                    "#result_list td.field-action, #result_list td.field-total,"
                    " #result_list td.field-done, #result_list td.field-skipped",
                    _BROKEN_WORDS,
                )
                assert broken == [], (size, broken)
        for name, path in OTHER_PAGES.items():
            page.goto(base + path)
            _shoot(page, name, size)
            scroll = page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= viewport["width"], (name, size, scroll)
            assert _boxes_scrolled(page) == [], (name, size)
            if name == "overview":
                # The charts' labels stay readable however far the chart is scaled.
                heights = page.eval_on_selector_all(
                    ".jobstate-chart text", "els => els.map(e => e.getBoundingClientRect().height)"
                )
                assert heights and min(heights) >= 11, (size, heights)
    # What an operator scans first is among the shown columns on the phone.
    page.goto(base + LISTS["jobs"])
    shown = [header["text"].lower() for header in _headers(page) if header["shown"]]
    assert {"status", "task / target", "age / lease"} <= set(shown), shown


def test_an_audit_entrys_long_detail_can_be_read_to_its_end(console: tuple[Page, str]) -> None:
    """At 1440 px the Detail JSON box was 1,071 px wide and its row clipped it at
    x=1,400 with no scrollbar: the end of a long line could not be seen."""
    page, base = console
    page.goto(f"{base}{LISTS['audit']}?q={LONG_DETAIL}")
    page.click("#result_list tbody th a")
    page.wait_for_selector("pre.jobstate-json")
    for size, viewport in SIZES.items():
        page.set_viewport_size(viewport)
        _shoot(page, "audit-entry-long-detail", size)
        boxes = page.eval_on_selector_all("pre.jobstate-json", _CUT_OFF)
        assert boxes, size
        assert [box for box in boxes if box] == [], (size, boxes)


#: Per ``pre``: "" when all of it can be read (inside the viewport and every box that
#: holds it, its content wrapped or scrolling inside it), else what is cut off.
_CUT_OFF = """els => els.map(e => {
    const box = e.getBoundingClientRect();
    const style = getComputedStyle(e);
    const scrolls = ['auto', 'scroll'].includes(style.overflowX);
    if (e.scrollWidth > e.clientWidth && !scrolls)
        return `content ${e.scrollWidth} px in a box of ${e.clientWidth} px`;
    if (box.right > document.documentElement.clientWidth)
        return `box ends at ${box.right} px, past the viewport`;
    for (let up = e.parentElement; up; up = up.parentElement) {
        const clips = getComputedStyle(up).overflowX !== 'visible';
        const edge = up.getBoundingClientRect().right;
        if (clips && box.right > edge + 0.5)
            return `box ends at ${Math.round(box.right)} px, clipped by ${
                up.tagName}.${up.className} at ${Math.round(edge)} px`;
    }
    return '';
})"""


def _boxes_scrolled(page: Page) -> list[list[Any]]:
    """The boxes of the page's tables (the Queues page's) that scroll sideways, as
    [id, content width, box width]: a table may run past its box while the page itself
    stays as wide as the screen."""
    return [
        box
        for box in page.eval_on_selector_all(
            ".jobstate-columns-box", "els => els.map(e => [e.id, e.scrollWidth, e.clientWidth])"
        )
        if box[1] > box[2]
    ]


#: The one-line values drawn past their cell's edge, into the next cell: "class: text
#: (px over)".
_SPILLED_VALUES = """cells => cells.flatMap(cell => {
    const edge = cell.getBoundingClientRect().right;
    return [...cell.querySelectorAll('.jobstate-one-line')]
        .filter(e => e.getBoundingClientRect().right > edge + 0.5)
        .map(e => `${cell.className}: ${e.textContent} (${
            Math.round(e.getBoundingClientRect().right - edge)} px over)`);
})"""


def _broken_parts(part: str, *, longest: int) -> str:
    """A script for ``eval_on_selector_all``: the runs of text matching the JavaScript
    pattern ``part`` in the elements picked that are drawn on more than one line (a run
    so drawn has more than one box); runs longer than ``longest`` may break anywhere."""
    return f"""els => els.flatMap(e => {{
    const broken = [];
    const walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {{
        for (const match of node.textContent.matchAll(/{part}/g)) {{
            if (match[0].length > {longest}) continue;
            const range = document.createRange();
            range.setStart(node, match.index);
            range.setEnd(node, match.index + match[0].length);
            const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
            if (lines.size > 1) broken.push(match[0]);
        }}
    }}
    return broken;
}})"""


#: The words of the elements ``selector`` picks that wrapped in the middle.
_BROKEN_WORDS = _broken_parts(r"\S+", longest=10**9)

#: The parts of names (between dots, dashes, underscores, colons, slashes and spaces) of
#: the elements ``selector`` picks that wrapped in their middle ("defa/ult"); a part
#: longer than 24 characters may break anywhere.
_BROKEN_NAME_PARTS = _broken_parts(r"[^\s.:_\/-]+", longest=24)


def test_the_overviews_names_break_between_their_parts_on_a_phone(
    console: tuple[Page, str],
) -> None:
    """On a phone the Overview's queue depth read "tasks:defa/ult": a name could break
    anywhere, not only after its dots, dashes and colons."""
    page, base = console
    for size in ("phone", "small-phone"):
        page.set_viewport_size(SIZES[size])
        page.goto(base + OTHER_PAGES["overview"])
        page.wait_for_selector("#jobstate-depth")
        _shoot(page, "overview-names", size)
        names = page.eval_on_selector_all("#jobstate-depth td:first-child", "els => els.length")
        assert names >= 2, size
        broken = page.eval_on_selector_all("#jobstate-depth td:first-child", _BROKEN_NAME_PARTS)
        assert broken == [], (size, broken)


def test_a_workers_page_and_a_jobs_page_with_long_names_fit_a_phone(
    console: tuple[Page, str],
) -> None:
    """The worker's "Finished lately" and the job's attempts named a long task path that
    did not wrap, and pushed the page past a phone's edge."""
    page, base = console
    page.set_viewport_size(PHONE)
    page.goto(f"{base}/admin/jobstate/worker/find/?id={LONG_WORKER}")
    page.wait_for_selector("#jobstate-worker-recent table.jobstate-trail")
    _shoot(page, "worker-page", "phone")
    assert LONG_TASK in page.locator("#jobstate-worker-recent").inner_text()
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= PHONE["width"], ("worker page", scroll)
    page.locator("#jobstate-worker-recent table.jobstate-trail a").first.click()
    page.wait_for_selector("ol.jobstate-timeline")
    _shoot(page, "finished-job-page", "phone")
    assert LONG_TASK in page.locator("ol.jobstate-timeline").inner_text()
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= PHONE["width"], ("job page", scroll)
    for size, viewport in SIZES.items():
        # Each summary value inside its own cell: the instants (enqueued, started,
        # finished) were drawn 8 px past theirs, into the next one's.
        page.set_viewport_size(viewport)
        _shoot(page, "finished-job-page", size)
        spilled = page.eval_on_selector_all(
            "dl.jobstate-summary dd",
            "els => els.filter(e => e.scrollWidth > e.clientWidth).map(e => e.textContent)",
        )
        assert spilled == [], (size, spilled)


def test_a_notifications_history_page_fits_a_phone(console: tuple[Page, str]) -> None:
    """Django's own history page titles the row with its ``__str__``, here a long
    destination URL, and lacked the console's stylesheet that wraps it."""
    page, base = console
    page.set_viewport_size(PHONE)
    page.goto(base + LISTS["notifications"])
    page.locator("#result_list tbody tr a[href*='/change/']").first.click()
    page.get_by_role("link", name="History").click()
    # (The title is #content's child on Django 5.2, inside .titles from 6.1.)
    title = page.locator("#content h1").first
    title.wait_for()
    _shoot(page, "notification-history", "phone")
    assert "hooks.example.com" in title.inner_text()
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= PHONE["width"], scroll


def test_the_queues_and_a_confirmations_words_are_not_broken_on_a_phone(
    console: tuple[Page, str],
) -> None:
    """On a phone the Queues page read "acti/ve", "REA/DY" and a confirmation's reason
    "alread/y queue/d": every cell could break anywhere, not only the long names."""
    page, base = console
    page.set_viewport_size(PHONE)
    page.goto(base + OTHER_PAGES["queues"])
    page.wait_for_selector("#jobstate-queues")
    _shoot(page, "queues-words", "phone")
    broken = page.eval_on_selector_all(
        "#jobstate-queues th, #jobstate-queues .jobstate-badge, #jobstate-queues .button,"
        " #jobstate-queues td.jobstate-number",
        _BROKEN_WORDS,
    )
    assert broken == [], broken
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= PHONE["width"], scroll
    # A discard of a finished job: it is skipped, and says why.
    page.goto(f"{base}/admin/jobstate/job/?status__exact=done")
    page.locator("#result_list tbody input.action-select").first.check()
    page.select_option("select[name=action]", "discard_jobs")
    page.locator("button[name=index]").click()
    page.wait_for_selector("td.jobstate-reason")
    _shoot(page, "requeue-skipped", "phone")
    broken = page.eval_on_selector_all("td.jobstate-reason, th", _BROKEN_WORDS)
    assert broken == [], broken


#: Every control drawn as a button in the console's content: row actions (the Queues
#: page's Pause/Resume), the object tools, a job's action buttons, the list's bulk
#: action "Go", the filter and column toggles, live updates' toggle.
_BUTTONS = (
    "#content .button, #content button, #content input[type=submit],"
    " #content input[type=button], #content .object-tools a"
)

#: The shown buttons' text and box height, rounded down to the pixel.
_BUTTON_HEIGHTS = """els => els.filter(e => e.getClientRects().length && getComputedStyle(e)
    .visibility !== 'hidden').map(e => [
        (e.innerText || e.value || '').trim(), Math.floor(e.getBoundingClientRect().height)])"""

#: The least height of a button on a phone, in CSS pixels (WCAG 2.5.5's target size,
#: and the Apple and Android guidelines' 44 and 48).
TAP_HEIGHT = 44


def test_buttons_on_a_phone_are_tall_enough_to_tap(console: tuple[Page, str]) -> None:
    """On a phone the Queues page's Pause and Resume and the object tools were about
    47 x 17 px, too small to tap; on a wide screen they stay compact."""
    page, base = console
    pages = {
        "queues": OTHER_PAGES["queues"],
        "jobs": LISTS["jobs"],
        "schedules": LISTS["schedules"],
        "queued-job": f"{LISTS['jobs']}?status__exact=queued",
    }
    for viewport in (PHONE, SMALL_PHONE):
        page.set_viewport_size(viewport)
        for name, path in pages.items():
            page.goto(base + path)
            if name == "queued-job":
                # A job's own page, with its Discard… and History among the tools.
                page.locator("#result_list tbody tr a[href*='/change/']").first.click()
                page.wait_for_selector(".object-tools button.jobstate-action")
            elif name == "jobs":
                # The bulk action's "Go" shows once a row is selected.
                page.locator("#result_list tbody input.action-select").first.check()
            _shoot(page, f"buttons-{name}", f"{viewport['width']}x{viewport['height']}")
            heights = page.eval_on_selector_all(_BUTTONS, _BUTTON_HEIGHTS)
            assert len(heights) >= 2, (name, viewport, heights)
            small = [shown for shown in heights if shown[1] < TAP_HEIGHT]
            assert small == [], (name, viewport, small)
    page.set_viewport_size(DESKTOP)
    page.goto(base + OTHER_PAGES["queues"])
    heights = page.eval_on_selector_all("#jobstate-queues .button", _BUTTON_HEIGHTS)
    assert heights and max(height for _, height in heights) < TAP_HEIGHT, heights


def test_the_status_badge_is_visible_on_a_phone(console: tuple[Page, str]) -> None:
    from playwright.sync_api import expect

    page, base = console
    page.set_viewport_size(PHONE)
    page.goto(base + LISTS["jobs"])
    badge = page.locator("#result_list tbody tr").first.locator(".jobstate-badge")
    expect(badge).to_be_visible()
    box = badge.bounding_box()
    assert box is not None and box["x"] + box["width"] <= PHONE["width"]


def test_the_overview_link_on_the_app_page_is_one_line(console: tuple[Page, str]) -> None:
    page, base = console
    for viewport in SIZES.values():
        page.set_viewport_size(viewport)
        page.goto(base + "/admin/jobstate/")
        link = page.locator("#jobstate-dashboard-link")
        height, line = link.evaluate(
            "e => [e.getBoundingClientRect().height,"
            " parseFloat(getComputedStyle(e).lineHeight) ||"
            " 1.2 * parseFloat(getComputedStyle(e).fontSize)]"
        )
        assert height < 1.5 * line, (viewport, height, line)


#: The WCAG contrast ratio of an element's text against the first opaque background
#: behind it, in the page.
CONTRAST = """e => {
  const rgb = c => (c.match(/[\\d.]+/g) || []).map(Number);
  const lum = ([r, g, b]) => [r, g, b].map(v => {
      v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
  }).reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
  let back = e, bg = null;
  while (back) {
    const c = rgb(getComputedStyle(back).backgroundColor);
    if (c.length >= 3 && (c.length < 4 || c[3] > 0.5)) { bg = c; break; }
    back = back.parentElement;
  }
  bg = bg || [255, 255, 255];
  const [a, b] = [lum(rgb(getComputedStyle(e).color)), lum(bg)];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}"""


def test_links_contrast_with_their_background(console: tuple[Page, str]) -> None:
    page, base = console
    page.goto(base + LISTS["notifications"])
    checked: list[tuple[str, float]] = []
    for selector in ("#header a", "#result_list tbody a"):
        for link in page.locator(selector).all()[:5]:
            checked.append((selector, link.evaluate(CONTRAST)))
    # A job's page: the header of each of its notifications links the notification.
    page.goto(base + LISTS["jobs"])
    page.locator("#result_list tbody tr").first.locator("th a").click()
    page.wait_for_url(re.compile(r"/change/$"))
    captions = page.locator("#jobstate-notifications caption a").all()
    assert captions, "the job's page lists its notification"
    checked += [("notification header", link.evaluate(CONTRAST)) for link in captions]
    assert checked
    for selector, ratio in checked:
        assert ratio >= 3, (selector, ratio)


def test_the_ids_of_a_list_are_distinct(console: tuple[Page, str]) -> None:
    page, base = console
    shown = {
        LISTS["jobs"]: "#result_list tbody th.field-request_id_cell",
        LISTS["notifications"]: "#result_list tbody .field-id_cell code",
        LISTS["audit"]: "#result_list tbody .field-job_cell code",
    }
    for path, selector in shown.items():
        page.goto(base + path)
        texts = [text.strip() for text in page.locator(selector).all_inner_texts()]
        assert len(texts) >= 8, (path, texts)
        assert len(set(texts)) == len(texts), (path, texts)
        # Shortened, yet the whole id is in the tooltip.
        assert any("…" in text for text in texts), (path, texts)


def _crumbs(page: Page) -> list[str]:
    """The breadcrumbs' element structure: each element's tag, classes, current mark."""
    return list(
        page.eval_on_selector_all(
            "nav[aria-label] .breadcrumbs, nav[aria-label] .breadcrumbs *",
            "els => els.map(e => [e.tagName, e.className, e.getAttribute('aria-current')]"
            ".join(' ')).filter(s => !s.startsWith('A '))",
        )
    )


def test_the_app_pages_breadcrumbs_are_django_s_own(console: tuple[Page, str]) -> None:
    page, base = console
    page.goto(base + LISTS["jobs"])
    stock = _crumbs(page)
    assert stock, "a stock change list has breadcrumbs"
    for path in ("/admin/jobstate/job/overview/", "/admin/jobstate/queuepause/"):
        page.goto(base + path)
        assert _crumbs(page) == stock, path
        bar = page.locator(".breadcrumbs")
        assert bar.is_visible() and (bar.bounding_box() or {"height": 0})["height"] > 10


def test_instants_show_in_the_viewer_s_zone_and_ids_copy(console: tuple[Page, str]) -> None:
    from playwright.sync_api import expect

    page, base = console
    page.goto(base + LISTS["audit"])
    moment = page.locator("time.jobstate-moment").first
    expect(moment).to_have_attribute("data-jobstate-local", "")
    # One format everywhere: date, time with seconds, the zone's abbreviation.
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+", moment.inner_text().strip())
    page.goto(base + LISTS["notifications"])
    button = page.locator("#result_list .jobstate-copy").first
    whole = button.get_attribute("data-copy")
    button.click()
    expect(button).to_contain_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == whole


def test_the_filter_sidebar_hides_and_stays_hidden(console: tuple[Page, str]) -> None:
    from playwright.sync_api import expect

    page, base = console
    page.goto(base + LISTS["jobs"])
    table = page.locator("#changelist-form")
    wide_before = (table.bounding_box() or {"width": 0})["width"]
    page.get_by_role("button", name="Hide filters").click()
    expect(page.locator("#changelist-filter")).to_be_hidden()
    # The table takes the sidebar's width, and the choice outlives the page.
    assert (table.bounding_box() or {"width": 0})["width"] > wide_before
    page.goto(base + LISTS["audit"])
    expect(page.locator("#changelist-filter")).to_be_hidden()
    page.get_by_role("button", name="Show filters").click()
    expect(page.locator("#changelist-filter")).to_be_visible()


def test_a_confirmation_page_fits_a_phone(console: tuple[Page, str]) -> None:
    """The confirmation's reason box (here a queued task's discard) stayed as wide as its
    declared columns and pushed the page past a phone's edge."""
    page, base = console
    page.set_viewport_size(SIZES["phone"])
    # (No ORM here: the browser's event loop runs in this thread.)
    page.goto(f"{base}/admin/jobstate/job/?status__exact=queued")
    page.locator("#result_list tbody tr a[href*='/change/']").first.click()
    page.get_by_role("button", name="Discard…").first.click()
    page.wait_for_selector("#jobstate-confirm-form")
    _shoot(page, "discard-confirmation", "phone")
    scroll = page.evaluate("document.documentElement.scrollWidth")
    assert scroll <= SIZES["phone"]["width"], scroll
    box = page.locator("#jobstate-confirm-form textarea").bounding_box()
    assert box is not None and box["x"] + box["width"] <= SIZES["phone"]["width"], box


#: Names as long as their columns allow, without a dot, dash or colon to wrap after.
LONGEST_TARGET = "tasks:" + "t" * 194
LONGEST_QUEUE = "q" * 100
LONGEST_KEY = "k" * 100


@pytest.fixture
def long_names(live_server: Any) -> Iterator[tuple[Page, str]]:
    """The console with a target, a queue and a schedule key as long as they may be,
    the target's queue paused."""
    _rows()
    now = datetime.now(UTC)
    for n in range(3):
        Job.objects.create(
            request_id=f"long-{n}",
            target=LONGEST_TARGET,
            task_path=LONG_TASK,
            queue_name=LONGEST_QUEUE,
        )
    QueuePause.objects.create(target=LONGEST_TARGET, queue_name=LONGEST_QUEUE, paused_by="ops")
    Worker.objects.create(
        worker_id="w-long-queues",
        kind="tasks",
        host="app-1",
        pid=1,
        backend="default",
        queues=[LONGEST_QUEUE, "default", "q" * 99 + "x"],
        concurrency=1,
        lease=timedelta(minutes=1),
        started_at=now,
    )
    _bulk_operations(now)
    definition = parse_declaration(
        LONGEST_KEY, {"task": "tests.support.task_functions.add", "cron": "0 3 * * *"}
    )
    Schedule.objects.create(
        key=definition.key,
        kind=definition.kind,
        target=definition.target,
        cron=definition.cron,
        timezone="UTC",
        catch_up=definition.catch_up,
        definition=definition.as_json(),
        effective_from=now,
        next_slot=now + timedelta(hours=3),
    )
    make_operator("view_job", "view_worker", "view_schedule", "view_queuepause", "pause_queue")
    base = str(live_server).rstrip("/")
    with chromium_page() as page:
        log_in(page, base)
        yield page, base


def test_names_as_long_as_allowed_fit_a_wide_screen_and_a_phone(
    long_names: tuple[Page, str],
) -> None:
    """A 200-character target made the Overview 1,327 px wide on a phone and the Queues
    page 2,731 px on a wide screen; a 100-character schedule key pushed the schedules'
    other columns out of the list's box, and the workers' queues were cut off. On a
    phone the Queues table ran 9 px past its box with its pause buttons, more with a
    paused queue's resume button."""
    page, base = long_names
    pages = {
        "overview": OTHER_PAGES["overview"],
        "queues": OTHER_PAGES["queues"],
        "schedules": LISTS["schedules"],
        "workers": LISTS["workers"],
    }
    for size, viewport in SIZES.items():
        page.set_viewport_size(viewport)
        for name, path in pages.items():
            page.goto(base + path)
            _shoot(page, f"long-names-{name}", size)
            scroll = page.evaluate("document.documentElement.scrollWidth")
            assert scroll <= viewport["width"], (name, size, scroll)
            # The paused queue's "Resume…" and who paused it, beside the longest names.
            assert _boxes_scrolled(page) == [], (name, size)
            if name == "overview":
                # "tasks:" stays whole beside the 194 letters after it, which break.
                broken = page.eval_on_selector_all(
                    "#jobstate-depth td:first-child", _BROKEN_NAME_PARTS
                )
                assert broken == [], (size, broken)
            if path in LISTS.values():
                inner = page.locator("#changelist-form .results").evaluate(
                    "e => [e.scrollWidth, e.clientWidth]"
                )
                assert inner[0] <= inner[1], (name, size, inner)
                spilled = page.eval_on_selector_all(
                    "#result_list tbody th, #result_list tbody td", _SPILLED_VALUES
                )
                assert spilled == [], (name, size, spilled)
            if name == "workers" and size == "phone":
                # A worker's whole id shows (two ids alike at their start stayed "w-…"
                # on a phone), and its running jobs' commas keep to their jobs' lines.
                ids = page.eval_on_selector_all(
                    "#result_list tbody th a > .jobstate-one-line",
                    "els => els.map(e => e.scrollWidth <= e.clientWidth)",
                )
                assert ids and all(ids), (size, ids)
                lone = page.eval_on_selector_all("#result_list td.field-running_now", _LONE_COMMAS)
                assert lone == 0, (size, lone)


#: How many commas are drawn on a line of their own in the cells given.
_LONE_COMMAS = """cells => cells.flatMap(cell => [...cell.querySelectorAll('.jobstate-list-sep')])
    .filter(sep => {
        const rects = [...sep.getClientRects()];
        if (!rects.length) return false;
        const prev = sep.previousElementSibling.getBoundingClientRect();
        return Math.round(rects[0].top) > Math.round(prev.top);
    }).length"""


def _column_widths(page: Page, selector: str) -> dict[str, float]:
    """The width of each shown cell of the first row of the table ``selector``, by its
    class."""
    return dict(
        page.eval_on_selector_all(
            f"{selector} tbody tr:first-child td",
            """els => els.filter(e => e.getBoundingClientRect().width > 0)
                .map(e => [e.className, e.getBoundingClientRect().width])""",
        )
    )


def test_all_columns_on_a_phone_are_readable_on_the_workers_and_queues_pages(
    console: tuple[Page, str],
) -> None:
    """The Workers page's "All columns" squeezed its queues to a column one word-piece
    wide; the Queues page left out two columns with no way to see them on a phone."""
    page, base = console
    page.set_viewport_size(PHONE)
    for name, table, hidden in (
        ("workers", "#result_list", "td.field-queues_cell"),
        ("queues", "#jobstate-queues", "td.jobstate-delayed"),
    ):
        path = LISTS.get(name) or OTHER_PAGES[name]
        page.goto(base + path)
        page.wait_for_selector(table)
        assert not page.locator(f"{table} {hidden}").first.is_visible(), name
        button = page.locator("#jobstate-columns-toggle")
        assert button.is_visible() and button.inner_text() == "All columns", name
        button.click()
        _shoot(page, f"{name}-all-columns", "phone")
        assert page.locator(f"{table} {hidden}").first.is_visible(), name
        # No column is squeezed to a letter or two (a badge "live" is 30 px wide).
        widths = _column_widths(page, table)
        assert min(widths.values()) >= 30, (name, widths)
        # The table scrolls in its own box; the page stays as wide as the screen.
        assert page.evaluate("document.documentElement.scrollWidth") <= PHONE["width"], name
        button.click()
        assert not page.locator(f"{table} {hidden}").first.is_visible(), name
    # A worker's queues read as whole names, not pieces ("invoices-/eu-/west-1-").
    page.goto(base + LISTS["workers"])
    page.locator("#jobstate-columns-toggle").click()
    broken = page.eval_on_selector_all("#result_list td.field-queues_cell", _BROKEN_WORDS)
    page.locator("#jobstate-columns-toggle").click()
    assert broken == [], broken
