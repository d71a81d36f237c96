"""Bulk operations of the console: one row per "requeue / reject / delete all matching",
holding what it applies to and how far it has got, so it survives restarts."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _


class BulkAction(models.TextChoices):
    REQUEUE = "requeue", _("requeue")
    REJECT = "reject", _("reject (cancel)")
    DELETE = "delete", _("delete finished")


class BulkState(models.TextChoices):
    RUNNING = "running", _("running")
    DONE = "done", _("done")
    CANCELLED = "cancelled", _("cancelled")


class BulkOperation(models.Model):
    """An operator's action over every job matching a filter of the jobs list.

    The filter (the list's filter parameters and search term) is captured when the
    operator confirms, with ``cutoff``, the database's clock at that moment: jobs
    created later are never included. The operation advances in batches along the list's
    order (newest first); ``cursor_created_at`` / ``cursor_id`` is the last job a batch
    looked at, written in the same transaction as that batch's transitions and counts,
    so a crash loses at most an uncommitted batch and never applies one twice."""

    id = models.BigAutoField(primary_key=True)
    action = models.CharField(_("action"), max_length=16, choices=BulkAction.choices)
    state = models.CharField(
        _("state"), max_length=16, choices=BulkState.choices, default=BulkState.RUNNING
    )
    operator = models.CharField(_("operator"), max_length=200)
    filters = models.JSONField(_("filters"), default=dict, blank=True)
    search = models.CharField(_("search"), max_length=500, blank=True, default="")
    reason = models.CharField(_("reason"), max_length=2000, blank=True, default="")
    cutoff = models.DateTimeField(
        _("cutoff"), help_text=_("Jobs created after this instant are not included.")
    )
    search_window_start = models.DateTimeField(
        _("search window start"),
        null=True,
        blank=True,
        help_text=_("For search terms no index serves: the oldest job they look at."),
    )
    total = models.PositiveIntegerField(
        _("matching at confirmation"), default=0, help_text=_("Counted when confirmed.")
    )
    done = models.PositiveIntegerField(_("done"), default=0)
    skipped = models.PositiveIntegerField(
        _("skipped"), default=0, help_text=_("Jobs that changed (e.g. were claimed) meanwhile.")
    )
    cursor_created_at = models.DateTimeField(_("cursor (created at)"), null=True, blank=True)
    cursor_id = models.UUIDField(_("cursor (job id)"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), db_default=Now(), editable=False)
    updated_at = models.DateTimeField(_("updated at"), db_default=Now())
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)

    class Meta:
        verbose_name = _("bulk operation")
        verbose_name_plural = _("bulk operations")
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(action__in=BulkAction.values),
                name="jobstate_bulkoperation_action_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=BulkState.values),
                name="jobstate_bulkoperation_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} #{self.pk} ({self.state})"

    @property
    def processed(self) -> int:
        return self.done + self.skipped
