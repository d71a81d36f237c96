"""Operational metrics and schema readiness on the Django ORM."""

from __future__ import annotations

import pkgutil
from datetime import datetime
from importlib import import_module
from typing import Any

from django.apps import apps
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.recorder import MigrationRecorder
from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    Min,
    OuterRef,
    QuerySet,
    Value,
)
from django.db.models.functions import Now

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import (
    CLAIMED_JOB_STATUSES,
    INFLIGHT_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobOperationalMetrics,
    JobStatus,
    Readiness,
)
from jobstate.models import Job
from jobstate.stores.contracts.primitives import (
    METRICS_TERMINAL_WINDOW,
    MONITOR_SOURCE,
    operational_metrics,
)
from jobstate.stores.database.backends import database_ops

__all__ = [
    "METRICS_TERMINAL_WINDOW",
    "MONITOR_SOURCE",
    "connection_problem",
    "metrics_snapshot",
    "pending_jobstate_migrations",
    "schema_readiness",
]

_APP_LABEL = "jobstate"

_TERMINAL_KEYS = sorted(status.value for status in TERMINAL_JOB_STATUSES)
_INFLIGHT_KEYS = sorted(status.value for status in INFLIGHT_JOB_STATUSES)
_CLAIMED_KEYS = sorted(status.value for status in CLAIMED_JOB_STATUSES)


def _count_by_status(rows: QuerySet[Job]) -> dict[str, int]:
    # COUNT(*), not COUNT(id): counting a column makes PostgreSQL read every matching
    # row from the table, while COUNT(*) lets the (status, updated_at) index answer on
    # its own (an index-only scan, about a third of the time at 1,000,000 jobs).
    return dict(rows.values("status").annotate(n=Count("*")).values_list("status", "n"))


def pending_jobstate_migrations(connection: BaseDatabaseWrapper) -> list[str]:
    """Names of the jobstate migrations known to the code but not recorded as applied on
    ``connection``, in dependency order. A database without the migration table has all
    of them pending. Database errors propagate."""
    if _all_recorded(connection):
        return []
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    applied = loader.applied_migrations
    pending: list[str] = []
    for leaf in loader.graph.leaf_nodes(_APP_LABEL):
        for node in loader.graph.forwards_plan(leaf):
            if node[0] == _APP_LABEL and node not in applied and node[1] not in pending:
                pending.append(node[1])
    return pending


def _all_recorded(connection: BaseDatabaseWrapper) -> bool:
    """Whether every migration file of jobstate's migrations package is recorded as
    applied on ``connection``: one query, where the full answer loads every app's
    migration modules and builds their graph (about 50 ms of a worker's start-up).
    ``False`` means "ask the graph", which names the pending ones in order (and knows
    squashed migrations); a recorded file is applied in the graph's eyes too."""
    module_name, _explicit = MigrationLoader.migrations_module(_APP_LABEL)
    if module_name is None:
        return False
    try:
        package = import_module(module_name)
    except ImportError:
        return False
    on_disk = {
        name
        for _finder, name, is_package in pkgutil.iter_modules(getattr(package, "__path__", ()))
        if not is_package and name[0] not in "_~"
    }
    recorder = MigrationRecorder(connection)
    if not on_disk or not recorder.has_table():
        return False
    recorded = recorder.migration_qs.filter(app=_APP_LABEL).values_list("name", flat=True)
    return on_disk <= set(recorded)


def metrics_snapshot(using: str, now: datetime | None, exact: bool) -> JobOperationalMetrics:
    """The six operational figures of database ``using``. Definitions:

    - ``by_status``: jobs per status, every status present (0 when none). Queued,
      running and dispatched jobs are always counted exactly. Done, error and
      rejected jobs are counted exactly too, unless the store is on PostgreSQL, the
      jobs table holds more than ``JOBSTATE['METRICS_EXACT_LIMIT']`` rows and
      ``exact`` is false: then they are estimated from the table's statistics and
      named in ``estimated_statuses``.
    - ``terminal_last_15m``: done / error / rejected jobs with ``updated_at >= now -
      15 min``.
    - ``oldest_queued_age_seconds``: ``now`` minus the oldest ``created_at`` of the
      queued jobs whose ``source`` is not ``"monitor"``; 0 when there are none.
    - ``delayed_queued_jobs``: queued jobs with ``run_after > now``.
    - ``expired_leases``: running or dispatched jobs with ``lease_until < now``.
    - ``blocked_threads``: distinct threads with at least one queued job and at
      least one running or dispatched job.

    Every figure is clamped to ``>= 0`` (:func:`operational_metrics`). Each is read
    by a small statement that one of the job table's partial indexes answers, so the
    cost follows the live queue, not the history (an exact count of the finished jobs
    is the exception: it reads them all). ``now`` (validated) defaults to the database clock.
    """
    at: Any
    if now is None:
        at = Now()
        cutoff: Any = Now() - METRICS_TERMINAL_WINDOW
    else:
        at = Value(now, output_field=DateTimeField())
        cutoff = Value(now - METRICS_TERMINAL_WINDOW, output_field=DateTimeField())
    jobs = Job.objects.using(using).order_by()
    queued = jobs.filter(status=JobStatus.QUEUED)
    claimed = jobs.filter(status__in=_CLAIMED_KEYS)

    by_status = _count_by_status(jobs.filter(status__in=_INFLIGHT_KEYS))
    estimate = None if exact else _estimated_finished(using, sum(by_status.values()))
    if estimate is None:
        by_status.update(_count_by_status(jobs.filter(status__in=_TERMINAL_KEYS)))
    terminal = _count_by_status(jobs.filter(status__in=_TERMINAL_KEYS, updated_at__gte=cutoff))
    oldest = queued.exclude(source=MONITOR_SOURCE).aggregate(
        age=ExpressionWrapper(at - Min("created_at"), output_field=DurationField())
    )["age"]
    delayed = queued.filter(run_after__isnull=False, run_after__gt=at).count()
    expired = claimed.filter(lease_until__isnull=False, lease_until__lt=at).count()
    # Driven from the claimed jobs, which are few (one per busy worker or executor).
    blocked = (
        claimed.filter(thread_id__isnull=False)
        .filter(Exists(queued.filter(thread_id=OuterRef("thread_id"))))
        .values("thread_id")
        .distinct()
        .count()
    )
    return operational_metrics(
        by_status=by_status,
        terminal=terminal,
        oldest_queued_age=oldest,
        delayed=delayed,
        expired=expired,
        blocked=blocked,
        estimated=estimate,
    )


