"""jobstate's vocabulary: every status, status set, outcome and value type that the
models, the stores, the services and the console share.

This module sits at the bottom of the package: it imports only the standard library and
Django's choices, never a model or a store, so anything may import it without closing a
circle. Value types that carry a model instance (``CompletionResult``) stay with the store
contracts in :mod:`jobstate.stores.base`.
"""

from __future__ import annotations

import enum
import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import models
from django.utils.translation import gettext_lazy as _

#: A job id as callers hand it in: a UUID or its string form.
JobId = uuid.UUID | str


@dataclass(frozen=True)
class Trigger:
    """Who or what started a run. ``source`` is an open set; the listed values are
    conventions: ``"SCHEDULER"``, ``"CLI"``, ``"ADMIN"``, ``"CELERY"``."""

    source: str
    triggered_by: str | None = None


class JobRunStatus(models.TextChoices):
    RUNNING = "RUNNING", _("Running")
    """Claimed and executing; holds its overlap key."""
    SUCCEEDED = "SUCCEEDED", _("Succeeded")
    """The body finished and did not report ``ok: False``."""
    FAILED = "FAILED", _("Failed")
    """The body raised, reported ``ok: False``, or was aborted."""
    TIMED_OUT = "TIMED_OUT", _("Timed out")
    """Hit its deadline, or was reaped because its heartbeat went stale."""
    SKIPPED = "SKIPPED", _("Skipped")
    """Never executed because another run held the overlap key."""


TERMINAL_RUN_STATUSES = frozenset(
    {JobRunStatus.SUCCEEDED, JobRunStatus.FAILED, JobRunStatus.TIMED_OUT, JobRunStatus.SKIPPED}
)


REAPED_RUN_ERROR = "heartbeat stale: the running instance is assumed gone"


class JobStatus(models.TextChoices):
    QUEUED = "queued", _("Queued")
    """Waiting to be claimed; claimable once ``run_after`` (if any) has passed."""
    RUNNING = "running", _("Running")
    """Claimed by an in-process worker (``claim_next_inhub_job``); holds a lease."""
    DISPATCHED = "dispatched", _("Dispatched")
    """Claimed by a remote executor (``claim_next_job``); holds a lease the executor
    renews with ``extend_executor_leases``."""
    DONE = "done", _("Done")
    """Finished successfully. Terminal."""
    ERROR = "error", _("Error")
    """Failed, or expired in the queue. Terminal."""
    REJECTED = "rejected", _("Rejected")
    """Refused before or instead of running (policy, kill switch, denied approval). Terminal."""


TERMINAL_JOB_STATUSES = frozenset({JobStatus.DONE, JobStatus.ERROR, JobStatus.REJECTED})


#: Statuses that count as in flight: against per-thread quotas and in the thread gate.
INFLIGHT_JOB_STATUSES = frozenset({JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DISPATCHED})


#: Statuses a claim moves a job into; while one of a thread's jobs is in them the
#: thread's other jobs wait.
CLAIMED_JOB_STATUSES = frozenset({JobStatus.RUNNING, JobStatus.DISPATCHED})


EXPIRED_QUEUED_ERROR = (
    "queue timeout: the job waited longer than its time to live without being claimed "
    "and was expired, so stale work is not replayed in bulk once executors recover"
)


class CompletionOutcome(enum.Enum):
    """What a fenced report (``complete_claimed_job``) did."""

    COMPLETED = "completed"
    """The claim was current; the new status and patch were written."""
    STALE_CLAIM = "stale_claim"
    """The job is no longer held by that claim (requeued, claimed again, finished by
    someone else, or the token never matched). Nothing was written."""
    NOT_FOUND = "not_found"
    """No job has that id. Nothing was written."""


@dataclass(frozen=True)
class ClaimReport:
    """One fenced report in a batch (:meth:`StateStore.complete_claimed_jobs`): the same
    arguments :meth:`StateStore.complete_claimed_job` takes, as a value."""

    job_id: JobId
    claim_token: uuid.UUID | str
    status: str
    patch: Mapping[str, Any] = field(default_factory=dict)


def task_claim_token(claim_round: uuid.UUID, job_id: JobId) -> uuid.UUID:
    """The claim token a task claim made under ``claim_round`` gives the task ``job_id``:
    the MD5 digest of the round's and the job's ids in their canonical text, with the
    version (4) and variant bits of a random UUID set, as databases with a native UUID
    type (MariaDB 10.7+) insist. Each task of a claim gets its own token, and a worker
    whose claim reply was lost can still tell the tasks that claim took
    (``release_task_claim``), though it never saw their ids. PostgreSQL computes the
    same value in its claim statement; the other stores compute it here."""
    text = f"{claim_round}{uuid.UUID(str(job_id))}"
    digest = hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()
    return uuid.UUID(hex=digest, version=4)


