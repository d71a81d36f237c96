"""The bases every jobstate admin page builds on: changelists that stay fast on big
tables and pages that never edit a row, with what they share per row (the database's
clock, exact search, the row's redactor, links to other rows)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from types import MethodType
from typing import TYPE_CHECKING, Any

from django.contrib import admin, messages
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ERROR_FLAG, ChangeList
from django.core.exceptions import PermissionDenied
from django.db.models import DateTimeField, Model, Q, QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.http import MAX_URL_REDIRECT_LENGTH
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from jobstate.admin.display import json_block, moment, text_block
from jobstate.admin.list_input import (
    filter_parameters,
    repeated_parameter,
    unapplied,
    unreadable_parameter,
    unusable_page,
)
from jobstate.admin.paginator import EstimatedCountPaginator
from jobstate.console.job_search import SearchError, bounded_search, unreadable_text
from jobstate.console.redaction import Redactor
from jobstate.console.redaction import redactor as make_redactor

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

__all__ = [
    "DATABASE_NOW",
    "REDACTOR_ATTRIBUTE",
    "ReadOnlyAdmin",
    "ReadOnlyInline",
    "ScaledAdmin",
    "admin_change_url",
    "database_now",
    "exact_search",
    "moment_field",
    "permission_check",
    "redacted_field",
    "redirect_with_query",
    "row_redactor",
    "search_refused",
    "with_database_now",
]

logger = logging.getLogger("jobstate.admin")

#: Where :meth:`ScaledAdmin.redactor_for` keeps a row's redactor on the row object.
REDACTOR_ATTRIBUTE = "_jobstate_redactor"

#: Set on a request whose list refused its search (see :func:`search_refused`).
_SEARCH_REFUSED = "_jobstate_search_refused"


def search_refused(request: HttpRequest) -> bool:
    """Whether the list answering ``request`` refused its search, and so listed
    nothing: what acts on the list (the jobs list's bulk links) is not offered then."""
    return bool(getattr(request, _SEARCH_REFUSED, False))


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


def redirect_with_query(path: str, query: str) -> HttpResponseRedirect:
    """A redirect to ``path?query``, or to ``path`` alone when that would be longer than
    Django lets a redirect be (``MAX_URL_REDIRECT_LENGTH``; longer, it raises
    ``DisallowedRedirect``): a query that long was pasted or forged, and the page then
    opens without it. The caller's message says why the page was left."""
    url = f"{path}?{query}" if query else path
    return HttpResponseRedirect(url if len(url) <= MAX_URL_REDIRECT_LENGTH else path)


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


class _RefusedWithErrorFlag(Exception):
    """A list URL carrying Django's ``?e=1`` with parameters the list cannot apply:
    not Django's :class:`IncorrectLookupParameters`, which its list answers with the
    "Database error" page when ``?e=1`` is given."""


class ScaledAdmin(admin.ModelAdmin):
    """List settings every jobstate changelist shares so it stays fast on big tables:
    no full ``COUNT(*)`` (estimated or capped counts, no unfiltered second count), no
    facet counts, no date hierarchy."""

    paginator = EstimatedCountPaginator
    object_history_template = "admin/jobstate/object_history.html"
    # An empty value as the console's own cells show one (Django's default is "-").
    empty_value_display = "—"
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    date_hierarchy = None
    list_per_page = 50

    def __init__(self, model: type[Model], admin_site: admin.AdminSite) -> None:
        super().__init__(model, admin_site)
        # Every instant of the model that a page names as it is (a column or a read-only
        # field) shows as every console instant does (moment: seconds, one format, the
        # viewer's zone), through a ``<name>_moment`` twin: the admin renders a model
        # field itself before it looks at the ModelAdmin, so the twin takes its place.
        self.instant_fields = {
            field.name: field
            for field in model._meta.concrete_fields
            if isinstance(field, DateTimeField)
        }
        for name, field in self.instant_fields.items():
            if not hasattr(self, f"{name}_moment"):
                shown = moment_field(name, field.verbose_name)
                setattr(self, f"{name}_moment", MethodType(shown, self))

    def as_moments(self, names: Sequence[Any]) -> list[Any]:
        """``names`` with each instant of the model replaced by its ``_moment`` twin
        (rows of a fieldset, given as tuples, too)."""
        return [
            tuple(self.as_moments(name))
            if isinstance(name, list | tuple)
            else (f"{name}_moment" if name in self.instant_fields else name)
            for name in names
        ]

    def get_list_display(self, request: HttpRequest) -> Any:
        return self.as_moments(super().get_list_display(request))

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        return [
            (title, {**options, "fields": self.as_moments(options["fields"])})
            for title, options in super().get_fieldsets(request, obj)
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        names = list(super().get_readonly_fields(request, obj))
        return [*names, *(f"{name}_moment" for name in names if name in self.instant_fields)]

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        # The twins keep their model field's help text under them.
        kwargs.setdefault(
            "help_texts",
            {f"{name}_moment": field.help_text for name, field in self.instant_fields.items()},
        )
        return super().get_form(request, obj, change, **kwargs)

    #: Columns of ``list_display`` left out on a phone (a viewport under 768 px): the
    #: ones an operator scans first stay; the rest are on each row's page.
    phone_hidden_columns: tuple[str, ...] = ()
    #: What an empty list says: what would be listed here and how rows get here.
    empty_list_text: StrOrPromise = gettext_lazy("Nothing is recorded here yet.")

    class Media:
        # The console's stylesheet and script (ids, instants, the filter toggle) on
        # every page of a jobstate admin: its lists, its row pages, its actions.
        css = {"all": ["jobstate/console.css"]}
        js = ["jobstate/console.js"]

    def get_search_results(
        self, request: HttpRequest, queryset: QuerySet[Any], search_term: str
    ) -> tuple[QuerySet[Any], bool]:
        """The list narrowed by :meth:`search`. A search the list cannot read (longer
        than any list reads, see :func:`~jobstate.console.job_search.bounded_search`)
        is refused before any query: an error message says why, and no row is listed.
        A list without a search box ignores ``q``, as Django's does."""
        if not self.get_search_fields(request):
            return queryset, False
        try:
            term = bounded_search(search_term)
        except SearchError as exc:
            # Every list's limit, said in the same words on every list: a list's
            # search help (search_refusal) is for a search it cannot read.
            self.message_user(request, str(exc), messages.ERROR)
            setattr(request, _SEARCH_REFUSED, True)
            return queryset.none(), False
        try:
            return self.search(queryset, term), False
        except SearchError as exc:
            self.message_user(request, self.search_refusal(exc), messages.ERROR)
            setattr(request, _SEARCH_REFUSED, True)
            return queryset.none(), False

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        """Narrow ``queryset`` to ``term`` (stripped, at most ``SEARCH_LIMIT``
        characters); subclasses call :func:`exact_search`, or raise
        :class:`~jobstate.console.job_search.SearchError` for a search they cannot
        read."""
        return queryset

    def search_refusal(self, exc: SearchError) -> str:
        """What the list says when it refuses a search."""
        return str(exc)

    #: The JSON fields of a row whose members under redacted keys are hidden, and whose
    #: values are masked in the row's text fields (see :mod:`jobstate.console.redaction`).
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

    def lookup_allowed(self, lookup: str, value: str, request: HttpRequest | None = None) -> bool:
        """Only the parameters of the list's own filters (see
        :func:`~jobstate.admin.list_input.filter_parameters`)."""
        if request is None:
            return False
        return lookup in filter_parameters(self, request)

    def get_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The list; when a filter, the ordering or the page cannot be applied, Django
        shows the whole list (``?e=1``), and this says which parameters and why. A
        lookup that is none of the list's filters is such a parameter too, rather than
        Django's "Bad Request". So is a page number that is no number, which Django
        would read as the first page without a word.

        Django takes ``?e=1`` given with parameters it cannot apply for a broken
        database ("Database error"); here it is the whole list with the same message
        (see :meth:`changelist_view`): such a URL was forged or edited by hand."""
        try:
            return self._said_changelist_instance(request)
        except IncorrectLookupParameters as exc:
            if ERROR_FLAG in request.GET and set(request.GET) - {ERROR_FLAG}:
                raise _RefusedWithErrorFlag from exc
            # A bare ``?e=1`` the list cannot show either: Django's "Database error".
            raise

    def _said_changelist_instance(self, request: HttpRequest) -> ChangeList:
        """The list, or :class:`IncorrectLookupParameters` once a message says which
        parameters it cannot apply and why."""
        try:
            page_problem = unusable_page(request)
            if page_problem is not None:
                raise IncorrectLookupParameters(page_problem)
            return super().get_changelist_instance(request)
        except DisallowedModelAdminLookup as exc:
            named = str(exc).removeprefix("Filtering by ").removesuffix(" not allowed")
            self.message_user(
                request,
                _("The list has no filter “%(name)s”. The whole list is shown.")
                % {"name": named[:50]},
                messages.ERROR,
            )
            raise IncorrectLookupParameters from exc
        except IncorrectLookupParameters as exc:
            # Bare ``?e=1`` names no parameter: there is nothing to say.
            if set(request.GET) - {ERROR_FLAG}:
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
        unreadable = unreadable_parameter(request, self.opts.pk) or repeated_parameter(request)
        if unreadable is not None:
            self.message_user(request, unreadable, messages.ERROR)
            return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
        try:
            return self._checked_changelist_view(request, extra_context)
        except _RefusedWithErrorFlag:
            # The message is said (get_changelist_instance); the whole list shows it.
            return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")

    def _checked_changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None
    ) -> HttpResponse:
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
                return redirect_with_query(request.path, request.META.get("QUERY_STRING", ""))
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


def redacted_field(
    name: str, description: StrOrPromise, *, text: bool = False
) -> Callable[[ScaledAdmin, Any], SafeString | str]:
    """A read-only field of a :class:`ScaledAdmin` showing the row's ``name`` as JSON
    (with ``text``: as long text), redacted by the row's redactor and folded when long;
    declared on the class as ``input_json = redacted_field("input", gettext_lazy("input"))``."""
    render = text_block if text else json_block

    def show(model_admin: ScaledAdmin, obj: Any) -> SafeString | str:
        return render(getattr(obj, name), model_admin.redactor_for(obj))

    shown: Callable[[ScaledAdmin, Any], SafeString | str] = admin.display(description=description)(
        show
    )
    return shown


def moment_field(
    name: str, description: StrOrPromise
) -> Callable[[ScaledAdmin, Any], SafeString | str]:
    """A column or read-only field of a :class:`ScaledAdmin` showing the row's instant
    ``name`` as every console page shows one (:func:`~jobstate.admin.display.moment`),
    sortable by it; declared on the class as
    ``created = moment_field("created_at", gettext_lazy("created"))``."""

    def show(model_admin: ScaledAdmin, obj: Any) -> SafeString | str:
        return moment(getattr(obj, name))

    shown: Callable[[ScaledAdmin, Any], SafeString | str] = admin.display(
        description=description, ordering=name
    )(show)
    return shown


def permission_check(codename: str) -> Callable[[ScaledAdmin, HttpRequest], bool]:
    """A ``has_<name>_permission`` method of a :class:`ScaledAdmin`: whether the user
    holds the app's permission ``codename``."""

    def check(model_admin: ScaledAdmin, request: HttpRequest) -> bool:
        return model_admin.user_can(request, codename)

    return check
