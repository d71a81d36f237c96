"""The notification outbox, its delivery history and replays, and the permanent
approval markers."""

from __future__ import annotations

from typing import Any

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from jobstate.core.bidi import isolated
from jobstate.core.states import (
    NotificationState,
)
from jobstate.models.job_identity import time_ordered_uuid
from jobstate.models.jobs import Job

#: Unique constraint behind the outbox's idempotency keys.
NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY = "jobstate_notification_unique_idempotency_key"


class Notification(models.Model):
    """An outbox row: written in the same transaction as the job transition that caused
    it, delivered afterwards by a relay (at least once, with ``idempotency_key`` for the
    receiver)."""

    id = models.UUIDField(primary_key=True, default=time_ordered_uuid, editable=False)
    job = models.ForeignKey(
        Job,
        verbose_name=_("job"),
        null=True,
        blank=True,
        # Pruning a finished job must not lose its undelivered notifications.
        on_delete=models.SET_NULL,
        related_name="notifications",
    )
    channel = models.CharField(_("channel"), max_length=100)
    destination = models.CharField(_("destination"), max_length=2000)
    payload = models.JSONField(_("payload"), default=dict, blank=True)
    idempotency_key = models.CharField(_("idempotency key"), max_length=200)
    state = models.CharField(
        _("state"),
        max_length=16,
        choices=NotificationState.choices,
        default=NotificationState.PENDING,
    )
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    next_attempt_at = models.DateTimeField(_("next attempt at"), db_default=Now())
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    relay_id = models.CharField(_("relay"), max_length=200, null=True, blank=True)
    last_error = models.TextField(_("last error"), null=True, blank=True)
    delivered_at = models.DateTimeField(_("delivered at"), null=True, blank=True)
    created_at = models.DateTimeField(_("created at"), db_default=Now(), editable=False)
    updated_at = models.DateTimeField(_("updated at"), db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("notification")
        verbose_name_plural = _("notifications")
        ordering = ["-created_at"]
        permissions = [("replay_notification", _("Can replay dead-letter notifications"))]
        constraints = [
            models.UniqueConstraint(
                fields=["idempotency_key"], name=NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=NotificationState.values),
                name="jobstate_notification_state_valid",
            ),
        ]
        indexes = [
            # Relays claim due pending rows, oldest due first.
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=models.Q(state="pending"),
                name="jobstate_notif_due_idx",
            ),
            # Re-arming rows whose relay lease ended.
            models.Index(
                fields=["lease_until"],
                condition=models.Q(state="delivering"),
                name="jobstate_notif_lease_idx",
            ),
            # Retention and the admin's state filter.
            models.Index(fields=["state", "updated_at"], name="jobstate_notif_state_idx"),
            models.Index(fields=["-created_at"], name="jobstate_notif_recent_idx"),
        ]

    def __str__(self) -> str:
        return f"{isolated(self.channel)} → {isolated(self.destination)} ({self.state})"


class DeliveryAttempt(models.Model):
    """One try of a relay to deliver a notification: the outbox's history."""

    id = models.BigAutoField(primary_key=True)
    notification = models.ForeignKey(
        Notification,
        verbose_name=_("notification"),
        on_delete=models.CASCADE,
        related_name="delivery_attempts",
    )
    number = models.PositiveIntegerField(_("attempt"))
    relay_id = models.CharField(_("relay"), max_length=200)
    started_at = models.DateTimeField(_("started at"))
    finished_at = models.DateTimeField(_("finished at"), db_default=Now())
    succeeded = models.BooleanField(_("succeeded"))
    error = models.TextField(_("error"), null=True, blank=True)

    class Meta:
        verbose_name = _("delivery attempt")
        verbose_name_plural = _("delivery attempts")
        ordering = ["notification", "number"]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.notification_id}"


def _marker_of(
    to: type[models.Model], verbose_name: Any, *, related_name: str
) -> models.ForeignKey[Any, Any]:
    """The link of a permanent marker to the row it marks: no database constraint and
    nothing done on delete, so the marker outlives the row's pruning."""
    return models.ForeignKey(
        to,
        verbose_name=verbose_name,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name=related_name,
    )


class DeliveryReplay(models.Model):
    """Permanent marker: the dead letter ``dlq_key`` was replayed once. Kept even after
    the notification is pruned (no database constraint), so a key can never replay twice."""

    dlq_key = models.CharField(_("dead-letter key"), max_length=200, primary_key=True)
    notification = _marker_of(Notification, _("notification"), related_name="replays")
    requested_by = models.CharField(_("requested by"), max_length=200)
    created_at = models.DateTimeField(_("created at"), db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("delivery replay")
        verbose_name_plural = _("delivery replays")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return isolated(self.dlq_key)


# --- approval continuation ---------------------------------------------------------------


class ApprovalDecision(models.Model):
    """Permanent marker: decision ``decision_id`` requeued ``job`` once. Kept even after
    the job is pruned (no database constraint), so a decision can never requeue twice."""

    decision_id = models.CharField(_("decision id"), max_length=200, primary_key=True)
    job = _marker_of(Job, _("job"), related_name="approval_decisions")
    approver = models.CharField(_("approver"), max_length=200)
    comment = models.TextField(_("comment"), blank=True, default="")
    created_at = models.DateTimeField(_("created at"), db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("approval decision")
        verbose_name_plural = _("approval decisions")
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["job"], name="jobstate_approval_job_idx")]

    def __str__(self) -> str:
        return f"{self.decision_id} → {self.job_id}"
