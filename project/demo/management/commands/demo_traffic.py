"""Live demo traffic: jobs flow through the queue while the admin watches.

Each tick runs one relay pass over the notification outbox, enqueues a few jobs, lets a
simulated in-process worker and a simulated remote executor claim, renew, finish, fail,
reject or crash on them (a crashed owner stops renewing, so its lease expires), runs an
operations job now and then (and leaves a "crashed" run behind), and every few seconds
runs the reaping sweeps that recover what the crashes left, and now and then enqueues
one of the demo's tasks (:mod:`project.demo.tasks`) for the ``jobstate_worker`` that
``scripts/demo`` runs beside it. Finished and failed jobs
notify the demo's receivers (:mod:`project.demo.notifications`) through
``complete_job_with_notifications``: most notifications are delivered, some after a
retry, and those to the receiver that always fails end as dead letters. Stops cleanly on
SIGTERM or Ctrl-C.

Operators act on the same jobs from the console while it runs: they requeue, reject and
approve jobs, pause queues, delete finished jobs. What that does to the traffic's own
work (a claim it held is gone, a completion's notification is already in the outbox, the
database is busy with a bulk operation) is an expected outcome: it is logged in a line
and the traffic goes on. Anything else that fails in one step of a tick is logged with
its traceback, and the next step and tick run all the same.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import signal
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import FrameType
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser
from django.db.models import Count
from django.test.utils import override_settings

from jobstate.core.wakeup import Wakeup
from jobstate.exceptions import DuplicateNotification, StoreError, ThreadQuotaExceeded
from jobstate.maintenance import SweepReport, run_reaping_sweeps
from jobstate.models import Job, JobRun, Notification
from jobstate.outbox.relay import deliver_notifications
from jobstate.runner import JobRunner
from jobstate.stores import get_run_store, get_state_store
from jobstate.stores.base import (
    JobStatus,
    NotificationRequest,
    NotificationState,
    StateStore,
    Trigger,
)
from project.demo.notifications import ACCEPTS, ALWAYS_FAILS, BUSY_ONCE
from project.demo.tasks import build_report, flaky_sync, send_welcome_email

INHUB_TARGET = "demo.inhub"
REMOTE_TARGET = "demo.remote"
#: The target of the sample jobs ``demo_setup`` claims itself. The remote executor also
#: serves it, so a sample that is handed back or requeued from the console runs again.
SETUP_TARGET = "demo.setup"
WORKER_ID = "demo-worker-1"
EXECUTOR_ID = "demo-executor-1"

#: How many jobs each simulated owner (the worker, the executor) holds at most.
HOLD_LIMIT = 5

#: The liveness budget the demo reaps runs with: the shortest the runner accepts with
#: its default 30 s heartbeat, so a crashed run is reaped within a minute or two.
DEMO_STALE_RUN_AFTER = timedelta(minutes=1)

#: The name the traffic's lines carry, where a log line carries its logger's.
TRAFFIC_NAME = "project.demo.traffic"


def stamped(message: str) -> str:
    """``message`` as the demo's loggers write their lines to demo.log (the time, then a
    name), so the traffic's lines there can be told apart and read in order with them."""
    line = logging.Formatter(settings.DEMO_LOG_FORMAT)
    return line.format(logging.makeLogRecord({"name": TRAFFIC_NAME, "msg": message}))


