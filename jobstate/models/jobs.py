"""The job queue: one row per job, its states as QuerySet methods."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import models
from django.db.models import Exists, F, OuterRef, Q, Value
from django.db.models.functions import Coalesce, Now
from django.utils.translation import gettext_lazy as _

from jobstate.core.bidi import isolated
from jobstate.core.states import (
    CLAIMED_JOB_STATUSES,
    INFLIGHT_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobStatus,
)
from jobstate.models.fleet import NO_QUEUE, QueuePause
from jobstate.models.job_identity import (
    JOB_UNIQUE_TASK,
    time_ordered_uuid,
    unique_hold,
)

#: Unique constraint behind request-id idempotency; stores match ``IntegrityError`` on it.
JOB_UNIQUE_REQUEST_ID = "jobstate_job_unique_request_id"
#: PostgreSQL's name for the runtime lock table's primary key.
RUNTIME_LOCK_PKEY = "jobstate_runtimelock_pkey"

# --- the claim's rules, as ORM conditions ----------------------------------------------
#
# The one-statement claims (jobstate.stores.database.backends) cannot be written on the
# ORM, so each rule they share with the portable claims is written twice: here, and as
# SQL text in jobstate.models.claim_sql; tests/stores/test_sql_twins.py runs both on the
# same rows on every backend and asserts they select the same ones.


def _ready() -> Q:
    """Queued jobs without a delay, or whose delay has passed on the database clock."""
    return Q(run_after__isnull=True) | Q(run_after__lte=Now())


#: The order a claim takes jobs in (``JobQuerySet.claimable``), and in SQL.
CLAIM_ORDER = ("created_at", "id")


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


def queue_paused() -> Exists:
    """Whether the outer job's queue (its target and ``queue_name``, or
    :data:`~jobstate.models.NO_QUEUE` without one) is paused. Use as
    ``~queue_paused()``: every claim filters on it."""
    return Exists(
        QueuePause.objects.filter(
            target=OuterRef("target"),
            queue_name=Coalesce(OuterRef("queue_name"), Value(NO_QUEUE)),
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

    def unpaused(self) -> JobQuerySet:
        """Jobs whose queue is not paused."""
        return self.filter(~queue_paused())

    def claimable(self, targets: Iterable[str], *, gated: bool = True) -> JobQuerySet:
        """What a claim may take, oldest first: ready, of an unpaused queue, through the
        per-thread gate (without ``gated``, the jobs of a thread regardless of the gate:
        for a claim that puts them through it itself)."""
        rows = self.ready().for_targets(targets).unpaused()
        return (rows.thread_unblocked() if gated else rows).order_by(*CLAIM_ORDER)

    def due_tasks(self, target: str, *, keyed: bool = False) -> JobQuerySet:
        """The queued tasks of ``target`` that are due on the database clock, with their
        due instant as the alias ``due`` (:data:`TASK_DUE`): those without a concurrency
        key, or with ``keyed`` those with one (claimed under their key's gate)."""
        return (
            self.filter(
                status=JobStatus.QUEUED,
                task_path__isnull=False,
                target=target,
                concurrency_digest__isnull=not keyed,
            )
            .alias(due=TASK_DUE)
            .filter(due__lte=Now())
        )

    def in_task_claim_order(self) -> JobQuerySet:
        """:meth:`due_tasks` in the order a task claim takes them."""
        return self.order_by(F("priority").desc(), "due", "created_at", "id")

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

    def requeueable(self) -> JobQuerySet:
        """The jobs a requeue may take (the refire of reruns, the console's bulk requeue,
        the admin's action): finished ones, and running or dispatched ones whose lease
        ended before the database clock. A claimed job without a lease is not: its
        holder never said how long it needs. :meth:`Job.requeueable_at` is the same rule
        on one loaded job."""
        return self.filter(
            Q(status__in=list(TERMINAL_JOB_STATUSES))
            | Q(status__in=list(CLAIMED_JOB_STATUSES), lease_until__lt=Now())
        )

    def cancellable(self) -> JobQuerySet:
        """The jobs a cancel may take (``StateStore.cancel_job``, the console's Cancel):
        every job not finished yet. A queued one is rejected before it runs; a running
        or dispatched one is rejected and its claim revoked, so its holder's report is
        refused. :meth:`Job.cancellable_now` is the same rule on one loaded job."""
        return self.inflight()

    def retryable_now(self) -> JobQuerySet:
        """Tasks waiting for a retry (``StateStore.retry_job_now``): queued after at
        least one attempt, with the ``run_after`` the retry's backoff set. (Its instant
        is not compared with the clock: bringing forward a retry already due only
        keeps it due.) :meth:`Job.waiting_for_retry` is the same rule on one loaded job."""
        return self.filter(
            status=JobStatus.QUEUED,
            task_path__isnull=False,
            attempts__gt=0,
            run_after__isnull=False,
        )

    def discardable(self) -> JobQuerySet:
        """Tasks a discard may give up (``StateStore.discard_job``): queued ones, waiting
        for a retry or for their first attempt. :meth:`Job.discardable_now` is the same
        rule on one loaded job."""
        return self.filter(status=JobStatus.QUEUED, task_path__isnull=False)

    def approvable(self) -> JobQuerySet:
        """The jobs the console's "approve and requeue" offers: failed or rejected jobs
        that are no tasks (a task is retried or requeued, it is not approved; a done
        job has nothing to approve). :meth:`Job.approvable_now` is the same rule on
        one loaded job."""
        return self.filter(status__in=[JobStatus.ERROR, JobStatus.REJECTED], task_path__isnull=True)

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
    # django.tasks (jobstate.tasks.backend): set on the jobs that are tasks, whose target
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

    # Task policy (jobstate.tasks.policy), stored with the job so the worker that runs it
    # honours what was declared when it was enqueued, whatever code that worker runs.
    policy = models.JSONField(
        _("policy"),
        null=True,
        blank=True,
        help_text=_(
            "The task's declared policy (timeout, retry backoff, the errors that retry, "
            "its keys) when it was enqueued; what it leaves out comes from the backend."
        ),
    )
    # A unique task: the digest of its uniqueness key (any length, compared byte for
    # byte on every backend) and the TaskResultStatus names it covers, as a mask
    # (jobstate.core.states.UNIQUE_STATE_BITS).
    unique_digest = models.CharField(_("uniqueness digest"), max_length=64, null=True, blank=True)
    unique_states = models.PositiveSmallIntegerField(_("unique states"), null=True, blank=True)
    # A task under a concurrency key: the key's digest and how many of its jobs may run at
    # once. Claims take such a task only under the key's gate, counting its running jobs.
    concurrency_digest = models.CharField(
        _("concurrency digest"), max_length=64, null=True, blank=True
    )
    concurrency_limit = models.PositiveIntegerField(_("concurrency limit"), null=True, blank=True)

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
            ("delete_finished_job", _("Can delete finished jobs")),
            ("cancel_job", _("Can cancel queued, running or dispatched jobs")),
            ("retry_job_now", _("Can run a task waiting for its retry at once")),
            ("discard_job", _("Can discard queued tasks")),
        ]
        constraints = [
            models.UniqueConstraint(fields=["request_id"], name=JOB_UNIQUE_REQUEST_ID),
            # Unique tasks: one holder per backend and key. Partial, so a job that is no
            # unique task, or has left the states it covers, costs the index nothing.
            models.UniqueConstraint(
                fields=["target", "unique_digest"],
                condition=unique_hold(),
                name=JOB_UNIQUE_TASK,
            ),
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
            # Concurrency keys: a key's running jobs (what a claim counts under the key's
            # gate) and its waiting ones. Only tasks under a key are in it.
            models.Index(
                fields=["concurrency_digest", "status", "target"],
                condition=models.Q(concurrency_digest__isnull=False),
                name="jobstate_job_concurrency_idx",
            ),
        ]

    def __str__(self) -> str:
        # How the admin names a job in its breadcrumbs, messages and history: a task by
        # its task path, any other job by its request id; the id tells them apart. The
        # status is left out: the history keeps this text after the status has moved on.
        return f"{isolated(self.task_path or self.request_id)} ({self.id})"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_JOB_STATUSES

    def cancellable_now(self) -> bool:
        """Whether :meth:`JobQuerySet.cancellable` takes this job as loaded."""
        return self.status in INFLIGHT_JOB_STATUSES

    def waiting_for_retry(self) -> bool:
        """Whether :meth:`JobQuerySet.retryable_now` takes this job as loaded."""
        return (
            self.status == JobStatus.QUEUED
            and self.task_path is not None
            and self.attempts > 0
            and self.run_after is not None
        )

    def approvable_now(self) -> bool:
        """Whether :meth:`JobQuerySet.approvable` takes this job as loaded."""
        return self.status in (JobStatus.ERROR, JobStatus.REJECTED) and self.task_path is None

    def discardable_now(self) -> bool:
        """Whether :meth:`JobQuerySet.discardable` takes this job as loaded."""
        return self.status == JobStatus.QUEUED and self.task_path is not None

    def requeueable_at(self, now: datetime) -> bool:
        """Whether :meth:`JobQuerySet.requeueable` takes this job as loaded, with ``now``
        the database clock (for a page that shows why a job cannot be requeued)."""
        if self.status in TERMINAL_JOB_STATUSES:
            return True
        lease = self.lease_until
        return self.status in CLAIMED_JOB_STATUSES and lease is not None and lease < now
