"""What every process of the torture run shares: its timing, its work mix, and how a
process sets Django up on the run's own database.

The settings module (:mod:`reliability._torture_settings`) reads the environment
variables named here, so each process sets them before ``django.setup()``; a process
started with the ``spawn`` method begins with a fresh interpreter, so nothing of the
parent's Django state leaks into it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

#: The queue target every loaded job has and every worker claims from.
TARGET = "torture"

#: Operations jobs with ``overlap="forbid"``: the workers share these few keys, so
#: many runs contend for each one and the one-RUNNING-run-per-key guarantee is busy.
OVERLAP_KEYS = ("torture.overlap-0", "torture.overlap-1", "torture.overlap-2")

#: Every job the harness loads has a request id with this prefix.
REQUEST_PREFIX = "torture-"

#: The database name must contain this, so a mistyped URL cannot drop a real database.
NAME_GUARD = "torture"

DEFAULT_SERVER = "postgres://postgres@127.0.0.1:5432/"
DEFAULT_DATABASE = "jobstate_torture"

ENV_DATABASE_URL = "JOBSTATE_TORTURE_DATABASE_URL"
ENV_PROCESS_NAME = "JOBSTATE_TORTURE_PROCESS"
ENV_LEASE = "JOBSTATE_TORTURE_LEASE_SECONDS"
ENV_STALE_AFTER = "JOBSTATE_TORTURE_STALE_AFTER_SECONDS"
ENV_ATTEMPT_LIMIT = "JOBSTATE_TORTURE_ATTEMPT_LIMIT"
ENV_TASK_ATTEMPTS = "JOBSTATE_TORTURE_TASK_ATTEMPTS"


@dataclass(frozen=True)
class Timing:
    """The short liveness settings that make recovery fast enough to watch.

    ``lease`` is ``WORKER_LEASE``; ``stale_after`` is ``STALE_RUN_AFTER`` (the heartbeat
    interval is a quarter of it, inside the runner's "at least twice" rule);
    ``reap_interval`` is how often the reaper runs every reaping sweep; ``slack`` is
    what a loaded machine adds to the recovery bound (a late reaper pass, a slow
    statement).
    """

    lease: float = 2.0
    stale_after: float = 2.0
    reap_interval: float = 1.0
    slack: float = 2.0
    attempt_limit: int = 5
    task_attempts: int = 5
    """``MAX_ATTEMPTS`` of the task backend."""

    @property
    def heartbeat_interval(self) -> float:
        return self.stale_after / 4

    @property
    def job_bound(self) -> float:
        """Longest time from a worker's death to the recovery of a job it held."""
        return self.lease + self.reap_interval + self.slack

    @property
    def run_bound(self) -> float:
        """Longest time from a worker's death to the reaping of a run it held."""
        return self.stale_after + self.reap_interval + self.slack

    @property
    def pause(self) -> float:
        """How long a paused worker stays stopped: long enough for the reaper to take
        back everything it held, so its late reports meet a fenced-off claim."""
        return max(self.lease, self.stale_after) + 2 * self.reap_interval


@dataclass(frozen=True)
class Mix:
    """What a worker does on each step, as shares of its steps (runs) or of its claimed
    jobs (the rest)."""

    run_share: float = 0.3
    """Steps that run an operations job on one of :data:`OVERLAP_KEYS`."""
    renew_share: float = 0.05
    """Jobs that take 1.5 leases and renew the lease as they go."""
    overrun_share: float = 0.02
    """Jobs that take longer than their lease without renewing: the reaper hands them
    to another worker, and the late report must be refused."""
    error_share: float = 0.04
    """Jobs reported as ``error``."""
    retry_share: float = 0.04
    """Jobs given back to the queue (``status="queued"``) for a retry."""


@dataclass(frozen=True)
class ProcessConfig:
    """What a worker or the reaper needs to know; pickled into each process."""

    database_url: str
    timing: Timing
    mix: Mix


def process_environment(database_url: str, timing: Timing, process_name: str) -> dict[str, str]:
    """The environment variables :mod:`reliability._torture_settings` reads, for a
    process named ``process_name`` (also the name of its database sessions)."""
    return {
        ENV_DATABASE_URL: database_url,
        ENV_PROCESS_NAME: process_name,
        ENV_LEASE: repr(timing.lease),
        ENV_STALE_AFTER: repr(timing.stale_after),
        ENV_ATTEMPT_LIMIT: str(timing.attempt_limit),
        ENV_TASK_ATTEMPTS: str(timing.task_attempts),
        "DJANGO_SETTINGS_MODULE": "reliability._torture_settings",
    }


def setup_django(database_url: str, timing: Timing, process_name: str) -> None:
    """Point :mod:`reliability._torture_settings` at ``database_url`` with ``timing``
    and set Django up, once per process. ``process_name`` names the process's
    connections (PostgreSQL's ``application_name``; on MariaDB each connection notes its
    id under the name), which is how the controller knows when a killed worker's
    sessions are gone."""
    os.environ.update(process_environment(database_url, timing, process_name))
    import django

    django.setup()
