"""What tells jobs apart: their time-ordered ids, and the uniqueness key a unique task
holds (``jobstate.tasks.policy(unique=...)``), as the unique index's condition and, for
MariaDB and MySQL, as the generated column that stands in for it."""

from __future__ import annotations

import os
import threading
import time
import uuid

from django.db.models import Q

from jobstate.core.states import UNIQUE_STATE_BITS, unique_hold_statuses

__all__ = ["JOB_UNIQUE_TASK", "UNIQUE_HOLD_SQL", "time_ordered_uuid", "unique_hold"]

#: Unique index behind unique tasks (``jobstate.tasks.policy(unique=...)``): one job per
#: backend and uniqueness key among the jobs whose status their ``unique_states`` cover.
JOB_UNIQUE_TASK = "jobstate_job_unique_task"

_uuid_lock = threading.Lock()
_uuid_last_ms = 0
_uuid_counter = 0


def time_ordered_uuid() -> uuid.UUID:
    """A version 7 UUID (RFC 9562): 48 bits of Unix milliseconds, a 12-bit counter,
    62 random bits.

    Jobs are claimed oldest first by ``(created_at, id)``. ``created_at`` comes from the
    database clock, whose precision (milliseconds on SQLite) can tie for jobs queued in
    quick succession; time-ordered ids break such ties in the order this process created
    the jobs, which keeps a thread's queue first in, first out. The counter keeps ids
    from one process strictly increasing even within one millisecond.
    """
    global _uuid_last_ms, _uuid_counter
    with _uuid_lock:
        now_ms = time.time_ns() // 1_000_000
        if now_ms > _uuid_last_ms:
            _uuid_last_ms, _uuid_counter = now_ms, 0
        else:
            # Same millisecond, or the clock stepped back: stay on the last instant.
            _uuid_counter += 1
            if _uuid_counter > 0xFFF:
                _uuid_last_ms, _uuid_counter = _uuid_last_ms + 1, 0
        millis, counter = _uuid_last_ms, _uuid_counter
    random_bits = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (millis & ((1 << 48) - 1)) << 80 | 0x7 << 76 | counter << 64 | 0b10 << 62 | random_bits
    return uuid.UUID(int=value)


def unique_hold() -> Q:
    """The jobs that hold their uniqueness key: a unique task (``unique_digest`` set)
    whose status is one of those its ``unique_states`` mask covers. The condition of the
    partial unique index :data:`JOB_UNIQUE_TASK` (PostgreSQL, SQLite); written as
    ``IN`` lists of the masks that have each status's bit, which every backend indexes."""
    masks = range(1, 2 ** len(UNIQUE_STATE_BITS))
    by_status = [
        Q(status=status, unique_states__in=[mask for mask in masks if mask & bit])
        for status, bit in unique_hold_statuses().items()
    ]
    held = by_status[0]
    for condition in by_status[1:]:
        held |= condition
    return Q(unique_digest__isnull=False) & held


#: :func:`unique_hold` as a value, for the stored generated column MariaDB and MySQL hold
#: the key in (they ignore a unique constraint's condition): the digest while the job
#: holds its key, else NULL, which their unique indexes admit any number of.
UNIQUE_HOLD_SQL = (
    "CASE WHEN "
    + " OR ".join(
        f"(`status` = '{status}' AND (`unique_states` & {bit}) <> 0)"
        for status, bit in unique_hold_statuses().items()
    )
    + " THEN `unique_digest` END"
)
