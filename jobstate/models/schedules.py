"""Periodic schedules: one row per schedule key, one row per occurrence enqueued.

The schedules are declared in ``JOBSTATE["SCHEDULES"]``; :mod:`jobstate.schedules`
copies each declaration into its :class:`Schedule` row and evaluates the rows. What
keeps an occurrence of a schedule from being enqueued twice is the unique key of
:class:`ScheduleOccurrence` on ``(schedule, slot)``, together with the schedule's
watermark (``last_slot``), which a caller moves in the same transaction before it
enqueues anything.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from jobstate.core.bidi import isolated

#: The unique key behind "each (schedule, slot) is enqueued once": an occurrence of a
#: cron slot. Matched by name when an insert violates it (the slot was taken).
ONCE_PER_SLOT = "jobstate_schedule_once_per_slot"
#: One row per schedule key.
SCHEDULE_UNIQUE_KEY = "jobstate_schedule_unique_key"


class ScheduleKind(models.TextChoices):
    """What a schedule enqueues."""

    TASK = "task", _("django.tasks task")
    OPERATIONS_JOB = "operations_job", _("operations job")


class CatchUp(models.TextChoices):
    """What an evaluation enqueues of the slots that came due since the last one."""

    LATEST = "latest", _("the latest missed slot")
    ALL = "all", _("every missed slot, up to a cap")


class OccurrenceTrigger(models.TextChoices):
    """Why an occurrence was enqueued."""

    CRON = "cron", _("cron slot")
    MANUAL = "manual", _("run now")


class ScheduleQuerySet(models.QuerySet["Schedule"]):
    def declared(self) -> ScheduleQuerySet:
        """Schedules still declared in the settings of the last synchronisation."""
        return self.filter(removed_at__isnull=True)

    def active(self) -> ScheduleQuerySet:
        """Declared schedules that are not paused: the ones an evaluation enqueues."""
        return self.declared().filter(paused=False)


class Schedule(models.Model):
    """One declared schedule: its definition as last synchronised from settings, its
    watermark and whether an operator paused it. A schedule removed from settings keeps
    its row (``removed_at``) and its occurrences."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(_("key"), max_length=100)
    kind = models.CharField(_("kind"), max_length=16, choices=ScheduleKind.choices)
    target = models.CharField(
        _("runs"),
        max_length=300,
        help_text=_("The task's dotted path, or the operations job's key."),
    )
    cron = models.CharField(_("cron"), max_length=200)
    timezone = models.CharField(_("time zone"), max_length=100)
    catch_up = models.CharField(_("catch-up"), max_length=8, choices=CatchUp.choices)
    definition = models.JSONField(
        _("definition"), help_text=_("The declaration as it stands in settings, normalised.")
    )
    revision = models.PositiveIntegerField(
        _("revision"),
        default=1,
        help_text=_("Goes up each time a synchronisation changes the definition."),
    )
    effective_from = models.DateTimeField(
        _("effective from"),
        help_text=_(
            "Slots at or before this instant are never enqueued: when the schedule was "
            "first seen, its cron or time zone last changed, or it was last resumed."
        ),
    )
    last_slot = models.DateTimeField(
        _("last slot"),
        null=True,
        blank=True,
        help_text=_("The latest cron slot enqueued; evaluations start after it."),
    )
    next_slot = models.DateTimeField(_("next slot"), null=True, blank=True)
    paused = models.BooleanField(_("paused"), default=False)
    paused_at = models.DateTimeField(_("paused at"), null=True, blank=True)
    paused_by = models.CharField(_("paused by"), max_length=200, blank=True, default="")
    removed_at = models.DateTimeField(
        _("removed at"),
        null=True,
        blank=True,
        help_text=_("When a synchronisation found the key gone from settings."),
    )
    created_at = models.DateTimeField(_("created at"), db_default=Now(), editable=False)

    objects = ScheduleQuerySet.as_manager()

    class Meta:
        verbose_name = _("schedule")
        verbose_name_plural = _("schedules")
        ordering = ["key"]
        permissions = [
            ("run_schedule", _("Can run schedules now")),
            ("pause_schedule", _("Can pause and resume schedules")),
        ]
        constraints = [
            models.UniqueConstraint(fields=["key"], name=SCHEDULE_UNIQUE_KEY),
            models.CheckConstraint(
                condition=models.Q(kind__in=ScheduleKind.values),
                name="jobstate_schedule_kind_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(catch_up__in=CatchUp.values),
                name="jobstate_schedule_catch_up_valid",
            ),
        ]

    def __str__(self) -> str:
        return isolated(self.key)


class ScheduleOccurrence(models.Model):
    """One enqueue of a schedule: a cron slot, or an operator's "run now"."""

    id = models.BigAutoField(primary_key=True)
    schedule = models.ForeignKey(
        Schedule,
        verbose_name=_("schedule"),
        on_delete=models.PROTECT,
        related_name="occurrences",
    )
    slot = models.DateTimeField(
        _("slot"),
        help_text=_("The instant the cron expression named; for a run now, when it was asked."),
    )
    trigger = models.CharField(_("trigger"), max_length=8, choices=OccurrenceTrigger.choices)
    result_id = models.UUIDField(_("result id"), help_text=_("The enqueued job (task result)."))
    enqueued_at = models.DateTimeField(_("enqueued at"), db_default=Now(), editable=False)
    enqueued_by = models.CharField(_("enqueued by"), max_length=200, blank=True, default="")

    class Meta:
        verbose_name = _("schedule occurrence")
        verbose_name_plural = _("schedule occurrences")
        ordering = ["-enqueued_at", "-id"]
        constraints = [
            # A run now is an extra occurrence, so only cron slots are unique.
            models.UniqueConstraint(
                fields=["schedule", "slot"],
                condition=models.Q(trigger=OccurrenceTrigger.CRON),
                name=ONCE_PER_SLOT,
            ),
            models.CheckConstraint(
                condition=models.Q(trigger__in=OccurrenceTrigger.values),
                name="jobstate_occurrence_trigger_valid",
            ),
        ]
        indexes = [
            # A schedule's latest occurrences (the console's "last run" and history).
            models.Index(
                fields=["schedule", "-enqueued_at"], name="jobstate_occurrence_recent_idx"
            ),
            # A job's schedule (the console's link from a job to the schedule that
            # enqueued it).
            models.Index(fields=["result_id"], name="jobstate_occurrence_result_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.schedule_id} {self.slot.isoformat()} ({self.trigger})"
