"""Django settings of the restart run's processes (the harness and every component).

The database URL, the process name (PostgreSQL's ``application_name``) and the file the
notification handler appends to come from the environment the harness sets. The
liveness settings are seconds, not minutes, so that work a restart orphaned (a claim
committed just before the connection died, a relay's unsettled rows) comes back within
the run.
"""

from __future__ import annotations

import os
from datetime import timedelta

import environ

from reliability._base_settings import *  # noqa: F403
from reliability._restart_common import (
    ENV_DATABASE_URL,
    ENV_PROCESS_NAME,
    HEARTBEAT_INTERVAL,
    LEASE,
    STALE_RUN_AFTER,
)

_database = environ.Env.db_url_config(
    os.environ.get(ENV_DATABASE_URL, "postgres://postgres@127.0.0.1:5432/restart")
)

DATABASES = {
    "default": {
        **_database,
        # Long-lived processes keep their connection; a restart kills it under them.
        "CONN_MAX_AGE": None,
        # Connecting to a server that is restarting must fail fast, not hang.
        "OPTIONS": {
            "application_name": os.environ.get(ENV_PROCESS_NAME, "restart"),
            "connect_timeout": 5,
        },
    }
}

JOBSTATE = {
    "OPERATIONS_JOB_MODULES": ["reliability._restart_ops"],
    "WORKER_LEASE": LEASE,
    # A job a restart orphaned may be recovered several times in a long run; it must
    # come back to the queue each time, not end in error.
    "WORKER_ATTEMPT_LIMIT": 100,
    "OUTBOX_LEASE": LEASE,
    "OUTBOX_BATCH_SIZE": 20,
    "OUTBOX_MAX_ATTEMPTS": 100,
    "OUTBOX_BACKOFF_BASE": timedelta(seconds=1),
    "OUTBOX_BACKOFF_MAX": timedelta(seconds=2),
    "HEARTBEAT_INTERVAL": HEARTBEAT_INTERVAL,
    "STALE_RUN_AFTER": STALE_RUN_AFTER,
    "DEFAULT_JOB_TIMEOUT": timedelta(minutes=1),
    "QUEUED_TTL": timedelta(days=7),
    "CHANNELS": {"callable": "jobstate.outbox.channels.CallableChannel"},
}

# Every failed store call during a restart is logged as a warning by design; the
# components' own event files say what happened, so only errors reach their stderr.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["stderr"], "level": "ERROR"},
}