def _estimated_finished(using: str, inflight: int) -> dict[str, int] | None:
    """Done / error / rejected counts estimated from PostgreSQL's statistics of the
    jobs table, or ``None`` when they should be counted exactly: another database,
    no statistics yet, or a table no larger than ``METRICS_EXACT_LIMIT``.

    The table's size is estimated the way the planner does (rows per page at the
    last ``ANALYZE`` times the pages it has now); the finished jobs are that minus
    the exact in-flight count, split by the status frequencies ``ANALYZE`` sampled.
    """
    limit = jobstate_settings.METRICS_EXACT_LIMIT
    if limit is None:
        return None
    statistics = database_ops(using).table_statistics(Job, "status")
    if statistics is None or statistics.rows <= limit:
        return None
    sampled = {
        value: frequency
        for value, frequency in statistics.frequencies.items()
        if value in _TERMINAL_KEYS
    }
    weight = sum(sampled.values())
    if weight <= 0:
        return None
    finished = max(0.0, statistics.rows - inflight)
    return {
        status: round(finished * sampled.get(status, 0.0) / weight) for status in _TERMINAL_KEYS
    }


def connection_problem(using: str) -> str | None:
    """Why database ``using`` cannot be connected to, or ``None``. Connecting reads the
    connection's options, and one the driver refuses raises what the driver raises (a
    ``ValueError``, ``ImproperlyConfigured``) rather than a ``DatabaseError``: either way
    the database cannot be read, which is what a probe or a check must say."""
    try:
        connections[using].ensure_connection()
    # Fail closed: whatever connecting raised, the database cannot be read.
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return None


def schema_readiness(using: str) -> Readiness:
    """Whether the jobstate schema on database ``using`` is usable.

    Runs ``SELECT 1`` on database ``using``, then compares the jobstate migrations
    the code knows with those recorded as applied, then checks that every jobstate
    table exists. Any exception (unknown alias, refused connection, broken
    migration graph) answers not ready with the reason in ``detail``; nothing is
    raised, so a probe can never mistake an error for readiness. On MariaDB and MySQL
    the unique indexes and the thread gate of migration ``0009_mysql_guards`` must be
    there too: without them the guarantees they carry do not hold.
    """
    try:
        connection = connections[using]
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    # Fail closed: whatever went wrong, this process must not receive traffic.
    except Exception as exc:
        return _not_ready("failed", "failed", 0, f"database unreachable: {exc}")
    try:
        pending = pending_jobstate_migrations(connection)
        if pending:
            return _not_ready(
                "ok",
                "pending",
                len(pending),
                f"unapplied jobstate migrations: {', '.join(pending)}",
            )
        present = set(connection.introspection.table_names())
        missing = sorted(
            model._meta.db_table
            for model in apps.get_app_config(_APP_LABEL).get_models()
            if model._meta.managed and model._meta.db_table not in present
        )
        if missing:
            return _not_ready("ok", "failed", 0, f"missing tables: {', '.join(missing)}")
        unguarded = database_ops(using).missing_server_guards()
        if unguarded:
            return _not_ready(
                "ok", "failed", 0, f"missing MariaDB/MySQL guards: {', '.join(unguarded)}"
            )
    except Exception as exc:
        return _not_ready("ok", "failed", 0, f"migration state unreadable: {exc}")
    return Readiness(ready=True, database="ok", migrations="ok", pending=0)


def _not_ready(database: str, migrations: str, pending: int, detail: str) -> Readiness:
    # Logged by the readiness endpoint; a command that asks says it on stderr itself.
    return Readiness(
        ready=False, database=database, migrations=migrations, pending=pending, detail=detail
    )
