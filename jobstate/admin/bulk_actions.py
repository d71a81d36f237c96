"""Bulk actions over a filter of the jobs list: "requeue all matching", "reject (cancel)
all matching" and "delete all finished matching".

The jobs list links to a confirmation page carrying the list's filter and search; it
shows how many jobs match and what the filter is. Confirming records a
:class:`~jobstate.models.BulkOperation` (:func:`jobstate.console.bulk.start_bulk_operation`)
and opens its progress page, whose script posts "step" after "step" (each runs batches
for about 1.5 s through :func:`jobstate.console.bulk.advance_bulk_operation`) until it is done;
without a script a button does the same. Each page and each step checks the action's
permission; a read-only user gets 403. The operations are listed (read-only) under
"Bulk operations", from where an interrupted one is resumed.
"""

from __future__ import annotations

import logging
from typing import Any, NoReturn

from django.contrib import admin, messages
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import (
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    JsonResponse,
    QueryDict,
)
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from jobstate.admin.action_log import log_console_action
from jobstate.admin.common import (
    SEEN_FIELD,
    ReadOnlyAdmin,
    RejectForm,
    ScaledAdmin,
    choice_badge,
)
from jobstate.admin.display import moment
from jobstate.admin.filters import OfferedChoicesFilter
from jobstate.admin.page_bases import moment_field, redirect_with_query
from jobstate.console.bulk import (
    BulkOperationFinished,
    advance_bulk_operation,
    applicable_jobs,
    cancel_bulk_operation,
    latest_operation_id,
    running_twin,
    start_bulk_operation,
    twin_since,
)
from jobstate.console.job_search import (
    FILTER_PARAMETERS,
    SEARCH_PARAMETER,
    SearchError,
    bounded_search,
    filter_jobs,
)
from jobstate.models import BulkAction, BulkOperation, BulkState, Job

__all__ = ["BulkOperationAdmin", "bulk_links", "bulk_urls"]

logger = logging.getLogger("jobstate.admin")

#: Parameters of the jobs list's URL that do not narrow it (ordering, page, "show all",
#: the "incorrect lookup" note, facets).
_NOT_FILTERS = {"o", "p", "all", "e", "_facets"}

#: The confirmation form's field that carries the newest operation's id as the page
#: was shown: what tells the form sent again from a new confirmation.
OPERATIONS_SEEN_FIELD = f"{SEEN_FIELD}operations"

#: The permission suffix (``has_<suffix>_permission`` on the job admin) of each action.
PERMISSIONS = {
    BulkAction.REQUEUE: "requeue",
    BulkAction.REJECT: "reject",
    BulkAction.DELETE: "delete_finished",
}

TITLES = {
    BulkAction.REQUEUE: gettext_lazy("Requeue all matching jobs"),
    BulkAction.REJECT: gettext_lazy("Reject (cancel) all matching queued jobs"),
    BulkAction.DELETE: gettext_lazy("Delete all finished matching jobs"),
}

INTROS = {
    BulkAction.REQUEUE: gettext_lazy(
        "Finished jobs (done, error, rejected) and running or dispatched jobs whose lease "
        "has expired go back to the queue, each with a “rerun” audit entry naming you."
    ),
    BulkAction.REJECT: gettext_lazy(
        "Queued jobs become rejected and are never claimed, each with a “rejected” audit "
        "entry naming you and the reason."
    ),
    BulkAction.DELETE: gettext_lazy(
        "Finished jobs (done, error, rejected) are deleted, each with a “deleted” audit "
        "entry naming you; the audit entries of a deleted job stay."
    ),
}


def list_filters(query: QueryDict) -> tuple[dict[str, str], str]:
    """The filter parameters and the search of a jobs list URL's query; a parameter the
    list does not know raises :class:`~jobstate.console.job_search.SearchError`."""
    filters: dict[str, str] = {}
    search = ""
    for name in query:
        value = query.get(name, "")
        if len(query.getlist(name)) > 1 and name not in _NOT_FILTERS:
            # The list refuses it too: both must act on one set of jobs.
            raise SearchError(
                _("The filter “%(name)s” is given more than once.") % {"name": name[:50]}
            )
        if name == SEARCH_PARAMETER:
            search = value
        elif name in FILTER_PARAMETERS:
            if value:
                filters[name] = value
        elif name not in _NOT_FILTERS:
            raise SearchError(_("The jobs list has no filter “%(name)s”.") % {"name": name[:50]})
    return filters, search


