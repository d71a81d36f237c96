"""Who claims through the store: remote executors (``claim_next_job``,
``extend_executor_leases``) and a host's own hub workers (``claim_next_inhub_job(s)``)
appear on the console's Workers page as workers of kind ``executor``, registered by
their claims rather than by themselves.

A claim (found or not: an executor polling an empty queue is alive) or a renewal moves
the executor's last beat, at most once per :func:`beat_every` of its lease per process,
so a busy executor costs one ``UPDATE`` of its row per beat, not one per claim. The
first beat of an executor nobody registered yet inserts its row; two processes doing so
at once meet on the worker id's unique key and the loser beats the winner's row (see
``fleet_rows.register_worker``). Its lease is the claim's. Its claims cannot tell that
it ended, so whatever ends its work (the command that claimed, the host's view a remote
executor calls on its way out) says so with ``stop_worker``, and the console shows it
stopped; one that just stops claiming and renewing is shown lost once that lease has
passed, like any worker whose beat went silent.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from datetime import timedelta

from jobstate.core.states import WorkerKind

__all__ = ["BEAT_SHARE", "ClaimerBeats", "beat_every", "claimer_fields"]

#: A claimer's row is written at most every this share of its lease (and at most every
#: minute), so it is live again well before a lease it keeps renewing ends.
BEAT_SHARE = 4
_LONGEST_GAP = 60.0
#: How many claimers a process remembers; more (a web process relaying for many
#: executors) starts afresh, which costs one extra write per claimer.
_REMEMBERED = 10_000


def beat_every(lease: timedelta) -> float:
    """Seconds between two writes of a claimer's row."""
    return min(lease.total_seconds() / BEAT_SHARE, _LONGEST_GAP)


def claimer_fields(owner: str, lease: timedelta) -> dict[str, object]:
    """The registry row of a claimer first seen: the process that called the store
    (for a remote executor that calls through a web API, the web process)."""
    return {
        "worker_id": owner,
        "kind": WorkerKind.EXECUTOR,
        "host": (socket.gethostname() or "unknown")[:255],
        "pid": os.getpid(),
        "lease": lease,
        "backend": "",
        "queues": None,
        "concurrency": 1,
    }


class ClaimerBeats:
    """When each claimer's row is next due, in this process (shared by every store
    instance of one database, as stores are cheap and made per call)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[tuple[str, str], float] = {}

    def due(self, store: object, owner: str, lease: timedelta) -> bool:
        """Whether the claimer's row should be written now; when it is, the next write
        is due one beat later."""
        now = time.monotonic()
        key = _key(store, owner)
        with self._lock:
            if self._due.get(key, 0.0) > now:
                return False
            if len(self._due) >= _REMEMBERED:
                self._due.clear()
            self._due[key] = now + beat_every(lease)
        return True

    def stopped(self, store: object, owner: str) -> None:
        """The claimer said it stopped: its next claim through this process (it started
        again under the same id) writes its row at once, rather than leaving it shown
        stopped for up to a beat while it claims."""
        with self._lock:
            self._due.pop(_key(store, owner), None)

    def forget(self) -> None:
        with self._lock:
            self._due.clear()


def _key(store: object, owner: str) -> tuple[str, str]:
    # Per database, not per store instance: stores are cheap and made per call.
    return str(getattr(store, "using", id(store))), owner


#: The process's record of its claimers' beats.
claimer_beats = ClaimerBeats()
