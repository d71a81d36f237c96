"""System checks: refuse invalid ``JOBSTATE`` settings at start-up, and say so when a
configured database cannot give jobstate's guarantees."""

from __future__ import annotations

from typing import Any

import django
from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, register
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


#: How a host accepts a weaker guarantee knowingly: Django's own list of silenced checks.
_ACCEPT_HINT = "To accept the weaker guarantee knowingly, add {id!r} to SILENCED_SYSTEM_CHECKS."

#: MariaDB and MySQL isolation levels under which every claim's re-check sees what
#: committed before it (Django's default there is READ COMMITTED).
_SAFE_ISOLATION = "read committed"


@register(Tags.compatibility)
def check_database_guarantees(**kwargs: Any) -> list[CheckMessage]:
    """Each configured database must give every guarantee, or the check fails naming
    the one it cannot give (errors ``jobstate.E040``-``E043``; a host that accepts the
    weaker guarantee silences that id through ``SILENCED_SYSTEM_CHECKS``).

    PostgreSQL gives them all. SQLite needs IMMEDIATE transactions (each writer takes
    the database lock at BEGIN, so a claim cannot interleave). MariaDB 10.6+ and MySQL
    8+ need ``SKIP LOCKED``, READ COMMITTED isolation, and the guards of migration
    ``0009_mysql_guards`` (the deploy check ``jobstate.E044``). Other backends have no
    partial unique indexes and are refused."""
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
                    Error(
                        f"Database {alias!r} is SQLite without transaction_mode 'IMMEDIATE': "
                        "concurrent claims and runtime locks may fail with 'database is "
                        "locked' instead of waiting, and a quota count can interleave.",
                        hint="Set DATABASES[...]['OPTIONS'] = {'transaction_mode': "
                        "'IMMEDIATE'}. " + _ACCEPT_HINT.format(id="jobstate.E040"),
                        id="jobstate.E040",
                    )
                )
            continue
        if vendor != "mysql":
            messages.append(
                Error(
                    f"Database {alias!r} ({vendor}) has no partial unique indexes: one "
                    "RUNNING run per overlap key (S1) and one enqueue per schedule slot "
                    "are not enforced.",
                    hint="Use PostgreSQL, MariaDB 10.6+, MySQL 8+ or SQLite for jobstate's "
                    "tables. " + _ACCEPT_HINT.format(id="jobstate.E041"),
                    id="jobstate.E041",
                )
            )
            continue
        messages += _mysql_guarantees(alias, connection)
    return messages


def _mysql_guarantees(alias: str, connection: Any) -> list[CheckMessage]:
    messages: list[CheckMessage] = []
    options = connection.settings_dict.get("OPTIONS", {})
    # Django sets READ COMMITTED unless OPTIONS names another level (None: the
    # server's default, REPEATABLE READ unless changed).
    level = options.get("isolation_level", _SAFE_ISOLATION)
    if not isinstance(level, str) or level.lower() != _SAFE_ISOLATION:
        messages.append(
            Error(
                f"Database {alias!r} (MariaDB/MySQL) runs at isolation level {level!r}: a "
                "claim's re-check of the per-thread gate reads its transaction's first "
                "snapshot there and can miss a sibling claimed since, so two jobs of one "
                "thread may run at once.",
                hint="Leave DATABASES[...]['OPTIONS']['isolation_level'] unset or set it to "
                "'read committed'. " + _ACCEPT_HINT.format(id="jobstate.E043"),
                id="jobstate.E043",
            )
        )
    try:
        skip_locked = connection.features.has_select_for_update_skip_locked
    except DatabaseError as exc:
        return [
            *messages,
            Error(
                f"Cannot read the server version of database {alias!r}: {exc}",
                id="jobstate.E011",
            ),
        ]
    if not skip_locked:
        messages.append(
            Error(
                f"Database {alias!r} is a MariaDB older than 10.6 or a MySQL older than 8: "
                "it has no SELECT ... FOR UPDATE SKIP LOCKED, which claims, the outbox "
                "relay and reaping lock with.",
                hint="Upgrade the server. " + _ACCEPT_HINT.format(id="jobstate.E042"),
                id="jobstate.E042",
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
            continue
        messages += _server_guards(alias)
    return messages


def _server_guards(alias: str) -> list[CheckMessage]:
    """On MariaDB and MySQL, migration 0009's guards must be in place even though it is
    recorded as applied (a database restored without them, a table rebuilt by hand)."""
    from jobstate.stores.database.server_guards import missing_server_guards

    try:
        missing = missing_server_guards(connections[alias])
    except DatabaseError as exc:
        return [Error(f"Cannot read the indexes of database {alias!r}: {exc}", id="jobstate.E011")]
    if not missing:
        return []
    return [
        Error(
            f"Database {alias!r} (MariaDB/MySQL) lacks {', '.join(missing)}: one RUNNING "
            "run per overlap key, one enqueue per schedule slot or the per-thread gate is "
            "not enforced.",
            hint="Create what is missing as migration 0009_mysql_guards does (README, "
            "'Databases'). " + _ACCEPT_HINT.format(id="jobstate.E044"),
            id="jobstate.E044",
        )
    ]


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
