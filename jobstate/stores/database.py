"""Stores backed by the Django ORM.

Raw SQL appears only where the ORM cannot say a hot path in one statement; each such
place says why and has a portable path for the other backends.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Field
from django.db.models.functions import Greatest, Now

from jobstate.exceptions import InvalidJobState
from jobstate.jsonvalues import ensure_json
from jobstate.models import ONE_RUNNING_PER_OVERLAP_KEY, JobRun, JobRunQuerySet
from jobstate.stores.base import (
    REAPED_RUN_ERROR,
    JobRunStatus,
    JobRunStore,
    Trigger,
)
from jobstate.stores.database_retention import DatabaseRunSweepStore
from jobstate.stores.errors import translate_store_errors
from jobstate.stores.integrity import violates
from jobstate.stores.validation import (
    optional_key,
    require_text,
    validate_claim_arguments,
    validate_duration,
    validate_duration_ms,
    validate_error_text,
    validate_instant,
    validate_reap_limit,
    validate_run_id,
    validate_skip_reason,
    validate_terminal_status,
)

__all__ = ["DatabaseJobRunStore", "DatabaseStateStore"]


def _check_lengths(**values: str | None) -> None:
    # PostgreSQL rejects an over-long value with a DataError while SQLite stores it whole,
    # so the limits are checked here to give every backend the same answer.
    for name, value in values.items():
        if value is not None and not isinstance(value, str):
            raise InvalidJobState(f"{name} must be a string, got {type(value).__name__}.")
        field = JobRun._meta.get_field(name)
        limit = field.max_length if isinstance(field, Field) else None
        if value is not None and limit is not None and len(value) > limit:
            raise InvalidJobState(f"{name} is {len(value)} characters long; the limit is {limit}.")


@translate_store_errors
class DatabaseJobRunStore(JobRunStore):
    """:class:`JobRunStore` on the ``JobRun`` table of database ``using``.

    S1 rests on the partial unique constraint ``jobstate_jobrun_one_running_per_overlap_key``;
    S2 and S6 on ``heartbeat_at`` defaulting to, and advancing with, the database clock;
    S3 and S4 on conditional updates that re-check ``status = 'RUNNING'``.
    """

    def __init__(self, using: str = "default") -> None:
        self.using = using

    def claim(
        self,
        *,
        job_key: str,
        overlap_key: str,
        trigger: Trigger,
        input: Any,
        started_at: datetime,
        service_revision: str | None = None,
    ) -> str | None:
        validate_claim_arguments(
            job_key=job_key,
            # A claim takes a key; only a skipped run (record_skipped) holds none.
            overlap_key=require_text(overlap_key, field="overlap_key", max_length=None),
            trigger=trigger,
            service_revision=service_revision,
        )
        started_at = validate_instant(started_at, field="started_at")
        _check_lengths(
            job_key=job_key,
            overlap_key=overlap_key,
            trigger_source=trigger.source,
            triggered_by=trigger.triggered_by,
            service_revision=service_revision,
        )
        ensure_json(input, field="input")
        try:
            # The savepoint keeps a host's surrounding transaction usable after a lost race.
            with transaction.atomic(using=self.using):
                run = JobRun.objects.using(self.using).create(
                    job_key=job_key,
                    overlap_key=overlap_key,
                    status=JobRunStatus.RUNNING,
                    trigger_source=trigger.source,
                    triggered_by=trigger.triggered_by,
                    input=input,
                    started_at=started_at,
                    service_revision=service_revision,
                )
        except IntegrityError as exc:
            if violates(
                exc,
                constraint=ONE_RUNNING_PER_OVERLAP_KEY,
                table=JobRun._meta.db_table,
                columns=["overlap_key"],
            ):
                return None
            raise
        return str(run.id)

    def heartbeat(self, *, run_id: str, progress: dict[str, Any] | None = None) -> bool:
        running = self._running(run_id)
        changes: dict[str, Any] = {"heartbeat_at": Greatest(F("heartbeat_at"), Now())}
        if progress is not None:
            changes["summary"] = ensure_json(progress, field="progress")
        return running.update(**changes) > 0

    def complete(
        self,
        *,
        run_id: str,
        status: str,
        finished_at: datetime,
        duration_ms: int,
        summary: dict[str, Any] | None = None,
        error: str | None = None,
    ) -> bool:
        running = self._running(run_id)
        terminal = validate_terminal_status(status)
        finished_at = validate_instant(finished_at, field="finished_at")
        validate_duration_ms(duration_ms)
        validate_error_text(error)
        changes: dict[str, Any] = {
            "status": terminal,
            "finished_at": finished_at,
            "duration_ms": duration_ms,
        }
        if summary is not None:
            changes["summary"] = ensure_json(summary, field="summary")
        if error is not None:
            changes["error"] = error
        return running.update(**changes) > 0

    def record_skipped(
        self,
        *,
        job_key: str,
        trigger: Trigger,
        input: Any,
        at: datetime,
        reason: str = "overlap",
        service_revision: str | None = None,
    ) -> str:
        validate_claim_arguments(
            job_key=job_key, overlap_key=None, trigger=trigger, service_revision=service_revision
        )
        at = validate_instant(at, field="at")
        validate_skip_reason(reason)
        _check_lengths(
            job_key=job_key,
            trigger_source=trigger.source,
            triggered_by=trigger.triggered_by,
            service_revision=service_revision,
        )
        ensure_json(input, field="input")
        run = JobRun.objects.using(self.using).create(
            job_key=job_key,
            overlap_key=None,
            status=JobRunStatus.SKIPPED,
            trigger_source=trigger.source,
            triggered_by=trigger.triggered_by,
            input=input,
            summary={"reason": reason},
            started_at=at,
            finished_at=at,
            duration_ms=0,
            service_revision=service_revision,
        )
        return str(run.id)

    def reap_stale(
        self,
        *,
        stale_after: timedelta,
        job_key: str | None = None,
        overlap_key: str | None = None,
        limit: int | None = None,
    ) -> int:
        validate_duration(stale_after, field="stale_after")
        validate_reap_limit(limit)
        optional_key(job_key, field="job_key")
        optional_key(overlap_key, field="overlap_key")
        vendor = connections[self.using].vendor
        if vendor == "postgresql":
            return self._reap_postgresql(stale_after, job_key, overlap_key, limit)
        candidates = JobRun.objects.using(self.using).stale(stale_after)
        if job_key is not None:
            candidates = candidates.filter(job_key=job_key)
        if overlap_key is not None:
            candidates = candidates.filter(overlap_key=overlap_key)
        candidates = candidates.order_by("heartbeat_at")
        if vendor == "sqlite":
            # SQLite has one writer at a time, so the ORM's
            # UPDATE ... WHERE id IN (SELECT ... LIMIT n) is already one atomic statement.
            ids = candidates.values("id")
            if limit is not None:
                ids = ids[:limit]
            return self._time_out(JobRun.objects.using(self.using).filter(id__in=ids))
        return self._reap_locking(candidates, limit)

    def _reap_locking(self, candidates: JobRunQuerySet, limit: int | None) -> int:
        # Backends without LIMIT inside IN (subquery) (MySQL, MariaDB): lock the candidates
        # with SKIP LOCKED, then move them in the same transaction. A concurrent reaper
        # passes over the locked rows, and the update re-checks the status, so each row
        # is counted by exactly one reaper (S4).
        with transaction.atomic(using=self.using):
            locked = candidates.select_for_update(skip_locked=True)
            if limit is not None:
                locked = locked[:limit]
            ids = list(locked.values_list("id", flat=True))
            if not ids:
                return 0
            return self._time_out(JobRun.objects.using(self.using).filter(id__in=ids))

    def _time_out(self, rows: JobRunQuerySet) -> int:
        return rows.filter(status=JobRunStatus.RUNNING).update(
            status=JobRunStatus.TIMED_OUT, finished_at=Now(), error=REAPED_RUN_ERROR
        )

    def _reap_postgresql(
        self,
        stale_after: timedelta,
        job_key: str | None,
        overlap_key: str | None,
        limit: int | None,
    ) -> int:
        # Raw SQL because the ORM cannot lock with FOR UPDATE SKIP LOCKED inside an UPDATE.
        # SKIP LOCKED lets a second reaper pass over rows the first one holds instead of
        # waiting and counting them again (S4); the outer status check keeps the count exact
        # even if a row settled in between. The candidates are a MATERIALIZED CTE, not an
        # IN (subquery): the planner may rescan such a subquery once per outer row, and each
        # rescan skips the rows already moved and locks the next ones, overrunning LIMIT.
        table = connections[self.using].ops.quote_name(JobRun._meta.db_table)
        sql = f"""
            WITH picked AS MATERIALIZED (
                SELECT id FROM {table}
                 WHERE status = %s
                   AND heartbeat_at <= statement_timestamp() - %s
                   AND (%s::text IS NULL OR job_key = %s)
                   AND (%s::text IS NULL OR overlap_key = %s)
                 ORDER BY heartbeat_at
                 LIMIT %s
                   FOR UPDATE SKIP LOCKED)
            UPDATE {table} AS run
               SET status = %s, finished_at = statement_timestamp(), error = %s
              FROM picked
             WHERE run.id = picked.id AND run.status = %s
        """
        params: list[Any] = [
            JobRunStatus.RUNNING.value,
            stale_after,
            job_key,
            job_key,
            overlap_key,
            overlap_key,
            limit,
            JobRunStatus.TIMED_OUT.value,
            REAPED_RUN_ERROR,
            JobRunStatus.RUNNING.value,
        ]
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def _running(self, run_id: str) -> JobRunQuerySet:
        return JobRun.objects.using(self.using).filter(
            id=validate_run_id(run_id), status=JobRunStatus.RUNNING
        )

    supports_sweeps = True

    def sweep_store(self) -> DatabaseRunSweepStore:
        """See :meth:`JobRunStore.sweep_store`: it reaps through this store."""
        return DatabaseRunSweepStore(self.using, runs=self)


# The state store has its own module (it is large); this is its public address.
from jobstate.stores.database_state import DatabaseStateStore  # noqa: E402
