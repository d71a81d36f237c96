"""What every jobstate admin page shares: read-only bases, badges, JSON and time
renderings, exact search, and the confirmed-action machinery.

An operator action here is a Django admin action in two steps, like Django's own
"delete selected": choosing it shows a confirmation page listing the rows it will
change and the rows it will skip (and why); the page's form posts back with
``post=yes`` and the action then calls the store once per eligible row. Each store
call re-checks its row's condition in the database, so a row that changed between the
two steps is skipped and named rather than overwritten.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG, ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import Model, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.formats import number_format
from django.utils.functional import Promise
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.safestring import SafeString
from django.utils.text import Truncator
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from jobstate.admin.list_input import unapplied, unreadable_parameter
from jobstate.admin.paginator import EstimatedCountPaginator
from jobstate.admin.redaction import REDACTED, Redactor
from jobstate.admin.redaction import redactor as make_redactor
from jobstate.console.job_search import unreadable_text
from jobstate.stores.base import JobRunStatus, JobStatus, NotificationState
from jobstate.stores.contracts.audit import AuditSeverity
from jobstate.stores.contracts.validation import REJECT_REASON_LIMIT

__all__ = [
    "ACTION_ROW_LIMIT",
    "REDACTED",
    "REDACTOR_ATTRIBUTE",
    "ActionRow",
    "ActionSpec",
    "ReadOnlyAdmin",
    "RejectForm",
    "admin_change_url",
    "exact_search",
    "json_block",
    "relative_time",
    "row_redactor",
    "run_confirmed_action",
    "short_duration",
    "status_badge",
    "text_block",
]

logger = logging.getLogger("jobstate.admin")

#: Where :meth:`ScaledAdmin.redactor_for` keeps a row's redactor on the row object.
REDACTOR_ATTRIBUTE = "_jobstate_redactor"

#: The most rows one action may touch; a larger selection is refused, nothing changes.
ACTION_ROW_LIMIT = 500

#: Text longer than this (lines or characters) is folded in a ``<details>`` element.
FOLD_LINES = 20
FOLD_CHARS = 2000


class RejectForm(forms.Form):
    """The optional reason of a reject, on the single and the bulk confirmation pages."""

    reason = forms.CharField(
        label=gettext_lazy("Reason"),
        required=False,
        max_length=REJECT_REASON_LIMIT,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text=gettext_lazy("Stored as the jobs' error and in their audit entries."),
    )


#: How many skipped rows a message names before it says "and N more".
NAMED_IN_MESSAGE = 10

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
    first = Truncator(preview).chars(80)
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
    redactor of ``value`` itself; see :mod:`jobstate.admin.redaction`), and folded in a
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


# --- the database's clock ---------------------------------------------------------------

#: The annotation that carries the database's clock on rows an admin loads.
DATABASE_NOW = "database_now"


def with_database_now(queryset: QuerySet[Any]) -> QuerySet[Any]:
    """``queryset`` with the database's clock read by the same SELECT.

    Leases, heartbeats and lock expiries are written on the database's clock, so their
    age is judged on it too: the application server's clock may be skewed. The reading
    rides on the SELECT that loads the rows (a list's page, an action's selection, a
    change page's object): no extra query."""
    return queryset.annotate(**{DATABASE_NOW: Now()})


def database_now(row: Model) -> datetime:
    """The database's clock as read by the SELECT that loaded ``row``
    (see :func:`with_database_now`)."""
    now: datetime = getattr(row, DATABASE_NOW)
    return now


# --- links and search --------------------------------------------------------------------


def admin_change_url(model: type[Model], pk: Any, site_name: str = "admin") -> str:
    opts = model._meta
    return reverse(f"{site_name}:{opts.app_label}_{opts.model_name}_change", args=[pk])


def exact_search(
    queryset: QuerySet[Any],
    term: str,
    *,
    uuid_fields: Iterable[str] = (),
    int_fields: Iterable[str] = (),
    text_fields: Iterable[str] = (),
) -> QuerySet[Any]:
    """Rows where one of the fields equals ``term`` exactly: UUID fields when it parses
    as a UUID, integer fields when it is a 64-bit integer, text fields always. Exact
    matches use the tables' indexes; ``icontains`` would read every row."""
    term = term.strip()
    if not term:
        return queryset
    condition = Q()
    try:
        as_uuid = uuid.UUID(term)
    except ValueError:
        pass
    else:
        for name in uuid_fields:
            condition |= Q(**{name: as_uuid})
    try:
        as_int = int(term)
    except ValueError:
        pass
    else:
        if -(2**63) <= as_int < 2**63:
            for name in int_fields:
                condition |= Q(**{name: as_int})
    if len(term) <= 200:
        for name in text_fields:
            condition |= Q(**{name: term})
    if not condition:
        return queryset.none()
    return queryset.filter(condition)


def row_redactor(obj: Any, build: Callable[[], Redactor]) -> Redactor:
    """The redactor of one row, built by ``build`` on first use and kept on the row
    object (under :data:`REDACTOR_ATTRIBUTE`), so the page's fields share it."""
    cached: Redactor | None = getattr(obj, REDACTOR_ATTRIBUTE, None)
    if cached is None:
        cached = build()
        setattr(obj, REDACTOR_ATTRIBUTE, cached)
    return cached


# --- read-only bases -------------------------------------------------------------------


class ScaledAdmin(admin.ModelAdmin):
    """List settings every jobstate changelist shares so it stays fast on big tables:
    no full ``COUNT(*)`` (estimated or capped counts, no unfiltered second count), no
    facet counts, no date hierarchy."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    date_hierarchy = None
    list_per_page = 50

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        return self.search(queryset, search_term), False

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        """Narrow ``queryset`` to ``term``; subclasses call :func:`exact_search`."""
        return queryset

    #: The JSON fields of a row whose members under redacted keys are hidden, and whose
    #: values are masked in the row's text fields (see :mod:`jobstate.admin.redaction`).
    redaction_sources: tuple[str, ...] = ()

    def redactor_for(self, obj: Any) -> Redactor:
        """The redactor of ``obj``'s page, built once per row object."""
        return row_redactor(obj, lambda: self.build_redactor(obj))

    def build_redactor(self, obj: Any) -> Redactor:
        """The redactor of ``obj`` from its :attr:`redaction_sources`."""
        return make_redactor(*(getattr(obj, name) for name in self.redaction_sources))

    def user_can(self, request: HttpRequest, codename: str) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def operator(self, request: HttpRequest) -> str:
        """The name audit entries give the signed-in user."""
        return str(request.user.get_username())

    def require(self, request: HttpRequest, allowed: bool, *, asked: str) -> None:
        """Refuse (403) a request the user lacks a permission for, logging who
        ``asked`` for what, so a probe of the console's pages leaves a trace."""
        if not allowed:
            logger.warning("admin: %s asked %s", self.operator(request), asked)
            raise PermissionDenied

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        # An id no row can have (a NUL, which PostgreSQL refuses in a query) is a row
        # that does not exist: Django's "doesn't exist" message, not a server error.
        if unreadable_text(object_id) is not None:
            return None
        return super().get_object(request, object_id, from_field)

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The list; when a filter, the ordering or the page cannot be applied, Django
        shows the whole list (``?e=1``), and this says which parameters and why."""
        try:
            return super().get_changelist_instance(request)
        except IncorrectLookupParameters as exc:
            if ERROR_FLAG not in request.GET:
                self.message_user(request, unapplied(request, exc), messages.ERROR)
            raise

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        """Refuse a search or filter value no row can hold (a NUL character, a lone
        surrogate): an error message naming it and the whole list, as Django shows it
        for a filter it cannot apply (``?e=1``), never a server error.

        Refuse a POST naming an action the user may not run: an error message, the
        list again, nothing changed, and a warning in the ``jobstate.admin`` log.

        Django alone would answer "No action selected" (or just the list, when the
        user may run no action at all), which reads like an operator's slip rather
        than a refusal. Each action also checks its permission again when it runs."""
        unreadable = unreadable_parameter(request, self.opts.pk)
        if unreadable is not None:
            self.message_user(request, unreadable, messages.ERROR)
            return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
        if request.method == "POST":
            allowed = self.get_actions(request)
            # Cut: the value is whatever the request sent, and it goes to a log line.
            refused = [
                name[:100]
                for name in request.POST.getlist("action")
                if name and name not in allowed
            ]
            if refused:
                logger.warning(
                    "admin: %s posted the action %r on %s without its permission",
                    self.operator(request),
                    refused[0],
                    self.opts.label,
                )
                self.message_user(
                    request,
                    _("You may not run the action “%(action)s”; nothing was changed.")
                    % {"action": refused[0]},
                    messages.ERROR,
                )
                return HttpResponseRedirect(request.get_full_path())
        return super().changelist_view(request, extra_context)


class ReadOnlyAdmin(ScaledAdmin):
    """Viewable by anyone with the view permission; never added, edited or deleted here.
    Rows change only through the stores (and this admin's actions, which call them)."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    """History rows shown under their parent, never edited."""

    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


# --- confirmed actions -------------------------------------------------------------------


@dataclass(frozen=True)
class ActionRow:
    """One selected row as an action sees it."""

    obj: Any
    label: str
    """How the row is named on the page and in messages."""
    detail: str
    """What the operator needs to know about it (status, lease, owner...)."""
    skip_reason: str | None
    """``None`` when the action applies; otherwise why the row is skipped."""


@dataclass(frozen=True)
class ActionSpec:
    """An operator action: who may run it, what it applies to and what it does."""

    name: str
    """The action's method name on the ModelAdmin (the ``action`` POST value)."""
    permission: str
    """The ModelAdmin permission suffix: ``has_<permission>_permission``."""
    title: str | Promise
    intro: str | Promise
    confirm_label: str | Promise
    done: Callable[[int], str]
    """The success message for ``n`` rows changed."""
    row: Callable[[Any], ActionRow]
    perform: Callable[[HttpRequest, Any, dict[str, Any]], str | None]
    """Change one eligible row through the store; ``None`` when done, else why not."""
    form_class: type[forms.Form] | None = None
    """Extra inputs shown on the confirmation page (a reason, a comment)."""


def _named(items: list[tuple[str, str]]) -> str:
    shown = "; ".join(f"{label} ({why})" for label, why in items[:NAMED_IN_MESSAGE])
    rest = len(items) - NAMED_IN_MESSAGE
    if rest > 0:
        shown += " " + ngettext("and %(n)d more", "and %(n)d more", rest) % {"n": rest}
    return shown


def _return_to(request: HttpRequest) -> str:
    """Where a button outside the changelist (the job page) asks to come back to after
    the action; only a path on this site is honoured."""
    target = request.POST.get("_return_to", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return ""


def run_confirmed_action(
    model_admin: ScaledAdmin, request: HttpRequest, queryset: QuerySet[Any], spec: ActionSpec
) -> HttpResponse | None:
    """Show the confirmation page of ``spec`` for the selected rows, or (on the page's
    ``post=yes`` submit) perform it and report what changed and what was skipped.

    The permission is checked again here, so a forged POST by a user without it is
    refused even if the action list were bypassed. A selection of more than
    :data:`ACTION_ROW_LIMIT` rows is refused as a whole. Returns ``None`` (the
    changelist again) after the action, or a redirect to ``_return_to``.
    """
    allowed: Callable[[HttpRequest], bool] = getattr(
        model_admin, f"has_{spec.permission}_permission"
    )
    if not allowed(request):
        raise PermissionDenied
    opts = model_admin.opts
    objects = list(queryset[: ACTION_ROW_LIMIT + 1])
    if len(objects) > ACTION_ROW_LIMIT:
        model_admin.message_user(
            request,
            _(
                "Select at most %(limit)d %(items)s for one action; nothing was changed. "
                "Narrow the list with its filters first."
            )
            % {"limit": ACTION_ROW_LIMIT, "items": opts.verbose_name_plural},
            messages.ERROR,
        )
        return None
    rows = [spec.row(obj) for obj in objects]
    # Selected rows the list no longer shows (gone, or out of its filters by now).
    vanished: list[tuple[str, str]] = []
    if request.POST.get("select_across") != "1":
        present = {str(obj.pk) for obj in objects}
        vanished = [
            (str(pk), _("no longer in this list"))
            for pk in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            if pk not in present
        ]
    confirmed = request.POST.get("post") == "yes"
    form = spec.form_class(request.POST if confirmed else None) if spec.form_class else None
    if confirmed and (form is None or form.is_valid()):
        inputs = form.cleaned_data if form is not None else {}
        skipped = [(row.label, row.skip_reason) for row in rows if row.skip_reason] + vanished
        done = 0
        for row in rows:
            if row.skip_reason:
                continue
            why = spec.perform(request, row.obj, inputs)
            if why is None:
                done += 1
            else:
                skipped.append((row.label, why))
        if done:
            model_admin.message_user(request, spec.done(done), messages.SUCCESS)
        if skipped:
            model_admin.message_user(
                request,
                ngettext(
                    "Skipped %(count)d %(item)s: %(names)s.",
                    "Skipped %(count)d %(items)s: %(names)s.",
                    len(skipped),
                )
                % {
                    "count": len(skipped),
                    "item": opts.verbose_name,
                    "items": opts.verbose_name_plural,
                    "names": _named([(label, str(why)) for label, why in skipped]),
                },
                messages.WARNING,
            )
        if not done and not skipped:
            model_admin.message_user(request, _("Nothing was changed."), messages.WARNING)
        back = _return_to(request)
        return HttpResponseRedirect(back) if back else None
    eligible = [row for row in rows if not row.skip_reason]
    skipped_rows = [row for row in rows if row.skip_reason]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": spec.title,
        "subtitle": None,
        "intro": spec.intro,
        "opts": opts,
        "action_name": spec.name,
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "confirm_label": spec.confirm_label,
        "eligible": eligible,
        "skipped": skipped_rows,
        "vanished": vanished,
        "skipped_count": len(skipped_rows) + len(vanished),
        "form": form,
        "return_to": _return_to(request),
        "media": model_admin.media,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(
        request,
        [
            f"admin/{opts.app_label}/{opts.model_name}/action_confirmation.html",
            f"admin/{opts.app_label}/action_confirmation.html",
        ],
        context,
    )
