"""Operational metrics and schema readiness on the Django ORM
(``DatabaseObservabilityMixin``)."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from django.apps import apps
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.migrations.loader import MigrationLoader
from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    Exists,
    ExpressionWrapper,
    Min,
    OuterRef,
    Q,
    Value,
)
from django.db.models.functions import Now

from jobstate.models import Job
from jobstate.stores.base import (
    CLAIMED_JOB_STATUSES,
    INFLIGHT_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobOperationalMetrics,
    JobStatus,
    Readiness,
    StateStore,
)
from jobstate.stores.validation import validate_instant

__all__ = [
    "METRICS_TERMINAL_WINDOW",
    "MONITOR_SOURCE",
    "DatabaseObservabilityMixin",
    "pending_jobstate_migrations",
]

logger = logging.getLogger("jobstate.readiness")

#: How far back ``terminal_last_15m`` looks.
METRICS_TERMINAL_WINDOW = timedelta(minutes=15)

#: Jobs of this ``source`` are probes; they do not age the queue (``oldest_queued_age``).
MONITOR_SOURCE = "monitor"

_APP_LABEL = "jobstate"

_TERMINAL_KEYS = sorted(status.value for status in TERMINAL_JOB_STATUSES)


def pending_jobstate_migrations(connection: BaseDatabaseWrapper) -> list[str]:
    """Names of the jobstate migrations known to the code but not recorded as applied on
    ``connection``, in dependency order. A database without the migration table has all
    of them pending. Database errors propagate."""
    loader = MigrationLoader(connection, ignore_no_migrations=True)
    applied = loader.applied_migrations
    pending: list[str] = []
    for leaf in loader.graph.leaf_nodes(_APP_LABEL):
        for node in loader.graph.forwards_plan(leaf):
            if node[0] == _APP_LABEL and node not in applied and node[1] not in pending:
                pending.append(node[1])
    return pending


class DatabaseObservabilityMixin(StateStore):
    """``operational_metrics_snapshot`` and ``schema_readiness`` for the database state
    store. One of the bases of :class:`~jobstate.stores.database_state.DatabaseStateStore`;
    it relies on that class's ``using``."""

    using: str

    def operational_metrics_snapshot(self, now: datetime | None = None) -> JobOperationalMetrics:
        """See :meth:`StateStore.operational_metrics_snapshot`. Definitions:

        - ``by_status``: jobs per status, every status present (0 when none).
        - ``terminal_last_15m``: done / error / rejected jobs with ``updated_at >= now -
          15 min``.
        - ``oldest_queued_age_seconds``: ``now`` minus the oldest ``created_at`` of the
          queued jobs whose ``source`` is not ``"monitor"``; 0 when there are none.
        - ``delayed_queued_jobs``: queued jobs with ``run_after > now``.
        - ``expired_leases``: running or dispatched jobs with ``lease_until < now``.
        - ``blocked_threads``: distinct threads with at least one queued job and at
          least one running or dispatched job.

        Every figure is clamped to ``>= 0``. Two statements: a ``GROUP BY status`` over
        the table, and one aggregate restricted to in-flight jobs and recently finished
        ones, so its cost follows the live queue, not the history. ``now`` defaults to
        the database clock.
        """
        at: Any
        if now is None:
            at = Now()
            cutoff: Any = Now() - METRICS_TERMINAL_WINDOW
        else:
            instant = validate_instant(now, field="now")
            at = Value(instant, output_field=DateTimeField())
            cutoff = Value(instant - METRICS_TERMINAL_WINDOW, output_field=DateTimeField())
        jobs = Job.objects.using(self.using).order_by()

        by_status = dict.fromkeys(JobStatus.values, 0)
        for status, count in (
            jobs.values("status").annotate(n=Count("id")).values_list("status", "n")
        ):
            by_status[status] = max(0, count)

        queued = Q(status=JobStatus.QUEUED)
        thread_has_claimed_job = Exists(
            Job.objects.using(self.using).filter(
                thread_id=OuterRef("thread_id"), status__in=list(CLAIMED_JOB_STATUSES)
            )
        )
        figures: dict[str, Any] = {
            f"terminal_{status}": Count("id", filter=Q(status=status, updated_at__gte=cutoff))
            for status in _TERMINAL_KEYS
        }
        figures["oldest_queued_age"] = ExpressionWrapper(
            at - Min("created_at", filter=queued & ~Q(source=MONITOR_SOURCE)),
            output_field=DurationField(),
        )
        figures["delayed"] = Count("id", filter=queued & Q(run_after__gt=at))
        figures["expired"] = Count(
            "id",
            filter=Q(status__in=list(CLAIMED_JOB_STATUSES), lease_until__lt=at),
        )
        figures["blocked"] = Count(
            "thread_id",
            distinct=True,
            filter=queued & Q(thread_id__isnull=False) & Q(thread_has_claimed_job),
        )
        live = Q(status__in=list(INFLIGHT_JOB_STATUSES)) | Q(
            status__in=list(TERMINAL_JOB_STATUSES), updated_at__gte=cutoff
        )
        row = jobs.filter(live).aggregate(**figures)

        age: timedelta | None = row["oldest_queued_age"]
        return JobOperationalMetrics(
            by_status=by_status,
            terminal_last_15m={
                status: max(0, row[f"terminal_{status}"]) for status in _TERMINAL_KEYS
            },
            oldest_queued_age_seconds=max(0.0, age.total_seconds()) if age is not None else 0.0,
            delayed_queued_jobs=max(0, row["delayed"]),
            expired_leases=max(0, row["expired"]),
            blocked_threads=max(0, row["blocked"]),
        )

    def schema_readiness(self) -> Readiness:
        """See :meth:`StateStore.schema_readiness`.

        Runs ``SELECT 1`` on database ``using``, then compares the jobstate migrations
        the code knows with those recorded as applied, then checks that every jobstate
        table exists. Any exception (unknown alias, refused connection, broken
        migration graph) answers not ready with the reason in ``detail``; nothing is
        raised, so a probe can never mistake an error for readiness.
        """
        try:
            connection = connections[self.using]
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
        except Exception as exc:
            return _not_ready("ok", "failed", 0, f"migration state unreadable: {exc}")
        return Readiness(ready=True, database="ok", migrations="ok", pending=0)


def _not_ready(database: str, migrations: str, pending: int, detail: str) -> Readiness:
    logger.warning("jobstate is not ready: %s", detail)
    return Readiness(
        ready=False, database=database, migrations=migrations, pending=pending, detail=detail
    )
