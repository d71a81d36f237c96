"""Settings of the task workers the tests start as processes: the project's settings
with the ``TASKS`` options a test gives in ``JOBSTATE_TEST_TASK_OPTIONS`` (JSON; durations
in seconds), so a worker and its test agree on them."""

import json
import os
from datetime import timedelta

from project.settings import *  # noqa: F403
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
