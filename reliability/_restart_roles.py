"""The components of the restart run, one process each:

    python -m reliability._restart_roles producer|worker|runner|reaper NAME EVENTS_FILE

- **producer**: enqueues jobs (idempotently, by request id) and records each one the
  store acknowledged;
- **worker**: the job-queue worker loop: claim, complete with a notification;
- **runner**: runs the operations job :data:`RUN_KEY` through ``JobRunner`` again and
  again (claim, heartbeats, final write);
- **reaper**: every reaping sweep once a second, as cron would run ``reap_stale``.

Each is host code written against the public API the way the documentation shows: a
retryable :class:`~jobstate.exceptions.StoreError` means "wait and try again" (the store
has already dropped the dead connection); anything else ends the process with status 1.
A call whose answer was lost may still have committed, so every retried call is one
that is safe to repeat: an enqueue by the same request id, a completion fenced by the
claim token. SIGTERM or SIGINT stops a component after its current step: a worker
finishes the job it holds, the producer gets its last enqueue acknowledged.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import django

_T = TypeVar("_T")

#: How long a stopping component keeps retrying the step it must finish.
FINISH_SECONDS = 60.0
#: The producer's pause between two enqueues.
PRODUCE_EVERY = 0.05
#: The reaper's pause between two passes.
REAP_EVERY = 1.0
#: A worker's pause when the queue is empty.
IDLE_WAIT = 0.05


class Stopped(Exception):
    """The component was asked to stop while a step could not be finished."""


class Component:
    """One component process: its event log, its stop flag, and the retry rule."""

    def __init__(self, name: str, events: Path) -> None:
        from reliability._restart_common import EventLog

        self.name = name
        self.log = EventLog(events, name)
        self.stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._request_stop)

    def _request_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop.set()

    def call(self, step: str, action: Callable[[], _T], *, must_finish: bool) -> _T:
        """``action()``, tried again after each retryable store error (each one is
        logged as a ``store_error`` event). When the component is stopping, a step
        that need not finish raises :class:`Stopped` at the next failure; one that must
        finish keeps trying for :data:`FINISH_SECONDS`."""
        from jobstate.exceptions import StoreError

        delay = 0.1
        give_up_at: float | None = None
        while True:
            try:
                return action()
            except StoreError as exc:
                if not exc.retryable:
                    raise
                self.log.write(
                    "store_error", step=step, error=type(exc).__name__, sqlstate=exc.sqlstate
                )
            if self.stop.is_set():
                if not must_finish:
                    raise Stopped(step)
                give_up_at = give_up_at or time.monotonic() + FINISH_SECONDS
                if time.monotonic() > give_up_at:
                    raise Stopped(step)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def produce(component: Component) -> None:
    from jobstate.stores import get_state_store
    from reliability._restart_common import TARGET

    store = get_state_store()
    number = 0
    while not component.stop.is_set():
        request_id = f"{component.name}-{number:07d}"

        def enqueue(request_id: str = request_id, number: int = number) -> Any:
            return store.enqueue(request_id=request_id, target=TARGET, input={"n": number})

        job, created = component.call("enqueue", enqueue, must_finish=True)
        component.log.write("enqueued", request_id=request_id, job=str(job.id), created=created)
        number += 1
        component.stop.wait(PRODUCE_EVERY)


def work(component: Component) -> None:
    from jobstate.stores import get_state_store
    from jobstate.stores.base import JobStatus, NotificationRequest
    from reliability._restart_common import HANDLER, TARGET

    store = get_state_store()
    while not component.stop.is_set():
        try:
            job = component.call(
                "claim",
                lambda: store.claim_next_inhub_job([TARGET], component.name),
                must_finish=False,
            )
        except Stopped:
            return
        if job is None:
            component.stop.wait(IDLE_WAIT)
            continue
        notification = NotificationRequest("callable", HANDLER, {"job": str(job.id)})

        def complete(job: Any = job, notification: NotificationRequest = notification) -> Any:
            patch = {"status": JobStatus.DONE, "result": {"by": component.name}}
            return store.complete_job_with_notifications(job, patch, [notification])

        if component.call("complete", complete, must_finish=True) is not None:
            component.log.write("completed", job=str(job.id))
            continue

        # Fenced off: an earlier try whose answer was lost wrote it, or the lease ran out
        # and the job went back to the queue. Either way the job is not this worker's.
        def current(job: Any = job) -> Any:
            return store.get_job(job.id)

        now = component.call("get_job", current, must_finish=True)
        component.log.write("stale", job=str(job.id), status=None if now is None else now.status)


class _RunnerLog(logging.Handler):
    """Turns the runner's warnings (a failed heartbeat, a failed reap, a retried final
    write) into events, naming the store error behind each."""

    def __init__(self, component: Component) -> None:
        super().__init__(logging.WARNING)
        self.component = component

    def emit(self, record: logging.LogRecord) -> None:
        error = record.exc_info[1] if record.exc_info else None
        self.component.log.write(
            "runner_warning",
            message=record.getMessage()[:200],
            error=None if error is None else type(error).__name__,
        )


def run(component: Component) -> None:
    from jobstate.runner import JobRunner
    from jobstate.stores.base import Trigger
    from reliability._restart_common import RUN_KEY

    runner_logger = logging.getLogger("jobstate.runner")
    runner_logger.setLevel(logging.WARNING)
    runner_logger.addHandler(_RunnerLog(component))
    runner = JobRunner()
    trigger = Trigger("CLI", component.name)
    while not component.stop.is_set():
        try:
            result = component.call(
                "execute", lambda: runner.execute(RUN_KEY, trigger=trigger), must_finish=False
            )
        except Stopped:
            return
        component.log.write(
            "run",
            run=result.run_id,
            status=str(result.status.value),
            recorded=result.recorded,
            reason=None if result.reason is None else str(result.reason.value),
        )


def reap(component: Component) -> None:
    from jobstate.maintenance import run_reaping_sweeps
    from jobstate.stores.errors import translated_database_errors
    from reliability._restart_common import STALE_RUN_AFTER

    def one_pass() -> dict[str, int]:
        # The sweeps run their own statements, not only the stores' methods; their
        # database errors are translated the same way.
        with translated_database_errors("reaping sweeps"):
            return run_reaping_sweeps(stale_after=STALE_RUN_AFTER).counts

    while not component.stop.is_set():
        try:
            counts = component.call("sweep", one_pass, must_finish=False)
        except Stopped:
            return
        component.log.write("swept", **{name: count for name, count in counts.items() if count})
        component.stop.wait(REAP_EVERY)


ROLES: dict[str, Callable[[Component], None]] = {
    "producer": produce,
    "worker": work,
    "runner": run,
    "reaper": reap,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reliability._restart_roles")
    parser.add_argument("role", choices=sorted(ROLES))
    parser.add_argument("name")
    parser.add_argument("events", type=Path)
    args = parser.parse_args(argv)
    django.setup()
    from django.db import connections

    component = Component(args.name, args.events)
    component.log.write("started")
    try:
        ROLES[args.role](component)
    except Stopped as stopped:
        component.log.write("gave_up", step=str(stopped))
        return 1
    finally:
        connections.close_all()
    component.log.write("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
