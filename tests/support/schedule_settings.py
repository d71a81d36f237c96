"""Settings of the processes the schedule tests start (workers, commands, racing
callers): the task workers' settings with the ``JOBSTATE["SCHEDULES"]`` a test gives in
``JOBSTATE_TEST_SCHEDULES`` (JSON)."""

import json
import os

from tests.support.worker_settings import *  # noqa: F403
from tests.support.worker_settings import JOBSTATE as WORKER_JOBSTATE

JOBSTATE = {
    **WORKER_JOBSTATE,
    "SCHEDULES": json.loads(os.environ.get("JOBSTATE_TEST_SCHEDULES", "{}")),
}
