"""Whether ready tasks wait in queues no worker serves: what a worker's start-up banner
warns about when its own queues hold nothing ready (a worker started on the wrong
``--queue-name``, a queue added to ``QUEUES`` without a worker of its own)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from django.db import DatabaseError
from django.db.models import Count

from jobstate.core.states import WorkerKind
from jobstate.models import Job, QueuePause, Worker

__all__ = ["unserved_queues_warning"]

logger = logging.getLogger("jobstate.worker")


def unserved_queues_warning(
    *, target: str, alias: str, queues: Sequence[str], using: str
) -> str | None:
    """The warning for a worker of ``queues`` (backend ``alias``, jobs of ``target``)
    when none of its queues holds a ready task while another queue holds ready tasks
    that no live task worker of the backend claims from (nor a pause holds); ``None``
    otherwise, and when the database cannot tell (the worker's first claim will)."""
    try:
        served: set[str] = set()
        for claimed in (
            Worker.objects.using(using)
            .live()
            .filter(kind=WorkerKind.TASKS, backend=alias)
            .values_list("queues", flat=True)
        ):
            if not claimed:
                return None  # a live worker of every queue
            served.update(claimed)
        ready = dict(
            Job.objects.using(using)
            .ready()
            .filter(target=target, task_path__isnull=False)
            .order_by()
            .values_list("queue_name")
            .annotate(n=Count("*"))
        )
        paused = set(
            QueuePause.objects.using(using)
            .filter(target=target)
            .values_list("queue_name", flat=True)
        )
    except DatabaseError as exc:
        logger.debug("Could not read which queues have ready tasks: %s", exc)
        return None
    if any(ready.get(name) for name in queues):
        return None
    unserved = {
        name: count
        for name, count in sorted(ready.items(), key=lambda item: str(item[0]))
        if name is not None and name not in served and name not in paused and count
    }
    if not unserved:
        return None
    waiting = ", ".join(f"{name!r} ({count} ready)" for name, count in unserved.items())
    return (
        f"None of this worker's queues ({', '.join(queues)}) holds a ready task, while "
        f"queue(s) {waiting} hold ready tasks no live worker serves: start a worker with "
        f"--queue-name {','.join(unserved)} (or '*')."
    )
