"""How the jobstate admin pages show values: status badges, JSON and long text
(redacted, folded when long) and lengths of time."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from django.urls import NoReverseMatch, reverse
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from jobstate.console.redaction import Redactor
from jobstate.console.redaction import redactor as make_redactor
from jobstate.core.bidi import isolated
from jobstate.stores.base import JobRunStatus, JobStatus, NotificationState
from jobstate.stores.contracts.audit import AuditSeverity

__all__ = [
    "BADGE_COLOURS",
    "choice_badge",
    "delivery_attempts_text",
    "job_link",
    "json_block",
    "moment",
    "relative_time",
    "short_duration",
    "short_id",
    "shortened_id",
    "status_badge",
    "text_block",
    "worker_link",
]

#: Text longer than this (lines or characters) is folded in a ``<details>`` element.
FOLD_LINES = 20
FOLD_CHARS = 2000

BADGE_COLOURS: dict[str, str] = {
    # Jobs
    JobStatus.QUEUED: "#6e7781",
    JobStatus.RUNNING: "#1f6feb",
    JobStatus.DISPATCHED: "#8250df",
    JobStatus.DONE: "#1a7f37",
    JobStatus.ERROR: "#cf222e",
    JobStatus.REJECTED: "#bc4c00",
    # Runs
    JobRunStatus.RUNNING: "#1f6feb",
    JobRunStatus.SUCCEEDED: "#1a7f37",
    JobRunStatus.FAILED: "#cf222e",
    JobRunStatus.TIMED_OUT: "#bc4c00",
    JobRunStatus.SKIPPED: "#6e7781",
    # Notifications
    NotificationState.PENDING: "#6e7781",
    NotificationState.DELIVERING: "#1f6feb",
    NotificationState.DELIVERED: "#1a7f37",
    NotificationState.DEAD: "#cf222e",
    # Audit severities
    AuditSeverity.INFO: "#1f6feb",
    AuditSeverity.WARNING: "#bc4c00",
    # AuditSeverity.ERROR is "error", the same key (and colour) as JobStatus.ERROR.
}


def status_badge(label: str | Promise, colour: str) -> SafeString:
    return format_html(
        '<span class="jobstate-badge" style="background:{};color:#fff;padding:1px 8px;'
        'border-radius:9px;font-size:11px;font-weight:600;white-space:nowrap">{}</span>',
        colour,
        label,
    )


def choice_badge(value: str, label: str | Promise) -> SafeString:
    """A badge for a status, state or severity value, coloured by :data:`BADGE_COLOURS`."""
    return status_badge(label, BADGE_COLOURS.get(value, "#6e7781"))


# --- JSON and long text ----------------------------------------------------------------


def _folded(text: str, css_class: str, preview: str) -> SafeString:
    lines = text.count("\n") + 1
    if lines <= FOLD_LINES and len(text) <= FOLD_CHARS:
        return format_html('<pre class="{}">{}</pre>', css_class, text)
    first = isolated(Truncator(preview).chars(80))
    size = ngettext(
        "%(lines)s line, %(chars)s characters",
        "%(lines)s lines, %(chars)s characters",
        lines,
    ) % {"lines": number_format(lines), "chars": number_format(len(text))}
    return format_html(
        '<details class="jobstate-fold"><summary><code>{}</code> … ({})</summary>'
        '<pre class="{}">{}</pre></details>',
        first,
        size,
        css_class,
        text,
    )


def json_block(value: Any, redactor: Redactor | None = None) -> SafeString | str:
    """``value`` as indented JSON in a ``<pre>``, redacted (by ``redactor``, default the
    redactor of ``value`` itself; see :mod:`jobstate.console.redaction`), and folded in a
    ``<details>`` element when long. ``None`` shows as a dash."""
    if value is None:
        return "—"
    shown = (redactor or make_redactor(value)).json(value)
    text = json.dumps(shown, indent=2, ensure_ascii=False)
    return _folded(text, "jobstate-json", json.dumps(shown, ensure_ascii=False))


def text_block(text: str | None, redactor: Redactor | None = None) -> SafeString | str:
    """Multi-line text (an error, a traceback) in a ``<pre>``, folded when long, with
    the hidden values of ``redactor`` (default: the configured secrets) masked."""
    if not text:
        return "—"
    text = (redactor or make_redactor()).text(text)
    return _folded(text, "jobstate-text", text.split("\n", 1)[0])


# --- time --------------------------------------------------------------------------------


def delivery_attempts_text(counted: int, listed: int) -> str:
    """A notification's attempts as its page says them beside the attempts it lists: a
    replay sets its count (``counted``) back to 0 and keeps the attempts made before
    (``listed``), so a replayed one says both ("3 since its last replay, 6 in all")."""
    if listed <= counted:
        return ngettext("%(n)d attempt", "%(n)d attempts", counted) % {"n": counted}
    return _("%(n)d since its last replay, %(all)d in all") % {"n": counted, "all": listed}


def short_duration(seconds: float) -> str:
    """A compact length of time for narrow columns: "45 s", "12 min", "3.5 h", "4 d"."""
    length = abs(seconds)
    if length < 60:
        return _("%(n)d s") % {"n": length}
    if length < 3600:
        return _("%(n)d min") % {"n": length // 60}
    if length < 36000:
        return _("%(n).1f h") % {"n": length / 3600}
    if length < 172800:
        return _("%(n)d h") % {"n": length // 3600}
    return _("%(n)d d") % {"n": length // 86400}


def relative_time(instant: datetime | None, now: datetime | None = None) -> str:
    """The time from ``now`` to ``instant``: "3 min ago", "in 3 min" (a dash for None)."""
    if instant is None:
        return "—"
    now = now or timezone.now()
    delta = (instant - now).total_seconds()
    if delta <= 0:
        return _("%(time)s ago") % {"time": short_duration(delta)}
    return _("in %(time)s") % {"time": short_duration(delta)}


def moment(instant: datetime | None, now: datetime | None = None) -> SafeString | str:
    """An instant, the one way every console page shows one: ``2026-12-02 15:30:12 UTC``
    (seconds included, in the server's zone) inside a ``<time>`` element whose
    ``datetime`` attribute carries the ISO instant, so the console's script can show it
    in the viewer's zone, and whose tooltip says how long ago (or ahead) it is. A dash
    for ``None``."""
    if instant is None:
        return "—"
    local = timezone.localtime(instant) if timezone.is_aware(instant) else instant
    return format_html(
        '<time class="jobstate-moment" datetime="{}" title="{}">{}</time>',
        instant.isoformat(),
        relative_time(instant, now),
        local.strftime("%Y-%m-%d %H:%M:%S %Z").strip(),
    )


#: Characters kept at each end of an id shortened by :func:`short_id`.
ID_HEAD = 4
ID_TAIL = 6


def shortened_id(value: object) -> str:
    """An id as :func:`short_id` shows it, as text: ``0193…a41f2c``, a short one whole."""
    text = str(value)
    if len(text) <= ID_HEAD + ID_TAIL + 2:
        return text
    return f"{text[:ID_HEAD]}…{text[-ID_TAIL:]}"


def job_link(url: str, job_id: object, name: str, shown: str | None = None) -> SafeString:
    """A job linked to its page by its name and its short id: two jobs of one task read
    alike by their name alone. The whole name and id are in the tooltip; ``shown`` is
    the name as cut to fit, the whole ``name`` when not given. The id is never cut."""
    return format_html(
        '<a href="{}" title="{} {}"><span class="jobstate-job-name">{}</span> <code>{}</code></a>',
        url,
        name,
        job_id,
        name if shown is None else shown,
        shortened_id(job_id),
    )


def short_id(value: object, url: str | None = None) -> SafeString | str:
    """A long id shortened in the middle (``0193…a41f2c``), the whole id in its tooltip
    and a copy button beside it; with ``url``, the shortened id links there. Ids of
    UUIDv7 share their first characters (they begin with their time), so the end is
    kept as well as the start: ids of one list stay distinct. Short values are shown
    whole; ``None`` as a dash."""
    if value is None or value == "":
        return "—"
    text = str(value)
    code = format_html("<code>{}</code>", shortened_id(text))
    if url:
        code = format_html('<a href="{}">{}</a>', url, code)
    return format_html(
        '<span class="jobstate-id" title="{}">{}'
        '<button type="button" class="jobstate-copy" data-copy="{}" aria-label="{}">'
        "⧉</button></span>",
        text,
        code,
        text,
        _("Copy %(id)s") % {"id": text},
    )


def worker_link(worker_id: str | None) -> SafeString | str:
    """A worker's (or executor's) name linked to its own page on the Workers page, through
    the page that finds it by id (``jobstate_worker_find``: no query until the link is
    followed, so a list of jobs links every name for free); the bare name when the
    Workers page is not registered, a dash when there is none."""
    if not worker_id:
        return "—"
    try:
        url = reverse("admin:jobstate_worker_find")
    except NoReverseMatch:
        return worker_id
    return format_html(
        '<a class="jobstate-worker" href="{}?{}">{}</a>',
        url,
        urlencode({"id": worker_id}),
        worker_id,
    )
