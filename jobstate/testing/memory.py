"""The in-memory reference :class:`~jobstate.stores.base.JobRunStore`.

For tests; never in production. It lives in one process, forgets everything when the
process ends, and its atomicity is a ``threading.Lock``. It exists to pin down the
contract's semantics in a few readable lines, to run the contract cases against, and to
give runner tests a store with a controllable clock.
"""

from __future__ import annotations

import copy
import json
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from jobstate.exceptions import InvalidJobState, StoreError
from jobstate.jsonvalues import ensure_json
from jobstate.stores.base import (
    REAPED_RUN_ERROR,
    JobRunStatus,
    JobRunStore,
    Trigger,
)
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
from jobstate.testing.clock import Clock, SystemClock

__all__ = ["MemoryJobRunStore", "StoredJobRun"]


@dataclass(frozen=True)
class StoredJobRun:
    """One stored run, as a store holds it. Instants are aware datetimes."""

    run_id: str
    job_key: str
    #: ``None`` for SKIPPED rows, which never hold a key.
    overlap_key: str | None
    status: JobRunStatus
    trigger: Trigger
    input: Any
    summary: dict[str, Any] | None
    error: str | None
    #: Recorded instant: the runner's clock, verbatim.
    started_at: datetime
    #: Liveness watermark: the store's clock only, never ``None``.
    heartbeat_at: datetime
    #: The runner's instant for a completed run; the store's clock for a reaped one.
    finished_at: datetime | None
    duration_ms: int | None
    service_revision: str | None


