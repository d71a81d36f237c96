"""System checks: refuse invalid ``JOBSTATE`` settings at start-up, and say so when a
configured database cannot give jobstate's guarantees."""

from __future__ import annotations

from difflib import get_close_matches
from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from jobstate.core.conf import jobstate_settings
from jobstate.exceptions import ImproperlyConfiguredStore


class JobStateTags:
    """The tags of jobstate's system checks. A command runs only the checks that concern
    it (its ``requires_system_checks``), so one bad schedule or task backend stops
    neither the maintenance commands nor the workers; ``manage.py check`` runs them
    all, and ``check --tag jobstate_schedules`` one kind."""

    settings = "jobstate_settings"
    databases = "jobstate_databases"
    tasks = "jobstate_tasks"
    schedules = "jobstate_schedules"
    operations = "jobstate_operations"
    outbox = "jobstate_outbox"


#: The checks a maintenance command or a worker runs before it starts: the ``JOBSTATE``
#: settings and what each database guarantees. A broken schedule is skipped by the
#: evaluation, a worker checks its own task backend, ``run_operations_job`` its modules.
MAINTENANCE_CHECKS = [JobStateTags.settings, JobStateTags.databases]

#: Every kind of jobstate check: ``jobstate_ready`` is not ready while one reports an
#: error.
JOBSTATE_CHECKS = [
    JobStateTags.settings,
    JobStateTags.databases,
    JobStateTags.tasks,
    JobStateTags.schedules,
    JobStateTags.operations,
    JobStateTags.outbox,
]


@register(JobStateTags.settings)
def check_settings(**kwargs: Any) -> list[CheckMessage]:
    """Read every ``JOBSTATE`` setting, so a bad value (an unknown name, a zero lease,
    an empty observability token) stops ``runserver``, ``migrate`` and ``check``
    instead of the first request or job that needs it. One message per problem."""
    return [Error(problem, id="jobstate.E001") for problem in jobstate_settings.problems()]


#: The least ``MAX_PAYLOAD_BYTES``: a failed attempt's error (up to 4,000 bytes) and the
#: record of a refused report must fit, or a failing task cannot be reported at all.
PAYLOAD_BYTES_FLOOR = 4096


@register(JobStateTags.settings)
def check_payload_limit(**kwargs: Any) -> list[CheckMessage]:
    """``MAX_PAYLOAD_BYTES`` leaves room for jobstate's own records (``jobstate.E005``)."""
    try:
        limit = jobstate_settings.MAX_PAYLOAD_BYTES
    except ImproperlyConfigured:
        return []  # jobstate.E001 says what is wrong with the setting
    problem = (
        f"JOBSTATE['MAX_PAYLOAD_BYTES'] is {limit}; it must be at least {PAYLOAD_BYTES_FLOOR}: "
        "a failing task's error, which jobstate stores under the same limit, would not fit."
    )
    return [] if limit >= PAYLOAD_BYTES_FLOOR else [Error(problem, id="jobstate.E005")]


@register(JobStateTags.settings)
def check_stores(**kwargs: Any) -> list[CheckMessage]:
    """``STATE_STORE`` and ``RUN_STORE`` each import to a store class of their kind
    (``jobstate.E004``): a wrong one would otherwise fail every job, run and command that
    needs it, at its start."""
    from jobstate.stores import store_class
    from jobstate.stores.base import JobRunStore, StateStore

    messages: list[CheckMessage] = []
    for setting, base in (("STATE_STORE", StateStore), ("RUN_STORE", JobRunStore)):
        try:
            store_class(setting, base)
        except ImproperlyConfigured:
            return []  # jobstate.E001 says what is wrong with the setting
        except ImproperlyConfiguredStore as exc:
            messages.append(
                Error(
                    str(exc),
                    hint=f"Name a {base.__name__} subclass by its dotted path, or leave "
                    f"JOBSTATE[{setting!r}] out for the database store; see docs/settings.md.",
                    id="jobstate.E004",
                )
            )
    return messages


