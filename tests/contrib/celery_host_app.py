"""A host's Celery app written as the docs say (docs/production.md, *Celery*):
its own tasks by autodiscovery, then the one line that registers jobstate's. The host
test starts ``celery -A tests.contrib.celery_host_app worker`` and ``beat`` with it."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.contrib.celery_host_settings")

app = Celery("host")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
app.autodiscover_tasks(["jobstate.contrib.celery"], related_name="celery_tasks")
