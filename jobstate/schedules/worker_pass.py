"""The schedules as a worker evaluates them between claims.

Every ``jobstate_worker`` evaluates the periodic schedules when it starts and again at
each schedule's next slot (at least once a minute), so a deployment with workers needs no
other scheduler: however many workers evaluate a slot, it is enqueued once. The worker
lives below this package (:mod:`jobstate.tasks.worker`), so the command hands it a
:class:`WorkerSchedulePass` to call.
"""

from __future__ import annotations

import logging

from jobstate.schedules.service import evaluate_schedules, sync_schedules

__all__ = ["WorkerSchedulePass"]

logger = logging.getLogger("jobstate.worker")

#: Longest wait between two evaluations of the schedules: a schedule resumed in the
#: console is seen within it.
RECHECK_SECONDS = 60.0
#: Shortest wait: the database's clock and this process's may differ by a little, so
#: an evaluation just before a slot comes again at once.
MIN_WAIT_SECONDS = 0.01


class WorkerSchedulePass:
    """One worker's evaluations of the schedules on database ``using``, enqueued as
    ``worker_id``; each call returns how many occurrences it enqueued and the seconds until
    the next call is due."""

    def __init__(self, *, using: str, worker_id: str) -> None:
        self.using = using
        self.worker_id = worker_id
        self._synced = False

    def __call__(self) -> tuple[int, float]:
        """Enqueue the due slots of the schedules (after bringing their rows in step
        with settings, the first time)."""
        if not self._synced:
            sync_schedules(using=self.using)
            self._synced = True
        result = evaluate_schedules(using=self.using, by=self.worker_id)
        for occurrence in result.enqueued:
            logger.info(
                "Schedule %s: enqueued its slot %s as %s",
                occurrence.schedule,
                occurrence.slot.isoformat(),
                occurrence.result_id,
            )
        if result.next_slot is None:
            return len(result.enqueued), RECHECK_SECONDS
        wait = (result.next_slot - result.now).total_seconds()
        return len(result.enqueued), min(max(wait, MIN_WAIT_SECONDS), RECHECK_SECONDS)
