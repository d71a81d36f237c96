"""A Celery beat schedule for jobstate's maintenance, for the host to merge.

Merge it into the host's own schedule in settings::

    from jobstate.beat import JOBSTATE_BEAT_SCHEDULE

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

__all__ = ["JOBSTATE_BEAT_SCHEDULE", "PRUNE_EVERY", "REAP_EVERY", "beat_schedule"]

#: How often the reaping sweeps run by default (``manage.py reap_stale`` from cron).
REAP_EVERY = timedelta(minutes=1)
#: How often the retention sweeps run by default (``manage.py prune_jobstate``).
PRUNE_EVERY = timedelta(hours=6)


def beat_schedule(
    *, reap_every: timedelta = REAP_EVERY, prune_every: timedelta = PRUNE_EVERY
) -> dict[str, dict[str, Any]]:
    """Beat entries for ``jobstate.reap_stale`` and ``jobstate.prune`` at the given
    intervals.

    Each message expires when its next one is due: when no worker is free for a while,
    the backlog does not pile up, since one reap or prune does all the work there is.
    """
    for name, every in (("reap_every", reap_every), ("prune_every", prune_every)):
        if not isinstance(every, timedelta) or every <= timedelta(0):
            raise ValueError(f"{name} must be a positive timedelta, got {every!r}.")
    return {
        "jobstate-reap-stale": {
            "task": "jobstate.reap_stale",
            "schedule": reap_every,
            "options": {"expires": reap_every.total_seconds()},
        },
        "jobstate-prune": {
            "task": "jobstate.prune",
            "schedule": prune_every,
            "options": {"expires": prune_every.total_seconds()},
        },
    }


#: The documented default: reap every minute, prune every six hours.
JOBSTATE_BEAT_SCHEDULE: dict[str, dict[str, Any]] = beat_schedule()