@register(JobStateTags.settings)
def check_pooler_settings(**kwargs: Any) -> list[CheckMessage]:
    """With ``JOBSTATE["CONNECTION_POOLER"] = "transaction"``, the settings that need a
    database session to last beyond one transaction, which a pooler in transaction mode
    does not give: prepared statements (``jobstate.W050``), ``LISTEN`` (``W051``) and
    server-side cursors (``W052``) on the default database."""
    try:
        if jobstate_settings.CONNECTION_POOLER != "transaction":
            return []
        prepared, listen = jobstate_settings.PREPARED_STATEMENTS, jobstate_settings.LISTEN_NOTIFY
    except ImproperlyConfigured:
        return []  # jobstate.E001 says what is wrong with the settings
    if DEFAULT_DB_ALIAS not in settings.DATABASES:
        return []
    connection = connections[DEFAULT_DB_ALIAS]
    if connection.vendor != "postgresql":
        return []
    database = connection.settings_dict
    pooled = "JOBSTATE['CONNECTION_POOLER'] is 'transaction'"
    messages: list[CheckMessage] = []
    threshold = database.get("OPTIONS", {}).get("prepare_threshold")
    if prepared or threshold is not None:
        which = (
            "JOBSTATE['PREPARED_STATEMENTS'] is True"
            if prepared
            else f"DATABASES['default']['OPTIONS']['prepare_threshold'] is {threshold!r}"
        )
        messages.append(
            Warning(
                f"{pooled} but {which}: a statement prepared on one server connection is "
                "run on another, which fails with 'prepared statement does not exist'.",
                hint="Set JOBSTATE['PREPARED_STATEMENTS'] = False and leave prepare_threshold "
                "unset; on PgBouncer 1.22 or newer with max_prepared_statements above 0, "
                "add 'jobstate.W050' to SILENCED_SYSTEM_CHECKS instead.",
                id="jobstate.W050",
            )
        )
    if listen:
        messages.append(
            Warning(
                f"{pooled} but JOBSTATE['LISTEN_NOTIFY'] is True: a LISTEN through the pooler "
                "ends with its transaction, so no worker is woken by NOTIFY (workers behind "
                "the pooler poll instead, and enqueues send NOTIFY for nothing).",
                hint="Set JOBSTATE['LISTEN_NOTIFY'] = False.",
                id="jobstate.W051",
            )
        )
    if not database.get("DISABLE_SERVER_SIDE_CURSORS", False):
        messages.append(
            Warning(
                f"{pooled} but DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'] is not "
                "True: a QuerySet.iterator() outside a transaction opens a cursor that the "
                "pooler may look for on another server connection.",
                hint="Set DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'] = True, as "
                "Django's documentation of transaction pooling says.",
                id="jobstate.W052",
            )
        )
    return messages


@register(JobStateTags.operations)
def check_operations_modules(**kwargs: Any) -> list[CheckMessage]:
    """Each module of ``JOBSTATE["OPERATIONS_JOB_MODULES"]`` imports (``jobstate.E002``):
    a misspelt one would otherwise surface as a traceback of the first run or listing."""
    from jobstate.operations.job_registry import operations_module_problems

    try:
        problems = operations_module_problems()
    except ImproperlyConfigured:
        return []  # jobstate.E001 says what is wrong with the setting
    return [
        Error(
            problem,
            hint="Fix or remove the module name; every installed app's 'operations' "
            "module is imported without being listed.",
            id="jobstate.E002",
        )
        for problem in problems
    ]


@register(JobStateTags.outbox)
def check_channels(**kwargs: Any) -> list[CheckMessage]:
    """Each channel of ``JOBSTATE["CHANNELS"]`` imports to a class (``jobstate.E003``): a
    misspelt path would otherwise fail every notification of that channel at its send.
    No command requires this check: the relay goes on delivering the other channels."""
    from jobstate.core.imports import NotImportable, import_path

    try:
        channels = jobstate_settings.CHANNELS
    except ImproperlyConfigured:
        return []  # jobstate.E001 says what is wrong with the setting
    messages: list[CheckMessage] = []
    for name, path in channels.items():
        try:
            loaded = import_path(path)
        except NotImportable as exc:
            problem = f"does not import ({exc.reason})"
        else:
            if isinstance(loaded, type):
                continue
            problem = f"is a {type(loaded).__name__}, not a class"
        messages.append(
            Error(
                f"JOBSTATE['CHANNELS'][{name!r}] = {path!r} {problem}: every notification "
                "sent through it would fail.",
                hint="Name the channel's class by its dotted path; see docs/outbox.md.",
                id="jobstate.E003",
            )
        )
    return messages