def describe_filter(filters: dict[str, str], search: str) -> list[str]:
    described = [f"{name.removesuffix('__exact')} = {value}" for name, value in filters.items()]
    if search:
        described.append(_("search: %(search)s") % {"search": search})
    return described or [_("no filter: every job")]


def bulk_links(model_admin: ScaledAdmin, request: HttpRequest) -> list[dict[str, str]]:
    """The jobs list's links to the bulk actions the user may run, with its filter."""
    query = request.GET.copy()
    for name in _NOT_FILTERS:
        query.pop(name, None)
    suffix = f"?{query.urlencode()}" if query else ""
    links = []
    for action, permission in PERMISSIONS.items():
        if getattr(model_admin, f"has_{permission}_permission")(request):
            url = reverse(f"{model_admin.admin_site.name}:jobstate_job_bulk", args=[action])
            links.append({"action": action, "label": str(TITLES[action]), "url": url + suffix})
    return links


def _require(model_admin: ScaledAdmin, request: HttpRequest, action: str) -> None:
    """The action's permission and the jobs' view permission: the confirmation counts
    the jobs matching any search, and the operation then acts on jobs the user would
    otherwise not see."""
    if action not in PERMISSIONS:
        # No such page, for anyone: the actions' names are the console's, not secrets.
        raise Http404(_("There is no bulk action “%(action)s”.") % {"action": action[:50]})
    model_admin.require(
        request,
        model_admin.has_view_permission(request),
        asked=f"for a bulk {action} without the view permission on jobs",
    )
    if not getattr(model_admin, f"has_{PERMISSIONS[BulkAction(action)]}_permission")(request):
        raise PermissionDenied


