"""The Schedules page: every periodic schedule with its cron, time zone, next run and
last run, and the operator actions run now, pause and resume.

Schedules are declared in settings and synchronised into their rows, so the page never
adds, edits or deletes one; a schedule removed from settings stays listed as removed,
with its history. Each action has a confirmation page and a permission of its own
(``run_schedule``, ``pause_schedule``), goes through :mod:`jobstate.schedules` and
leaves an audit entry naming the user.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString
from django.utils.timezone import localtime
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext_lazy

from jobstate.admin.common import (
    ActionRow,
    ActionSpec,
    ReadOnlyAdmin,
    admin_change_url,
    confirmed_action,
    counted,
    database_now,
    json_block,
    permission_check,
    relative_time,
    status_badge,
    with_database_now,
)
from jobstate.admin.display import moment
from jobstate.admin.filters import OfferedChoicesFilter, offered_value
from jobstate.admin.list_cells import breakable
from jobstate.admin.list_input import unusable_find_value
from jobstate.admin.schedule_page import next_run_text, recent_runs_table, schedule_buttons
from jobstate.console.job_search import shortened
from jobstate.exceptions import ScheduleError, UnknownSchedule
from jobstate.models import Job, OccurrenceTrigger, Schedule, ScheduleOccurrence
from jobstate.schedules import (
    pause_schedule,
    resume_schedule,
    row_definition,
    run_schedule_now,
    schedule_declarations,
    schedule_problem,
)

__all__ = ["ScheduleAdmin", "ScheduleStateFilter"]

#: How many of a schedule's latest occurrences its page lists.
OCCURRENCES_SHOWN = 20

_STATE_COLOURS = {"active": "#1a7f37", "paused": "#bc4c00", "removed": "#6e7781"}
_BROKEN_COLOUR = "#cf222e"


def _state(schedule: Schedule) -> str:
    if schedule.removed_at is not None:
        return "removed"
    return "paused" if schedule.paused else "active"


def _state_label(state: str) -> str:
    return {"active": _("active"), "paused": _("paused"), "removed": _("removed")}[state]


class ScheduleStateFilter(admin.SimpleListFilter):
    title = gettext_lazy("state")
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, _state_label(state)) for state in ("active", "paused", "removed")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = offered_value(self, ("active", "paused", "removed"))
        if value == "active":
            return queryset.filter(removed_at__isnull=True, paused=False)
        if value == "paused":
            return queryset.filter(removed_at__isnull=True, paused=True)
        if value == "removed":
            return queryset.filter(removed_at__isnull=False)
        return queryset


_SCHEDULE_FIELDS = (
    "key",
    "state_display",
    "kind",
    "target",
    "cron_display",
    "timezone",
    "catch_up",
    "next_run",
    "last_run",
    "effective_from",
    "last_slot",
    "paused_at",
    "paused_by",
    "removed_at",
    "created_at",
    "revision",
    "definition_json",
    "recent_occurrences",
    "recent_runs",
)


@admin.register(Schedule)
class ScheduleAdmin(ReadOnlyAdmin):
    """Schedules: what each runs and when, and the operator's run now, pause and resume."""

    list_display = [
        "key_cell",
        "state_display",
        "target_cell",
        "cron_display",
        "next_run",
        "last_run",
    ]
    phone_hidden_columns = ("target_cell", "cron_display")
    empty_list_text = gettext_lazy(
        "No schedules. A schedule appears when a worker, manage.py "
        "enqueue_due_schedules or the Celery beat first evaluates the periodic "
        "schedules declared in the JOBSTATE settings; each due slot is then enqueued once."
    )
    list_filter = [ScheduleStateFilter, ("kind", OfferedChoicesFilter)]
    search_fields = ["key"]
    search_help_text = gettext_lazy("Part of a schedule key or what it runs.")
    ordering = ["key"]
    actions = ["run_schedules_now", "pause_schedules", "resume_schedules"]
    fields = _SCHEDULE_FIELDS
    readonly_fields = _SCHEDULE_FIELDS
    change_form_template = "admin/jobstate/schedule/change_form.html"

    def get_urls(self) -> list[URLPattern]:
        find = path(
            "find/", self.admin_site.admin_view(self.find_view), name="jobstate_schedule_find"
        )
        return [find, *super().get_urls()]

    def find_view(self, request: HttpRequest) -> HttpResponse:
        """The page of the schedule whose key is ``?key=``: what a run or a job links
        its schedule through; the list searched for the key when no row holds it."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method not in ("GET", "HEAD"):
            return HttpResponseNotAllowed(["GET", "HEAD"])
        key = request.GET.get("key", "")
        schedules = reverse(f"{self.admin_site.name}:jobstate_schedule_changelist")
        unusable = unusable_find_value(key, _("schedule key"))
        if unusable is not None:
            messages.warning(request, unusable)
            return HttpResponseRedirect(schedules)
        pk = Schedule.objects.filter(key=key).values_list("pk", flat=True).first()
        if pk is not None:
            return HttpResponseRedirect(admin_change_url(Schedule, pk, self.admin_site.name))
        messages.info(request, _("No schedule has the key %(key)s.") % {"key": shortened(key)})
        return HttpResponseRedirect(schedules)

    def render_change_form(
        self,
        request: HttpRequest,
        context: dict[str, Any],
        add: bool = False,
        change: bool = False,
        form_url: str = "",
        obj: Schedule | None = None,
    ) -> HttpResponse:
        if obj is not None:
            context["schedule_buttons"] = schedule_buttons(self, request, obj)
            context["schedule_changelist_url"] = reverse(
                f"{self.admin_site.name}:jobstate_schedule_changelist"
            )
        return super().render_change_form(request, context, add, change, form_url, obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Schedule]:
        latest = ScheduleOccurrence.objects.filter(schedule=OuterRef("pk")).order_by(
            "-enqueued_at", "-id"
        )
        return with_database_now(super().get_queryset(request)).annotate(
            last_result_id=Subquery(latest.values("result_id")[:1]),
            last_enqueued_at=Subquery(latest.values("enqueued_at")[:1]),
            last_trigger=Subquery(latest.values("trigger")[:1]),
        )

    def search(self, queryset: QuerySet[Any], term: str) -> QuerySet[Any]:
        # A few rows, one per declared key: a substring search reads next to nothing.
        if not term:
            return queryset
        return queryset.filter(key__icontains=term) | queryset.filter(target__icontains=term)

    # --- columns and fields ----------------------------------------------------------

    @admin.display(description=gettext_lazy("state"))
    def state_display(self, schedule: Schedule) -> SafeString:
        state = _state(schedule)
        badge = status_badge(_state_label(state), _STATE_COLOURS[state])
        problem = None if state == "removed" else schedule_problem(schedule.key)
        if problem is None:
            return badge
        # Every evaluation skips it (and logs why) until settings or the code are fixed.
        return format_html(
            '{} {}<br><span class="help jobstate-broken">{}</span>',
            badge,
            status_badge(_("broken"), _BROKEN_COLOUR),
            problem,
        )

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        # A broken schedule of a new key has no row yet: say so above the list. Broken is
        # a declaration refused, or a good one whose task or job cannot be enqueued.
        good, broken = schedule_declarations()
        keys = [*broken, *good]
        known = set(Schedule.objects.filter(key__in=keys).values_list("key", flat=True))
        for key in keys:
            if key in known:
                continue
            problem = broken[key] if key in broken else schedule_problem(key)
            if problem is not None:
                messages.error(
                    request,
                    _("Schedule %(key)s is broken and is skipped: %(problem)s")
                    % {"key": key, "problem": problem},
                )
        return super().changelist_view(request, extra_context)

    @admin.display(description=gettext_lazy("key"), ordering="key")
    def key_cell(self, schedule: Schedule) -> SafeString:
        return breakable(schedule.key)

    @admin.display(description=gettext_lazy("target"), ordering="target")
    def target_cell(self, schedule: Schedule) -> SafeString:
        return breakable(schedule.target)

    @admin.display(description=gettext_lazy("cron"), ordering="cron")
    def cron_display(self, schedule: Schedule) -> SafeString:
        try:
            words = row_definition(schedule).explain()
        except (ScheduleError, ValueError):
            words = ""
        return format_html(
            '<code>{}</code> <span class="help">{}</span><br><span class="help">{}</span>',
            schedule.cron,
            schedule.timezone,
            words,
        )

    @admin.display(description=gettext_lazy("next run"), ordering="next_slot")
    def next_run(self, schedule: Schedule) -> SafeString | str:
        state = _state(schedule)
        if state != "active":
            return "—"
        if schedule_problem(schedule.key) is not None:
            # Every evaluation skips it: no slot is enqueued until it is fixed.
            return _("none while it is broken")
        return next_run_text(schedule, database_now(schedule))

    @admin.display(description=gettext_lazy("latest runs"))
    def recent_runs(self, schedule: Schedule) -> SafeString | str:
        return recent_runs_table(schedule, self.admin_site.name)

    @admin.display(description=gettext_lazy("last run"))
    def last_run(self, schedule: Schedule) -> SafeString | str:
        result_id = getattr(schedule, "last_result_id", None)
        enqueued_at = getattr(schedule, "last_enqueued_at", None)
        if result_id is None or enqueued_at is None:
            return "—"
        manual = getattr(schedule, "last_trigger", "") == "manual"
        return format_html(
            '<a href="{}">{}</a>{}',
            admin_change_url(Job, result_id, self.admin_site.name),
            relative_time(enqueued_at, database_now(schedule)),
            format_html(" ({})", _("run now")) if manual else "",
        )

    @admin.display(description=gettext_lazy("definition"))
    def definition_json(self, schedule: Schedule) -> SafeString | str:
        return json_block(schedule.definition)

    @admin.display(description=gettext_lazy("latest occurrences"))
    def recent_occurrences(self, schedule: Schedule) -> SafeString | str:
        occurrences = list(schedule.occurrences.order_by("-enqueued_at", "-id")[:OCCURRENCES_SHOWN])
        if not occurrences:
            return "—"
        rows = format_html_join(
            "",
            '<tr><td>{}</td><td>{}</td><td><a href="{}">{}</a></td><td>{}</td><td>{}</td></tr>',
            (
                (
                    moment(occurrence.slot),
                    occurrence.get_trigger_display(),
                    admin_change_url(Job, occurrence.result_id, self.admin_site.name),
                    occurrence.result_id,
                    moment(occurrence.enqueued_at),
                    occurrence.enqueued_by or "—",
                )
                for occurrence in occurrences
            ),
        )
        return format_html(
            '<table class="jobstate-occurrences"><thead><tr><th>{}</th><th>{}</th><th>{}</th>'
            "<th>{}</th><th>{}</th></tr></thead><tbody>{}</tbody></table>",
            _("slot"),
            _("trigger"),
            _("job"),
            _("enqueued at"),
            _("enqueued by"),
            rows,
        )

    # --- permissions -----------------------------------------------------------------

    has_run_permission = permission_check("run_schedule")
    has_pause_permission = permission_check("pause_schedule")

    # --- actions ---------------------------------------------------------------------

    run_schedules_now = confirmed_action(
        "run_spec", description=gettext_lazy("Run selected schedules now…"), permission="run"
    )

    pause_schedules = confirmed_action(
        "pause_spec", description=gettext_lazy("Pause selected schedules…"), permission="pause"
    )

    resume_schedules = confirmed_action(
        "resume_spec", description=gettext_lazy("Resume selected schedules…"), permission="pause"
    )

    def _row(self, schedule: Schedule, why: str | None) -> ActionRow:
        detail = f"{_state_label(_state(schedule))} · {schedule.cron} ({schedule.timezone})"
        return ActionRow(schedule, schedule.key, detail, why)

    def run_spec(self, request: HttpRequest) -> ActionSpec:
        by = self.operator(request)

        def row(schedule: Schedule) -> ActionRow:
            removed = schedule.removed_at is not None
            shown = self._row(schedule, _("removed from settings") if removed else None)
            # The confirmation names the schedule's last run now, and a confirmation sent
            # again (twice, or after the back button) no longer matches it once the first
            # has run: it is skipped rather than run a second time.
            last = (
                ScheduleOccurrence.objects.filter(
                    schedule=schedule, trigger=OccurrenceTrigger.MANUAL
                )
                .order_by("-id")
                .values_list("id", "enqueued_at")
                .first()
            )
            if last is None:
                return replace(shown, seen="")
            when = localtime(last[1]).strftime("%Y-%m-%d %H:%M:%S")
            detail = _("%(detail)s · last run now %(when)s") % {
                "detail": shown.detail,
                "when": when,
            }
            return replace(shown, detail=detail, seen=str(last[0]))

        def perform(request: HttpRequest, schedule: Schedule, inputs: dict[str, Any]) -> str | None:
            try:
                run_schedule_now(schedule.key, by=by)
            except UnknownSchedule:
                return _("removed from settings")
            except ScheduleError as exc:
                return str(exc)
            return None

        return ActionSpec(
            title=_("Run schedules now"),
            intro=_(
                "Each schedule enqueues one extra occurrence now, paused or not; its cron "
                "slots are not affected. Each gets a “schedule_run_now” audit entry naming "
                "you, on the job it enqueued."
            ),
            confirm_label=_("Yes, run now"),
            done=counted(
                ngettext_lazy(
                    "Enqueued a job of %(count)d schedule.",
                    "Enqueued a job of each of %(count)d schedules.",
                    "count",
                )
            ),
            row=row,
            perform=perform,
        )

    def pause_spec(self, request: HttpRequest) -> ActionSpec:
        return self._switch_spec(request, pause=True)

    def resume_spec(self, request: HttpRequest) -> ActionSpec:
        return self._switch_spec(request, pause=False)

    def _switch_spec(self, request: HttpRequest, *, pause: bool) -> ActionSpec:
        """Pausing (``pause``) or resuming: the rows each applies to, its store call and
        its texts."""
        by = self.operator(request)
        applies_to = "active" if pause else "paused"
        switch = pause_schedule if pause else resume_schedule

        def row(schedule: Schedule) -> ActionRow:
            state = _state(schedule)
            return self._row(schedule, None if state == applies_to else _state_label(state))

        def perform(request: HttpRequest, schedule: Schedule, inputs: dict[str, Any]) -> str | None:
            try:
                changed = switch(schedule.key, by=by)
            except UnknownSchedule:
                return _("removed from settings")
            if changed:
                return None
            return _("already paused") if pause else _("not paused")

        return ActionSpec(
            title=_("Pause schedules") if pause else _("Resume schedules"),
            intro=_(
                "A paused schedule enqueues nothing until it is resumed; a slot being "
                "enqueued as you confirm is the last. Each gets a “schedule_paused” audit "
                "entry naming you."
            )
            if pause
            else _(
                "Each schedule runs again from its next slot; the slots it missed while "
                "paused are not caught up. Each gets a “schedule_resumed” audit entry "
                "naming you."
            ),
            confirm_label=_("Yes, pause") if pause else _("Yes, resume"),
            done=counted(
                ngettext_lazy("Paused %(count)d schedule.", "Paused %(count)d schedules.", "count")
                if pause
                else ngettext_lazy(
                    "Resumed %(count)d schedule.", "Resumed %(count)d schedules.", "count"
                )
            ),
            row=row,
            perform=perform,
        )
