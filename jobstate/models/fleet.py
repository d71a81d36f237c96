"""The fleet an operator watches: the worker processes that registered themselves, and
the queues an operator paused.

A :class:`Worker` row is written by the process it describes: when it starts, on each
beat it already makes (a task worker's lease-renewal beat, a relay's pass), and when it
stops gracefully; an executor's row by the store its claims go through, at most once
per beat (``jobstate.stores.contracts.claimer_presence``). Whether it is live or lost
is read from its last beat against its own lease, on the database clock. A
:class:`QueuePause` row exists while its queue is paused; every claim reads the (tiny)
table in the claim statement itself, so a pause needs no cache to be invalidated and
holds from the moment it commits.

Neither table needs a partial unique constraint: a queue's pause is unique on
``(target, queue_name)`` and a worker on ``worker_id``, both plain unique keys, which
every supported backend enforces as written.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import models
from django.db.models.functions import Now
from django.utils.translation import gettext_lazy as _

from jobstate.core.bidi import isolated
from jobstate.core.states import NO_QUEUE, WorkerKind

__all__ = [
    "NO_QUEUE",
    "QUEUE_PAUSE_UNIQUE",
    "WORKER_UNIQUE_ID",
    "QueuePause",
    "Worker",
    "WorkerKind",
    "WorkerQuerySet",
]

#: One pause per queue: a second pause of a paused queue changes nothing.
QUEUE_PAUSE_UNIQUE = "jobstate_queuepause_unique_queue"
#: One row per worker id (a worker id is new for each start of a process).
WORKER_UNIQUE_ID = "jobstate_worker_unique_worker_id"


class WorkerQuerySet(models.QuerySet["Worker"]):
    def running(self) -> WorkerQuerySet:
        """Workers that did not say they stopped (live or lost)."""
        return self.filter(stopped_at__isnull=True)

    def lost(self) -> WorkerQuerySet:
        """Workers that did not stop gracefully and whose last beat is older than their
        lease, on the database clock: killed, hung or cut off from the database."""
        return self.running().filter(heartbeat_at__lt=Now() - models.F("lease"))

    def live(self) -> WorkerQuerySet:
        return self.running().filter(heartbeat_at__gte=Now() - models.F("lease"))

    def silent_for(self, older_than: timedelta) -> WorkerQuerySet:
        """Workers (stopped, lost or not) whose last beat is older than ``older_than``
        (a duration): what the retention sweep forgets."""
        return self.filter(heartbeat_at__lt=Now() - older_than)


class Worker(models.Model):
    """One registered worker process: a ``jobstate_worker``, the relay loop of
    ``deliver_notifications --loop``, or a process claiming through the store."""

    id = models.BigAutoField(primary_key=True)
    worker_id = models.CharField(_("worker id"), max_length=200)
    kind = models.CharField(_("kind"), max_length=8, choices=WorkerKind.choices)
    host = models.CharField(_("host"), max_length=255)
    pid = models.PositiveIntegerField(_("pid"))
    backend = models.CharField(
        _("backend"),
        max_length=100,
        blank=True,
        default="",
        help_text=_("The django.tasks backend alias of a task worker."),
    )
    queues = models.JSONField(
        _("queues"),
        null=True,
        blank=True,
        help_text=_("The queues it claims from; empty: every queue."),
    )
    concurrency = models.PositiveIntegerField(_("concurrency"), default=1)
    lease = models.DurationField(
        _("lease"),
        help_text=_("A worker whose last beat is older than this is lost."),
    )
    started_at = models.DateTimeField(_("started"), db_default=Now(), editable=False)
    heartbeat_at = models.DateTimeField(_("last beat"), db_default=Now())
    stopped_at = models.DateTimeField(_("stopped"), null=True, blank=True)
    stopped_reason = models.CharField(_("stopped by"), max_length=200, blank=True, default="")

    objects = WorkerQuerySet.as_manager()

    class Meta:
        verbose_name = _("worker")
        verbose_name_plural = _("workers")
        ordering = ["-started_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["worker_id"], name=WORKER_UNIQUE_ID),
            models.CheckConstraint(
                condition=models.Q(kind__in=WorkerKind.values),
                name="jobstate_worker_kind_valid",
            ),
        ]
        indexes = [
            # The retention sweep, oldest beat first.
            models.Index(fields=["heartbeat_at", "id"], name="jobstate_worker_beat_idx"),
        ]

    def __str__(self) -> str:
        return isolated(self.worker_id)


class QueuePause(models.Model):
    """A paused queue: no worker or executor claims a job of ``target`` whose queue is
    ``queue_name`` (:data:`NO_QUEUE` for the jobs without one) while the row exists."""

    id = models.BigAutoField(primary_key=True)
    target = models.CharField(_("target"), max_length=200)
    queue_name = models.CharField(_("queue"), max_length=100, blank=True, default=NO_QUEUE)
    paused_at = models.DateTimeField(_("paused at"), db_default=Now(), editable=False)
    paused_by = models.CharField(_("paused by"), max_length=200, blank=True, default="")

    class Meta:
        # A row is a paused queue; the admin's page of them is the Queues page, which
        # lists every queue and pauses and resumes them.
        verbose_name = _("queue")
        verbose_name_plural = _("queues")
        ordering = ["target", "queue_name"]
        permissions = [("pause_queue", _("Can pause and resume queues"))]
        constraints = [
            models.UniqueConstraint(fields=["target", "queue_name"], name=QUEUE_PAUSE_UNIQUE),
        ]

    def __str__(self) -> str:
        return f"{isolated(self.target)} / {isolated(self.queue_name or '—')}"
