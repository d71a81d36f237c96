"""What the restart run's processes share: names, timing and the event files they
write. Nothing here imports Django, so the settings module can read it."""

from __future__ import annotations

import json
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

ENV_DATABASE_URL = "JOBSTATE_RESTART_DATABASE_URL"
ENV_PROCESS_NAME = "JOBSTATE_RESTART_PROCESS"
ENV_DELIVERIES = "JOBSTATE_RESTART_DELIVERIES"

#: The queue target of every job the producer enqueues.
TARGET = "restart"
#: The key of the operations job the runner runs over and over.
RUN_KEY = "restart.beating"
#: The notification handler (:mod:`reliability._restart_ops`), every notification's
#: destination.
HANDLER = "reliability._restart_ops.record_delivery"

#: ``WORKER_LEASE`` and ``OUTBOX_LEASE``: what a restart orphans comes back this soon.
LEASE = timedelta(seconds=6)
HEARTBEAT_INTERVAL = timedelta(milliseconds=500)
#: ``STALE_RUN_AFTER``: a run claimed just before a restart, whose claim never reached
#: the runner, is reaped this long after it was claimed. Several restarts' worth of
#: heartbeat failures fit in it, so a live run is never reaped.
STALE_RUN_AFTER = timedelta(seconds=10)
#: How long one run's body works, beating as it goes.
RUN_SECONDS = 2.0


class EventLog:
    """Append-only JSON lines, one file per process, flushed line by line so a process
    killed mid-run still leaves every event it wrote."""

    def __init__(self, path: Path, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._file = path.open("a", buffering=1)

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"t": time.time(), "who": self.name, "event": event, **fields})
        with self._lock:
            self._file.write(line + "\n")

    def close(self) -> None:
        self._file.close()


def read_events(path: Path) -> list[dict[str, Any]]:
    """Every complete event of one file (a last line cut short by a kill is skipped)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events