def confirm_view(model_admin: ScaledAdmin, request: HttpRequest, action: str) -> HttpResponse:
    """GET: the count and the filter; POST: record the operation and go to its page."""
    _require(model_admin, request, action)
    changelist = reverse(f"{model_admin.admin_site.name}:jobstate_job_changelist")
    if request.method == "GET":
        query = request.GET
    elif request.method == "POST":
        # The confirmation form carries the filter the page showed.
        query = QueryDict(request.POST.get("_filter", ""))
    else:
        return HttpResponseNotAllowed(["GET", "POST"])
    # Back to the list with what it can use, which it then shows without a word: sent
    # what the bulk page refused, it would refuse it again under this page's message.
    try:
        filters, search = list_filters(query)
        rows = filter_jobs(Job.objects.all(), filters)
    except SearchError as exc:
        # The whole list, as the list shows a filter it cannot apply.
        _say_nothing_started(model_admin, request, exc)
        return HttpResponseRedirect(f"{changelist}?{ERROR_FLAG}=1")
    try:
        bounded_search(search)
    except SearchError as exc:
        # The list as the operator filtered it, without the search: too long to give
        # back (and the list would refuse it again).
        kept = query.copy()
        kept.pop(SEARCH_PARAMETER, None)
        _say_nothing_started(model_admin, request, exc)
        return redirect_with_query(changelist, kept.urlencode())
    try:
        # The page's count; the operation counts again, on the database's clock, when it
        # is recorded.
        count = applicable_jobs(filter_jobs(rows, {}, search), action).count()
    except SearchError:
        # Back to the list as the operator filtered and searched, to correct the search
        # there: the list says what it cannot read in it.
        model_admin.message_user(request, _("Nothing was started."), messages.ERROR)
        return redirect_with_query(changelist, query.urlencode())
    form = RejectForm(request.POST if request.method == "POST" else None)
    if request.method == "POST" and form.is_valid():
        reason = form.cleaned_data.get("reason", "") if action == BulkAction.REJECT else ""
        asked: dict[str, Any] = {
            "action": action,
            "filters": filters,
            "search": search,
            "operator": model_admin.operator(request),
            "reason": reason,
        }
        with transaction.atomic():
            operation = _started_from_this_page(request, asked) or running_twin(**asked)
            if operation is not None and operation.state != BulkState.RUNNING:
                model_admin.message_user(
                    request,
                    format_html(
                        '{} <a href="{}">{}</a> ({}). {}',
                        _("This operation already ran:"),
                        _progress_url(model_admin, operation),
                        _("bulk operation #%(id)d") % {"id": operation.pk},
                        operation.get_state_display(),
                        _("Nothing more was started."),
                    ),
                    messages.WARNING,
                )
            elif operation is not None:
                model_admin.message_user(
                    request,
                    _("This operation is already running; nothing more was started."),
                    messages.WARNING,
                )
            else:
                operation = start_bulk_operation(**asked)
                # One entry for the operation: its jobs are many, and its page lists them.
                described = "; ".join(describe_filter(filters, search))
                log_console_action(
                    request, [operation], f"{TITLES[BulkAction(action)]}: {described}"
                )
        return HttpResponseRedirect(_progress_url(model_admin, operation))
    context = {
        **model_admin.admin_site.each_context(request),
        "title": TITLES[BulkAction(action)],
        "subtitle": None,
        "opts": model_admin.opts,
        "intro": INTROS[BulkAction(action)],
        "action": action,
        "count": count,
        "filter_lines": describe_filter(filters, search),
        "filter_query": query.urlencode(),
        "seen_field": OPERATIONS_SEEN_FIELD,
        "seen_operation": latest_operation_id(),
        "form": form if action == BulkAction.REJECT else None,
        "changelist_url": changelist + (f"?{query.urlencode()}" if query else ""),
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/jobstate/bulk_confirmation.html", context)


def _say_nothing_started(model_admin: ScaledAdmin, request: HttpRequest, why: SearchError) -> None:
    # Prefixed: the page capitalises a message's first letter, which would change a
    # search field's name ("input:") at the start of the reason.
    model_admin.message_user(
        request, _("Nothing was started: %(why)s") % {"why": why}, messages.ERROR
    )


def _started_from_this_page(request: HttpRequest, asked: dict[str, Any]) -> BulkOperation | None:
    """The operation this confirmation form already started, when it is sent again (the
    back button, then the submit): the form carries the newest operation's id as the
    page was shown (:data:`OPERATIONS_SEEN_FIELD`), and one with the same action,
    filter, search and operator recorded since is this form's. ``None`` for a form
    without it (an older page, a hand-made request)."""
    seen = request.POST.get(OPERATIONS_SEEN_FIELD, "")
    # ASCII digits only, and short enough to be an id.
    if not (seen.isascii() and seen.isdigit() and len(seen) <= 19):
        return None
    return twin_since(
        action=asked["action"],
        filters=asked["filters"],
        search=asked["search"],
        operator=asked["operator"],
        after=int(seen),
    )


def _progress_url(model_admin: ScaledAdmin, operation: BulkOperation) -> str:
    return reverse(f"{model_admin.admin_site.name}:jobstate_job_bulk_progress", args=[operation.pk])


def progress_view(model_admin: ScaledAdmin, request: HttpRequest, pk: int) -> HttpResponse:
    """GET: the operation's progress; POST ``step``: run batches for about 1.5 s (JSON
    for the page's script, a redirect otherwise); POST ``stop``: cancel it."""
    operation = get_object_or_404(BulkOperation, pk=pk)
    if request.method == "GET":
        if not model_admin.has_view_permission(request):
            raise PermissionDenied
    elif request.method == "POST":
        _require(model_admin, request, operation.action)
        if "stop" in request.POST:
            try:
                operation = cancel_bulk_operation(operation.pk, by=model_admin.operator(request))
            except BulkOperationFinished as exc:
                model_admin.message_user(request, str(exc), messages.WARNING)
        else:
            try:
                operation = advance_bulk_operation(operation.pk)
            except SearchError as exc:
                # A filter recorded under older search rules that no longer reads.
                message = _("This operation's filter cannot be read: %(why)s Stop it.") % {
                    "why": exc
                }
                model_admin.message_user(request, message, messages.ERROR)
                if request.headers.get("Accept", "").startswith("application/json"):
                    return JsonResponse({**_progress(operation), "error": message}, status=400)
                return HttpResponseRedirect(request.path)
        if request.headers.get("Accept", "").startswith("application/json"):
            return JsonResponse(_progress(operation))
        return HttpResponseRedirect(request.path)
    else:
        return HttpResponseNotAllowed(["GET", "POST"])
    may_run = getattr(model_admin, f"has_{PERMISSIONS[BulkAction(operation.action)]}_permission")(
        request
    )
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Bulk operation #%(id)d: %(action)s")
        % {"id": operation.pk, "action": operation.get_action_display()},
        "subtitle": None,
        "opts": model_admin.opts,
        "operation": operation,
        "progress": _progress(operation),
        "filter_lines": describe_filter(operation.filters, operation.search),
        # As every console page shows an instant: with seconds and its zone.
        "cutoff": moment(operation.cutoff),
        "may_run": may_run,
        "changelist_url": reverse(f"{model_admin.admin_site.name}:jobstate_job_changelist"),
        "matching_url": _matching_url(model_admin, operation),
        "audit_url": reverse(f"{model_admin.admin_site.name}:jobstate_auditentry_changelist")
        + f"?bulk={operation.pk}",
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, "admin/jobstate/bulk_progress.html", context)


