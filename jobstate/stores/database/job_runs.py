"""The run store on the ``JobRun`` table (the JobRunStore contract).

:class:`~jobstate.stores.contracts.run_store.JobRunStore` checks every argument; this module only
writes: the primitives, on the ORM and, where the backend has one, a one-statement
reaper.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Field
from django.db.models.functions import Greatest, Now

from jobstate.exceptions import InvalidJobState
from jobstate.models import ONE_RUNNING_PER_OVERLAP_KEY, JobRun, JobRunQuerySet
from jobstate.stores.base import REAPED_RUN_ERROR, JobRunStatus
from jobstate.stores.contracts.run_store import JobRunSettlement, JobRunStore, NewJobRun
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.sweep_statements import DatabaseRunSweepStore
from jobstate.stores.errors import translate_store_errors
from jobstate.stores.integrity import violates

__all__ = ["DatabaseJobRunStore"]


def _check_lengths(run: NewJobRun) -> None:
    # PostgreSQL rejects an over-long value with a DataError while SQLite stores it whole,
    # so the limits are checked here to give every backend the same answer. They are this
    # table's column sizes, not the contract's: the in-memory reference store has no
    # columns and stores any length, so the check belongs to this store's primitives and
    # runs after the contract's checks.
    for name, value in (
        ("job_key", run.job_key),
        ("overlap_key", run.overlap_key),
        ("trigger_source", run.trigger.source),
        ("triggered_by", run.trigger.triggered_by),
        ("service_revision", run.service_revision),
    ):
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

    def _claim(self, run: NewJobRun) -> str | None:
        _check_lengths(run)
        try:
            # The savepoint keeps a host's surrounding transaction usable after a lost race.
            with transaction.atomic(using=self.using):
                return self._insert(run)
        except IntegrityError as exc:
            if violates(
                exc,
                constraint=ONE_RUNNING_PER_OVERLAP_KEY,
                table=JobRun._meta.db_table,
                columns=["overlap_key"],
            ):
                return None
            raise

    def _record_skipped(self, run: NewJobRun) -> str:
        _check_lengths(run)
        return self._insert(run)

    def _heartbeat(self, run_id: str, progress: dict[str, Any] | None) -> bool:
        changes: dict[str, Any] = {"heartbeat_at": Greatest(F("heartbeat_at"), Now())}
        if progress is not None:
            changes["summary"] = progress
        return self._running(run_id).update(**changes) > 0

    def _complete(self, run_id: str, settlement: JobRunSettlement) -> bool:
        changes: dict[str, Any] = {
            "status": settlement.status,
            "finished_at": settlement.finished_at,
            "duration_ms": settlement.duration_ms,
        }
        if settlement.summary is not None:
            changes["summary"] = settlement.summary
        if settlement.error is not None:
            changes["error"] = settlement.error
        return self._running(run_id).update(**changes) > 0

    def _reap_stale(
        self,
        stale_after: timedelta,
        job_key: str | None,
        overlap_key: str | None,
        limit: int | None,
    ) -> int:
        ops = database_ops(self.using)
        if ops.hot_statements:
            return ops.reap_stale_runs(stale_after, job_key, overlap_key, limit)
        candidates = JobRun.objects.using(self.using).stale(stale_after)
        if job_key is not None:
            candidates = candidates.filter(job_key=job_key)
        if overlap_key is not None:
            candidates = candidates.filter(overlap_key=overlap_key)
        candidates = candidates.order_by("heartbeat_at")
        if not ops.locks_rows:
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

    def _running(self, run_id: str) -> JobRunQuerySet:
        return JobRun.objects.using(self.using).filter(id=run_id, status=JobRunStatus.RUNNING)

    def _insert(self, run: NewJobRun) -> str:
        row = JobRun.objects.using(self.using).create(
            job_key=run.job_key,
            overlap_key=run.overlap_key,
            status=run.status,
            trigger_source=run.trigger.source,
            triggered_by=run.trigger.triggered_by,
            input=run.input,
            summary=run.summary,
            started_at=run.started_at,
            finished_at=run.finished_at,
            duration_ms=run.duration_ms,
            service_revision=run.service_revision,
        )
        return str(row.id)

    supports_sweeps = True

    def sweep_store(self) -> DatabaseRunSweepStore:
        """See :meth:`JobRunStore.sweep_store`: it reaps through this store."""
        return DatabaseRunSweepStore(self.using, runs=self)
