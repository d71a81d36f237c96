"""The Queues page: per queue (a target and its queue name) the ready, delayed, running
and recently finished jobs and the age of the oldest ready job, and the operator's pause
and resume.

The page is the change list of :class:`~jobstate.models.QueuePause` (a row per paused
queue), so seeing it takes that model's view permission; pausing and resuming take the
permission of their own, ``jobstate.pause_queue``. Each goes through a confirmation page
(``GET`` shows what will happen, the page's form posts it), then through the state
store (``pause_queue`` / ``resume_queue``), which re-checks the queue in the database
(a queue paused meanwhile is "already paused") and writes a ``queue_paused`` or
``queue_resumed`` audit entry naming the operator in the same transaction. The page
refreshes itself in place (``jobstate/static/jobstate/live.js``).
"""

from __future__ import annotations

import logging
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.translation import gettext as _

from jobstate.admin.action_log import log_console_action
from jobstate.admin.common import ReadOnlyAdmin, permission_check, short_duration
from jobstate.admin.list_cells import breakable
from jobstate.console.queue_stats import QueueRow, keys_at_limit, queue_rows
from jobstate.core.bidi import isolated
from jobstate.core.states import NO_QUEUE
from jobstate.exceptions import InvalidJobState
from jobstate.models import QueuePause
from jobstate.stores import get_state_store
from jobstate.stores.contracts.fleet_part import parse_queue_key

__all__ = ["QueuePauseAdmin"]

logger = logging.getLogger("jobstate.admin")

_ACTIONS = ("pause", "resume")


@admin.register(QueuePause)
class QueuePauseAdmin(ReadOnlyAdmin):
    """The Queues page and its pause and resume pages."""

    has_pause_permission = permission_check("pause_queue")

    def get_urls(self) -> list[URLPattern]:
        wrap = self.admin_site.admin_view
        info = self.opts.app_label
        return [
            path("pause/", wrap(self.pause_view), name=f"{info}_queue_pause"),
            path("resume/", wrap(self.resume_view), name=f"{info}_queue_resume"),
            *super().get_urls(),
        ]

    # --- the page ----------------------------------------------------------------------

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Every queue and its figures. ``GET`` and ``HEAD`` only: it changes nothing."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        rows = queue_rows()
        context = {
            **self.admin_site.each_context(request),
            "title": _("Queues"),
            "subtitle": None,
            "opts": self.opts,
            "rows": [_shown(row) for row in rows],
            "full_keys": keys_at_limit(),
            "can_pause": self.has_pause_permission(request),
            "job_changelist_url": reverse(f"{self.admin_site.name}:jobstate_job_changelist"),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/jobstate/queues.html", context)

    # --- pause and resume ---------------------------------------------------------------

    def pause_view(self, request: HttpRequest) -> HttpResponse:
        return self._confirmed(request, "pause")

    def resume_view(self, request: HttpRequest) -> HttpResponse:
        return self._confirmed(request, "resume")

    def _confirmed(self, request: HttpRequest, action: str) -> HttpResponse:
        """The confirmation page of ``action`` (``GET``), or the action itself (the
        page's ``POST`` with ``post=yes``). The permission is checked on both steps, so a
        forged ``POST`` without it is refused and changes nothing."""
        # The page shows the queue's figures, so it takes the Queues page's view
        # permission as well as the pause permission.
        self.require(
            request,
            self.has_view_permission(request),
            asked=f"to {action} a queue without the view permission",
        )
        self.require(
            request,
            self.has_pause_permission(request),
            asked=f"to {action} a queue without the pause_queue permission",
        )
        if request.method not in ("GET", "POST"):
            return HttpResponseNotAllowed(["GET", "POST"])
        queues_url = reverse(f"{self.admin_site.name}:jobstate_queuepause_changelist")
        given: QueryDict = request.POST if request.method == "POST" else request.GET
        if not given.get("target"):
            # A link or form that names no queue: say so in the operator's words rather
            # than the store's argument check.
            self.message_user(
                request,
                _("Nothing was changed: no queue was named. Use a queue's button on this page."),
                messages.ERROR,
            )
            return HttpResponseRedirect(queues_url)
        try:
            target, queue = parse_queue_key(given.get("target"), given.get("queue", NO_QUEUE))
        except InvalidJobState as exc:
            self.message_user(
                request, _("Nothing was changed: %(why)s") % {"why": exc}, messages.ERROR
            )
            return HttpResponseRedirect(queues_url)
        label = _queue_label(target, queue)
        if request.method == "POST" and request.POST.get("post") == "yes":
            store = get_state_store()
            by = self.operator(request)
            pauses = QueuePause.objects.filter(target=target, queue_name=queue)
            if action == "pause":
                with transaction.atomic():
                    changed = store.pause_queue(target=target, queue=queue, by=by)
                    if changed:
                        log_console_action(request, pauses, _("Paused the queue"))
                done, unchanged = (
                    _("Paused %(queue)s."),
                    _("Queue %(queue)s was already paused; nothing was changed."),
                )
            else:
                with transaction.atomic():
                    paused = list(pauses)
                    changed = store.resume_queue(target=target, queue=queue, by=by)
                    if changed:
                        log_console_action(request, paused, _("Resumed the queue"), deleted=True)
                done, unchanged = (
                    _("Resumed %(queue)s."),
                    _("Queue %(queue)s was not paused; nothing was changed."),
                )
            if changed:
                self.message_user(request, done % {"queue": label}, messages.SUCCESS)
            else:
                self.message_user(request, unchanged % {"queue": label}, messages.WARNING)
            return HttpResponseRedirect(queues_url)
        matching = queue_rows(target=target, queue=queue)
        row = matching[0] if matching else QueueRow(target=target, queue=queue)
        context = {
            **self.admin_site.each_context(request),
            "title": _("Pause a queue") if action == "pause" else _("Resume a queue"),
            "subtitle": None,
            "opts": self.opts,
            "action": action,
            "row": _shown(row),
            "label": label,
            "already": row.paused if action == "pause" else not row.paused,
            # A queue no job of which is in the database: a typo in a hand-made link,
            # or a queue paused before its first job.
            "unknown": not matching,
            "queues_url": queues_url,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/jobstate/queue_confirmation.html", context)


def _queue_label(target: str, queue: str) -> str:
    # Isolated: a right-to-left override in a name would reverse the sentence around it.
    shown = isolated(queue) if queue != NO_QUEUE else _("(no queue)")
    return f"{isolated(target)} / {shown}"


def _shown(row: QueueRow) -> dict[str, Any]:
    return {
        "row": row,
        "label": _queue_label(row.target, row.queue),
        # On a phone a name wraps after its dots and colons before anywhere else.
        "target": breakable(row.target),
        "queue": breakable(row.queue) if row.queue else "—",
        "oldest": short_duration(row.oldest_ready_seconds) if row.oldest_ready_at else "—",
    }