#: Statuses a claim holder may report through ``complete_claimed_job``.
RELEASE_JOB_STATUSES = TERMINAL_JOB_STATUSES | {JobStatus.QUEUED}


# --- the outbox, approvals, replay, readiness and metrics ------------------------------


class NotificationState(models.TextChoices):
    PENDING = "pending", _("Pending")
    """Waiting for a relay; due once ``next_attempt_at`` has passed."""
    DELIVERING = "delivering", _("Delivering")
    """Claimed by a relay until ``lease_until``; due again if the relay dies."""
    DELIVERED = "delivered", _("Delivered")
    """The channel accepted it. Terminal."""
    DEAD = "dead", _("Dead letter")
    """Gave up after the last attempt; only a replay brings it back."""


@dataclass(frozen=True)
class NotificationRequest:
    """A notification to write into the outbox together with a job's terminal transition.

    ``channel`` names a registered relay channel (``"webhook"``, ``"email"``,
    ``"callable"`` or a host's own); ``destination`` is what that channel sends to (a URL,
    an address, a dotted path). ``idempotency_key`` is unique across the outbox and is
    handed to the receiver so it can drop a repeated delivery; when omitted the store
    derives one from the job, the channel and the destination.
    """

    channel: str
    destination: str
    payload: dict[str, Any]
    idempotency_key: str | None = None


class ApprovalRequeueOutcome(enum.StrEnum):
    """What ``requeue_approved_job_once`` did."""

    REQUEUED = "requeued"
    """The terminal job went back to the queue and the decision marker was written."""
    ALREADY_REQUEUED = "already_requeued"
    """This decision already requeued this job; nothing changed (idempotent answer)."""
    DECISION_CONFLICT = "decision_conflict"
    """The ``decision_id`` was already used for another job; nothing changed."""
    JOB_IN_FLIGHT = "job_in_flight"
    """The job is queued, running or dispatched and will consume the approval itself."""
    NOT_FOUND = "not_found"
    """No job has that id."""


class DeliveryRequeueOutcome(enum.StrEnum):
    """What ``requeue_delivery_job_once`` did."""

    REQUEUED = "requeued"
    """The dead notification went back to pending and the replay marker was written."""
    ALREADY_REQUEUED = "already_requeued"
    """That dead-letter key already replayed this notification; nothing changed."""
    KEY_CONFLICT = "key_conflict"
    """That dead-letter key was already used for another notification; nothing changed."""
    NOT_DEAD = "not_dead"
    """The notification is not a dead letter; nothing changed."""
    NOT_FOUND = "not_found"
    """No notification has that id."""


@dataclass(frozen=True)
class JobOperationalMetrics:
    """The seed's six operational figures (definitions in the README)."""

    by_status: dict[str, int]
    terminal_last_15m: dict[str, int]
    oldest_queued_age_seconds: float
    delayed_queued_jobs: int
    expired_leases: int
    blocked_threads: int
    #: Statuses whose ``by_status`` count is an estimate from the database's statistics
    #: rather than an exact count (see ``JOBSTATE['METRICS_EXACT_LIMIT']``).
    estimated_statuses: tuple[str, ...] = ()


@dataclass(frozen=True)
class Readiness:
    """Whether this process may serve: the database answers, every jobstate migration is
    applied and the tables exist. ``database`` is ``"ok"`` or ``"failed"``;
    ``migrations`` is ``"ok"``, ``"pending"`` or ``"failed"``; ``pending`` counts the
    unapplied jobstate migrations; ``detail`` says what failed."""

    ready: bool
    database: str
    migrations: str
    pending: int
    detail: str = ""


# --- the audit ledger ------------------------------------------------------------------


class AuditStage(models.TextChoices):
    LAUNCH = "launch", _("Launch")
    CONTEXT = "context", _("Context")
    EXECUTION = "execution", _("Execution")
    TOOL = "tool", _("Tool")
    APPROVAL = "approval", _("Approval")
    DELIVERY = "delivery", _("Delivery")
    SUMMARY = "summary", _("Summary")
    RECOVERY = "recovery", _("Recovery")
    CHANNEL = "channel", _("Channel")
    CONFIG = "config", _("Configuration")
    SYSTEM = "system", _("System")


class AuditSeverity(models.TextChoices):
    INFO = "info", _("Info")
    WARNING = "warning", _("Warning")
    ERROR = "error", _("Error")