#: How a host accepts a weaker guarantee knowingly: Django's own list of silenced checks.
_ACCEPT_HINT = "To accept the weaker guarantee knowingly, add {id!r} to SILENCED_SYSTEM_CHECKS."

#: MariaDB and MySQL isolation levels under which every claim's re-check sees what
#: committed before it (Django's default there is READ COMMITTED).
_SAFE_ISOLATION = "read committed"


@register(Tags.compatibility, JobStateTags.databases)
def check_database_guarantees(**kwargs: Any) -> list[CheckMessage]:
    """Each configured database must give every guarantee, or the check fails naming
    the one it cannot give (errors ``jobstate.E040``-``E043``; a host that accepts the
    weaker guarantee silences that id through ``SILENCED_SYSTEM_CHECKS``).

    PostgreSQL gives them all. SQLite needs IMMEDIATE transactions (each writer takes
    the database lock at BEGIN, so a claim cannot interleave). MariaDB 10.6+ and MySQL
    8+ need ``SKIP LOCKED``, READ COMMITTED isolation, and the guards of migration
    ``0009_mysql_guards`` (the deploy check ``jobstate.E044``). Other backends have no
    partial unique indexes and are refused.

    A database that is not SQLite but keeps SQLite's ``OPTIONS`` (the quick start's
    ``transaction_mode`` and ``timeout``, left behind when ``ENGINE`` was changed) gets
    the warning ``jobstate.W053``: its driver refuses them at the first connection."""
    messages: list[CheckMessage] = []
    databases = kwargs.get("databases") or settings.DATABASES.keys()
    for alias in databases:
        connection = connections[alias]
        vendor = connection.vendor
        if vendor != "sqlite":
            messages += _sqlite_options_elsewhere(alias, connection)
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
                        hint=f"Set DATABASES[{alias!r}]['OPTIONS'] = {{'transaction_mode': "
                        "'IMMEDIATE', 'timeout': 30}: the timeout lets a process wait up to "
                        "30 s for the write lock rather than 5. "
                        + _ACCEPT_HINT.format(id="jobstate.E040"),
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


#: ``DATABASES[...]["OPTIONS"]`` keys that only Django's SQLite backend takes.
_SQLITE_ONLY_OPTIONS = ("transaction_mode", "timeout")


def _sqlite_options_elsewhere(alias: str, connection: Any) -> list[CheckMessage]:
    options = connection.settings_dict.get("OPTIONS") or {}
    stray = [name for name in _SQLITE_ONLY_OPTIONS if name in options]
    if not stray:
        return []
    return [
        Warning(
            f"Database {alias!r} ({connection.vendor}) has SQLite's OPTIONS "
            f"{', '.join(map(repr, stray))}: its driver refuses them, so every connection "
            "fails (PostgreSQL: 'invalid connection option').",
            hint=f"Remove {' and '.join(map(repr, stray))} from DATABASES[{alias!r}]"
            "['OPTIONS']: they were for SQLite (the quick start's settings).",
            id="jobstate.W053",
        )
    ]


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
    from jobstate.stores.database.figures import connection_problem, pending_jobstate_migrations

    messages: list[CheckMessage] = []
    for alias in kwargs.get("databases") or ():
        problem = connection_problem(alias)
        if problem is not None:
            messages.append(
                Error(
                    f"Cannot read the migration state of database {alias!r}: {problem}",
                    id="jobstate.E011",
                )
            )
            continue
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
        try:
            messages += server_guard_errors(alias)
        except DatabaseError as exc:
            messages.append(
                Error(f"Cannot read the indexes of database {alias!r}: {exc}", id="jobstate.E011")
            )
    return messages


