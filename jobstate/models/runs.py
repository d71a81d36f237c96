"""The runs of operations jobs (the JobRunStore contract's table)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from jobstate.core.bidi import isolated
from jobstate.core.states import (
    JobRunStatus,
)

#: Name of the partial unique constraint behind obligation S1. Stores match
#: ``IntegrityError`` against this name and turn only this violation into "key held".
ONE_RUNNING_PER_OVERLAP_KEY = "jobstate_jobrun_one_running_per_overlap_key"


class JobRunQuerySet(models.QuerySet["JobRun"]):
    def running(self) -> JobRunQuerySet:
        return self.filter(status=JobRunStatus.RUNNING)

    def finished(self) -> JobRunQuerySet:
        return self.exclude(status=JobRunStatus.RUNNING)

    def stale(self, stale_after: timedelta) -> JobRunQuerySet:
        """RUNNING rows whose watermark is at or before the database clock minus
        ``stale_after`` (the reaper's candidates)."""
        return self.running().filter(heartbeat_at__lte=Now() - stale_after)


class JobRun(models.Model):
    """One run of an operations job: claimed, executing, settled or skipped."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job_key = models.CharField(_("job key"), max_length=200)
    overlap_key = models.CharField(
        _("overlap key"),
        max_length=300,
        null=True,
        blank=True,
        help_text=_("Held while RUNNING; empty for SKIPPED rows, which never hold a key."),
    )
    status = models.CharField(_("status"), max_length=16, choices=JobRunStatus.choices)
    trigger_source = models.CharField(_("trigger"), max_length=100)
    triggered_by = models.CharField(_("triggered by"), max_length=200, null=True, blank=True)
    input = models.JSONField(_("input"), null=True, blank=True)
    summary = models.JSONField(_("summary"), null=True, blank=True)
    error = models.TextField(_("error"), null=True, blank=True)
    # Recorded instants: the runner's clock, stored verbatim (S6).
    started_at = models.DateTimeField(_("started at"))
    finished_at = models.DateTimeField(_("finished at"), null=True, blank=True)
    duration_ms = models.BigIntegerField(_("duration (ms)"), null=True, blank=True)
    # Liveness instant: the database clock only, never null (S6).
    heartbeat_at = models.DateTimeField(_("heartbeat at"), db_default=Now())
    service_revision = models.CharField(
        _("service revision"), max_length=100, null=True, blank=True
    )

    objects = JobRunQuerySet.as_manager()

    class Meta:
        verbose_name = _("job run")
        verbose_name_plural = _("job runs")
        ordering = ["-started_at"]
        permissions = [("reap_runs", _("Can reap stale runs from the admin"))]
        constraints = [
            models.UniqueConstraint(
                fields=["overlap_key"],
                condition=models.Q(status=JobRunStatus.RUNNING),
                name=ONE_RUNNING_PER_OVERLAP_KEY,
            ),
            models.CheckConstraint(
                condition=models.Q(status__in=JobRunStatus.values),
                name="jobstate_jobrun_status_valid",
            ),
        ]
        indexes = [
            # The reaper: RUNNING rows ordered by watermark.
            models.Index(fields=["status", "heartbeat_at"], name="jobstate_run_liveness_idx"),
            # History of one job, newest first (admin, "last run of X").
            models.Index(fields=["job_key", "-started_at"], name="jobstate_run_job_started_idx"),
            # The admin changelist's default ordering.
            models.Index(fields=["-started_at"], name="jobstate_run_started_idx"),
        ]

    def __str__(self) -> str:
        return f"{isolated(self.job_key)} {self.status} ({self.id})"
