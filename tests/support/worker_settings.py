"""Settings of the task workers the tests start as processes: the project's settings
with the ``TASKS`` options a test gives in ``JOBSTATE_TEST_TASK_OPTIONS`` (JSON; durations
in seconds), so a worker and its test agree on them, ``JOBSTATE['MAX_PAYLOAD_BYTES']``
from ``JOBSTATE_TEST_MAX_PAYLOAD_BYTES`` when a test lowers it, the settings of a worker
behind a pooler in transaction mode with ``JOBSTATE_TEST_POOLER=transaction``,
Django's log of the tasks tagged (see :class:`TaggedFormatter`), and with
``JOBSTATE_TEST_LOG_INSTANTS=1`` the worker's log lines led by the instant each was
logged (seconds since the epoch, to the microsecond), for a test that orders them
against the database's timestamps; and the module ``JOBSTATE_TEST_IMPORT_AT_START``
names imported with the settings, as a project's own modules are at start-up (each
import that fails appends the exception's name to the file ``JOBSTATE_TEST_IMPORT_FAILURES``
names, so a test waits for the failure rather than for a guessed time)."""

import importlib
import json
import logging
import os
from datetime import timedelta

from project.settings import *  # noqa: F403
from project.settings import JOBSTATE as PROJECT_JOBSTATE
from project.settings import LOGGING as PROJECT_LOGGING
from project.settings import TASKS as PROJECT_TASKS

_DURATIONS = ("RETRY_BACKOFF", "LEASE", "TIMEOUT", "UNKNOWN_TASK_TIMEOUT")


def _options(text: str) -> dict[str, object]:
    given = json.loads(text)
    return {
        name: timedelta(seconds=value) if name in _DURATIONS and value is not None else value
        for name, value in given.items()
    }


# Workers run as in production: without --reload (on by default when DEBUG), unless a
# test asks for it.
DEBUG = False

TASKS = {
    "default": {
        **PROJECT_TASKS["default"],
        "OPTIONS": _options(os.environ.get("JOBSTATE_TEST_TASK_OPTIONS", "{}")),
    }
}

JOBSTATE = dict(PROJECT_JOBSTATE)
if "JOBSTATE_TEST_MAX_PAYLOAD_BYTES" in os.environ:
    JOBSTATE["MAX_PAYLOAD_BYTES"] = int(os.environ["JOBSTATE_TEST_MAX_PAYLOAD_BYTES"])

# Behind a pooler in transaction mode, the settings the system checks ask for there.
if os.environ.get("JOBSTATE_TEST_POOLER") == "transaction":
    JOBSTATE.update(CONNECTION_POOLER="transaction", PREPARED_STATEMENTS=False, LISTEN_NOTIFY=False)
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True  # noqa: F405


class TaggedFormatter(logging.Formatter):
    """Prefixes every line of a record, its traceback too, with the logger's name, so a
    test tells Django's log of a failed task (which carries the task's traceback) from
    a traceback of the worker itself."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(f"{record.name}| {line}" for line in super().format(record).splitlines())


# Django's log of each task that ended (django.tasks on Django 6, the backport's
# django_tasks on 5.2), tagged; WARNING and up, as Python prints it with no handler.
_TASK_LOG = {"handlers": ["tasks"], "level": "WARNING", "propagate": False}
LOGGING = {
    **PROJECT_LOGGING,
    "formatters": {"tagged": {"()": TaggedFormatter}},
    "handlers": {
        **PROJECT_LOGGING["handlers"],
        "tasks": {"class": "logging.StreamHandler", "formatter": "tagged"},
    },
    "loggers": {**PROJECT_LOGGING["loggers"], "django.tasks": _TASK_LOG, "django_tasks": _TASK_LOG},
}

if os.environ.get("JOBSTATE_TEST_LOG_INSTANTS") == "1":
    LOGGING["formatters"]["instants"] = {"format": "%(created).6f %(message)s"}
    LOGGING["handlers"]["instants"] = {"class": "logging.StreamHandler", "formatter": "instants"}
    LOGGING["loggers"]["jobstate.worker"] = {
        "handlers": ["instants"],
        "level": "INFO",
        "propagate": False,
    }

if "JOBSTATE_TEST_IMPORT_AT_START" in os.environ:
    try:
        importlib.import_module(os.environ["JOBSTATE_TEST_IMPORT_AT_START"])
    except Exception as failure:
        if "JOBSTATE_TEST_IMPORT_FAILURES" in os.environ:
            with open(os.environ["JOBSTATE_TEST_IMPORT_FAILURES"], "a") as failures:
                failures.write(f"{type(failure).__name__}\n")
        raise
