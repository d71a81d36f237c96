"""An operator at the demo's console, over HTTP: signs in to the admin of a running
server and uses its pages as a person would (the jobs list and its filters, the
confirmation pages of the actions, the bulk operations' pages, the Queues and
Schedules pages). Standard library only (``urllib`` with a cookie jar), so it drives
any live server: the one ``tests/demo/test_demo_live.py`` starts, or ``scripts/demo``'s own.
"""

from __future__ import annotations

import html
import http.cookiejar
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

_CSRF = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
_SELECTED = re.compile(r'name="_selected_action" value="([^"]+)"')
#: What a confirmation page says it showed of each row, sent back as a browser would.
_SEEN = re.compile(r'name="(_jobstate_seen:[^"]*)" value="([^"]*)"')
_MESSAGES = re.compile(r'<li class="(success|warning|error|info)">(.*?)</li>', re.S)
_PROGRESS = re.compile(r'href="(/admin/jobstate/job/bulk-operation/\d+/)"')


class ConsoleError(AssertionError):
    """A console page answered with something an operator would call broken: a server
    error, a page without its form, a refusal."""


@dataclass
class Page:
    url: str
    status: int
    text: str

    def messages(self) -> list[tuple[str, str]]:
        """The admin's messages on the page: (level, text)."""
        return [
            (level, html.unescape(re.sub(r"<[^>]+>", "", body)).strip())
            for level, body in _MESSAGES.findall(self.text)
        ]

    def csrf(self) -> str:
        found = _CSRF.search(self.text)
        if found is None:
            raise ConsoleError(f"{self.url}: no form on the page ({self.status})")
        return found[1]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are followed by :meth:`Console._open` itself, as GETs, like a browser."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


