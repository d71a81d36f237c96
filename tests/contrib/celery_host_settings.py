"""Settings of the host-like Celery worker and beat the host test starts: the demo
project's, with jobstate's beat schedule built at intervals of a second (the same
entries as ``JOBSTATE_BEAT_SCHEDULE``) and one periodic schedule for the beat's
schedule pass to enqueue."""

from datetime import timedelta

from jobstate.contrib.celery.beat import beat_schedule
from project.settings import *  # noqa: F403
from project.settings import JOBSTATE as PROJECT_JOBSTATE

#: The periodic schedule the beat's ``jobstate.enqueue_due_schedules`` enqueues.
HOST_SCHEDULE_KEY = "host-welcome-mail"

JOBSTATE = {
    **PROJECT_JOBSTATE,
    "SCHEDULES": {
        HOST_SCHEDULE_KEY: {
            "task": "project.demo.tasks.send_welcome_email",
            "cron": "* * * * *",
            "kwargs": {"user_id": 7},
        }
    },
}

_EVERY = timedelta(seconds=1)
CELERY_BEAT_SCHEDULE = beat_schedule(
    reap_every=_EVERY, prune_every=_EVERY, deliver_every=_EVERY, schedules_every=_EVERY
)
