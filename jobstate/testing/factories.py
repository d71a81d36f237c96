"""factory-boy factories for jobstate's rows: jobs, runs, audit entries, notifications and
runtime locks.

Needs factory-boy, which jobstate does not need at runtime: install the ``testing`` extra
(``pip install "django-jobstate[testing]"``). Nothing in jobstate imports this module.

Defaults build rows that pass the models' constraints and the stores' JSON checks; traits
name the states tests start from, and any field can be given explicitly::

    from jobstate.testing.factories import JobFactory, RuntimeLockFactory

    job = JobFactory(running=True, target="mail", lease_until=an_hour_ago)
    RuntimeLockFactory.bulk_create_batch(50, expired=True)

The rows are written directly, the way a crash or an older release might have left them:
no audit entry, no outbox row, no store validation. That is what a test seeding the
candidates of a sweep or the pages of the console wants; a test of a transition goes
through a store instead.
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any, TypeVar

import factory
from django.db import models
from django.utils import timezone
from factory.django import DjangoModelFactory

from jobstate.models import AuditEntry, Job, JobRun, Notification, RuntimeLock
from jobstate.stores.base import JobRunStatus, JobStatus, NotificationState

__all__ = [
    "AuditEntryFactory",
    "JobFactory",
    "JobRunFactory",
    "NotificationFactory",
    "RuntimeLockFactory",
]

# The settings' defaults (WORKER_LEASE, EXECUTOR_LEASE, OUTBOX_LEASE, OUTBOX_MAX_ATTEMPTS),
# repeated rather than read: a factory's rows must not change when a test overrides them.
WORKER_LEASE = timedelta(minutes=20)
EXECUTOR_LEASE = timedelta(minutes=4)
OUTBOX_LEASE = timedelta(minutes=2)
OUTBOX_MAX_ATTEMPTS = 8

M = TypeVar("M", bound=models.Model)


class _BulkFactory(DjangoModelFactory[M]):
    """Adds one-statement batches: sweeps are tested over thousands of rows, and
    ``create_batch`` writes them one INSERT at a time."""

    class Meta:
        abstract = True

    @classmethod
    def bulk_create_batch(cls, size: int, **kwargs: Any) -> list[M]:
        """Build ``size`` rows as ``build_batch`` does and insert them with one
        ``bulk_create``. Post-generation hooks and related factories do not run, so every
        related row given must already be saved."""
        rows: list[M] = cls.build_batch(size, **kwargs)
        # The manager ``create`` uses: it honours the factory's ``database`` option.
        manager: models.Manager[M] | models.QuerySet[M] = cls._get_manager(cls._meta.model)
        return manager.bulk_create(rows)


class JobFactory(_BulkFactory[Job]):
    """A queued job. Traits: ``queued``, ``running`` (claimed by an in-process worker,
    with a lease and a claim token), ``dispatched`` (claimed by a remote executor),
    ``done`` and ``failed`` (terminal)."""

    class Meta:
        model = Job

    request_id = factory.Sequence(lambda n: f"request-{n}")
    target = "default"
    status = JobStatus.QUEUED

    class Params:
        queued = factory.Trait(
            status=JobStatus.QUEUED,
            executor_id=None,
            claim_token=None,
            claimed_at=None,
            lease_until=None,
            dispatched_at=None,
        )
        running = factory.Trait(
            status=JobStatus.RUNNING,
            executor_id="worker-1",
            claim_token=factory.LazyFunction(uuid.uuid4),
            claimed_at=factory.LazyFunction(timezone.now),
            lease_until=factory.LazyAttribute(lambda job: job.claimed_at + WORKER_LEASE),
        )
        dispatched = factory.Trait(
            status=JobStatus.DISPATCHED,
            executor_id="executor-1",
            claim_token=factory.LazyFunction(uuid.uuid4),
            claimed_at=factory.LazyFunction(timezone.now),
            dispatched_at=factory.SelfAttribute("claimed_at"),
            lease_until=factory.LazyAttribute(lambda job: job.claimed_at + EXECUTOR_LEASE),
        )
        done = factory.Trait(status=JobStatus.DONE)
        failed = factory.Trait(status=JobStatus.ERROR, error="failed")


class JobRunFactory(_BulkFactory[JobRun]):
    """A RUNNING run holding its own overlap key. Traits: ``running``, ``settled``
    (SUCCEEDED; give ``status`` for another outcome) and ``skipped`` (holds no key).

    ``heartbeat_at`` is left to the database clock unless given, as the stores leave it."""

    class Meta:
        model = JobRun

    job_key = "operations.job"
    overlap_key = factory.Sequence(lambda n: f"overlap-{n}")
    status = JobRunStatus.RUNNING
    trigger_source = "CLI"
    started_at = factory.LazyFunction(timezone.now)

    class Params:
        running = factory.Trait(status=JobRunStatus.RUNNING, finished_at=None, duration_ms=None)
        settled = factory.Trait(
            status=JobRunStatus.SUCCEEDED,
            finished_at=factory.SelfAttribute("started_at"),
            duration_ms=0,
        )
        skipped = factory.Trait(
            status=JobRunStatus.SKIPPED,
            overlap_key=None,
            summary=factory.LazyFunction(lambda: {"reason": "overlap"}),
            finished_at=factory.SelfAttribute("started_at"),
            duration_ms=0,
        )


class AuditEntryFactory(_BulkFactory[AuditEntry]):
    """An audit entry, of no job unless ``job`` is given (then with its request id).
    ``ts`` is the database clock unless given."""

    class Meta:
        model = AuditEntry

    job = None
    request_id = factory.LazyAttribute(lambda entry: entry.job.request_id if entry.job else "")
    event = "received"


class NotificationFactory(_BulkFactory[Notification]):
    """A pending webhook notification. Traits: ``delivering`` (held by a relay's lease),
    ``delivered`` and ``dead`` (dead-lettered after the last attempt)."""

    class Meta:
        model = Notification

    job = None
    channel = "webhook"
    destination = "https://hooks.example.com/jobs"
    idempotency_key = factory.Sequence(lambda n: f"notification-{n}")
    state = NotificationState.PENDING

    class Params:
        delivering = factory.Trait(
            state=NotificationState.DELIVERING,
            attempts=1,
            relay_id="relay-1",
            lease_until=factory.LazyFunction(lambda: timezone.now() + OUTBOX_LEASE),
        )
        delivered = factory.Trait(
            state=NotificationState.DELIVERED,
            attempts=1,
            delivered_at=factory.LazyFunction(timezone.now),
        )
        dead = factory.Trait(
            state=NotificationState.DEAD,
            attempts=OUTBOX_MAX_ATTEMPTS,
            last_error="HTTP 503",
        )


class RuntimeLockFactory(_BulkFactory[RuntimeLock]):
    """A lock held for another five minutes. Trait: ``expired`` (its lease ran out a
    minute ago, so any owner may take it)."""

    class Meta:
        model = RuntimeLock

    lock_key = factory.Sequence(lambda n: f"lock-{n}")
    owner = "worker-1"
    expires_at = factory.LazyFunction(lambda: timezone.now() + timedelta(minutes=5))

    class Params:
        expired = factory.Trait(
            expires_at=factory.LazyFunction(lambda: timezone.now() - timedelta(minutes=1))
        )
