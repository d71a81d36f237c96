"""What users wrote, as the console shows it in headless Chromium (as in
:mod:`tests.admin.test_admin_browser_layout`), measured from the characters' boxes:

- a right-to-left override (U+202E) in a job's request id, source, input or error is
  reversed itself, but the console's text after it is not: the job's id in the
  breadcrumbs, the timeline's "from", the size of a folded value;
- a long value in an audit entry's detail, or a long target on the Queues page, does
  not squeeze the short words of the other columns into pieces ("recovere/d",
  "defa/ult").
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from django.db.models.functions import Now

from jobstate.core.states import AuditSeverity, AuditStage, JobStatus
from jobstate.models import AuditEntry, Job
from tests.admin.test_admin_browser_layout import _BROKEN_WORDS, DESKTOP, SIZES
from tests.support.browser import chromium_page, log_in, make_operator

if TYPE_CHECKING:
    from playwright.sync_api import Page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.postgres,
    pytest.mark.slow,
    pytest.mark.django_db(transaction=True),
]

OVERRIDE = "\u202e"
LONG_KEY = "01a24d54-2a52-7000-831b-d0e1d2324466:ff107902-c27b-4ebf-a4b9-3d69840d66c5:" * 2
LONG_TARGET = "tasks:" + "t" * 194

#: For each element of a selector, whether each occurrence of ``word`` in its text reads
#: left to right on the screen: its first character left of its last.
_READS_LEFT_TO_RIGHT = """([selector, word]) =>
  [...document.querySelectorAll(selector)].flatMap(e => {
    const found = [];
    const walker = document.createTreeWalker(e, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
        const at = node.textContent.indexOf(word);
        if (at < 0) continue;
        const range = document.createRange();
        range.setStart(node, at);
        range.setEnd(node, at + 1);
        const first = range.getBoundingClientRect().left;
        range.setStart(node, at + word.length - 1);
        range.setEnd(node, at + word.length);
        found.push(first < range.getBoundingClientRect().left);
    }
    return found;
})"""


@pytest.fixture
def hostile_values(live_server: Any) -> Iterator[tuple[Page, str, Job]]:
    """A job whose request id, source, input and error start with a right-to-left
    override, with an audit entry of a long detail."""
    job = Job.objects.create(
        request_id=OVERRIDE + "evil-request",
        target="demo.remote",
        source=OVERRIDE + "cli",
        status=JobStatus.ERROR,
        input={"note": OVERRIDE + "gpj.exe " + "x" * 3000},
        error="\n".join([OVERRIDE + "boom"] * 30),
    )
    AuditEntry.objects.create(
        job=job,
        request_id=job.request_id,
        event="recovered",
        stage=AuditStage.RECOVERY,
        severity=AuditSeverity.WARNING,
        title="Requeued: executor lease expired",
        detail={"idempotency_key": LONG_KEY, "via": "executor-lease-expired"},
    )
    make_operator("view_job", "view_auditentry")
    base = str(live_server).rstrip("/")
    with chromium_page() as page:
        log_in(page, base)
        yield page, base, job


def test_an_override_in_a_value_does_not_reverse_the_console_s_text(
    hostile_values: tuple[Page, str, Job],
) -> None:
    """The job's id in the breadcrumbs read "(079e6636…)", the timeline's "from" read
    "morf" and a folded value's "(4 lines, 2047 characters)" read backwards."""
    page, base, job = hostile_values
    page.set_viewport_size(DESKTOP)
    page.goto(f"{base}/admin/jobstate/job/{job.pk}/change/")
    page.wait_for_selector("ol.jobstate-timeline")
    for selector, word in (
        (".breadcrumbs", str(job.pk)),
        ("ol.jobstate-timeline", "from"),
        ("details.jobstate-fold summary", "characters"),
    ):
        reads = page.evaluate(_READS_LEFT_TO_RIGHT, [selector, word])
        assert reads and all(reads), (selector, word, reads)


def test_a_long_detail_leaves_the_short_words_of_other_columns_whole(
    hostile_values: tuple[Page, str, Job],
) -> None:
    page, base, job = hostile_values
    page.set_viewport_size(DESKTOP)
    page.goto(f"{base}/admin/jobstate/job/{job.pk}/change/")
    page.wait_for_selector("#jobstate-audit-trail table.jobstate-trail")
    broken = page.eval_on_selector_all(
        "#jobstate-audit-trail td:not(.jobstate-long), #jobstate-audit-trail th", _BROKEN_WORDS
    )
    assert broken == [], broken


@pytest.fixture(params=[True, False], ids=["with-a-long-target", "the-demo-s-names"])
def queues_page(live_server: Any, request: pytest.FixtureRequest) -> Iterator[tuple[Page, str]]:
    """The Queues page with the demo's queues (tasks in three queues, hub and executor
    jobs without one), and with a target as long as allowed beside them or not."""
    targets = [LONG_TARGET, "tasks:default"] if request.param else ["tasks:default"]
    for target in targets:
        for queue in ("default", "emails", "reports"):
            Job.objects.create(
                request_id=f"{queue}-{target[:10]}",
                target=target,
                task_path="tests.support.task_functions.add",
                queue_name=queue,
            )
    # Two-digit counts and ages, as the demo shows them.
    for target in ("demo.inhub", "demo.remote", "demo.setup"):
        for n in range(11):
            Job.objects.create(request_id=f"hub-{target}-{n}", target=target)
        Job.objects.create(request_id=f"hub-{target}-run", target=target, status=JobStatus.RUNNING)
    Job.objects.update(created_at=Now() - timedelta(seconds=41))
    # With the pause permission, as the demo's admin: each row has its button.
    make_operator("view_queuepause", "pause_queue")
    base = str(live_server).rstrip("/")
    with chromium_page() as page:
        log_in(page, base)
        yield page, base


def test_queue_names_stay_whole_and_the_page_fits(queues_page: tuple[Page, str]) -> None:
    """A long target broke "defa/ult"; with the demo's names alone the page was 402 px
    wide on a 390 px phone."""
    page, base = queues_page
    for size, viewport in SIZES.items():
        page.set_viewport_size(viewport)
        page.goto(f"{base}/admin/jobstate/queuepause/")
        page.wait_for_selector("#jobstate-queues")
        names = page.locator("#jobstate-queues td.jobstate-name").all_inner_texts()
        assert "emails" in names, names
        broken = page.eval_on_selector_all("#jobstate-queues td.jobstate-name", _BROKEN_WORDS)
        # The long target itself may break anywhere; the short names may not.
        assert [word for word in broken if len(word) < 20] == [], (size, broken)
        scroll = page.evaluate("document.documentElement.scrollWidth")
        assert scroll <= viewport["width"], (size, scroll)