@dataclass(frozen=True)
class AuditEventDefaults:
    """What ``append_audit`` fills in for a known event when the caller leaves it out."""

    stage: AuditStage
    severity: AuditSeverity
    title: str


def _events_of(
    stage: AuditStage, **events: tuple[AuditSeverity, str]
) -> dict[str, AuditEventDefaults]:
    """The defaults of ``stage``'s known events, given as ``name=(severity, title)``."""
    return {
        name: AuditEventDefaults(stage, severity, title)
        for name, (severity, title) in events.items()
    }


_INFO, _WARNING, _ERROR = AuditSeverity.INFO, AuditSeverity.WARNING, AuditSeverity.ERROR

#: Known audit events. An unknown event is stored as stage ``system``, severity ``info``
#: and its own name as the title.
AUDIT_EVENTS: dict[str, AuditEventDefaults] = {
    **_events_of(
        AuditStage.LAUNCH,
        received=(_INFO, "Request received"),
        rejected=(_WARNING, "Rejected"),
    ),
    **_events_of(
        AuditStage.EXECUTION,
        started=(_INFO, "Started"),
    ),
    **_events_of(
        AuditStage.SUMMARY,
        finished=(_INFO, "Finished"),
    ),
    **_events_of(
        AuditStage.RECOVERY,
        recovered=(_WARNING, "Recovered"),
        rerun=(_INFO, "Rerun requested"),
        retry_scheduled=(_WARNING, "Retry scheduled"),
        retry_now=(_INFO, "Retry brought forward"),
        expired=(_WARNING, "Expired"),
    ),
    **_events_of(
        AuditStage.SYSTEM,
        deleted=(_WARNING, "Deleted"),
        cancelled=(_WARNING, "Cancelled"),
        discarded=(_WARNING, "Discarded"),
        ledger_error=(_ERROR, "Ledger error"),
        queue_paused=(_WARNING, "Queue paused"),
        queue_resumed=(_INFO, "Queue resumed"),
    ),
    **_events_of(
        AuditStage.TOOL,
        tool_result=(_INFO, "Tool result"),
    ),
    **_events_of(
        AuditStage.APPROVAL,
        tool_approved=(_INFO, "Tool approved"),
        tool_approved_external=(_INFO, "Tool approved externally"),
        tool_denied=(_WARNING, "Tool denied"),
        tool_denied_external=(_WARNING, "Tool denied externally"),
    ),
    **_events_of(
        AuditStage.DELIVERY,
        delivery_queued=(_INFO, "Delivery queued"),
        delivery_skipped=(_INFO, "Delivery skipped"),
        delivery_error=(_ERROR, "Delivery failed"),
        dlq_resend_ok=(_INFO, "Dead letter resent"),
        dlq_resend_failed=(_ERROR, "Dead letter resend failed"),
    ),
    **_events_of(
        AuditStage.CHANNEL,
        channel_delivered=(_INFO, "Delivered to channel"),
        channel_delivery_error=(_ERROR, "Channel delivery failed"),
        channel_delivery_skipped=(_INFO, "Channel delivery skipped"),
    ),
}


AUDIT_SUMMARY_LIMIT = 500

#: Joins the ``key: value`` pairs of a summary built from ``detail``.
AUDIT_SUMMARY_SEPARATOR = " · "


AUDIT_TITLE_LIMIT = 200


# --- django.tasks ----------------------------------------------------------------------

#: A task's ``target`` is this prefix and its backend's alias, so the tasks of two
#: backends never mix and a hub worker's targets never name one by accident.
TASK_TARGET_PREFIX = "tasks:"

#: The PostgreSQL channel an enqueued task is announced on (``NOTIFY``), and idle task
#: workers listen to.
TASK_NOTIFY_CHANNEL = "jobstate_tasks"

#: The name of the ``TaskResultStatus`` member each job status is, for a task: kept as
#: names so the console can say them without importing ``django.tasks`` (optional on
#: Django 5.2); :data:`jobstate.tasks.results.RESULT_STATUSES` is built from it.
TASK_RESULT_STATUS_NAMES: dict[str, str] = {
    JobStatus.QUEUED: "READY",
    JobStatus.RUNNING: "RUNNING",
    JobStatus.DISPATCHED: "RUNNING",
    JobStatus.DONE: "SUCCESSFUL",
    JobStatus.ERROR: "FAILED",
    JobStatus.REJECTED: "FAILED",
}


#: The ``TaskResultStatus`` names a unique task's key may cover (``policy(unique_states=...)``),
#: each with its bit in the job's ``unique_states`` mask. A job holds its key while its
#: status is one its mask covers (the job statuses of each name are
#: :data:`TASK_RESULT_STATUS_NAMES`), and a unique index enforces one holder per key.
UNIQUE_STATE_BITS: dict[str, int] = {"READY": 1, "RUNNING": 2, "SUCCESSFUL": 4, "FAILED": 8}

