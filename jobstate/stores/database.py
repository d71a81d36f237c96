"""Stores backed by the Django ORM.

Raw SQL appears only where the ORM cannot say a hot path in one statement; each such
place says why and has a portable path for the other backends.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F
from django.db.models.functions import Greatest, Now

from jobstate.exceptions import InvalidJobState
from jobstate.jsonvalues import ensure_json
from jobstate.models import ONE_RUNNING_PER_OVERLAP_KEY, JobRun, JobRunQuerySet
from jobstate.stores.base import (
    REAPED_RUN_ERROR,
    JobRunStatus,
    JobRunStore,
    Trigger,
    validate_claim_arguments,
    validate_duration,
    validate_instant,
    validate_terminal_status,
)
from jobstate.stores.integrity import violates

__all__ = ["DatabaseJobRunStore"]


def _run_uuid(run_id: str | uuid.UUID) -> uuid.UUID:
    if isinstance(run_id, uuid.UUID):
        return run_id
    try:
        return uuid.UUID(str(run_id))
    except ValueError as exc:
        raise InvalidJobState(f"{run_id!r} is not a run id (a UUID).") from exc


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
        validate_claim_arguments(job_key=job_key, overlap_key=overlap_key, trigger=trigger)
        validate_instant(started_at, field="started_at")
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
        changes: dict[str, Any] = {"heartbeat_at": Greatest(F("heartbeat_at"), Now())}
        if progress is not None:
            changes["summary"] = ensure_json(progress, field="progress")
        moved = self._running(run_id).update(**changes)
        return moved > 0

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
        terminal = validate_terminal_status(status)
        validate_instant(finished_at, field="finished_at")
        if isinstance(duration_ms, bool) or not isinstance(duration_ms, int) or duration_ms < 0:
            raise InvalidJobState(f"duration_ms must be a non-negative int, got {duration_ms!r}.")
        changes: dict[str, Any] = {
            "status": terminal,
            "finished_at": finished_at,
            "duration_ms": duration_ms,
        }
        if summary is not None:
            changes["summary"] = ensure_json(summary, field="summary")
        if error is not None:
            changes["error"] = error
        return self._running(run_id).update(**changes) > 0

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
        validate_claim_arguments(job_key=job_key, overlap_key=None, trigger=trigger)
        validate_instant(at, field="at")
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
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise InvalidJobState(f"limit must be a positive int or None, got {limit!r}.")
        if connections[self.using].vendor == "postgresql":
            return self._reap_postgresql(stale_after, job_key, overlap_key, limit)
        # SQLite (IMMEDIATE transactions) serialises writers, so the ORM's
        # UPDATE ... WHERE id IN (SELECT ... LIMIT n) is already one atomic statement.
        candidates = JobRun.objects.using(self.using).stale(stale_after)
        if job_key is not None:
            candidates = candidates.filter(job_key=job_key)
        if overlap_key is not None:
            candidates = candidates.filter(overlap_key=overlap_key)
        ids = candidates.order_by("heartbeat_at").values("id")
        if limit is not None:
            ids = ids[:limit]
        return (
            JobRun.objects.using(self.using)
            .filter(id__in=ids, status=JobRunStatus.RUNNING)
            .update(status=JobRunStatus.TIMED_OUT, finished_at=Now(), error=REAPED_RUN_ERROR)
        )

    def _reap_postgresql(
        self,
        stale_after: timedelta,
        job_key: str | None,
        overlap_key: str | None,
        limit: int | None,
    ) -> int:
        # Raw SQL because the ORM cannot put FOR UPDATE SKIP LOCKED inside the subquery of
        # an UPDATE. SKIP LOCKED lets a second reaper pass over rows the first one holds
        # instead of waiting and counting them again (S4); the outer status check keeps the
        # count exact even if a row settled in between.
        table = connections[self.using].ops.quote_name(JobRun._meta.db_table)
        sql = f"""
            UPDATE {table}
               SET status = %s, finished_at = statement_timestamp(), error = %s
             WHERE status = %s AND id IN (
                SELECT id FROM {table}
                 WHERE status = %s
                   AND heartbeat_at <= statement_timestamp() - %s
                   AND (%s::text IS NULL OR job_key = %s)
                   AND (%s::text IS NULL OR overlap_key = %s)
                 ORDER BY heartbeat_at
                 LIMIT %s
                   FOR UPDATE SKIP LOCKED)
        """
        params: list[Any] = [
            JobRunStatus.TIMED_OUT.value,
            REAPED_RUN_ERROR,
            JobRunStatus.RUNNING.value,
            JobRunStatus.RUNNING.value,
            stale_after,
            job_key,
            job_key,
            overlap_key,
            overlap_key,
            limit,
        ]
        with transaction.atomic(using=self.using), connections[self.using].cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.rowcount

    def _running(self, run_id: str) -> JobRunQuerySet:
        return JobRun.objects.using(self.using).filter(
            id=_run_uuid(run_id), status=JobRunStatus.RUNNING
        )
