"""The rows every part of the in-memory state store works on (:class:`MemoryRows`), and
the helpers the parts share. Every primitive runs under the store's one re-entrant lock,
and :meth:`MemoryRows._atomic` holds the same lock, so a transition the base writes over
several primitives is one step for other callers."""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from django.utils import timezone

from jobstate.core.states import CLAIMED_JOB_STATUSES, JobStatus
from jobstate.models import NO_QUEUE, Job, time_ordered_uuid
from jobstate.stores.contracts.state_store import StateStore
from jobstate.stores.contracts.validation import JOB_DEFAULTS

__all__ = ["SWEEP_ACTOR", "MemoryRows", "Row", "is_ready", "job_of", "oldest_first"]

Row = dict[str, Any]

#: Who the audit entries of the store's own maintenance name (``detail["by"]``), as the
#: database store's sweeps do.
SWEEP_ACTOR = "jobstate.maintenance"


class MemoryRows(StateStore):
    """The store's rows, clock and lock; the capability parts of
    :class:`~jobstate.testing.memory_state.MemoryStateStore` build on it."""

    def __init__(
        self, using: str = "default", *, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.using = using
        self._clock = clock or timezone.now
        self._mutex = threading.RLock()
        self._jobs: dict[uuid.UUID, Row] = {}
        self._request_ids: dict[str, uuid.UUID] = {}
        self._audit: list[Row] = []
        self._audit_seq = 0
        self._locks: dict[str, tuple[str, datetime]] = {}
        self._decisions: dict[str, uuid.UUID] = {}
        self._pauses: dict[tuple[str, str], str] = {}
        self._workers: dict[str, Row] = {}

    def _atomic(self) -> AbstractContextManager[object]:
        return self._mutex

    # --- internals (callers hold the mutex) -------------------------------------------

    def _paused(self, row: Row) -> bool:
        return (row["target"], row["queue_name"] or NO_QUEUE) in self._pauses

    def _insert(self, cleaned: dict[str, Any]) -> Row:
        now = self._clock()
        row: Row = {field.attname: None for field in Job._meta.concrete_fields}
        row.update(copy.deepcopy(JOB_DEFAULTS))
        row.update(copy.deepcopy(cleaned))
        row["status"] = JobStatus(row["status"])
        row["id"] = time_ordered_uuid()
        row["created_at"] = now
        row["updated_at"] = now
        self._jobs[row["id"]] = row
        self._request_ids[row["request_id"]] = row["id"]
        return row

    def _blocked(self, row: Row, now: datetime) -> bool:
        thread = row["thread_id"]
        if thread is None:
            return False
        position = (row["created_at"], row["id"])
        for other in self._jobs.values():
            if other["thread_id"] != thread or other["id"] == row["id"]:
                continue
            if other["status"] in CLAIMED_JOB_STATUSES:
                return True
            if is_ready(other, now) and (other["created_at"], other["id"]) < position:
                return True
        return False

    def _listed(
        self,
        statuses: list[JobStatus],
        scope: list[str] | None,
        limit: int,
        keep: Callable[[Row, datetime], bool],
    ) -> list[Job]:
        """The jobs of ``scope`` in ``statuses`` that ``keep`` accepts at the store's
        clock, oldest first, at most ``limit``."""
        with self._mutex:
            now = self._clock()
            rows = [
                row for row in self._scoped(scope) if row["status"] in statuses and keep(row, now)
            ]
            return [job_of(row) for row in oldest_first(rows)[:limit]]

    def _scoped(self, scope: list[str] | None) -> list[Row]:
        return [row for row in self._jobs.values() if scope is None or row["target"] in scope]


def job_of(row: Row) -> Job:
    # A deep copy: callers may mutate what they get without touching the store.
    return Job(**copy.deepcopy(row))


def is_ready(row: Row, now: datetime) -> bool:
    return row["status"] == JobStatus.QUEUED and (
        row["run_after"] is None or row["run_after"] <= now
    )


def oldest_first(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda row: (row["created_at"], row["id"]))