#: The states a unique task covers when it names none: waiting or running.
DEFAULT_UNIQUE_STATES = ("READY", "RUNNING")


def unique_state_mask(names: tuple[str, ...] | list[str] | frozenset[str]) -> int:
    """The ``unique_states`` mask of the ``TaskResultStatus`` names ``names``."""
    mask = 0
    for name in names:
        mask |= UNIQUE_STATE_BITS[name]
    return mask


def unique_hold_statuses() -> dict[str, int]:
    """Each job status a task can be in, with the bit of ``unique_states`` that makes a
    job in that status hold its uniqueness key (a remote executor's ``dispatched`` is
    never a task's)."""
    return {
        status: UNIQUE_STATE_BITS[name]
        for status, name in TASK_RESULT_STATUS_NAMES.items()
        if status != JobStatus.DISPATCHED
    }


def task_target(alias: str) -> str:
    """The ``target`` of the tasks of backend ``alias``."""
    return f"{TASK_TARGET_PREFIX}{alias}"


def task_notify_payload(target: str, queue_name: str) -> str:
    """The payload announcing a task of ``target`` in ``queue_name``: a JSON pair, so a
    worker compares whole payloads and no separator can be mistaken inside a name.
    PostgreSQL delivers identical notifications of one transaction once, so a
    transaction that enqueues many tasks into one queue wakes the workers once."""
    return json.dumps([target, queue_name], ensure_ascii=False)


@dataclass(frozen=True)
class NewTask:
    """A django.tasks task to enqueue as a job (``StateStore.enqueue_task``).

    ``args`` and ``kwargs`` are stored as the job's ``input``; ``max_attempts`` is the
    task's (its policy's, or the backend's ``MAX_ATTEMPTS``) when it was enqueued, and
    stays with the task, as its ``policy`` does."""

    target: str
    task_path: str
    queue_name: str
    priority: int
    args: list[Any]
    kwargs: dict[str, Any]
    max_attempts: int
    run_after: datetime | None = None
    #: The declared policy the worker applies (``jobstate.tasks.policy``), as JSON.
    policy: dict[str, Any] | None = None
    #: A unique task: the digest of its key and the mask of the states it covers
    #: (:data:`UNIQUE_STATE_BITS`); a job of the same target holding the digest is
    #: returned instead of a new one.
    unique_digest: str | None = None
    unique_states: int | None = None
    #: A task under a concurrency key: the key's digest, and how many of the key's tasks
    #: may run at once (the claims count them).
    concurrency_digest: str | None = None
    concurrency_limit: int | None = None
    #: The new job's request id; the job returned has another one when it is the
    #: existing holder of the unique key.
    request_id: str = field(default_factory=lambda: f"task-{uuid.uuid4()}")


@dataclass(frozen=True)
class TaskRecovery:
    """What one pass over tasks whose worker stopped renewing their lease did (or,
    counted, would do)."""

    requeued: int = 0
    """Back to ``queued``, the lost attempt counted: attempts remained."""
    failed: int = 0
    """Moved to ``error`` with a :class:`~jobstate.exceptions.WorkerLost` error: the lost
    attempt was the last one allowed."""

    @property
    def total(self) -> int:
        return self.requeued + self.failed


# --- the fleet: paused queues, registered workers ---------------------------------------

#: The queue name of a target's jobs that have no queue (the hub and executor jobs): a
#: job's queue is its ``queue_name``, or this when it has none.
NO_QUEUE = ""


class WorkerKind(models.TextChoices):
    """What a registered worker process runs."""

    TASKS = "tasks", _("task worker")
    RELAY = "relay", _("notification relay")
    EXECUTOR = "executor", _("claiming executor")
    """A process that claims through the store (``claim_next_job``,
    ``claim_next_inhub_job(s)``, ``extend_executor_leases``): a remote executor or a
    host's own hub worker. Registered by its claims, not by itself."""


@dataclass(frozen=True)
class WorkerRegistration:
    """What a worker process says of itself when it starts
    (``StateStore.register_worker``)."""

    worker_id: str
    kind: str
    """``"tasks"`` (a ``jobstate_worker``), ``"relay"`` (``deliver_notifications
    --loop``) or ``"executor"`` (registered by its claims)."""
    host: str
    pid: int
    lease: timedelta
    """How long its beat may be silent before the console calls it lost."""
    backend: str = ""
    queues: tuple[str, ...] | None = None
    """The queues it claims from; ``None``: every queue."""
    concurrency: int = 1
