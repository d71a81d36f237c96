"""The torture run's controller: starts the reaper and the workers, injects faults for
the run's duration, then stops everything gracefully and lets the end state settle.

Faults come at random intervals around ``kill_every`` seconds and are aimed at a
worker that holds a job or a run at that moment (any live worker if none does within
a second). Until one kill has found its worker holding something, the faults are kills
and wait for such a worker, and the fault phase goes on past the run's duration (for
at most :data:`HOLDER_GRACE` seconds more) until one has: a short run on a loaded
machine, whose few kills could all land between two jobs or on a run that was skipped,
still exercises a recovery.

- **kill**: SIGKILL, then an immediate restart under a new worker id. Once the dead
  worker's database sessions are gone (so nothing it sent can still land), what it
  held — running jobs with its worker id, RUNNING runs it triggered — is handed to the
  monitor as orphans, each with its recovery bound.
- **pause** (a share of the faults, one worker at a time): SIGSTOP for longer than a
  lease and a stale-run threshold, then SIGCONT. The reaper takes the worker's work
  back while it sleeps; when it wakes, its reports must meet a fenced-off claim.
"""

from __future__ import annotations

import multiprocessing
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from reliability._torture_config import Mix, ProcessConfig, Timing
from reliability._torture_monitor import Fault, Monitor, MonitorResult, Orphan
from reliability._torture_pool import ProcessFailure, Reaper, Slot, WorkerPool
from reliability._torture_sql import Connection, connect
from reliability._torture_tasks import TaskWorkers, drain_tasks

#: How long the controller waits for a killed worker's sessions to end.
SESSION_WAIT = 15.0

#: How long the fault phase may run on past the run's duration while no kill has yet
#: found its worker holding a job or a run.
HOLDER_GRACE = 60.0


@dataclass(frozen=True)
class RunOptions:
    database_url: str
    duration: float
    workers: int
    kill_every: float
    pause_share: float
    timing: Timing
    mix: Mix = field(default_factory=Mix)
    seed: int | None = None
    task_workers: int = 2
    """``jobstate_worker`` processes running the run's tasks (0: no tasks)."""
    task_share: float = 0.3
    """Share of the faults that kill a task worker instead of a job worker."""


@dataclass
class RunFacts:
    """What the controller did and saw; the checks add what the database says."""

    fault_seconds: float = 0.0
    stop_seconds: float = 0.0
    """From the stop signal until every worker had exited."""
    settle_seconds: float = 0.0
    """From then until nothing was running (the reaper taking back the last orphans)."""
    kills: int = 0
    pauses: int = 0
    restarts: int = 0
    stop_kills: int = 0
    slow_session_exits: int = 0
    active_after_final_reap: int = 0
    failures: list[ProcessFailure] = field(default_factory=list)
    paused_workers: list[str] = field(default_factory=list)
    final_reap: dict[str, int] = field(default_factory=dict)
    monitor: MonitorResult = field(default_factory=MonitorResult)
    task_worker_kills: int = 0
    task_failures: list[str] = field(default_factory=list)
    """Task workers that exited on their own or would not stop, and a failed drain."""


