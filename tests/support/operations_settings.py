"""Settings of the command processes the operator-message tests start: the project's,
with the ``JOBSTATE["OPERATIONS_JOB_MODULES"]`` a test gives in
``JOBSTATE_TEST_OPERATIONS_MODULES`` (JSON)."""

import json
import os

from tests.support.worker_settings import *  # noqa: F403
from tests.support.worker_settings import JOBSTATE as WORKER_JOBSTATE

JOBSTATE = {
    **WORKER_JOBSTATE,
    "OPERATIONS_JOB_MODULES": json.loads(os.environ.get("JOBSTATE_TEST_OPERATIONS_MODULES", "[]")),
}
