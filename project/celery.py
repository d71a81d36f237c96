"""The demo project's Celery app.

Start a worker and beat next to the development server (Redis at ``CELERY_BROKER_URL``,
from the environment or ``.env``)::

    celery -A project worker --loglevel INFO
    celery -A project beat --loglevel INFO

Beat runs ``CELERY_BEAT_SCHEDULE`` from the settings: jobstate's maintenance
(:data:`jobstate.contrib.celery.beat.JOBSTATE_BEAT_SCHEDULE`) merged with the demo's own entries.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("project")
# Every CELERY_* setting configures the app (CELERY_BROKER_URL, CELERY_BEAT_SCHEDULE, ...).
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# jobstate's maintenance tasks (reaping, pruning, the relay, schedules).
app.autodiscover_tasks(["jobstate.contrib.celery"], related_name="celery_tasks")
