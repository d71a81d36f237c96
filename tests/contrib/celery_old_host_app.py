"""A host's Celery app as written before jobstate's Celery tasks moved to
``jobstate.contrib.celery``: autodiscovery alone, which no longer finds them. The host
test starts a worker and beat with it and expects them to say so."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.contrib.celery_host_settings")

app = Celery("old_host")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
