"""Runtime locks: who holds what until when, and releasing a lock by force."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db import transaction
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext_lazy

from jobstate.admin.common import (
    ActionRow,
    ActionSpec,
    ReadOnlyAdmin,
    confirmed_action,
    counted,
    database_now,
    permission_check,
    relative_time,
    with_database_now,
)
from jobstate.admin.filters import LockStateFilter
from jobstate.admin.page_bases import moment_field
from jobstate.core.bidi import isolated
from jobstate.models import RuntimeLock
from jobstate.stores import get_state_store
from jobstate.stores.contracts.audit import AuditSeverity, AuditStage

__all__ = ["RuntimeLockAdmin"]


_RUNTIME_LOCK_FIELDS: tuple[str, ...] = (
    "lock_key",
    "owner",
    "expires_at",
    "state_display",
    "updated_at",
)


@admin.register(RuntimeLock)
class RuntimeLockAdmin(ReadOnlyAdmin):
    """Locks are taken and released by their owners through the store. Force-release
    is for an owner that is gone and whose lock would otherwise hold until it expires."""

    list_display = ["lock_key", "owner", "state_display", "expires", "updated"]
    phone_hidden_columns = ("expires", "updated")
    empty_list_text = gettext_lazy(
        "No runtime locks are held. A lock appears while application code holds one "
        "through the state store (acquire_runtime_lock); it goes when released or expired. "
        "Operations jobs keep their runs from overlapping through their runs, not these "
        "locks: see Job runs."
    )
    expires = moment_field("expires_at", gettext_lazy("expires"))
    updated = moment_field("updated_at", gettext_lazy("updated"))
    list_filter = [LockStateFilter]
    search_fields = ["lock_key", "owner"]
    search_help_text = gettext_lazy("Part of a lock key or owner.")
    ordering = ["lock_key"]
    actions = ["force_release_locks"]
    fields = _RUNTIME_LOCK_FIELDS
    readonly_fields = _RUNTIME_LOCK_FIELDS

    def get_queryset(self, request: HttpRequest) -> QuerySet[RuntimeLock]:
        # Expiries are judged on the clock that wrote them (see with_database_now).
        return with_database_now(super().get_queryset(request))

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        # The table holds live locks only (expired ones are swept), so a substring
        # search stays cheap here.
        if not term:
            return queryset
        return queryset.filter(Q(lock_key__icontains=term) | Q(owner__icontains=term))

    @admin.display(description=gettext_lazy("state"), ordering="expires_at")
    def state_display(self, lock: RuntimeLock) -> SafeString | str:
        now = database_now(lock)
        when = relative_time(lock.expires_at, now)
        if lock.expires_at <= now:
            return format_html(
                '<span style="color:#6e7781">{}</span>', _("expired %(when)s") % {"when": when}
            )
        return _("held, ends %(when)s") % {"when": when}

    has_force_release_lock_permission = permission_check("force_release_lock")

    force_release_locks = confirmed_action(
        "release_spec",
        description=gettext_lazy("Force-release selected locks…"),
        permission="force_release_lock",
    )

    def release_spec(self, request: HttpRequest) -> ActionSpec:
        by = self.operator(request)

        def row(lock: RuntimeLock) -> ActionRow:
            now = database_now(lock)
            state = "expired" if lock.expires_at <= now else "held"
            detail = _("%(state)s by %(owner)s, ends %(when)s") % {
                "state": _("expired") if state == "expired" else _("held"),
                "owner": isolated(lock.owner),
                "when": relative_time(lock.expires_at, now),
            }
            return ActionRow(lock, lock.lock_key, detail, None, seen=lock.owner)

        def perform(request: HttpRequest, lock: RuntimeLock, inputs: dict[str, Any]) -> str | None:
            store = get_state_store()
            with transaction.atomic():
                # The row stays locked from this read to the release, so the owner
                # released (and audited) is the one holding the lock at that moment.
                held = (
                    RuntimeLock.objects.select_for_update()
                    .filter(lock_key=lock.lock_key)
                    .values_list("owner", "expires_at")
                    .first()
                )
                if held is None:
                    return _("already released")
                owner, expires_at = held
                if owner != lock.owner:
                    # Taken over since the operator confirmed: this owner is not the
                    # one they chose to release.
                    return _("now held by %(owner)s") % {"owner": isolated(owner)}
                store.release_runtime_lock(lock.lock_key, owner)
                store.append_audit(
                    event="lock_force_released",
                    stage=AuditStage.SYSTEM,
                    severity=AuditSeverity.WARNING,
                    title="Runtime lock force-released",
                    summary=f"{lock.lock_key} (held by {owner}) released by {by}",
                    detail={
                        "lock_key": lock.lock_key,
                        "owner": owner,
                        "expires_at": expires_at.isoformat(),
                        "by": by,
                        "via": "admin",
                    },
                )
            return None

        return ActionSpec(
            title=_("Force-release runtime locks"),
            intro=_(
                "The locks are deleted whoever holds them, so the next caller can take "
                "them at once. Release a lock only when its owner is gone: a live owner "
                "would carry on unprotected. A lock that another owner takes before you "
                "confirm is left alone. Each release gets a “lock_force_released” audit "
                "entry naming you and the owner."
            ),
            confirm_label=_("Yes, force-release"),
            done=counted(
                ngettext_lazy("Released %(count)d lock.", "Released %(count)d locks.", "count")
            ),
            row=row,
            perform=perform,
        )
