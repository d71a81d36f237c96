"""The admin's own log of what jobstate's console actions changed: a ``LogEntry`` per
object, which Django's index page lists under "Recent actions" and each object's
history page shows. The audit ledger stays the record of the jobs' transitions; this is
the admin's account of who pressed what.

``LogEntry.objects.log_actions`` is the one API Django 5.1 and later have in common
(``ModelAdmin.log_deletion`` is gone in 6.0), so the entries are written through it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.admin.models import CHANGE, DELETION, LogEntry
from django.http import HttpRequest

__all__ = ["log_console_action"]


def log_console_action(
    request: HttpRequest, objects: Iterable[Any], message: str, *, deleted: bool = False
) -> None:
    """One ``LogEntry`` per object (a change, or a deletion when the action removed
    it) naming the request's user and ``message``; nothing for an anonymous request."""
    user_id = getattr(request.user, "pk", None)
    rows = list(objects)
    if user_id is None or not rows:
        return
    LogEntry.objects.log_actions(user_id, rows, DELETION if deleted else CHANGE, message)
