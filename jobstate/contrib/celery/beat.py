"""A Celery beat schedule for jobstate's maintenance, for the host to merge.

Merge it into the host's own schedule in settings::

    from jobstate.contrib.celery.beat import JOBSTATE_BEAT_SCHEDULE

    CELERY_BEAT_SCHEDULE = {
        **JOBSTATE_BEAT_SCHEDULE,
        # the host's own entries, for example an operations job every night:
        "billing-close-day": {
            "task": "jobstate.run_operations_job",
            "schedule": crontab(hour=2, minute=5),
            "args": ["billing.close-day"],
        },
    }

With django-celery-beat (``--scheduler django_celery_beat.schedulers:DatabaseScheduler``)
the same entries are copied into its tables when beat starts, and can be edited in the
admin from then on.

This module imports neither Celery nor models, so a settings module can import it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

__all__ = [
    "DELIVER_EVERY",
    "JOBSTATE_BEAT_SCHEDULE",
    "PRUNE_EVERY",
    "REAP_EVERY",
    "SCHEDULES_EVERY",
    "beat_schedule",
]

#: How often the reaping sweeps run by default (``manage.py reap_stale`` from cron).
REAP_EVERY = timedelta(minutes=1)
#: How often the retention sweeps run by default (``manage.py prune_jobstate``).
PRUNE_EVERY = timedelta(hours=6)
#: How often a relay pass runs by default (``manage.py deliver_notifications``). A
#: notification waits up to this long after its commit; run
#: ``deliver_notifications --loop`` instead when that is too long.
DELIVER_EVERY = timedelta(seconds=10)
#: How often beat evaluates jobstate's periodic schedules (``JOBSTATE["SCHEDULES"]``,
#: ``manage.py enqueue_due_schedules``): a slot is enqueued at most this long after its
#: instant. Each slot is enqueued once, however many beats, workers and crons evaluate.
SCHEDULES_EVERY = timedelta(seconds=10)


def beat_schedule(
    *,
    reap_every: timedelta = REAP_EVERY,
    prune_every: timedelta = PRUNE_EVERY,
    deliver_every: timedelta | None = DELIVER_EVERY,
    schedules_every: timedelta | None = SCHEDULES_EVERY,
) -> dict[str, dict[str, Any]]:
    """Beat entries for ``jobstate.reap_stale``, ``jobstate.prune``,
    ``jobstate.deliver_notifications`` and ``jobstate.enqueue_due_schedules`` at the
    given intervals; ``deliver_every=None`` leaves the relay out (for a host that runs
    ``deliver_notifications --loop``), ``schedules_every=None`` the schedules (for a
    host whose ``jobstate_worker`` processes evaluate them).

    Each message expires when its next one is due: when no worker is free for a while,
    the backlog does not pile up, since one reap, prune or relay pass does all the work
    there is.
    """
    intervals = {"reap_every": reap_every, "prune_every": prune_every}
    if deliver_every is not None:
        intervals["deliver_every"] = deliver_every
    if schedules_every is not None:
        intervals["schedules_every"] = schedules_every
    for name, every in intervals.items():
        if not isinstance(every, timedelta) or every <= timedelta(0):
            raise ValueError(f"{name} must be a positive timedelta, got {every!r}.")
    schedule = {
        "jobstate-reap-stale": _entry("jobstate.reap_stale", reap_every),
        "jobstate-prune": _entry("jobstate.prune", prune_every),
    }
    if deliver_every is not None:
        schedule["jobstate-deliver-notifications"] = _entry(
            "jobstate.deliver_notifications", deliver_every
        )
    if schedules_every is not None:
        schedule["jobstate-enqueue-due-schedules"] = _entry(
            "jobstate.enqueue_due_schedules", schedules_every
        )
    return schedule


def _entry(task: str, every: timedelta) -> dict[str, Any]:
    return {"task": task, "schedule": every, "options": {"expires": every.total_seconds()}}


#: The documented default: reap every minute, prune every six hours, relay and evaluate
#: the schedules every ten seconds.
JOBSTATE_BEAT_SCHEDULE: dict[str, dict[str, Any]] = beat_schedule()
