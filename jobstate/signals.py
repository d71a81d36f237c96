"""Signal receivers: after ``migrate``, the schedule rows are made to say what
``JOBSTATE["SCHEDULES"]`` says (:func:`jobstate.schedules.sync_schedules`); every new
connection's session is set up as its backend needs (on MariaDB and MySQL the database's
clock is put on UTC: :func:`jobstate.stores.database.backends.prepare_connection`)."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.db import connections
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate
from django.dispatch import receiver

from jobstate.stores.database.backends import prepare_connection

connection_created.connect(prepare_connection, dispatch_uid="jobstate.prepare_connection")


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
