"""Signal receivers: after ``migrate``, the schedule rows are made to say what
``JOBSTATE["SCHEDULES"]`` says (:func:`jobstate.schedules.sync_schedules`); on every new
MariaDB or MySQL connection, the database's clock is put on UTC
(:func:`jobstate.core.clock.clock_in_utc`)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate
from django.dispatch import receiver

from jobstate.core.clock import clock_in_utc

connection_created.connect(clock_in_utc, dispatch_uid="jobstate.clock_in_utc")


@receiver(post_migrate)
def sync_schedules_after_migrate(*, sender: AppConfig, using: str, **kwargs: Any) -> None:
    """A deploy runs ``migrate``, so the schedules it declares are in their rows before
    any worker evaluates them. Skipped when the schedule table is not there (a
    migration back to before it)."""
    if sender.label != "jobstate":
        return
    from jobstate.models import Schedule
    from jobstate.schedules import sync_schedules

    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return
    sync_schedules(using=using)
