"""The processes the torture controller starts: workers (killed and restarted at
random) and the reaper (never killed).

A worker mixes the two kinds of work jobstate keeps state for:

- **queue jobs**: ``claim_next_inhub_job``, some work, then a fenced
  ``complete_claimed_job``. A few jobs renew their lease as they go, a few overrun it
  on purpose (the reaper gives them to someone else and the late report must be
  refused), and some end in ``error`` or are given back for a retry. Each claim and
  each accepted report is written to the harness's ledger in the same transaction as
  the store call; each refused report or renewal is noted too.
- **operations-job runs** through ``JobRunner`` on a few shared overlap keys; what the
  runner reported is noted for each run.

The worker publishes what it holds right now in a shared integer, so the controller
can aim its kills at workers that are in the middle of something.

Nothing here catches exceptions: a worker that fails for any reason other than the
controller's signals exits non-zero, and the controller counts that as a violation.
"""

from __future__ import annotations

import json
import os
import random
import time
import uuid
from typing import TYPE_CHECKING, Any

from reliability._torture_config import OVERLAP_KEYS, TARGET, ProcessConfig, setup_django

if TYPE_CHECKING:
    from jobstate.models import Job

#: Values of a worker's shared phase.
IDLE, HOLDS_JOB, HOLDS_RUN = 0, 1, 2

#: The trigger source of the workers' runs (its ``triggered_by`` is the worker id).
TRIGGER_SOURCE = "TORTURE"

#: How long a worker waits after finding the queue empty.
IDLE_SLEEP = 0.1


class _Worker:
    def __init__(self, config: ProcessConfig, worker_id: str, phase: Any) -> None:
        from jobstate.runner import JobRunner
        from jobstate.stores import get_state_store
        from reliability._torture_sql import dialect_of_django

        self.store = get_state_store()
        self.uuid = dialect_of_django().uuid_value
        self.runner = JobRunner()
        self.timing = config.timing
        self.mix = config.mix
        self.worker_id = worker_id
        self.phase = phase
        self.pid = os.getpid()
        self.rng = random.Random()

    def step(self) -> None:
        if self.rng.random() < self.mix.run_share:
            self.run_once()
        else:
            self.job_once()

    # --- queue jobs ---------------------------------------------------------------------

    def job_once(self) -> None:
        from django.db import connection, transaction

        # The claim and its ledger row commit together, as the report below does: the
        # ledger then holds every claim that ever took effect, and only those.
        with transaction.atomic():
            job = self.store.claim_next_inhub_job([TARGET], self.worker_id)
            if job is not None:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "INSERT INTO torture_claim (job_id, claim_token, worker)"
                        " VALUES (%s, %s, %s)",
                        [self.uuid(job.id), self.uuid(str(job.claim_token)), self.worker_id],
                    )
        if job is None:
            time.sleep(IDLE_SLEEP)
            return
        self.phase.value = HOLDS_JOB
        try:
            token = job.claim_token
            assert token is not None  # a claimed job always carries its token
            if self._work(job, token):
                self._report(job, token)
        finally:
            self.phase.value = IDLE

    def _work(self, job: Job, token: uuid.UUID) -> bool:
        """Do the job's "work"; ``False`` when a renewal found the claim gone."""
        timing, mix = self.timing, self.mix
        draw = self.rng.random()
        if draw < mix.overrun_share:
            time.sleep(timing.lease + 1.5 * timing.reap_interval + 0.5)
            return True
        if draw < mix.overrun_share + mix.renew_share:
            until = time.monotonic() + 1.5 * timing.lease
            while time.monotonic() < until:
                time.sleep(timing.lease / 4)
                if not self.store.extend_claim_lease(job.id, token):
                    self._refused("renewal", job.id, token, "claim gone")
                    return False
            return True
        time.sleep(self.rng.uniform(0.02, 0.2))
        return True

    def _report(self, job: Job, token: uuid.UUID) -> None:
        from django.db import connection, transaction

        from jobstate.stores.base import JobStatus

        mix = self.mix
        draw = self.rng.random()
        witness = {"claim_token": str(token), "worker": self.worker_id}
        patch: dict[str, Any]
        if draw < mix.error_share:
            status, patch = JobStatus.ERROR, {"result": witness, "error": "simulated failure"}
        elif draw < mix.error_share + mix.retry_share:
            status, patch = JobStatus.QUEUED, {"attempts": job.attempts + 1}
        else:
            status, patch = JobStatus.DONE, {"result": witness}
        # The report and its ledger row commit together: a kill between the two cannot
        # leave a completion the ledger does not know about, or the other way round.
        with transaction.atomic():
            outcome = self.store.complete_claimed_job(job.id, token, status, **patch)
            if outcome.completed:
                with connection.cursor() as cursor:
                    cursor.execute(
                        "INSERT INTO torture_completion (job_id, claim_token, status, worker, pid)"
                        " VALUES (%s, %s, %s, %s, %s)",
                        [
                            self.uuid(job.id),
                            self.uuid(token),
                            status.value,
                            self.worker_id,
                            self.pid,
                        ],
                    )
        if not outcome.completed:
            self._refused("report", job.id, token, outcome.outcome.value)

    def _refused(self, kind: str, job_id: uuid.UUID, token: uuid.UUID, outcome: str) -> None:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO torture_refusal (kind, job_id, claim_token, outcome, worker)"
                " VALUES (%s, %s, %s, %s, %s)",
                [kind, self.uuid(job_id), self.uuid(token), outcome, self.worker_id],
            )

    # --- operations-job runs ----------------------------------------------------------

    def run_once(self) -> None:
        from django.db import connection

        from jobstate.stores.base import Trigger

        key = self.rng.choice(OVERLAP_KEYS)
        self.phase.value = HOLDS_RUN
        try:
            result = self.runner.execute(key, trigger=Trigger(TRIGGER_SOURCE, self.worker_id))
        finally:
            self.phase.value = IDLE
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO torture_run_outcome (run_id, job_key, status, recorded, reason,"
                " worker) VALUES (%s, %s, %s, %s, %s, %s)",
                [
                    self.uuid(result.run_id),
                    result.job_key,
                    str(result.status.value),
                    result.recorded,
                    None if result.reason is None else str(result.reason.value),
                    self.worker_id,
                ],
            )


