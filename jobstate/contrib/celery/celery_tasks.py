"""Celery tasks: the maintenance sweeps and operations jobs, for Celery beat.

Each task is a thin call of the function the management commands use, and returns a
JSON-ready dict of what it did. Schedule them with
:data:`jobstate.contrib.celery.beat.JOBSTATE_BEAT_SCHEDULE`.
The task names (``jobstate.reap_stale``, ``jobstate.prune``,
``jobstate.deliver_notifications``, ``jobstate.run_operations_job``,
``jobstate.enqueue_due_schedules``) are stable, so beat entries can name them as
strings.

Needs Celery (``pip install "django-jobstate[celery]"``); the host's Celery app finds
this module with ``app.autodiscover_tasks(["jobstate.contrib.celery"],
related_name="celery_tasks")``.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from celery import shared_task
from django.db import DEFAULT_DB_ALIAS, connections

from jobstate.maintenance import run_reaping_sweeps, run_retention_sweeps
from jobstate.operations.job_runner import JobRunner
from jobstate.outbox.relay import deliver_notifications
from jobstate.schedules import evaluate_schedules, sync_schedules
from jobstate.stores import get_run_store, get_state_store
from jobstate.stores.base import Trigger

__all__ = [
    "deliver_notifications_task",
    "enqueue_due_schedules_task",
    "prune_task",
    "reap_stale_task",
    "run_operations_job_task",
]


@shared_task(name="jobstate.reap_stale")
def reap_stale_task(using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """Run every reaping sweep (``manage.py reap_stale``); returns every count."""
    return run_reaping_sweeps(using=_database(using)).as_dict()


@shared_task(name="jobstate.prune")
def prune_task(using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """Run every retention sweep with the retention settings (``manage.py
    prune_jobstate``); returns every count."""
    return run_retention_sweeps(using=_database(using)).as_dict()


@shared_task(name="jobstate.deliver_notifications")
def deliver_notifications_task(
    using: str = DEFAULT_DB_ALIAS, limit: int | None = None
) -> dict[str, Any]:
    """One relay pass (``manage.py deliver_notifications``): claim up to ``limit`` due
    notifications (default ``OUTBOX_BATCH_SIZE``), send and settle each; returns the
    :class:`~jobstate.outbox.relay.DeliveryReport` as a dict. A receiver's failure is recorded on
    the notification (retry or dead letter), never raised, so Celery does not retry the
    pass; a database error raises."""
    report = deliver_notifications(store=get_state_store(using=_database(using)), limit=limit)
    return asdict(report)


@shared_task(name="jobstate.run_operations_job")
def run_operations_job_task(
    job_key: str,
    input: Any = None,
    triggered_by: str | None = None,
    using: str = DEFAULT_DB_ALIAS,
) -> dict[str, Any]:
    """Run registered operations job ``job_key`` through
    :class:`~jobstate.operations.job_runner.JobRunner` with the trigger ``CELERY`` and
    return its :class:`~jobstate.operations.job_runner.JobExecutionResult` as a dict.

    The runner's overlap guard holds across workers: when beat (or anyone) starts a
    ``forbid`` job while another worker still runs it, this run is recorded as SKIPPED
    and the body does not execute. A failed run is recorded and returned, not raised,
    so Celery does not retry it behind the runner's back; an unknown job or rejected
    input raises.
    """
    runner = JobRunner(store=get_run_store(using=_database(using)))
    result = runner.execute(job_key, input, Trigger("CELERY", triggered_by))
    return result.as_dict()


@shared_task(name="jobstate.enqueue_due_schedules")
def enqueue_due_schedules_task(using: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """One evaluation of the periodic schedules (``manage.py enqueue_due_schedules``):
    bring their rows in step with settings and enqueue every due slot; returns what was
    enqueued and what could not be (by schedule key). Each slot is enqueued once, so
    overlapping beats, workers and crons never enqueue it twice; a schedule that could
    not be enqueued is reported, not raised, and is tried again at the next pass."""
    using = _database(using)
    sync_schedules(using=using)
    result = evaluate_schedules(using=using, by="celery beat")
    return {
        "enqueued": [
            {"schedule": item.schedule, "slot": item.slot.isoformat(), "result_id": item.result_id}
            for item in result.enqueued
        ],
        "failures": result.failures,
    }


def _database(using: Any) -> str:
    """``using`` when it is an alias of ``settings.DATABASES``: a task's arguments come
    from a beat entry or a caller's message, where ``None`` or a typo failed deep in a
    sweep with ``attribute name must be string``."""
    if not isinstance(using, str) or using not in connections:
        raise ValueError(
            f"using must be an alias of settings.DATABASES ({', '.join(connections)}), "
            f"got {using!r}."
        )
    return using
