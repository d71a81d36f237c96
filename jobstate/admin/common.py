"""What every jobstate admin page shares: read-only bases, badges, JSON and time
renderings, exact search, and the confirmed-action machinery.

An operator action here is a Django admin action in two steps, like Django's own
"delete selected": choosing it shows a confirmation page listing the rows it will
change and the rows it will skip (and why); the page's form posts back with
``post=yes`` and the action then calls the store once per eligible row. Each store
call re-checks its row's condition in the database, so a row that changed between the
two steps is skipped and named rather than overwritten.
The renderings (badges, JSON, text, times) live in :mod:`jobstate.admin.display` and the
page bases (:class:`ScaledAdmin`, :class:`ReadOnlyAdmin`, the database's clock, exact
search) in :mod:`jobstate.admin.page_bases`; both are importable from here too, the one
address the pages import what they share from.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.functional import Promise
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from jobstate.admin.action_log import log_console_action
from jobstate.admin.display import (
    BADGE_COLOURS,
    choice_badge,
    json_block,
    relative_time,
    short_duration,
    status_badge,
    text_block,
)
from jobstate.admin.page_bases import (
    DATABASE_NOW,
    REDACTOR_ATTRIBUTE,
    ReadOnlyAdmin,
    ReadOnlyInline,
    ScaledAdmin,
    admin_change_url,
    database_now,
    exact_search,
    permission_check,
    redacted_field,
    row_redactor,
    with_database_now,
)
from jobstate.console.redaction import REDACTED
from jobstate.core.bidi import isolated
from jobstate.stores.contracts.validation import REJECT_REASON_LIMIT

if TYPE_CHECKING:
    from django_stubs_ext import StrOrPromise

__all__ = [
    "ACTION_ROW_LIMIT",
    "BADGE_COLOURS",
    "DATABASE_NOW",
    "REDACTED",
    "REDACTOR_ATTRIBUTE",
    "ActionRow",
    "ActionSpec",
    "ReadOnlyAdmin",
    "ReadOnlyInline",
    "RejectForm",
    "ScaledAdmin",
    "admin_change_url",
    "choice_badge",
    "confirmed_action",
    "counted",
    "database_now",
    "exact_search",
    "json_block",
    "permission_check",
    "redacted_field",
    "relative_time",
    "row_redactor",
    "run_confirmed_action",
    "short_duration",
    "status_badge",
    "text_block",
    "with_database_now",
]

#: The most rows one action may touch; a larger selection is refused, nothing changes.
ACTION_ROW_LIMIT = 500


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
    seen: str | None = None
    """What the confirmation shows of the row that the action acts on (a lock's owner):
    the page sends back its digest (:attr:`seen_token`), and a row that no longer shows
    it when the operator confirms, or a confirmation that does not say, is skipped
    instead of changed."""

    @property
    def seen_token(self) -> str | None:
        """:attr:`seen` as the confirmation form carries it: a digest, since a browser
        turns a newline in a field's value into CR LF, and a name may hold anything."""
        if self.seen is None:
            return None
        return hashlib.sha256(self.seen.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class ActionSpec:
    """An operator action: what it applies to and what it does. Who may run it and
    under which name come from its :class:`confirmed_action` declaration."""

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
    name: str = ""
    """The action's attribute name on the ModelAdmin (the ``action`` POST value)."""
    permission: str = ""
    """The ModelAdmin permission suffix: ``has_<permission>_permission``."""


def counted(message: str | Promise) -> Callable[[int], str]:
    """An :attr:`ActionSpec.done` from a message with a ``%(count)d`` that chooses its
    plural by that number (``ngettext_lazy(singular, plural, "count")``)."""
    return lambda count: str(message % {"count": count})


class confirmed_action:
    """A ModelAdmin action, declared on the class as ``requeue_jobs =
    confirmed_action("requeue_spec", description=..., permission="requeue")``: it runs,
    through :func:`run_confirmed_action`, the action its ``spec`` method (called with
    the request) describes, under the attribute's name; Django offers it only to users
    with ``has_<permission>_permission``."""

    def __init__(self, spec: str, *, description: StrOrPromise, permission: str) -> None:
        self.spec = spec
        self.description = description
        self.permission = permission
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def bound_spec(self, model_admin: Any, request: HttpRequest) -> ActionSpec:
        """The action's spec for ``request``, with this declaration's name and permission."""
        build: Callable[[HttpRequest], ActionSpec] = getattr(model_admin, self.spec)
        return replace(build(request), name=self.name, permission=self.permission)

    def __get__(self, model_admin: Any, owner: type | None = None) -> Callable[..., Any]:
        def action(
            model_admin: Any, request: HttpRequest, queryset: QuerySet[Any]
        ) -> HttpResponse | None:
            spec = self.bound_spec(model_admin, request)
            return run_confirmed_action(model_admin, request, queryset, spec)

        action.__name__ = self.name
        decorated: Callable[..., Any] = admin.action(
            description=self.description, permissions=[self.permission]
        )(action)
        return decorated if model_admin is None else partial(decorated, model_admin)


def _logged_message(spec: ActionSpec, inputs: dict[str, Any]) -> str:
    """The change message of the admin's log entries of an action: its title, and the
    reason or comment given."""
    note = str(inputs.get("reason") or inputs.get("comment") or "").strip()
    return f"{spec.title}: {note}" if note else str(spec.title)


def _named(items: list[tuple[str, str]]) -> str:
    # Each name isolated: a right-to-left override in one would reverse the message's
    # text after it (messages are shown outside the page's content, which the console's
    # stylesheet isolates).
    shown = "; ".join(f"{isolated(label)} ({why})" for label, why in items[:NAMED_IN_MESSAGE])
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


#: The confirmation form's field (followed by the row's key) that sends back what the
#: page showed of a row (:attr:`ActionRow.seen`).
SEEN_FIELD = "_jobstate_seen:"


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
        logged = _logged_message(spec, inputs)
        for row in rows:
            if row.skip_reason:
                continue
            if row.seen_token is not None:
                shown = request.POST.get(f"{SEEN_FIELD}{row.obj.pk}")
                if shown is None:
                    # A form of an older page, or a hand-made request: it cannot say
                    # which state the operator confirmed.
                    skipped.append((row.label, _("not confirmed on this page; try again")))
                    continue
                if shown != row.seen_token:
                    changed = _("changed since the confirmation: %s") % row.detail
                    skipped.append((row.label, changed))
                    continue
            # The admin's log entry commits with the change, or neither does.
            with transaction.atomic():
                why = spec.perform(request, row.obj, inputs)
                if why is None:
                    gone = not type(row.obj)._default_manager.filter(pk=row.obj.pk).exists()
                    log_console_action(request, [row.obj], logged, deleted=gone)
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
        "seen_field": SEEN_FIELD,
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