def worker_main(
    config: ProcessConfig, worker_id: str, phase: Any, stop: Any, ready: Any, go: Any
) -> None:
    """A worker process: set up, count itself in ``ready``, wait for ``go`` (the first
    generation of workers starts together; a restarted worker finds it set), then
    step until ``stop`` is set."""
    setup_django(config.database_url, config.timing, worker_id)
    from django.db import connection, connections

    worker = _Worker(config, worker_id, phase)
    connection.ensure_connection()
    with ready.get_lock():
        ready.value += 1
    go.wait()
    try:
        while not stop.is_set():
            worker.step()
    finally:
        connections.close_all()


def reaper_main(config: ProcessConfig, stop: Any) -> None:
    """The reaper process: every ``reap_interval`` seconds, every reaping sweep — the
    same call ``manage.py reap_stale`` makes — and one ``torture_reap_pass`` row."""
    setup_django(config.database_url, config.timing, "torture-reaper")
    from django.db import connection, connections

    from jobstate.maintenance import run_reaping_sweeps

    interval = config.timing.reap_interval
    due = time.monotonic()
    try:
        while not stop.is_set():
            started = time.monotonic()
            report = run_reaping_sweeps()
            seconds = time.monotonic() - started
            with connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO torture_reap_pass (seconds, counts) VALUES (%s, %s)",
                    [seconds, json.dumps(report.counts)],
                )
            # Keep the cadence, but after a slow pass start the next one at once rather
            # than catching up with a burst.
            due = max(due + interval, time.monotonic())
            stop.wait(due - time.monotonic())
    finally:
        connections.close_all()
