"""Tells a Celery worker or beat at start when its app does not register jobstate's
Celery tasks although its beat schedule names them.

Until the tasks moved to :mod:`jobstate.contrib.celery.celery_tasks`, a host's plain
``app.autodiscover_tasks()`` found them in ``jobstate.tasks``. That module is now the
django.tasks backend, so such a host's beat still sends ``jobstate.reap_stale`` and the
others while its workers discard each message as an unregistered task, and nothing is
reaped, pruned or relayed. A system check cannot see this: Celery discovers tasks
lazily, only when a worker or beat starts, so in ``manage.py check`` even a correct
app has not registered them yet. Hence a warning on the ``jobstate.celery`` logger when
a worker or beat has imported its task modules, naming the missing tasks and the line
that registers them.

Imported only when Celery already is (see :class:`jobstate.apps.JobStateConfig`).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

__all__ = ["DISCOVERY_LINE", "TASK_NAMES", "connect_start_warning", "unregistered_task_names"]

logger = logging.getLogger("jobstate.celery")

#: The names of jobstate's Celery tasks (:mod:`jobstate.contrib.celery.celery_tasks`).
TASK_NAMES = frozenset(
    {
        "jobstate.reap_stale",
        "jobstate.prune",
        "jobstate.deliver_notifications",
        "jobstate.run_operations_job",
        "jobstate.enqueue_due_schedules",
    }
)

#: The line of the host's Celery app that registers them.
DISCOVERY_LINE = 'app.autodiscover_tasks(["jobstate.contrib.celery"], related_name="celery_tasks")'


def unregistered_task_names(app: Any) -> list[str]:
    """The jobstate task names ``app``'s beat schedule sends that ``app`` has not
    registered, sorted. A schedule that names none of them (a host running the
    maintenance from cron or ``jobstate_worker``) asks for nothing."""
    schedule = app.conf.beat_schedule or {}
    named = {entry.get("task") for entry in schedule.values() if isinstance(entry, dict)}
    return sorted(name for name in TASK_NAMES & named if name not in app.tasks)


def _warn(app: Any, process: str) -> None:
    missing = unregistered_task_names(app)
    if missing:
        logger.warning(
            "This Celery %s's app does not register %s, which its beat schedule names: "
            "its workers discard those messages and jobstate's maintenance does not run. "
            "Add this line to the Celery app, after its autodiscover_tasks(): %s",
            process,
            ", ".join(missing),
            DISCOVERY_LINE,
        )


def _on_worker_init(sender: Any = None, **kwargs: Any) -> None:
    # Sent once the worker has imported its task modules (autodiscovery included).
    if sender is not None:
        _warn(sender.app, "worker")


def _on_beat_init(sender: Any = None, **kwargs: Any) -> None:
    if sender is not None:
        _warn(sender.app, "beat")


def connect_start_warning() -> None:
    """Connect the warning to every worker's and beat's start in this process (once,
    however often it is called)."""
    signals.worker_init.connect(
        _on_worker_init, weak=False, dispatch_uid="jobstate.contrib.celery.worker_init"
    )
    signals.beat_init.connect(
        _on_beat_init, weak=False, dispatch_uid="jobstate.contrib.celery.beat_init"
    )