def _integer(text: str, *, most: int | None = None) -> int:
    """A count option: an integer of at least 1 (and at most ``most``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if most is not None and not 1 <= value <= most:
        raise argparse.ArgumentTypeError(f"must be between 1 and {most}, got {value}")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _attempts(text: str) -> int:
    return _integer(text, most=100)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value < 86_400:
        raise argparse.ArgumentTypeError(
            f"must be a number of seconds above 0 and under 86400, got {text}"
        )
    return value


@dataclass
class Held:
    """A job one of the simulated owners holds (as it was claimed), and its plan for it."""

    job: Job
    token: uuid.UUID
    ticks_left: int
    outcome: str  # done | error | rejected | crash | stall


class Command(BaseCommand):
    help = (
        "Simulate live traffic for the demo: enqueue jobs, run an in-process worker and a "
        "remote executor that sometimes crash, notify demo receivers and relay the "
        "notifications, run operations jobs, and reap what the crashes leave behind. Runs "
        "until SIGTERM or Ctrl-C (or --iterations)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tick", type=_seconds, default=1.0, help="Seconds between ticks.")
        parser.add_argument(
            "--lease", type=_seconds, default=6.0, help="Lease of every claim, seconds."
        )
        parser.add_argument(
            "--sweep-every",
            type=_seconds,
            default=3.0,
            help="Seconds between runs of the reaping sweeps.",
        )
        parser.add_argument(
            "--iterations", type=_integer, default=None, help="Stop after this many ticks."
        )
        parser.add_argument("--seed", type=int, default=None, help="Random seed (repeatable).")
        parser.add_argument(
            "--no-relay",
            dest="relay",
            action="store_false",
            help="Leave the outbox to a relay of its own (scripts/demo runs "
            "deliver_notifications --loop, which shows on the Workers page).",
        )
        parser.add_argument(
            "--outbox-attempts",
            type=_attempts,
            default=3,
            help="OUTBOX_MAX_ATTEMPTS while the demo runs, so dead letters show up soon.",
        )
        parser.add_argument(
            "--outbox-backoff",
            type=_seconds,
            default=1.0,
            help="OUTBOX_BACKOFF_BASE in seconds while the demo runs (the cap is 4 times it).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        self.rng = random.Random(options["seed"])
        self.store: StateStore = get_state_store()
        self.lease = timedelta(seconds=options["lease"])
        self.worker_jobs: list[Held] = []
        self.executor_jobs: list[Held] = []
        self.tick_number = 0
        self.relaying: bool = options["relay"]
        # A stalled owner comes back once its lease has expired and a sweep has run.
        self.stall_ticks = (
            math.ceil((options["lease"] + options["sweep_every"]) / options["tick"]) + 1
        )
        # Set by the stop signals' handler. A threading.Event there could hang the
        # traffic for good, neither working nor stopping (jobstate.core.wakeup says why).
        self.stop = Wakeup()
        self.stopped_by = ""
        previous = {
            sig: signal.signal(sig, self.request_stop) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        self.say(
            f"Demo traffic: a tick every {options['tick']} s, leases of {options['lease']} s, "
            f"reaping every {options['sweep_every']} s. Stop with Ctrl-C."
        )
        backoff = timedelta(seconds=options["outbox_backoff"])
        # With the production defaults a notification dies after eight attempts spread
        # over a quarter of an hour or more; the demo shortens that for its own process
        # only, so dead letters appear within seconds. override_settings also reloads
        # JOBSTATE's cached values.
        outbox = override_settings(
            JOBSTATE={
                **getattr(settings, "JOBSTATE", {}),
                "OUTBOX_MAX_ATTEMPTS": options["outbox_attempts"],
                "OUTBOX_BACKOFF_BASE": backoff,
                "OUTBOX_BACKOFF_MAX": backoff * 4,
            }
        )
        next_sweep = time.monotonic()
        try:
            with outbox:
                while not self.stop.is_set():
                    if (
                        options["iterations"] is not None
                        and self.tick_number >= options["iterations"]
                    ):
                        break
                    self.tick()
                    if time.monotonic() >= next_sweep:
                        self.sweep()
                        next_sweep = time.monotonic() + options["sweep_every"]
                    self.stop.wait(options["tick"])
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop.close()
        self.owners_stopped(self.stopped_by or "--iterations done")
        self.say(f"Demo traffic stopped after {self.tick_number} ticks.")

    def request_stop(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM's and SIGINT's handler: the traffic stops after the step it is in."""
        self.stopped_by = signal.Signals(signum).name
        self.stop.set()

    def owners_stopped(self, reason: str) -> None:
        """The simulated owners are registered on the Workers page by their claims, which
        cannot say they ended: without this they show live, then lost."""
        try:
            for owner in (WORKER_ID, EXECUTOR_ID):
                self.store.stop_worker(worker_id=owner, reason=reason)
        except StoreError as exc:
            # Exiting anyway: they show lost once their lease has passed.
            self.stderr.write(stamped(f"Could not record that the simulated owners stopped: {exc}"))

    # --- one tick ---------------------------------------------------------------------

    def tick(self) -> None:
        self.tick_number += 1
        # The relay runs first, so what this tick's completions write stays pending (and
        # visible in the admin) until the next tick.
        if self.relaying:
            self.step("relay", self.relay)
        self.step("enqueue", self.enqueue)
        self.step("worker", lambda: self.work(self.worker_jobs))
        self.step("executor", lambda: self.work(self.executor_jobs))
        self.step("claim", self.claim)
        if self.tick_number % 7 == 1:
            self.step("operations job", self.operations_job)
        if self.tick_number % 4 == 1:
            self.step("task", self.enqueue_task)

    def step(self, name: str, action: Callable[[], None]) -> None:
        """Run one step of a tick; a failure is logged and the traffic goes on."""
        try:
            action()
        except StoreError as exc:
            if not exc.retryable:
                self.log_failure(name)
                return
            # The database was busy (an operator's bulk operation holding SQLite's write
            # lock past the timeout) or the connection dropped: the next tick tries again.
            self.say(f"{name}: the database answered {exc!r}; trying again next tick")
        except Exception:
            # The demo runs in front of an operator who is trying things out; one broken
            # step must not stop the traffic they are watching, so everything else is
            # logged with its traceback (to stderr) and the next step runs.
            self.log_failure(name)

    def say(self, message: str) -> None:
        self.stdout.write(stamped(message))

    def log_failure(self, name: str) -> None:
        self.stderr.write(
            stamped(
                f"tick {self.tick_number}, {name} failed; the traffic goes on:\n"
                f"{traceback.format_exc().rstrip()}"
            )
        )

    def enqueue(self) -> None:
        for _ in range(self.rng.choice((0, 1, 1, 2))):
            target = self.rng.choice((INHUB_TARGET, REMOTE_TARGET))
            thread = self.rng.choice((None, None, 1, 2, 3))
            try:
                self.store.enqueue(
                    request_id=f"demo-{uuid.uuid4()}",
                    target=target,
                    source="demo",
                    thread_id=thread,
                    input={"document": self.rng.randrange(1, 10_000)},
                )
            except ThreadQuotaExceeded as exc:
                # With THREAD_INFLIGHT_QUOTA set, a thread whose jobs wait (its queue
                # paused from the console) takes no more until they drain.
                self.say(f"enqueue refused: {exc}")

    def enqueue_task(self) -> None:
        """One of the demo's django.tasks tasks, for the jobstate_worker that
        ``scripts/demo`` starts: most are quick, some fail once and are retried, a few
        are slow."""
        kind = self.rng.choice(("email", "email", "email", "sync", "report"))
        if kind == "email":
            send_welcome_email.enqueue(user_id=self.rng.randint(1, 9999))
        elif kind == "sync":
            flaky_sync.enqueue(self.rng.choice(("crm", "billing", "warehouse")))
        else:
            build_report.enqueue(rows=self.rng.randint(100, 10_000), seconds=5)

    def claim(self) -> None:
        owners = (
            (self.worker_jobs, [INHUB_TARGET], True),
            (self.executor_jobs, [REMOTE_TARGET, SETUP_TARGET], False),
        )
        for held, targets, in_process in owners:
            # Each owner fills its free slots, so a backlog (a few dozen jobs requeued
            # from the console at once) is worked off within a minute or two.
            while len(held) < HOLD_LIMIT:
                if in_process:
                    job = self.store.claim_next_inhub_job(targets, WORKER_ID, self.lease)
                else:
                    job = self.store.claim_next_job(targets, EXECUTOR_ID, self.lease)
                if job is None or job.claim_token is None:
                    break
                outcome = self.rng.choices(
                    ("done", "error", "rejected", "crash", "stall"), weights=(56, 12, 10, 14, 8)
                )[0]
                ticks = self.stall_ticks if outcome == "stall" else self.rng.randint(1, 4)
                held.append(Held(job, job.claim_token, ticks, outcome))

    def work(self, held: list[Held]) -> None:
        for item in list(held):
            item.ticks_left -= 1
            if item.outcome == "crash":
                # The owner "died": it forgets the job and never renews the lease, so
                # the lease expires and the reaping sweep recovers the job.
                held.remove(item)
                continue
            if item.ticks_left > 0:
                if item.outcome == "stall":
                    # Alive but stuck: it stops renewing and reports late, after its
                    # job was recovered; the fenced report is refused.
                    continue
                # Each claim is renewed on its own, the executor's too: renewing all of
                # an executor's jobs at once (extend_executor_leases) would keep the
                # ones it crashed or stalled on alive for as long as it holds another.
                if not self.store.extend_claim_lease(item.job.id, item.token, self.lease):
                    # An operator requeued (or a sweep recovered) the job meanwhile.
                    held.remove(item)
                    self.say(
                        f"claim lost on job {item.job.id}: it was requeued or recovered "
                        "while held; letting it go"
                    )
                continue
            held.remove(item)
            self.finish(item)

    def finish(self, item: Held) -> None:
        """Report the job's outcome. Finished and failed jobs notify a demo receiver in
        the same transaction (``complete_job_with_notifications``); rejections use the
        plain fenced report. Either is refused once the claim was recovered."""
        status = JobStatus.DONE if item.outcome == "stall" else JobStatus(item.outcome)
        payload = {"job": str(item.job.id), "status": status.value}
        if status == JobStatus.REJECTED:
            result = self.store.complete_claimed_job(item.job.id, item.token, status)
            accepted = result.completed
        else:
            if status == JobStatus.DONE:
                patch: dict[str, Any] = {"result": {"pages": self.rng.randrange(1, 40)}}
                receiver = BUSY_ONCE if self.rng.random() < 0.2 else ACCEPTS
            else:
                patch = {"error": "demo failure: the document could not be parsed"}
                receiver = ALWAYS_FAILS
            notes = [NotificationRequest("callable", receiver, payload)]
            try:
                finished = self.store.complete_job_with_notifications(
                    item.job, {"status": status, **patch}, notes
                )
            except DuplicateNotification as exc:
                # Nothing was written: the outbox already holds this notification (the
                # job notified once, before an operator requeued it). The job still
                # finishes, without a second notification.
                self.say(
                    f"job {item.job.id} finishes without notifying: {exc.idempotency_key} "
                    "is already in the outbox"
                )
                result = self.store.complete_claimed_job(item.job.id, item.token, status, **patch)
                accepted = result.completed
            else:
                accepted = finished is not None
        if not accepted:
            self.say(
                f"late report ignored for job {item.job.id}: stale claim "
                "(its lease expired and it was recovered)"
            )

    def relay(self) -> None:
        # Failed attempts and dead letters are logged by the relay (``jobstate.outbox.relay``).
        deliver_notifications(store=self.store)

    def operations_job(self) -> None:
        runner = JobRunner(store=get_run_store())
        runner.execute("demo.report-build", {"rows": 500}, Trigger("SCHEDULER", "demo"))
        if self.rng.random() < 0.4:
            # A run whose process "crashed": claimed, never beats, never completes.
            get_run_store().claim(
                job_key="demo.report-build",
                overlap_key=f"demo.report-build#crashed-{uuid.uuid4()}",
                trigger=Trigger("SCHEDULER", "demo"),
                input={"rows": 1},
                started_at=datetime.now(UTC),
            )

    # --- maintenance ------------------------------------------------------------------

    def sweep(self) -> None:
        def reap() -> None:
            report = run_reaping_sweeps(stale_after=DEMO_STALE_RUN_AFTER)
            self.say(f"{self.status_line()}{self.reaped_line(report)}")

        self.step("sweep", reap)

    def status_line(self) -> str:
        jobs = dict(Job.objects.values_list("status").annotate(n=Count("id")))
        runs = dict(JobRun.objects.values_list("status").annotate(n=Count("id")))
        notes = dict(Notification.objects.values_list("state").annotate(n=Count("id")))
        job_part = " · ".join(f"{s} {jobs.get(s, 0)}" for s in JobStatus.values)
        run_part = " · ".join(f"{s.lower()} {n}" for s, n in sorted(runs.items()))
        note_part = " · ".join(f"{s} {notes.get(s, 0)}" for s in NotificationState.values)
        return f"jobs: {job_part} | runs: {run_part} | notifications: {note_part}"

    @staticmethod
    def reaped_line(report: SweepReport) -> str:
        moved = [
            f"{name} {count}" for name, count in report.counts.items() if count and "_" not in name
        ]
        return f" | reaped: {', '.join(moved)}" if moved else ""
