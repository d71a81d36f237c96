"""The worker: claims tasks of its queues, runs them in threads, reports how they ended.

One control loop (the thread that calls :meth:`TaskWorker.run`) does all the database work
of the worker itself:

- it claims tasks in batches of at most its free slots, so it never holds a task it
  will not start, and hands each to an execution thread (:mod:`.execution`); each round
  claims before its housekeeping (beat, recovery, schedules), so the first claim is
  made before the start line is logged;
- it settles ended attempts in batches (:mod:`.reports`); a batch of successes also
  claims the slots it frees, in one store call (one statement on PostgreSQL); its log
  lines and ``task_finished`` go to a thread of their own (:mod:`.announcer`);
- it registers itself when it starts (host, pid, worker id, backend, queues,
  concurrency, lease: the console's Workers page), and once per beat it renews the
  leases of every task it holds, in one statement, and moves its own last beat; now and
  then it recovers tasks whose worker died (their lease ran out). When it stops
  gracefully it says so, so the console shows it stopped rather than lost;
- it interrupts an attempt past the backend's ``TIMEOUT``, or whose task was cancelled
  (seen within ``interval``, :mod:`.cancellation`), and fails it once its thread has
  stopped; when the thread does not stop within ``grace``, the worker stops;
- it hands back, uncounted, a task whose dotted path it cannot import, for a worker
  with newer code, or fails it once enqueued longer than ``UNKNOWN_TASK_TIMEOUT`` ago;
- it evaluates the periodic schedules (:mod:`jobstate.schedules`) at each next slot
  (at least once a minute): however many workers evaluate a slot, it is enqueued once;
- between rounds it sleeps until an attempt ends, a notification names one of its
  queues (:mod:`.waiter`, PostgreSQL), a timeout, beat or slot is due, or ``interval``
  passes.

A store failure that retrying can cure (the database or a pooler restarting, a
deadlock) is logged and retried with a growing wait, while the running tasks go on, as
is a registration that fails at start; the worker's own transactions (its reports, the
schedule evaluations) translate their errors as the store does. What a claim lost with
its reply took is given back at once (:mod:`.lost_claims`). Any other failure ends the
worker, after handing back the tasks it had not started.
"""

from __future__ import annotations

import logging
import queue
import signal
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any

from jobstate.core.wakeup import Wakeup
from jobstate.exceptions import ImproperlyConfiguredStore, StoreError
from jobstate.stores import get_state_store
from jobstate.stores.base import StateStore
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.policies import StoredPolicy
from jobstate.tasks.worker.announcer import Announcer
from jobstate.tasks.worker.atomic import AtomicReporter
from jobstate.tasks.worker.cancellation import CancelWatch
from jobstate.tasks.worker.config import (
    ScheduleEvaluation,
    WorkerConfig,
    WorkerSummary,
    default_worker_id,
)
from jobstate.tasks.worker.execution import Attempt, ExecutionPool, Outcome
from jobstate.tasks.worker.lost_claims import UnsureClaims
from jobstate.tasks.worker.presence import WorkerPresence
from jobstate.tasks.worker.settled import abandoned, held
from jobstate.tasks.worker.shutdown import stop_signals
from jobstate.tasks.worker.task_claims import KeyedPace, TaskClaim
from jobstate.tasks.worker.timeouts import next_due, overdue_attempts
from jobstate.tasks.worker.unknown_tasks import UnknownTasks
from jobstate.tasks.worker.waiter import NotificationListener, start_listener

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = ["TaskWorker", "WorkerConfig", "WorkerSummary", "default_worker_id"]

logger = logging.getLogger("jobstate.worker")

#: Longest wait after a retryable store failure (doubling from the interval).
_RETRY_CAP = 30.0
#: Recovery of lost tasks runs twice per lease, within these bounds.
_RECOVERY_BOUNDS = (1.0, 60.0)
#: The least a stopping worker waits for its last announcements (past ``grace``).
_ANNOUNCE_WAIT = 5.0


