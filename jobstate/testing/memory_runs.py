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
from dataclasses import dataclass, fields, replace
from datetime import datetime, timedelta
from typing import Any

from jobstate.exceptions import InvalidJobState, StoreError
from jobstate.stores.base import REAPED_RUN_ERROR, JobRunStatus, Trigger
from jobstate.stores.contracts.run_store import JobRunSettlement, JobRunStore, NewJobRun
from jobstate.stores.contracts.validation import validate_instant
from jobstate.testing.fake_clock import Clock, SystemClock

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

    Every primitive runs under one lock, so each is atomic against the others in this
    process. Arguments are checked by :class:`JobRunStore`, as for every store (this one
    adds no column lengths: it has no columns), and values are stored as they come back
    from JSON, so a test passing here does not hide a value the database store would
    refuse.

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
        key = self._parse_run_id(run_id)
        with self._lock:
            row = self._rows.get(key)
            return None if row is None else _copy(row)

    # The primitives

    def _claim(self, run: NewJobRun) -> str | None:
        stored = _as_stored(run)
        with self._lock:
            if self._holds_key(run.overlap_key):
                return None
            return self._insert(**stored)

    def _record_skipped(self, run: NewJobRun) -> str:
        stored = _as_stored(run)
        with self._lock:
            return self._insert(**stored)

    def _heartbeat(self, run_id: str, progress: dict[str, Any] | None) -> bool:
        stored_progress = None if progress is None else _json_copy(progress)
        with self._lock:
            row = self._running(run_id)
            if row is None:
                return False
            self._rows[run_id] = replace(
                row,
                heartbeat_at=max(row.heartbeat_at, self._now()),
                summary=row.summary if stored_progress is None else stored_progress,
            )
            return True

    def _complete(self, run_id: str, settlement: JobRunSettlement) -> bool:
        summary = settlement.summary
        stored_summary = None if summary is None else _json_copy(summary)
        with self._lock:
            row = self._running(run_id)
            if row is None:
                return False
            self._rows[run_id] = replace(
                row,
                status=settlement.status,
                finished_at=settlement.finished_at,
                duration_ms=settlement.duration_ms,
                summary=row.summary if stored_summary is None else stored_summary,
                error=row.error if settlement.error is None else settlement.error,
            )
            return True

    def _reap_stale(
        self,
        stale_after: timedelta,
        job_key: str | None,
        overlap_key: str | None,
        limit: int | None,
    ) -> int:
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

    def _parse_run_id(self, run_id: str | uuid.UUID) -> str:
        if self._new_id is None:
            return super()._parse_run_id(run_id)
        # A custom new_id makes ids of any shape, so any non-empty string names a run.
        if isinstance(run_id, uuid.UUID):
            return str(run_id)
        if not isinstance(run_id, str) or not run_id:
            raise InvalidJobState(f"run_id must be a non-empty string, got {run_id!r}.")
        return run_id

    # Internals. Callers hold self._lock.

    def _running(self, run_id: str) -> StoredJobRun | None:
        row = self._rows.get(run_id)
        return row if row is not None and row.status == JobRunStatus.RUNNING else None

    def _holds_key(self, overlap_key: str | None) -> bool:
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


def _json_copy(value: Any) -> Any:
    """What a JSON column gives back for ``value``, which the contract has checked."""
    return json.loads(json.dumps(value))


def _as_stored(run: NewJobRun) -> dict[str, Any]:
    """``run``'s fields as :meth:`MemoryJobRunStore._insert` takes them, ``input`` as a
    JSON column gives it back."""
    stored = {field.name: getattr(run, field.name) for field in fields(run)}
    return {**stored, "input": _json_copy(run.input)}


def _copy(row: StoredJobRun) -> StoredJobRun:
    return replace(row, input=copy.deepcopy(row.input), summary=copy.deepcopy(row.summary))