class MemoryJobRunStore(JobRunStore):
    """A :class:`JobRunStore` held in a dict, for tests; never use it in production.

    Every method runs under one lock, so each is atomic against the others in this
    process. Arguments are checked as :class:`~jobstate.stores.database.DatabaseJobRunStore`
    checks them (all but the column lengths of its table), and values are stored as they
    come back from JSON, so a test passing here does not hide a value the database store
    would refuse.

    ``clock`` is the store's clock (the liveness axis: watermarks and stale cutoffs);
    it defaults to the wall clock. ``new_id`` makes run ids; by default they are random
    UUID strings and run ids are checked like the database store checks them. With a
    custom ``new_id`` any non-empty string is an id. ``using`` is accepted and ignored
    so ``JOBSTATE['RUN_STORE']`` can name this class.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        new_id: Callable[[], str] | None = None,
        using: str = "default",
    ) -> None:
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.using = using
        self._new_id = new_id
        self._rows: dict[str, StoredJobRun] = {}
        self._lock = threading.Lock()

    # Inspection

    def runs(self) -> list[StoredJobRun]:
        """Every stored run in insertion order, as copies the caller may change freely."""
        with self._lock:
            return [_copy(row) for row in self._rows.values()]

    def run_of(self, run_id: str | uuid.UUID) -> StoredJobRun | None:
        """The stored run with ``run_id`` (a copy), or ``None``."""
        key = self._key(run_id)
        with self._lock:
            row = self._rows.get(key)
            return None if row is None else _copy(row)

    # The contract

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
        stored_input = _json_copy(input, field="input")
        with self._lock:
            if self._holds_key(overlap_key):
                return None
            return self._insert(
                job_key=job_key,
                overlap_key=overlap_key,
                status=JobRunStatus.RUNNING,
                trigger=trigger,
                input=stored_input,
                summary=None,
                started_at=started_at,
                finished_at=None,
                duration_ms=None,
                service_revision=service_revision,
            )

    def heartbeat(self, *, run_id: str, progress: dict[str, Any] | None = None) -> bool:
        key = self._key(run_id)
        stored_progress = None if progress is None else _json_copy(progress, field="progress")
        with self._lock:
            row = self._rows.get(key)
            if row is None or row.status != JobRunStatus.RUNNING:
                return False
            self._rows[key] = replace(
                row,
                heartbeat_at=max(row.heartbeat_at, self._now()),
                summary=row.summary if stored_progress is None else stored_progress,
            )
            return True

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
        key = self._key(run_id)
        terminal = validate_terminal_status(status)
        finished_at = validate_instant(finished_at, field="finished_at")
        validate_duration_ms(duration_ms)
        validate_error_text(error)
        stored_summary = None if summary is None else _json_copy(summary, field="summary")
        with self._lock:
            row = self._rows.get(key)
            if row is None or row.status != JobRunStatus.RUNNING:
                return False
            self._rows[key] = replace(
                row,
                status=terminal,
                finished_at=finished_at,
                duration_ms=duration_ms,
                summary=row.summary if stored_summary is None else stored_summary,
                error=row.error if error is None else error,
            )
            return True

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
        stored_input = _json_copy(input, field="input")
        with self._lock:
            return self._insert(
                job_key=job_key,
                overlap_key=None,
                status=JobRunStatus.SKIPPED,
                trigger=trigger,
                input=stored_input,
                summary={"reason": reason},
                started_at=at,
                finished_at=at,
                duration_ms=0,
                service_revision=service_revision,
            )

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
        with self._lock:
            now = self._now()
            cutoff = now - stale_after
            stale = sorted(
                (
                    row
                    for row in self._rows.values()
                    if row.status == JobRunStatus.RUNNING
                    and (job_key is None or row.job_key == job_key)
                    and (overlap_key is None or row.overlap_key == overlap_key)
                    and row.heartbeat_at <= cutoff
                ),
                key=lambda row: row.heartbeat_at,
            )
            moved = stale if limit is None else stale[:limit]
            for row in moved:
                self._rows[row.run_id] = replace(
                    row, status=JobRunStatus.TIMED_OUT, finished_at=now, error=REAPED_RUN_ERROR
                )
            return len(moved)

    # Internals. Callers hold self._lock.

    def _holds_key(self, overlap_key: str) -> bool:
        return any(
            row.status == JobRunStatus.RUNNING and row.overlap_key == overlap_key
            for row in self._rows.values()
        )

    def _insert(
        self,
        *,
        job_key: str,
        overlap_key: str | None,
        status: JobRunStatus,
        trigger: Trigger,
        input: Any,
        summary: dict[str, Any] | None,
        started_at: datetime,
        finished_at: datetime | None,
        duration_ms: int | None,
        service_revision: str | None,
    ) -> str:
        run_id = str(uuid.uuid4()) if self._new_id is None else self._new_id()
        if not isinstance(run_id, str) or not run_id:
            raise StoreError(f"new_id() must return a non-empty string, got {run_id!r}.")
        if run_id in self._rows:
            # A repeated id would overwrite another run (S5); a database raises here too.
            raise StoreError(f"new_id() returned {run_id!r}, which is already in use.")
        self._rows[run_id] = StoredJobRun(
            run_id=run_id,
            job_key=job_key,
            overlap_key=overlap_key,
            status=status,
            trigger=trigger,
            input=input,
            summary=summary,
            error=None,
            started_at=started_at,
            heartbeat_at=self._now(),
            finished_at=finished_at,
            duration_ms=duration_ms,
            service_revision=service_revision,
        )
        return run_id

    def _now(self) -> datetime:
        return validate_instant(self.clock.now(), field="clock.now()")

    def _key(self, run_id: str | uuid.UUID) -> str:
        if self._new_id is None:
            return str(validate_run_id(run_id))
        if isinstance(run_id, uuid.UUID):
            return str(run_id)
        if not isinstance(run_id, str) or not run_id:
            raise InvalidJobState(f"run_id must be a non-empty string, got {run_id!r}.")
        return run_id


def _json_copy(value: Any, *, field: str) -> Any:
    """Check ``value`` and return what a JSON column would give back for it."""
    return json.loads(json.dumps(ensure_json(value, field=field)))


def _copy(row: StoredJobRun) -> StoredJobRun:
    return replace(row, input=copy.deepcopy(row.input), summary=copy.deepcopy(row.summary))
