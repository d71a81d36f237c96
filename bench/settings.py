"""Django settings of the benchmark processes: jobstate and the two peers it is measured
against (procrastinate's Django integration, django-tasks-db) on one PostgreSQL database;
on MariaDB / MySQL (``--server mysql://...``) jobstate alone, beside the raw floor.

The harness names the database in ``JOBSTATE_BENCH_DATABASE_URL`` before it starts any
process. Connections are persistent (``CONN_MAX_AGE = None``) for every contender, so no
one pays for reconnecting: django-tasks-db's worker closes "old" connections twice per
task, which with Django's default ``CONN_MAX_AGE = 0`` would reconnect every time.
"""

from __future__ import annotations

import os
from datetime import timedelta

import environ

_database = environ.Env.db_url_config(
    os.environ.get(
        "JOBSTATE_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/jobstate_bench"
    )
)

_threshold = os.environ.get("JOBSTATE_BENCH_PREPARE_THRESHOLD", "5")
_prepare_threshold = None if _threshold == "off" else int(_threshold)
_hot_prepare = os.environ.get("JOBSTATE_BENCH_PREPARED_STATEMENTS", "on") != "off"

SECRET_KEY = "benchmark-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "jobstate",
    "procrastinate.contrib.django",
    "django_tasks_db",
]

_postgres = _database["ENGINE"] == "django.db.backends.postgresql"

DATABASES = {
    "default": {
        **_database,
        "CONN_MAX_AGE": None,
        # psycopg's own default (raw psycopg uses it): a statement run 5 times on a
        # connection is prepared. Django turns this off unless asked. The drain's workers
        # set JOBSTATE_BENCH_PREPARE_THRESHOLD per cell (bench/variants.py); "off" is
        # Django's default. mysqlclient prepares nothing: Django's defaults there.
        "OPTIONS": {"prepare_threshold": _prepare_threshold} if _postgres else {},
    }
}

# django-tasks-db is the default backend (its db_worker runs "default"); jobstate's task
# backend runs beside it as "jobstate" (python -m bench tasks).
# JOBSTATE_BENCH_LEASE (seconds): the PgBouncer benchmark's shorter lease, so a claim
# whose reply a killed pooler cut off comes back within the run, with attempts to spare.
_lease = os.environ.get("JOBSTATE_BENCH_LEASE")
_jobstate_options = {"LEASE": timedelta(seconds=float(_lease)), "MAX_ATTEMPTS": 3} if _lease else {}
TASKS = {
    "default": {"BACKEND": "django_tasks_db.DatabaseBackend"},
    "jobstate": {"BACKEND": "jobstate.tasks.JobStateBackend", "OPTIONS": _jobstate_options},
}
if not _postgres:
    # procrastinate's schema is PostgreSQL's; the peers are measured there only.
    INSTALLED_APPS = ["django.contrib.auth", "django.contrib.contenttypes", "jobstate"]
    TASKS = {"default": TASKS["jobstate"]}

# JOBSTATE_BENCH_LISTEN_NOTIFY=0 makes jobstate's task workers poll (the latency
# benchmark's second figure).
JOBSTATE = {"LISTEN_NOTIFY": os.environ.get("JOBSTATE_BENCH_LISTEN_NOTIFY", "1") != "0"}
# JOBSTATE_BENCH_PREPARED_STATEMENTS=off: what a host behind PgBouncer in transaction
# mode before 1.21 sets, so jobstate prepares nothing either.
if not _hot_prepare:
    JOBSTATE["PREPARED_STATEMENTS"] = False
# JOBSTATE_BENCH_POOLER=transaction: a host behind PgBouncer in transaction mode, with the
# settings the system checks ask for there (python -m bench pgbouncer).
# JOBSTATE_BENCH_POOLER=transaction-prepared: the same behind PgBouncer 1.22 or newer with
# max_prepared_statements above 0, where jobstate keeps its prepared statements and the
# host silences the check that asks otherwise (docs/databases.md).
_pooler = os.environ.get("JOBSTATE_BENCH_POOLER")
if _pooler in ("transaction", "transaction-prepared"):
    JOBSTATE.update(
        CONNECTION_POOLER="transaction",
        PREPARED_STATEMENTS=_pooler == "transaction-prepared",
        LISTEN_NOTIFY=False,
    )
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
    DATABASES["default"]["OPTIONS"] = {}
    if _pooler == "transaction-prepared":
        SILENCED_SYSTEM_CHECKS = ["jobstate.W050"]

# The peers' tasks live in bench.peer_tasks; procrastinate's worker imports them from
# there (and finds no tasks module of its own to autodiscover).
PROCRASTINATE_AUTODISCOVER_MODULE_NAME = "bench_tasks_not_autodiscovered"
PROCRASTINATE_IMPORT_PATHS = ["bench.peer_tasks"]

# JOBSTATE_BENCH_WORKER_LOG=1: the worker's warnings (the database failures it rides out,
# a claim it lost) on stderr, where the PgBouncer benchmark reads them; its INFO line per
# task would cost the drain it measures.
_worker_log = os.environ.get("JOBSTATE_BENCH_WORKER_LOG") == "1"
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {
        "null": {"class": "logging.NullHandler"},
        "stderr": {"class": "logging.StreamHandler"},
    },
    "root": {"handlers": ["null"], "level": "WARNING"},
    "loggers": (
        {"jobstate.worker": {"handlers": ["stderr"], "level": "WARNING", "propagate": False}}
        if _worker_log
        else {}
    ),
}