def _matching_url(model_admin: ScaledAdmin, operation: BulkOperation) -> str:
    """The jobs list with the operation's filter and search: what it matches now (the
    jobs it changed no longer match a requeue's or reject's status filter)."""
    query = QueryDict(mutable=True)
    query.update(operation.filters)
    if operation.search:
        query[SEARCH_PARAMETER] = operation.search
    changelist = reverse(f"{model_admin.admin_site.name}:jobstate_job_changelist")
    return f"{changelist}?{query.urlencode()}" if query else changelist


def _progress(operation: BulkOperation) -> dict[str, Any]:
    processed = operation.processed
    total = max(operation.total, processed)
    return {
        "id": operation.pk,
        "state": operation.state,
        "total": operation.total,
        "done": operation.done,
        "skipped": operation.skipped,
        "percent": 100
        if operation.state != BulkState.RUNNING
        else (int(100 * processed / total) if total else 0),
    }


def bulk_urls(model_admin: ScaledAdmin) -> list[Any]:
    from django.urls import path

    site = model_admin.admin_site
    return [
        path(
            "bulk/<str:action>/",
            site.admin_view(lambda request, action: confirm_view(model_admin, request, action)),
            name="jobstate_job_bulk",
        ),
        path(
            "bulk-operation/<int:pk>/",
            site.admin_view(lambda request, pk: progress_view(model_admin, request, pk)),
            name="jobstate_job_bulk_progress",
        ),
        # Anything else under it is no operation: a 404, rather than the admin's own
        # fallback, which would look the text up as a job's id ("Job with ID
        # “bulk-operation/abc” doesn't exist").
        path(
            "bulk-operation/<path:rest>",
            site.admin_view(lambda request, rest: _no_such_operation(rest)),
        ),
    ]


def _no_such_operation(rest: str) -> NoReturn:
    raise Http404(_("There is no bulk operation “%(rest)s”.") % {"rest": rest[:40]})


@admin.register(BulkOperation)
class BulkOperationAdmin(ReadOnlyAdmin):
    """The bulk operations, read-only; each links to its progress page (where one that
    stopped half-way, e.g. when its browser tab closed, is resumed)."""

    list_display = [
        "id",
        "action",
        "state_display",
        "operator",
        "total",
        "done",
        "skipped",
        "created",
        "progress_link",
    ]
    list_filter = [("action", OfferedChoicesFilter), ("state", OfferedChoicesFilter)]
    phone_hidden_columns = ("operator", "skipped", "created")
    empty_list_text = gettext_lazy(
        "No bulk operations. One is recorded when an operator requeues, rejects or "
        "deletes every job a filter matches (the buttons above the jobs list); its page "
        "shows its progress and resumes it."
    )
    created = moment_field("created_at", gettext_lazy("created"))
    ordering = ["-id"]

    @admin.display(description=gettext_lazy("state"), ordering="state")
    def state_display(self, operation: BulkOperation) -> SafeString:
        colour = {"running": "running", "done": "done", "cancelled": "rejected"}[operation.state]
        return choice_badge(colour, operation.get_state_display())

    @admin.display(description=gettext_lazy("progress"))
    def progress_link(self, operation: BulkOperation) -> SafeString:
        url = reverse(f"{self.admin_site.name}:jobstate_job_bulk_progress", args=[operation.pk])
        label = _("resume") if operation.state == BulkState.RUNNING else _("show")
        return format_html('<a href="{}">{}</a>', url, label)