class Controller:
    def __init__(self, options: RunOptions, log: Callable[[str], None]) -> None:
        self.options = options
        self.timing = options.timing
        self.log = log
        self.rng = random.Random(options.seed)
        self.facts = RunFacts()
        #: Whether a kill has found its worker holding a job or a run (see the module).
        self.killed_a_holder = False

    def run(self) -> RunFacts:
        options = self.options
        context = multiprocessing.get_context("spawn")
        config = ProcessConfig(options.database_url, options.timing, options.mix)
        monitor = Monitor(options.database_url)
        with connect(options.database_url, "torture-controller") as probe:
            monitor.start()
            reaper = Reaper(context, config)
            pool = WorkerPool(context, config, options.workers)
            tasks = TaskWorkers(options.database_url, self.timing, options.task_workers)
            try:
                self.log(f"starting {options.workers} workers and the reaper")
                pool.start(ready_timeout=600)
                if options.task_workers:
                    self.log(f"starting {options.task_workers} task workers")
                    tasks.start()
                self.log(f"running for {options.duration:g} s")
                started = time.monotonic()
                self._inject_faults(pool, reaper, probe, monitor, started + options.duration, tasks)
                self.facts.fault_seconds = time.monotonic() - started
                self.log("stopping the workers")
                self.facts.task_failures += tasks.stop(timeout=90)
                self._stop(pool, reaper, probe, monitor)
                if options.task_workers:
                    self.facts.task_failures += drain_tasks(
                        options.database_url, self.timing, probe, self.log
                    )
            finally:
                # On an error above, nothing may be left behind, least of all a stopped
                # process, which would ignore the SIGTERM multiprocessing sends at exit.
                pool.abandon()
                reaper.abandon()
                tasks.abandon()
            self.facts.task_worker_kills = tasks.kills
            self.facts.restarts = pool.restarts
        self.facts.monitor = monitor.finish()
        return self.facts

    # --- the fault phase -------------------------------------------------------------

    def _inject_faults(
        self,
        pool: WorkerPool,
        reaper: Reaper,
        probe: Connection,
        monitor: Monitor,
        end: float,
        tasks: TaskWorkers,
    ) -> None:
        due = time.monotonic() + self._gap()
        extended = False
        while (now := time.monotonic()) < end or (
            not self.killed_a_holder and now < end + HOLDER_GRACE
        ):
            if now >= end and not extended:
                extended = True
                self.log("no kill has found a worker holding a job or a run yet; running on")
            pool.resume_due()
            for exited in tasks.failures():
                self.facts.task_failures.append(exited)
                self.log(f"task worker {exited}; restarted")
            for slot, failure in pool.failures():
                self.facts.failures.append(failure)
                self.log(f"worker {failure.name} exited with status {failure.exitcode}")
                pool.restart(slot)
            reaper_failure = reaper.failure()
            if reaper_failure is not None:
                self.facts.failures.append(reaper_failure)
                self.log(f"the reaper exited with status {reaper_failure.exitcode}; restarted")
            if now >= due and tasks.count and self.rng.random() < self.options.task_share:
                tasks.kill_one(
                    self.rng, probe, lambda worker: _wait_sessions_gone(probe, worker, SESSION_WAIT)
                )
                due = time.monotonic() + self._gap()
            elif now >= due and self._fault(
                pool, probe, monitor, patient=now < due + 1.0 or not self.killed_a_holder
            ):
                due = time.monotonic() + self._gap()
            time.sleep(0.02)

    def _gap(self) -> float:
        return self.rng.uniform(0.5, 1.5) * self.options.kill_every

    def _fault(
        self, pool: WorkerPool, probe: Connection, monitor: Monitor, *, patient: bool
    ) -> bool:
        busy, live = pool.candidates()
        targets = busy or ([] if patient else live)
        if not targets:
            return False
        slot = self.rng.choice(targets)
        pausing = any(s.paused_until is not None for s in pool.slots)
        may_pause = self.killed_a_holder and not pausing
        if may_pause and self.rng.random() < self.options.pause_share:
            self._pause(pool, slot, probe, monitor)
        else:
            self._kill(pool, slot, probe, monitor, fault="kill")
            pool.restart(slot)
        return True

    def _kill(
        self,
        pool: WorkerPool,
        slot: Slot,
        probe: Connection,
        monitor: Monitor,
        *,
        fault: Fault,
    ) -> None:
        worker = slot.worker_id
        fault_at = _db_now(probe)
        pool.kill(slot)
        if fault == "kill":
            self.facts.kills += 1
        else:
            self.facts.stop_kills += 1
        gone = _wait_sessions_gone(probe, worker, SESSION_WAIT)
        if not gone:
            self.facts.slow_session_exits += 1
        holdings = self._holdings(probe, worker, fault, fault_at, sessions_gone=gone)
        if fault == "kill" and holdings:
            self.killed_a_holder = True
        monitor.track(holdings)

    def _pause(self, pool: WorkerPool, slot: Slot, probe: Connection, monitor: Monitor) -> None:
        fault_at = _db_now(probe)
        pool.pause(slot, self.timing.pause)
        self.facts.pauses += 1
        self.facts.paused_workers.append(slot.worker_id)
        monitor.track(self._holdings(probe, slot.worker_id, "pause", fault_at, sessions_gone=False))

    def _holdings(
        self,
        probe: Connection,
        worker: str,
        fault: Fault,
        fault_at: datetime,
        *,
        sessions_gone: bool,
    ) -> list[Orphan]:
        from jobstate.models import Job, JobRun

        bounded = fault != "pause"
        d = probe.dialect
        jobs = probe.execute(
            f"SELECT {d.id_text('id')}, {d.id_text('claim_token')} FROM {Job._meta.db_table} "
            "WHERE status = 'running' AND executor_id = %s",
            [worker],
        ).fetchall()
        runs = probe.execute(
            f"SELECT {d.id_text('id')} FROM {JobRun._meta.db_table} "
            "WHERE status = 'RUNNING' AND triggered_by = %s",
            [worker],
        ).fetchall()
        return [
            Orphan(
                "job",
                ident,
                worker,
                fault,
                fault_at,
                self.timing.job_bound if bounded else None,
                token=token,
                sessions_gone=sessions_gone,
            )
            for ident, token in jobs
        ] + [
            Orphan(
                "run",
                ident,
                worker,
                fault,
                fault_at,
                self.timing.run_bound if bounded else None,
                sessions_gone=sessions_gone,
            )
            for (ident,) in runs
        ]

    # --- the end -----------------------------------------------------------------------

    def _stop(
        self,
        pool: WorkerPool,
        reaper: Reaper,
        probe: Connection,
        monitor: Monitor,
    ) -> None:
        """Stop the workers (each finishes the job or run in hand), kill any that do
        not stop, let the reaper take back what is left, then run one last reap."""
        timing = self.timing
        longest = max(timing.lease, timing.stale_after)
        stop_started = time.monotonic()
        killed, failed = pool.stop(timeout=2 * longest + 3 * timing.reap_interval + 10)
        self.facts.stop_seconds = time.monotonic() - stop_started
        self.facts.failures.extend(failed)
        for worker in killed:
            self.log(f"worker {worker} did not stop; killed")
            fault_at = _db_now(probe)
            self.facts.stop_kills += 1
            gone = _wait_sessions_gone(probe, worker, SESSION_WAIT)
            monitor.track(self._holdings(probe, worker, "stop", fault_at, sessions_gone=gone))
        settle_started = time.monotonic()
        deadline = settle_started + longest + timing.reap_interval + timing.slack + 5
        while _active(probe) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.facts.settle_seconds = time.monotonic() - settle_started
        failure = reaper.stop(timeout=30)
        if failure is not None:
            self.facts.failures.append(failure)
        from jobstate.maintenance import run_reaping_sweeps

        self.facts.final_reap = run_reaping_sweeps().counts
        self.facts.active_after_final_reap = _active(probe)


def _db_now(probe: Connection) -> datetime:
    row = probe.execute(f"SELECT {probe.dialect.now}").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def _wait_sessions_gone(probe: Connection, worker: str, timeout: float) -> bool:
    """Wait until no session of ``worker`` is left on the server: a session of a killed
    client ends once it has finished (or rolled back) what it was doing."""
    deadline = time.monotonic() + timeout
    while True:
        row = probe.execute(probe.dialect.sessions_sql(), [worker]).fetchone()
        if row is None or row[0] == 0:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _active(probe: Connection) -> int:
    """Jobs still running and runs still RUNNING (nothing should be, once settled)."""
    from jobstate.models import Job, JobRun

    row = probe.execute(
        f"SELECT (SELECT count(*) FROM {Job._meta.db_table} WHERE status = 'running')"
        f" + (SELECT count(*) FROM {JobRun._meta.db_table} WHERE status = 'RUNNING')"
    ).fetchone()
    assert row is not None
    return int(row[0])
