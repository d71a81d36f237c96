"""The audit ledger and runtime locks."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from jobstate.core.bidi import isolated
from jobstate.core.states import (
    AuditSeverity,
    AuditStage,
)
from jobstate.models.jobs import Job


class AuditEntryQuerySet(models.QuerySet["AuditEntry"]):
    def older_than(self, cutoff: object) -> AuditEntryQuerySet:
        return self.filter(ts__lt=cutoff)


class AuditEntry(models.Model):
    """One line of a job's trace. Entries outlive their job: ``job`` keeps the id even
    after the job row is deleted (no database constraint), and only
    ``prune_audit_older_than`` removes entries."""

    id = models.BigAutoField(primary_key=True)
    ts = models.DateTimeField(_("time"), db_default=Now())
    job = models.ForeignKey(
        Job,
        verbose_name=_("job"),
        null=True,
        blank=True,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="audit_entries",
    )
    request_id = models.CharField(_("request id"), max_length=200, blank=True, default="")
    event = models.CharField(_("event"), max_length=100)
    stage = models.CharField(
        _("stage"), max_length=16, choices=AuditStage.choices, default=AuditStage.SYSTEM
    )
    severity = models.CharField(
        _("severity"), max_length=8, choices=AuditSeverity.choices, default=AuditSeverity.INFO
    )
    title = models.CharField(_("title"), max_length=200, blank=True, default="")
    summary = models.TextField(_("summary"), blank=True, default="")
    detail = models.JSONField(_("detail"), default=dict, blank=True)

    objects = AuditEntryQuerySet.as_manager()

    class Meta:
        verbose_name = _("audit entry")
        verbose_name_plural = _("audit entries")
        ordering = ["-ts", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(stage__in=AuditStage.values),
                name="jobstate_auditentry_stage_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(severity__in=AuditSeverity.values),
                name="jobstate_auditentry_severity_valid",
            ),
        ]
        indexes = [
            # Pruning by age, newest-first browsing.
            models.Index(fields=["ts"], name="jobstate_audit_ts_idx"),
            models.Index(fields=["request_id", "ts"], name="jobstate_audit_request_idx"),
            models.Index(fields=["stage", "severity"], name="jobstate_audit_stage_idx"),
            # The admin changelist's ordering, exactly: newest first, ties by id.
            models.Index(fields=["-ts", "-id"], name="jobstate_audit_recent_idx"),
        ]

    def __str__(self) -> str:
        about = self.request_id or (str(self.job_id) if self.job_id else "")
        return f"{isolated(self.event)} {isolated(about)}".strip()


# --- runtime locks -----------------------------------------------------------------------


class RuntimeLockQuerySet(models.QuerySet["RuntimeLock"]):
    def held(self) -> RuntimeLockQuerySet:
        return self.filter(expires_at__gt=Now())

    def expired(self) -> RuntimeLockQuerySet:
        return self.filter(expires_at__lte=Now())


class RuntimeLock(models.Model):
    """A short lease on a key (``serial:<thread>``, a summary lock): one owner until
    ``expires_at`` (database clock) or release."""

    lock_key = models.CharField(_("lock key"), max_length=200, primary_key=True)
    owner = models.CharField(_("owner"), max_length=200)
    expires_at = models.DateTimeField(_("expires at"))
    updated_at = models.DateTimeField(_("updated at"), db_default=Now())

    objects = RuntimeLockQuerySet.as_manager()

    class Meta:
        verbose_name = _("runtime lock")
        verbose_name_plural = _("runtime locks")
        ordering = ["lock_key"]
        permissions = [("force_release_lock", _("Can force-release runtime locks"))]

    def __str__(self) -> str:
        return f"{isolated(self.lock_key)} ({isolated(self.owner)})"
