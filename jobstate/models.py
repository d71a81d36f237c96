"""Models: the durable state. States are QuerySet methods; transitions live in the stores."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterable
from datetime import timedelta

from django.db import models
from django.db.models import Exists, F, OuterRef, Q
from django.db.models.functions import Coalesce, Now
from django.utils.translation import gettext_lazy as _

from jobstate.states import (
    CLAIMED_JOB_STATUSES,
    INFLIGHT_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    AuditSeverity,
    AuditStage,
    JobRunStatus,
    JobStatus,
    NotificationState,
)

__all__ = [
    "TASK_DUE",
    "ApprovalDecision",
    "AuditEntry",
    "AuditEntryQuerySet",
    "DeliveryAttempt",
    "DeliveryReplay",
    "Job",
    "JobQuerySet",
    "JobRun",
    "JobRunQuerySet",
    "JobRunStatus",
    "JobStatus",
    "Notification",
    "RuntimeLock",
    "RuntimeLockQuerySet",
    "thread_blockers",
    "time_ordered_uuid",
]

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
        return f"{self.job_key} {self.status} ({self.id})"


# --- the job queue -----------------------------------------------------------------------

#: Unique constraint behind request-id idempotency; stores match ``IntegrityError`` on it.
JOB_UNIQUE_REQUEST_ID = "jobstate_job_unique_request_id"
#: PostgreSQL's name for the runtime lock table's primary key.
RUNTIME_LOCK_PKEY = "jobstate_runtimelock_pkey"

_uuid_lock = threading.Lock()
_uuid_last_ms = 0
_uuid_counter = 0


def time_ordered_uuid() -> uuid.UUID:
    """A version 7 UUID (RFC 9562): 48 bits of Unix milliseconds, a 12-bit counter,
    62 random bits.

    Jobs are claimed oldest first by ``(created_at, id)``. ``created_at`` comes from the
    database clock, whose precision (milliseconds on SQLite) can tie for jobs queued in
    quick succession; time-ordered ids break such ties in the order this process created
    the jobs, which keeps a thread's queue first in, first out. The counter keeps ids
    from one process strictly increasing even within one millisecond.
    """
    global _uuid_last_ms, _uuid_counter
    with _uuid_lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _uuid_last_ms:
            _uuid_last_ms, _uuid_counter = now_ms, 0
        else:
            # Same millisecond, or the clock stepped back: stay on the last instant.
            _uuid_counter += 1
            if _uuid_counter > 0xFFF:
                _uuid_last_ms, _uuid_counter = _uuid_last_ms + 1, 0
        millis, counter = _uuid_last_ms, _uuid_counter
    random_bits = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (millis & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | random_bits
    return uuid.UUID(int=value)


def _ready() -> Q:
    """Queued jobs without a delay, or whose delay has passed on the database clock."""
    return Q(run_after__isnull=True) | Q(run_after__lte=Now())


def thread_blockers() -> JobQuerySet:
    """A subquery over the outer job's thread: the jobs that keep the outer job waiting
    (running or dispatched ones, and ready queued ones ahead of it by ``(created_at,
    id)``). Use as ``~Exists(thread_blockers())``."""
    return (
        Job.objects.filter(thread_id=OuterRef("thread_id"))
        .exclude(id=OuterRef("id"))
        .filter(
            Q(status__in=list(CLAIMED_JOB_STATUSES))
            | (
                Q(status=JobStatus.QUEUED)
                & _ready()
                & (
                    Q(created_at__lt=OuterRef("created_at"))
                    | Q(created_at=OuterRef("created_at"), id__lt=OuterRef("id"))
                )
            )
        )
    )


class JobQuerySet(models.QuerySet["Job"]):
    def with_status(self, statuses: Iterable[str]) -> JobQuerySet:
        return self.filter(status__in=list(statuses))

    def queued(self) -> JobQuerySet:
        return self.filter(status=JobStatus.QUEUED)

    def inflight(self) -> JobQuerySet:
        """Queued, running or dispatched: what per-thread quotas count."""
        return self.with_status(INFLIGHT_JOB_STATUSES)

    def claimed(self) -> JobQuerySet:
        return self.with_status(CLAIMED_JOB_STATUSES)

    def terminal(self) -> JobQuerySet:
        return self.with_status(TERMINAL_JOB_STATUSES)

    def ready(self) -> JobQuerySet:
        """Queued jobs whose ``run_after`` is unset or has passed."""
        return self.queued().filter(_ready())

    def delayed(self) -> JobQuerySet:
        """Queued jobs whose ``run_after`` is still in the future."""
        return self.queued().filter(run_after__gt=Now())

    def for_targets(self, targets: Iterable[str] | None) -> JobQuerySet:
        return self if targets is None else self.filter(target__in=list(targets))

    def thread_unblocked(self) -> JobQuerySet:
        """The per-thread FIFO gate: jobs without a thread, or whose thread has no
        running or dispatched job and no earlier ready queued job (earlier by
        ``(created_at, id)``)."""
        return self.filter(Q(thread_id__isnull=True) | ~Exists(thread_blockers()))

    def claimable(self, targets: Iterable[str]) -> JobQuerySet:
        """What a claim may take, oldest first."""
        return self.ready().for_targets(targets).thread_unblocked().order_by("created_at", "id")

    def expired_leases(self, fallback_older_than: timedelta) -> JobQuerySet:
        """Jobs whose lease ended before the database clock, or that have no lease and
        were last written more than ``fallback_older_than`` ago."""
        return self.filter(
            Q(lease_until__isnull=False, lease_until__lt=Now())
            | Q(lease_until__isnull=True, updated_at__lt=Now() - fallback_older_than)
        )

    def stale_dispatched(self, dead_after: timedelta, hard_cap: timedelta) -> JobQuerySet:
        """Dispatched jobs to hand back to the queue: lease expired, no lease and silent
        for ``dead_after``, or dispatched longer than ``hard_cap`` ago."""
        return self.filter(status=JobStatus.DISPATCHED).filter(
            Q(lease_until__isnull=False, lease_until__lt=Now())
            | Q(lease_until__isnull=True, updated_at__lt=Now() - dead_after)
            | Q(dispatched_at__lt=Now() - hard_cap)
        )

    def not_written_for(self, older_than: timedelta) -> JobQuerySet:
        return self.filter(updated_at__lt=Now() - older_than)

    def stale_queued(self, ttl: timedelta) -> JobQuerySet:
        """Queued jobs created more than ``ttl`` ago. Tasks are not among them: a task
        waits for a worker however long that takes (and may be deferred for days)."""
        return self.queued().filter(created_at__lt=Now() - ttl, task_path__isnull=True)


#: When a queued task became (or becomes) due: its ``run_after``, or when it was enqueued.
#: Task claims order by it after priority, so a retry or deferred task that came due
#: first runs first, and neither kind can starve the other.
TASK_DUE = Coalesce("run_after", "created_at")


class Job(models.Model):
    """One unit of background work in the queue: queued, claimed by an in-process worker
    (running) or a remote executor (dispatched), then done, error or rejected."""

    id = models.UUIDField(primary_key=True, default=time_ordered_uuid, editable=False)
    request_id = models.CharField(
        _("request id"),
        max_length=200,
        help_text=_("Business idempotency key: one job per request."),
    )
    status = models.CharField(
        _("status"), max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED
    )
    target = models.CharField(_("target"), max_length=200, null=True, blank=True)
    source = models.CharField(_("source"), max_length=100, blank=True, default="")
    thread_id = models.BigIntegerField(_("thread"), null=True, blank=True)
    session_id = models.CharField(_("session"), max_length=200, null=True, blank=True)
    input = models.JSONField(_("input"), null=True, blank=True)
    input_preview = models.TextField(_("input preview"), blank=True, default="")
    result = models.JSONField(_("result"), null=True, blank=True)
    report = models.JSONField(_("report"), null=True, blank=True)
    usage = models.JSONField(_("usage"), null=True, blank=True)
    error = models.TextField(_("error"), null=True, blank=True)
    metadata = models.JSONField(_("metadata"), default=dict, blank=True)
    callback_url = models.CharField(_("callback URL"), max_length=2000, null=True, blank=True)
    attempts = models.PositiveIntegerField(_("attempts"), default=0)
    run_after = models.DateTimeField(
        _("run after"),
        null=True,
        blank=True,
        help_text=_("A queued job is not claimed before this instant (delay, backoff)."),
    )
    # Claim fields: set by a claim, cleared by every release.
    claimed_at = models.DateTimeField(_("claimed at"), null=True, blank=True)
    lease_until = models.DateTimeField(_("lease until"), null=True, blank=True)
    executor_id = models.CharField(_("executor / worker"), max_length=200, null=True, blank=True)
    dispatched_at = models.DateTimeField(_("dispatched at"), null=True, blank=True)
    claim_token = models.UUIDField(_("claim token"), null=True, blank=True, editable=False)
    created_at = models.DateTimeField(_("created at"), db_default=Now(), editable=False)
    updated_at = models.DateTimeField(_("updated at"), db_default=Now(), editable=False)
    # django.tasks (jobstate.tasks_backend): set on the jobs that are tasks, whose target
    # is "tasks:<backend alias>"; empty on every other job.
    task_path = models.CharField(
        _("task"),
        max_length=300,
        null=True,
        blank=True,
        help_text=_("Dotted path of the django.tasks task this job runs."),
    )
    queue_name = models.CharField(_("queue"), max_length=100, null=True, blank=True)
    # db_default too: rows inserted by SQL of a host's own (or an older jobstate) get 0.
    priority = models.IntegerField(
        _("priority"),
        default=0,
        db_default=0,
        help_text=_("Tasks of a higher priority are claimed first (-100 to 100)."),
    )
    max_attempts = models.PositiveIntegerField(
        _("max attempts"),
        null=True,
        blank=True,
        help_text=_("A task is retried until it has made this many attempts."),
    )
    attempt_log = models.JSONField(
        _("attempt log"),
        null=True,
        blank=True,
        help_text=_("Each finished attempt of a task: worker, start, end, outcome, error."),
    )

    objects = JobQuerySet.as_manager()

    class Meta:
        verbose_name = _("job")
        verbose_name_plural = _("jobs")
        ordering = ["-created_at"]
        # The admin's actions; each needs its own permission besides view_job.
        permissions = [
            ("requeue_job", _("Can requeue finished or expired jobs")),
            ("reject_job", _("Can reject queued jobs")),
            ("approve_job", _("Can approve and requeue finished jobs")),
        ]
        constraints = [
            models.UniqueConstraint(fields=["request_id"], name=JOB_UNIQUE_REQUEST_ID),
            models.CheckConstraint(
                condition=models.Q(status__in=JobStatus.values),
                name="jobstate_job_status_valid",
            ),
        ]
        indexes = [
            # Claims: ready queued jobs of some targets, oldest first. Partial, so it
            # holds only the queue, not the history.
            models.Index(
                fields=["target", "created_at", "id"],
                condition=models.Q(status="queued"),
                name="jobstate_job_claim_idx",
            ),
            # The per-thread gate and quotas. Rows without a thread (most jobs) stay out,
            # so their claims and completions never write this index.
            models.Index(
                fields=["thread_id", "status", "created_at"],
                condition=models.Q(thread_id__isnull=False),
                name="jobstate_job_thread_idx",
            ),
            # Lease sweeps (expired leases, stale dispatched jobs). Only claimed rows hold
            # a lease; a release clears it and takes the row out of the index. The id
            # makes it the sweeps' exact order, so a batch reads no more than it takes.
            models.Index(
                fields=["status", "lease_until", "id"],
                condition=models.Q(lease_until__isnull=False),
                name="jobstate_job_lease_idx",
            ),
            # Executor lease renewal: only jobs dispatched to remote executors, so an
            # in-process worker's claim never writes it.
            models.Index(
                fields=["executor_id"],
                condition=models.Q(status="dispatched"),
                name="jobstate_job_executor_idx",
            ),
            # Queue expiry and listing the queue or the failures oldest first. Running and
            # done jobs are left out: claims and completions are the hot path, and those
            # listings are served by the metrics and recent indexes below.
            models.Index(
                fields=["status", "created_at"],
                condition=models.Q(status__in=["queued", "error", "rejected"]),
                name="jobstate_job_created_idx",
            ),
            # Delayed jobs (the metrics' delayed count); tiny, as most jobs never wait.
            models.Index(
                fields=["run_after"],
                condition=models.Q(status="queued", run_after__isnull=False),
                name="jobstate_job_delayed_idx",
            ),
            # Metrics (terminal in the last minutes), listing claimed jobs and "not
            # written for" scans.
            models.Index(fields=["status", "updated_at"], name="jobstate_job_metrics_idx"),
            # The admin changelist's default ordering.
            models.Index(fields=["-created_at"], name="jobstate_job_recent_idx"),
            # Task claims: the queued tasks of one backend and queue in claim order
            # (priority, then when they became due, then enqueue order). Partial, so
            # it holds only waiting tasks and no other job ever writes it.
            models.Index(
                F("target"),
                F("queue_name"),
                F("priority").desc(),
                TASK_DUE,
                F("created_at"),
                F("id"),
                condition=models.Q(status="queued", task_path__isnull=False),
                name="jobstate_job_task_claim_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.request_id} {self.status} ({self.id})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_JOB_STATUSES


# --- the audit ledger --------------------------------------------------------------------


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
        return f"{self.event} {self.request_id or self.job_id or ''}".strip()


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
        return f"{self.lock_key} ({self.owner})"


# --- the notification outbox -------------------------------------------------------------

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
        return f"{self.channel} → {self.destination} ({self.state})"


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


class DeliveryReplay(models.Model):
    """Permanent marker: the dead letter ``dlq_key`` was replayed once. Kept even after
    the notification is pruned (no database constraint), so a key can never replay twice."""

    dlq_key = models.CharField(_("dead-letter key"), max_length=200, primary_key=True)
    notification = models.ForeignKey(
        Notification,
        verbose_name=_("notification"),
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="replays",
    )
    requested_by = models.CharField(_("requested by"), max_length=200)
    created_at = models.DateTimeField(_("created at"), db_default=Now(), editable=False)

    class Meta:
        verbose_name = _("delivery replay")
        verbose_name_plural = _("delivery replays")
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.dlq_key


# --- approval continuation ---------------------------------------------------------------


class ApprovalDecision(models.Model):
    """Permanent marker: decision ``decision_id`` requeued ``job`` once. Kept even after
    the job is pruned (no database constraint), so a decision can never requeue twice."""

    decision_id = models.CharField(_("decision id"), max_length=200, primary_key=True)
    job = models.ForeignKey(
        Job,
        verbose_name=_("job"),
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        related_name="approval_decisions",
    )
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
