"""Cells of the console's lists: a value with a quieter second line, a long text cut
in its middle, an age with the instant in its tooltip. The lists are drawn for a
1440 px screen and a phone, so a cell holds what an operator scans and the rest is
on the row's page (styles in ``jobstate/static/jobstate/console.css``)."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

from jobstate.admin.display import relative_time

__all__ = ["age_cell", "breakable", "cut_middle", "cut_path", "one_line", "with_sub"]

#: Characters kept at each end of a text cut by :func:`cut_middle`.
KEPT_AT_EACH_END = 10


def cut_middle(text: str, keep: int = KEPT_AT_EACH_END) -> str:
    """``text`` with its middle replaced by an ellipsis when longer than two ``keep``:
    ids and request ids that share a prefix (a time, a host name) stay distinct."""
    if len(text) <= 2 * keep + 1:
        return text
    return f"{text[:keep]}…{text[-keep:]}"


def cut_path(path: str, limit: int) -> str:
    """A dotted path (a task's) in at most ``limit`` characters, cut at its start: its
    leading packages, alike from task to task, give way to an ellipsis and its last
    parts, which say what it is, stay whole (``…reports.build_report``). A last part
    longer than the room alone is cut in its middle (:func:`cut_middle`)."""
    if len(path) <= limit:
        return path
    parts = path.split(".")
    kept = parts.pop()
    if len(kept) + 1 > limit:
        keep = (limit - 1) // 2
        # No room for an end on each side of the ellipsis: the start, as it fits.
        return cut_middle(path, keep) if keep else path[:limit]
    while parts and len(parts[-1]) + len(kept) + 2 <= limit:
        kept = f"{parts.pop()}.{kept}"
    return f"…{kept}"


def breakable(text: str, marks: str = ".-:/", *, long_part: int | None = None) -> SafeString:
    """``text`` (a dotted path, a key) allowed to wrap after its dots, dashes, colons
    and slashes: a long name without spaces would otherwise widen its column past the
    screen. Underscores join words of one name, which stays whole unless ``marks``
    names them too. A part longer than ``long_part`` characters (a name of a hundred
    letters) may break anywhere (``.jobstate-long-part``), so a cell that keeps its
    short parts whole still fits the screen."""
    parts = re.split(f"(?<=[{re.escape(marks)}])", text) if marks else [text]
    shown = [
        format_html('<span class="jobstate-long-part">{}</span>', part)
        if long_part is not None and len(part) > long_part
        else escape(part)
        for part in parts
    ]
    # Escaped above; only <wbr> and the long parts' spans are added.
    return mark_safe("<wbr>".join(shown))


def one_line(shown: Any, whole: str) -> SafeString:
    """``shown`` on one line, cut with an ellipsis by the list's CSS, ``whole`` in the
    tooltip."""
    return format_html('<span class="jobstate-one-line" title="{}">{}</span>', whole, shown)


def with_sub(main: Any, sub: Any) -> SafeString | Any:
    """``main`` with ``sub`` on a quieter line under it (none when ``sub`` is empty)."""
    if not sub:
        return main
    return format_html('{}<span class="jobstate-sub">{}</span>', main, sub)


def age_cell(instant: datetime | None, now: datetime | None = None) -> SafeString | str:
    """How long ago ``instant`` was ("3 min ago"), the instant itself (seconds, the
    server's zone) in the tooltip."""
    if instant is None:
        return "—"
    local = timezone.localtime(instant) if timezone.is_aware(instant) else instant
    return format_html(
        '<time class="jobstate-age" datetime="{}" title="{}">{}</time>',
        instant.isoformat(),
        local.strftime("%Y-%m-%d %H:%M:%S %Z").strip(),
        relative_time(instant, now),
    )
