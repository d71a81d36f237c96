"""Django settings of the torture run's processes (controller, reaper, workers).

Everything run-specific comes from the environment, set by
:func:`reliability._torture_config.setup_django`: the database, the process name (the
PostgreSQL ``application_name``; on MariaDB noted with each connection's id), the worker
lease and the stale-run threshold. The liveness settings are seconds, not minutes, so
that a killed worker's work comes back within a few seconds.
"""

from __future__ import annotations

import os
from datetime import timedelta

import environ

from reliability._base_settings import *  # noqa: F403
from reliability._torture_config import (
    DEFAULT_DATABASE,
    DEFAULT_SERVER,
    ENV_ATTEMPT_LIMIT,
    ENV_DATABASE_URL,
    ENV_LEASE,
    ENV_PROCESS_NAME,
    ENV_STALE_AFTER,
    ENV_TASK_ATTEMPTS,
)
from reliability._torture_sql import dialect_of

_database = environ.Env.db_url_config(
    os.environ.get(ENV_DATABASE_URL, DEFAULT_SERVER + DEFAULT_DATABASE)
)
_stale_after = timedelta(seconds=float(os.environ.get(ENV_STALE_AFTER, "2")))

_url = os.environ.get(ENV_DATABASE_URL, DEFAULT_SERVER + DEFAULT_DATABASE)

DATABASES = {
    "default": {
        **_database,
        "CONN_MAX_AGE": None,
        # How the controller tells when a killed process's sessions are gone: their
        # application_name on PostgreSQL, their noted connection ids on MariaDB.
        "OPTIONS": dialect_of(_url).session_options(os.environ.get(ENV_PROCESS_NAME, "torture")),
    }
}

JOBSTATE = {
    "OPERATIONS_JOB_MODULES": ["reliability._torture_ops"],
    "WORKER_LEASE": timedelta(seconds=float(os.environ.get(ENV_LEASE, "2"))),
    "STALE_RUN_AFTER": _stale_after,
    "HEARTBEAT_INTERVAL": _stale_after / 4,
    "DEFAULT_JOB_TIMEOUT": timedelta(minutes=1),
    "WORKER_ATTEMPT_LIMIT": int(os.environ.get(ENV_ATTEMPT_LIMIT, "5")),
    # A long run keeps jobs queued for a long time; they must not expire mid-run.
    "QUEUED_TTL": timedelta(days=7),
}

# The task workers' backend: the worker lease as the task lease, retries at once (a
# lost attempt is retried right away anyway), enough attempts that a task survives a
# few kills of the workers running it.
TASKS = {
    "default": {
        "BACKEND": "jobstate.tasks.JobStateBackend",
        "QUEUES": ["default"],
        "OPTIONS": {
            "MAX_ATTEMPTS": int(os.environ.get(ENV_TASK_ATTEMPTS, "5")),
            "RETRY_BACKOFF": timedelta(0),
            "LEASE": timedelta(seconds=float(os.environ.get(ENV_LEASE, "2"))),
        },
    }
}

# Skipped runs and lost claims are the point of the exercise, and jobstate logs each one
# as a warning; only errors reach the terminal.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "ERROR"},
}
