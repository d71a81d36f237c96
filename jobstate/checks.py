"""System checks: refuse invalid ``JOBSTATE`` settings at start-up, and say so when a
configured database cannot give jobstate's guarantees."""

from __future__ import annotations

from typing import Any

import django
from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections

from jobstate.conf import DEFAULTS, jobstate_settings


@register()
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    """Read every ``JOBSTATE`` setting once, so a bad value (an unknown name, a zero
    lease, an empty observability token) stops ``runserver``, ``migrate`` and ``check``
    instead of the first request or job that needs it."""
    try:
        for name in DEFAULTS:
            getattr(jobstate_settings, name)
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="jobstate.E001")]
    return []


@register(Tags.compatibility)
def check_database_guarantees(**kwargs: Any) -> list[CheckMessage]:
    """PostgreSQL gives every guarantee. SQLite gives them only with IMMEDIATE
    transactions (each writer takes the database lock at BEGIN, so a claim cannot
    interleave); other backends lack partial unique indexes or SKIP LOCKED."""
    messages: list[CheckMessage] = []
    databases = kwargs.get("databases") or settings.DATABASES.keys()
    for alias in databases:
        connection = connections[alias]
        vendor = connection.vendor
        if vendor == "postgresql":
            continue
        if vendor == "sqlite":
            mode = connection.settings_dict.get("OPTIONS", {}).get("transaction_mode")
            if mode != "IMMEDIATE":
                messages.append(
                    Warning(
                        f"Database {alias!r} is SQLite without transaction_mode "
                        "'IMMEDIATE': concurrent claims may fail with 'database is "
                        "locked' instead of waiting.",
                        hint="Set DATABASES[...]['OPTIONS'] = {'transaction_mode': 'IMMEDIATE'}.",
                        id="jobstate.W001",
                    )
                )
            continue
        if not connection.features.supports_partial_indexes:
            messages.append(
                Warning(
                    f"Database {alias!r} ({vendor}) has no partial unique indexes: the "
                    "one-RUNNING-run-per-overlap-key guarantee (S1) is not enforced.",
                    hint="Use PostgreSQL for jobstate's tables.",
                    id="jobstate.W002",
                )
            )
        if not connection.features.has_select_for_update_skip_locked:
            messages.append(
                Warning(
                    f"Database {alias!r} ({vendor}) has no SELECT ... FOR UPDATE SKIP "
                    "LOCKED: concurrent claims serialise on row locks.",
                    id="jobstate.W003",
                )
            )
    return messages


@register(Tags.database, deploy=True)
def check_migrations_applied(**kwargs: Any) -> list[CheckMessage]:
    """Deploy check (``check --deploy --database <alias>``): every jobstate migration is
    applied on each database named. Database-tagged checks run only when databases are
    given, so a plain ``check`` never needs a connection."""
    from jobstate.stores.database.observability import pending_jobstate_migrations

    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or ():
        try:
            pending = pending_jobstate_migrations(connections[alias])
        except DatabaseError as exc:
            messages.append(
                Error(
                    f"Cannot read the migration state of database {alias!r}: {exc}",
                    id="jobstate.E011",
                )
            )
            continue
        if pending:
            messages.append(
                Error(
                    f"Database {alias!r} lacks {len(pending)} jobstate migration(s): "
                    f"{', '.join(pending)}. Transitions would fail on the old schema.",
                    hint=f"Run: python manage.py migrate jobstate --database {alias}",
                    id="jobstate.E010",
                )
            )
    return messages


#: The task backend's dotted path, as ``TASKS[...]["BACKEND"]`` names it.
TASK_BACKEND_PATH = "jobstate.tasks_backend.JobStateBackend"


@register()
def check_task_backends(**kwargs: Any) -> list[CheckMessage]:
    """Django runs each task backend's own check (``OPTIONS``, ``QUEUES``:
    ``jobstate.E020``-``E022``) through ``django.tasks``; on Django 5.2 the backport does
    so only when its app is in ``INSTALLED_APPS``. Without it, this check runs them, and
    says so when the backport is missing altogether (``jobstate.E023``)."""
    if django.VERSION >= (6, 0) or apps.is_installed("django_tasks"):
        return []
    ours = [
        alias
        for alias, params in (getattr(settings, "TASKS", None) or {}).items()
        if isinstance(params, dict) and params.get("BACKEND") == TASK_BACKEND_PATH
    ]
    if not ours:
        return []
    try:
        from jobstate.tasks_compat import task_backends
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="jobstate.E023")]
    messages: list[CheckMessage] = []
    for alias in ours:
        messages += task_backends[alias].check()
    return messages


@register()
def check_schedules(**kwargs: Any) -> list[CheckMessage]:
    """Each schedule of ``JOBSTATE["SCHEDULES"]``: its declaration (``jobstate.E030``:
    unknown keys, a bad cron expression, an unknown time zone, arguments that are not
    JSON), then what it runs (``jobstate.E031``: a task path that does not import or is
    no task, a backend that is not jobstate's or refuses the task's queue or priority,
    an operations job that is not registered or refuses its input). One message per
    problem, naming the schedule."""
    from jobstate.schedules import declared_schedules, schedule_problems, target_problems

    try:
        schedules = jobstate_settings.SCHEDULES
    except ImproperlyConfigured:
        return []  # jobstate.E001 says what is wrong with it
    problems = schedule_problems(schedules)
    if problems:
        return [Error(problem, id="jobstate.E030") for problem in problems]
    return [
        Error(problem, id="jobstate.E031")
        for definition in declared_schedules().values()
        for problem in target_problems(definition)
    ]