def server_guard_errors(alias: str) -> list[CheckMessage]:
    """On MariaDB and MySQL, migration 0009's guards must be in place even though it is
    recorded as applied (a database restored without them, a table rebuilt by hand):
    ``jobstate.E044`` when they are not. The deploy check and the commands that claim
    (``require_migrated``) ask. ``DatabaseError`` when the catalogue cannot be read."""
    from jobstate.stores.database.backends import database_ops

    missing = database_ops(alias).missing_server_guards()
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


#: The task backend's dotted paths, as ``TASKS[...]["BACKEND"]`` may name it: its public
#: name, the module it lives in, and the path it had before release 0.2 (deprecated).
TASK_BACKEND_PATHS = frozenset(
    {
        "jobstate.tasks.JobStateBackend",
        "jobstate.tasks.backend.JobStateBackend",
        "jobstate.tasks_backend.JobStateBackend",
    }
)


@register(JobStateTags.tasks)
def check_task_backends(**kwargs: Any) -> list[CheckMessage]:
    """jobstate's checks of each ``JobStateBackend`` of ``TASKS`` (``OPTIONS``,
    ``QUEUES``, the app, the store: ``jobstate.E020``-``E022``, ``E024``), registered
    here so they run on every Django version, whether or not something imported
    ``django.tasks`` (whose own check is registered only then); and
    ``jobstate.E023`` when Django 5.2 lacks the django-tasks backport."""
    tasks = getattr(settings, "TASKS", None) or {}
    if not isinstance(tasks, dict):
        return []
    try:
        from jobstate.tasks.backend import JobStateBackend
        from jobstate.tasks.compat import task_backends
    except ImproperlyConfigured as exc:
        named = any(
            isinstance(params, dict) and params.get("BACKEND") in TASK_BACKEND_PATHS
            for params in tasks.values()
        )
        return [Error(str(exc), id="jobstate.E023")] if named else []
    messages: list[CheckMessage] = []
    for alias, params in tasks.items():
        try:
            backend = task_backends[alias]
        except ImproperlyConfigured as exc:
            # Django's own check of TASKS reports a backend that does not load, but the
            # readiness probe runs jobstate's checks only: a misspelt path of jobstate's
            # backend is reported here too, so the probe does not say ready while no
            # worker can start.
            path = params.get("BACKEND") if isinstance(params, dict) else None
            if isinstance(path, str) and path.startswith("jobstate."):
                close = get_close_matches(path, sorted(TASK_BACKEND_PATHS), n=1)
                messages.append(
                    Error(
                        f"TASKS[{alias!r}]['BACKEND'] names {path!r}, which does not load: {exc}",
                        hint=f"Did you mean {close[0]!r}?" if close else None,
                        id="jobstate.E025",
                    )
                )
            continue
        if isinstance(backend, JobStateBackend):
            messages += backend.configuration_messages()
    return messages


@register(JobStateTags.schedules)
def check_schedules(**kwargs: Any) -> list[CheckMessage]:
    """Each schedule of ``JOBSTATE["SCHEDULES"]``: its declaration (``jobstate.E030``:
    unknown keys, a bad cron expression, an unknown time zone, arguments the job table
    cannot hold), and, when that is good, what it runs (``jobstate.E031``: a task path
    that does not import or is no task, a backend that is not jobstate's or refuses the
    task's queue or priority, an operations job that is not registered or refuses its
    input). One message per problem, naming the schedule; a broken schedule is skipped
    by every evaluation while the others run."""
    from jobstate.schedules import target_problems
    from jobstate.schedules.definitions import declaration_problems, parse_declaration

    try:
        schedules = jobstate_settings.SCHEDULES
    except ImproperlyConfigured:
        return []  # jobstate.E001 says what is wrong with it
    messages: list[CheckMessage] = []
    for key, declared in schedules.items():
        problems = declaration_problems(key, declared)
        if problems:
            messages += [Error(problem, id="jobstate.E030") for problem in problems]
            continue
        messages += [
            Error(problem, hint=_E031_HINT, id="jobstate.E031")
            for problem in target_problems(parse_declaration(key, declared))
        ]
    return messages


#: Django's migrate runs every check: a target that does not import yet would keep the
#: operator from migrating at all.
_E031_HINT = (
    "Correct the schedule or deploy the code it names; meanwhile the schedule is skipped, "
    "and 'manage.py migrate --skip-checks' migrates."
)
