"""What a console list says about parameters it cannot use: a search or filter value no
row can hold (a NUL character, a lone surrogate), refused before any query, and the
parameters behind Django's "incorrect lookup" (``?e=1``), named with the reason."""

from __future__ import annotations

from typing import Any

from django.contrib.admin import FieldListFilter, SimpleListFilter, helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import get_fields_from_path
from django.contrib.admin.views.main import ERROR_FLAG, PAGE_VAR, SEARCH_VAR
from django.core.exceptions import ValidationError
from django.core.paginator import InvalidPage
from django.db.models import Field
from django.http import HttpRequest
from django.utils.translation import gettext as _

from jobstate.console.job_search import shortened, unreadable_text

__all__ = [
    "filter_parameters",
    "repeated_parameter",
    "unapplied",
    "unreadable_parameter",
    "unusable_find_value",
    "unusable_page",
]


def unreadable_parameter(request: HttpRequest, pk: Field[Any, Any] | None = None) -> str | None:
    """Why a parameter of the list's URL (or a row the list's form selects) cannot be
    used, or ``None``. With the list's primary key field ``pk``, a selected value that
    is no id of it (``"abc"`` for an integer, a number out of its range, not a UUID) is
    refused too: Django's admin would filter by it and fail with a server error."""
    given = [(name, value) for name, values in request.GET.lists() for value in values]
    if request.method == "POST":
        given += [
            (helpers.ACTION_CHECKBOX_NAME, value)
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
        ]
    for name, value in given:
        why = unreadable_text(name) or unreadable_text(value)
        if why is None and name == helpers.ACTION_CHECKBOX_NAME and pk is not None:
            why = _not_an_id(pk, value)
        if why is None:
            continue
        if name == SEARCH_VAR:
            return _("The search cannot be used: %(why)s. The whole list is shown.") % {"why": why}
        if name == helpers.ACTION_CHECKBOX_NAME:
            return _("The selection cannot be used: %(why)s. Nothing was changed.") % {"why": why}
        return _("The filter “%(name)s” cannot be used: %(why)s. The whole list is shown.") % {
            "name": name[:50],
            "why": why,
        }
    return None


def unusable_find_value(value: str, what: str) -> str | None:
    """Why a find link's ``value`` (a worker id, a schedule key: ``what``) matches no
    row, said before any query (PostgreSQL refuses a NUL in a query's text), or
    ``None``."""
    if not value:
        return _("The link names no %(what)s.") % {"what": what}
    why = unreadable_text(value)
    if why is None:
        return None
    return _("The %(what)s cannot be used: %(why)s.") % {"what": what, "why": why}


def _not_an_id(pk: Field[Any, Any], value: str) -> str | None:
    """Why ``value`` is no value of the primary key ``pk``, or ``None``."""
    try:
        pk.run_validators(pk.to_python(value))
    except ValidationError as exc:
        # Django's message quotes the value, which a forged form may make huge.
        why = " ".join(exc.messages).rstrip(".")
        return why if len(why) <= _QUOTED_AT_MOST else f"{why[:_QUOTED_AT_MOST]}…"
    return None


#: The longest reason naming a refused value the console repeats.
_QUOTED_AT_MOST = 200


def unapplied(request: HttpRequest, exc: IncorrectLookupParameters) -> str:
    """What Django's "incorrect lookup" means for the operator: the parameters given
    and, when the exception says it, why."""
    cause = exc.args[0] if exc.args else None
    # Django's list raises it bare when its paginator refuses the page (past the end,
    # under 1); the refusal says which.
    if cause is None and isinstance(exc.__context__, InvalidPage):
        cause = exc.__context__
    if isinstance(cause, ValidationError):
        why = " ".join(cause.messages)
    elif isinstance(cause, InvalidPage):
        why = f"{cause}."
    else:
        why = str(cause) if cause is not None else ""
    shown = [
        f"{name[:50]}={shortened(str(value))}"
        for name, value in request.GET.items()
        if name != ERROR_FLAG
    ]
    message = _("The list cannot be shown with %(parameters)s.") % {
        "parameters": ", ".join(shown) or _("these parameters")
    }
    if why:
        message += " " + why
    return message + " " + _("The whole list is shown.")


def unusable_page(request: HttpRequest) -> str | None:
    """Why the list's page number (``?p=``) is no number, or ``None``: Django's list
    would show the first page without a word. (A number out of range Django refuses
    itself.) An empty one is the first page."""
    value = request.GET.get(PAGE_VAR, "")
    if not value:
        return None
    try:
        int(value)
    except ValueError:
        return _("That page number is not an integer.")
    return None


def filter_parameters(model_admin: Any, request: HttpRequest) -> set[str]:
    """The parameters the list's own filters read (``status__exact``, ``target``...):
    the only lookups its URL may carry. Django's admin would take any lookup on a field
    of the model, ``?input__password__startswith=h`` among them, which spells out a
    redacted value a character at a time (and scans the whole table)."""
    names: set[str] = set()
    for item in model_admin.get_list_filter(request):
        if isinstance(item, type) and issubclass(item, SimpleListFilter):
            names.add(str(item.parameter_name))
            continue
        field_path, filter_class = item if isinstance(item, list | tuple) else (item, None)
        field = get_fields_from_path(model_admin.model, field_path)[-1]
        # Django's choice of filter for the field, unless the list names one.
        make = filter_class or FieldListFilter.create
        spec = make(field, request, {}, model_admin.model, model_admin, field_path=field_path)
        # The field itself (``?kind=relay``) is its exact lookup, which links use.
        names.add(field_path)
        names.update(name for name in spec.expected_parameters() if name is not None)
    return names


def repeated_parameter(request: HttpRequest) -> str | None:
    """Why a list cannot use its URL when it gives a parameter more than once, or
    ``None``. Django's filters would match any of the values while a bulk action over
    the same URL reads one: the list and what the action changes would differ."""
    for name, values in request.GET.lists():
        if name != ERROR_FLAG and len(values) > 1:
            if name == SEARCH_VAR:
                return _("The search is given more than once; give one. The whole list is shown.")
            return _(
                "The filter “%(name)s” is given more than once; give it one value. The "
                "whole list is shown."
            ) % {"name": name[:50]}
    return None