class TaskWorker:
    """One worker process's control loop; see the module docstring."""

    def __init__(
        self,
        config: WorkerConfig,
        backend: JobStateBackend,
        schedule_pass: ScheduleEvaluation | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.options = backend.task_options
        self.store: StateStore = get_state_store(using=config.using)
        if not self.store.supports_tasks:
            raise ImproperlyConfiguredStore(
                f"JOBSTATE['STATE_STORE'] ({type(self.store).__qualname__}) does not support "
                "tasks (supports_tasks is False); the worker has nothing to claim from."
            )
        self._announcer = Announcer(name="jobstate-announcer")
        self.reporter = AtomicReporter(
            self.store,
            using=config.using,
            options=self.options,
            sender=type(backend),
            announcer=self._announcer,
        )
        self.summary = WorkerSummary(worker_id=config.worker_id)
        self._wake = Wakeup()
        self._stop_requested: str | None = None
        self._ended: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        self._pending: list[Outcome] = []
        #: The attempts held, by claim (see :func:`.settled.held`).
        self._active: dict[tuple[Any, Any], Attempt] = {}
        self._pool: ExecutionPool | None = None
        self._listener: NotificationListener | None = None
        self._schedule_pass = schedule_pass if config.schedules else None
        self._next_schedules = time.monotonic()
        #: Timed-out attempts whose thread did not stop (see _enforce_timeouts).
        self._stuck: list[Attempt] = []
        self._unknown = UnknownTasks(self.reporter, self.options)
        #: The queues claimed from: ``None`` when the backend allows any queue and the
        #: worker was asked for every queue.
        self.queues: tuple[str, ...] | None = config.queues
        if self.queues is None and backend.queues:
            self.queues = tuple(sorted(backend.queues))
        self._presence = WorkerPresence(self.store, config, backend, self.queues)
        self._cancels = CancelWatch(self.store, every=config.interval)
        self._unsure = UnsureClaims(self.store, config.worker_id)
        self._keyed = KeyedPace(config.interval)

    # --- public ----------------------------------------------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop claiming; finish (within ``grace``) what runs. Safe from any thread and
        from a signal handler."""
        if self._stop_requested is None:
            self._stop_requested = reason
        self._wake.set()

    def run(self) -> WorkerSummary:
        """Work until ``--batch`` or ``--max-tasks`` says the work is done, or a stop
        is requested; then let the running tasks finish (up to ``grace``), hand back the
        rest and return what was done."""
        with (
            stop_signals(lambda signum: self.request_stop(signal.Signals(signum).name)),
            self._announcer.deferring_logs(),
        ):
            self._pool = ExecutionPool(
                self.config.concurrency,
                self._attempt_ended,
                name="jobstate-task",
            )
            self._listener = start_listener(
                self.config, target=self.backend.target, queues=self.queues, wake=self._wake.set
            )
            try:
                if not self._register():
                    return self.summary
                self._work()
            finally:
                self._wind_down()
                self._wake.close()
        return self.summary

    # --- the loop --------------------------------------------------------------------

    def _work(self) -> None:
        options = self.options
        beat = options.beat.total_seconds()
        low, high = _RECOVERY_BOUNDS
        recovery_every = min(max(options.lease.total_seconds() / 2, low), high)
        next_beat = time.monotonic() + beat
        next_recovery = time.monotonic()
        failures = 0
        announced = False
        while True:
            self._wake.clear()
            try:
                self._watch_cancels()
                self._enforce_timeouts()
                self._unsure.release()
                # A round of successes claims the next tasks with its reports.
                room = self._settle_ended(claim=self._stop_requested is None)
                if self._stop_requested is not None:
                    return
                if self._done():
                    return
                # The claim comes before the round's housekeeping, so a worker's first
                # task starts before its banner's last line, its recovery of lost tasks
                # and its first evaluation of the schedules; what those two make ready
                # sets the wake-up, and the next round claims it at once.
                free, claimed = self._claim() if room is None else room
                if not announced:
                    announced = True
                    self._presence.announce(
                        listening=self._listener is not None, claimed=claimed > 0
                    )
                now = time.monotonic()
                if now >= next_beat:
                    self._beat()
                    next_beat = now + beat
                if now >= next_recovery:
                    self._recover_lost_tasks()
                    next_recovery = now + recovery_every
                if self._schedule_pass is not None and now >= self._next_schedules:
                    self._next_schedules = now + self._evaluate_schedules()
            except StoreError as exc:
                failures += 1
                self._wait_after(exc, failures)
                continue
            failures = 0
            # A claim that filled every free slot leaves nothing to claim until an
            # attempt ends, and an attempt that ends sets the wake-up: the wait below
            # returns at once for one that ended meanwhile, so no round is run idle.
            drained = self.config.batch and free and not claimed and not self._active
            if drained and not self._wake.is_set():
                # The last tasks' task_finished receivers, on the announcer's thread, may
                # enqueue tasks (a chain): the queues are drained once they have run.
                if self._announcer.settle(self._wake, max(self.config.grace, _ANNOUNCE_WAIT)):
                    continue
                self._stop_requested = self._stop_requested or "--batch: no task ready"
                return
            self._wake.wait(self._sleep_seconds(next_beat))

    def _wait_after(self, exc: StoreError, failures: int) -> None:
        """Wait before trying again after the ``failures``-th store failure in a row,
        longer each time; re-raise one that retrying cannot cure."""
        if not exc.retryable:
            raise exc
        wait = min(self.config.interval * 2 ** min(failures - 1, 10), _RETRY_CAP)
        logger.warning("The database failed (%s); trying again in %.1f s", exc, wait)
        self._wake.wait(wait)

    def _register(self) -> bool:
        """Register the worker, trying again while the database cannot be reached;
        ``False`` when a stop was requested first."""
        failures = 0
        while True:
            # The LISTEN thread sets it when it cannot connect either: left set, every
            # wait returned at once (thousands of retries and log lines a second).
            self._wake.clear()
            if self._stop_requested is not None:
                return False
            try:
                self._presence.register()
            except StoreError as exc:
                failures += 1
                self._wait_after(exc, failures)
                continue
            return True

    def _claim(self) -> tuple[int, int]:
        """Claim up to the free slots (and what ``--max-tasks`` still allows) and start
        what was claimed: ``(room, claimed)``."""
        request = self._claim_request()
        if request is None:
            return 0, 0
        with self._unsure.watching(request):
            jobs = request.claim(self.store)
        self._start(jobs)
        return request.limit, len(jobs)

    def _claim_request(self, ending: Collection[tuple[Any, Any]] = ()) -> TaskClaim | None:
        """The claim of the free slots once the attempts ``ending`` (as held) are
        settled (and what ``--max-tasks`` still allows); ``None`` when there is none."""
        if self._announcer.lagging():
            # A slow task_finished receiver or log handler: claim nothing until the
            # announcements catch up (see .announcer).
            return None
        running = len(self._active.keys() - ending) if ending else len(self._active)
        free = self.config.concurrency - running
        if self.config.max_tasks is not None:
            free = min(free, self.config.max_tasks - self.summary.started)
        if free <= 0:
            return None
        return TaskClaim(
            target=self.backend.target,
            queues=self.queues,
            worker_id=self.config.worker_id,
            lease=self.options.lease,
            limit=free,
            pace=self._keyed,
        )

    def _start(self, jobs: list[Job]) -> None:
        """Hand each claimed task to a thread."""
        assert self._pool is not None
        for job in jobs:
            attempt = Attempt(
                job=job,
                alias=self.backend.alias,
                worker_id=self.config.worker_id,
                sender=type(self.backend),
                policy=StoredPolicy.of(job.policy, self.options),
                atomic=self.reporter.run,
            )
            self._active[held(attempt)] = attempt
            self.summary.started += 1
            self._pool.submit(attempt)

    def _done(self) -> bool:
        """``--max-tasks`` reached and every task it started settled."""
        if self.config.max_tasks is None or self.summary.started < self.config.max_tasks:
            return False
        if self._active:
            return False
        self._stop_requested = f"--max-tasks {self.config.max_tasks} reached"
        return True

    def _attempt_ended(self, outcome: Outcome) -> None:
        """Called by an execution thread: queue the outcome for the control loop."""
        self._keyed.ended(outcome.attempt.job)
        self._ended.put(outcome)
        self._wake.set()

    def _settle_ended(self, *, claim: bool = False) -> tuple[int, int] | None:
        """Report every attempt that has ended. What a failed report leaves stays in
        ``_pending`` for the next round: an attempt is never dropped unreported. With
        ``claim``, a round of successes claims the free slots in the same store call
        and starts what it claimed: ``(room, claimed)`` as :meth:`_claim` answers, or
        ``None`` when no claim was made."""
        while True:
            try:
                self._pending.append(self._ended.get_nowait())
            except queue.Empty:
                break
        left, back = self._unknown.hand_back(self._pending)
        for attempt in back:
            self._active.pop(held(attempt), None)
            self.summary.started -= 1
            self.summary.unknown += 1
        self._pending = left
        if not self._pending:
            return None
        request = None
        if claim:
            request = self._claim_request({held(item.attempt) for item in self._pending})
        with self._announcer.gathering():  # queued once the next tasks started
            with self._unsure.watching(request):
                settled, jobs = self.reporter.settle_and_claim(self._pending, request)
            self._pending = []
            for item in settled:
                self._active.pop(held(item.outcome.attempt), None)
                item.count_in(self.summary)
            if request is None or jobs is None:
                return None
            self._start(jobs)
            return request.limit, len(jobs)

    def _watch_cancels(self, lost: list[Attempt] | None = None) -> None:
        """Stop the attempts whose task was cancelled (every ``interval``, or at once
        for ``lost``, the claims a lease renewal found gone)."""
        attempts = list(self._active.values()) if lost is None else lost
        for attempt in self._cancels.check(attempts, due_now=lost is not None):
            self._active.pop(held(attempt), None)
            self.summary.cancelled += 1

    def _enforce_timeouts(self) -> None:
        for attempt in overdue_attempts(
            self._active.values(),
            grace=self.config.grace,
            worker_id=self.config.worker_id,
            stuck=self._stuck,
        ):
            self._stuck.append(attempt)
            self.summary.stuck += 1
            self.request_stop(
                f"a {'cancelled' if attempt.cancelled else 'timed-out'} task did not stop"
            )

    def _beat(self) -> None:
        """The worker's beat: renew the leases it holds and move its own last beat, so
        the console sees it live for as long as its tasks' leases are kept."""
        self._renew_leases()
        self._presence.beat()

    def _renew_leases(self) -> None:
        holding = [attempt for attempt in self._active.values() if not attempt.claim_lost]
        claims = [
            (attempt.job.id, attempt.job.claim_token)
            for attempt in holding
            if attempt.job.claim_token is not None
        ]
        if not claims:
            return
        renewed = set(self.store.extend_claim_leases(claims, self.options.lease))
        missing = [attempt for attempt in holding if attempt.job.id not in renewed]
        if missing:
            # Cancelled or recovered elsewhere: the watch tells which, and stops the
            # cancelled ones.
            self._watch_cancels(missing)

    def _recover_lost_tasks(self) -> None:
        recovery = self.store.recover_expired_tasks()
        if recovery.requeued:
            # Claimable now: claim them without waiting out the interval.
            self._wake.set()
        if recovery.total:
            logger.warning(
                "Recovered %d task(s) of workers that stopped renewing their leases: "
                "%d requeued, %d failed (no attempt left)",
                recovery.total,
                recovery.requeued,
                recovery.failed,
            )

    def _evaluate_schedules(self) -> float:
        """Enqueue the due slots of the schedules; the seconds until the next pass."""
        assert self._schedule_pass is not None
        enqueued, wait = self._schedule_pass()
        self.summary.scheduled += enqueued
        if enqueued:
            # A slot due now is claimable now, also by a worker that does not listen.
            self._wake.set()
        return wait

    def _sleep_seconds(self, next_beat: float) -> float:
        now = time.monotonic()
        wake_at = min(now + self.config.interval, next_beat)
        if self._schedule_pass is not None and self._stop_requested is None:
            wake_at = min(wake_at, self._next_schedules)
        due = next_due(self._active.values(), grace=self.config.grace)
        return max(min(wake_at, due) - now, 0.0)

    # --- start and stop --------------------------------------------------------------

    def _wind_down(self) -> None:
        """Claim nothing more; hand back what no thread started; let the running tasks
        finish within ``grace`` (renewing their leases meanwhile); count and hand back
        the ones still running; stop the threads."""
        assert self._pool is not None
        deadline = time.monotonic() + self.config.grace
        if self._listener is not None:
            self._listener.stop()
        unstarted = [attempt for attempt in self._active.values() if attempt.hand_back()]
        self.summary.started -= len(unstarted)  # counted when handed to the pool
        try:
            self._unsure.release()
            if unstarted:
                self.summary.handed_back += self.reporter.hand_back(unstarted)
                for attempt in unstarted:
                    self._active.pop(held(attempt), None)
            self._finish_running()
        except StoreError as exc:
            # Stopping anyway: the leases of what could not be reported run out, and the
            # tasks are recovered as lost attempts.
            logger.error("Could not report the tasks still held while stopping: %s", exc)
        finally:
            self._pool.stop()
        reason = self.summary.stopped_by or self._stop_requested or "error"
        try:
            self._presence.stopped(reason)
        finally:
            counts = self.summary.counts()
            self.summary.unannounced = self._announcer.close(
                f"jobstate_worker {self.config.worker_id} stopped ({reason}): {counts}",
                timeout=max(deadline - time.monotonic(), _ANNOUNCE_WAIT),
            )

    def _finish_running(self) -> None:
        self.summary.stopped_by = self._stop_requested or "error"
        deadline = time.monotonic() + self.config.grace
        next_beat = time.monotonic() + self.options.beat.total_seconds()
        if self._waiting():
            logger.info(
                "Waiting up to %g s for %d running task(s) to finish",
                self.config.grace,
                sum(1 for attempt in self._active.values() if attempt not in self._stuck),
            )
        while self._waiting() and time.monotonic() < deadline:
            self._wake.clear()
            self._watch_cancels()
            self._enforce_timeouts()
            self._settle_ended()
            if time.monotonic() >= next_beat:
                self._beat()
                next_beat = time.monotonic() + self.options.beat.total_seconds()
            if self._waiting():
                self._wake.wait(min(self._sleep_seconds(next_beat), deadline - time.monotonic()))
        # The threads still running end with this process, which exits right after these
        # reports: a retry of theirs is not due before a lease has passed, as after a
        # crash, so it cannot start while one of them still runs.
        why = f"the worker stopped and its grace of {self.config.grace:g} s ran out"
        for attempt in [attempt for attempt in self._active.values() if attempt.abandon()]:
            if attempt.interrupted_at is None:
                self.summary.interrupted += 1
            self._ended.put(abandoned(attempt, why, hold=self.options.lease))
        self._settle_ended()

    def _waiting(self) -> bool:
        """Attempts are running that may still end by themselves (not stuck ones)."""
        return any(attempt not in self._stuck for attempt in self._active.values())