@dataclass
class Console:
    """A signed-in admin session against ``base`` (``http://127.0.0.1:<port>``)."""

    base: str
    timeout: float = 30.0
    jar: http.cookiejar.CookieJar = field(default_factory=http.cookiejar.CookieJar)

    def __post_init__(self) -> None:
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect()
        )

    def _open(self, path: str, data: dict[str, str | list[str]] | None = None) -> Page:
        url = urllib.parse.urljoin(self.base, path)
        for _hop in range(5):
            body = None
            headers = {"Referer": url}
            if data is not None:
                body = urllib.parse.urlencode(data, doseq=True).encode()
                headers["Content-Type"] = "application/x-www-form-urlencoded"
            request = urllib.request.Request(url, data=body, headers=headers)
            try:
                with self._opener.open(request, timeout=self.timeout) as answer:
                    return Page(url, answer.status, answer.read().decode())
            except urllib.error.HTTPError as error:
                if error.code in (301, 302, 303):
                    url = urllib.parse.urljoin(url, error.headers["Location"])
                    data = None
                    continue
                raise ConsoleError(
                    f"{url} answered {error.code}: {error.read()[:2000]!r}"
                ) from None
        raise ConsoleError(f"{url}: too many redirects")

    def get(self, path: str) -> Page:
        return self._open(path)

    def post(self, path: str, data: dict[str, str | list[str]], csrf_from: Page) -> Page:
        return self._open(path, {**data, "csrfmiddlewaretoken": csrf_from.csrf()})

    # --- signing in --------------------------------------------------------------------

    def log_in(self, username: str, password: str) -> Page:
        form = self.get("/admin/login/?next=/admin/")
        page = self.post(
            "/admin/login/?next=/admin/",
            {"username": username, "password": password, "next": "/admin/"},
            form,
        )
        if "/admin/login/" in page.url:
            raise ConsoleError(f"signing in as {username!r} failed")
        return page

    # --- jobs ----------------------------------------------------------------------------

    def job_ids(self, query: str) -> list[str]:
        """The ids of the jobs the jobs list shows for ``query`` (``status__exact=error``)."""
        page = self.get(f"/admin/jobstate/job/?{query}")
        return _SELECTED.findall(page.text)

    def _confirmed_action(self, changelist: str, action: str, ids: list[str], **extra: str) -> Page:
        """Select ``ids`` on ``changelist``, pick ``action``, then confirm on its page."""
        listing = self.get(changelist)
        chosen: dict[str, str | list[str]] = {"action": action, "_selected_action": ids}
        confirmation = self.post(changelist, {**chosen, "index": "0"}, listing)
        if 'id="jobstate-confirm-form"' not in confirmation.text:
            # Nothing to confirm: every row was skipped, or the list said why not.
            return confirmation
        shown = _SELECTED.findall(confirmation.text)
        seen = {
            html.unescape(name): html.unescape(value)
            for name, value in _SEEN.findall(confirmation.text)
        }
        return self.post(
            changelist,
            {"action": action, "_selected_action": shown, "post": "yes", **seen, **extra},
            confirmation,
        )

    def requeue_job(self, job_id: str) -> Page:
        """The job's page, its "Requeue…" button, and "Yes, requeue"."""
        self.get(f"/admin/jobstate/job/{job_id}/change/")
        return self._confirmed_action("/admin/jobstate/job/", "requeue_jobs", [job_id])

    def reject_jobs(self, ids: list[str], reason: str) -> Page:
        return self._confirmed_action("/admin/jobstate/job/", "reject_jobs", ids, reason=reason)

    def bulk(self, action: str, query: str, **extra: str) -> dict[str, object] | None:
        """ "<Action> all matching" from the jobs list filtered by ``query``: confirm, then
        step the operation to its end as its page's script does. Returns its progress,
        or ``None`` when nothing matched (the page has nothing to confirm)."""
        confirm = f"/admin/jobstate/job/bulk/{action}/?{query}"
        page = self.get(confirm)
        if 'id="jobstate-nothing"' in page.text:
            return None
        filter_query = re.search(r'name="_filter" value="([^"]*)"', page.text)
        if filter_query is None:
            raise ConsoleError(f"{confirm}: no confirmation form")
        progress = self.post(confirm, {"_filter": html.unescape(filter_query[1]), **extra}, page)
        operation = re.search(r"/admin/jobstate/job/bulk-operation/\d+/", progress.url)
        if operation is None:
            raise ConsoleError(f"{confirm}: no bulk operation started ({progress.messages()})")
        for _step in range(200):
            state = self._step(operation[0], progress)
            if state["state"] != "running":
                return state
        raise ConsoleError(f"{operation[0]} still running after 200 steps")

    def _step(self, path: str, page: Page) -> dict[str, object]:
        url = urllib.parse.urljoin(self.base, path)
        body = urllib.parse.urlencode({"step": "1", "csrfmiddlewaretoken": page.csrf()}).encode()
        request = urllib.request.Request(
            url,
            data=body,
            headers={"Accept": "application/json", "Referer": url, "X-Requested-With": "fetch"},
        )
        try:
            with self._opener.open(request, timeout=self.timeout) as answer:
                result: dict[str, object] = json.loads(answer.read())
                return result
        except urllib.error.HTTPError as error:
            raise ConsoleError(f"{url} answered {error.code}: {error.read()[:2000]!r}") from None

    # --- queues and schedules ------------------------------------------------------------

    def _queue_action(self, action: str, target: str, queue: str) -> Page:
        query = urllib.parse.urlencode({"target": target, "queue": queue})
        path = f"/admin/jobstate/queuepause/{action}/"
        page = self.get(f"{path}?{query}")
        return self.post(path, {"target": target, "queue": queue, "post": "yes"}, page)

    def pause_queue(self, target: str, queue: str = "") -> Page:
        return self._queue_action("pause", target, queue)

    def resume_queue(self, target: str, queue: str = "") -> Page:
        return self._queue_action("resume", target, queue)

    def run_schedule_now(self, key: str) -> Page:
        listing = self.get(f"/admin/jobstate/schedule/?q={urllib.parse.quote(key)}")
        ids = _SELECTED.findall(listing.text)
        if len(ids) != 1:
            raise ConsoleError(f"schedule {key!r}: the list shows {len(ids)} rows")
        return self._confirmed_action("/admin/jobstate/schedule/", "run_schedules_now", ids)
