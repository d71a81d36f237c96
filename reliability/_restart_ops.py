"""The operations job the restart run's runner runs over and over, and the handler the
relay delivers every notification to. Imported once Django is set up: through
``JOBSTATE['OPERATIONS_JOB_MODULES']`` and through the notification's destination."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from typing import Any

from jobstate.models import Notification
from jobstate.outbox.channels import notification_handler
from jobstate.runner import RunContext, operations_job
from reliability._restart_common import ENV_DELIVERIES, RUN_KEY, RUN_SECONDS

#: Heartbeats one run's body writes while it works.
STEPS = 10


@operations_job(RUN_KEY, overlap="allow", timeout=timedelta(minutes=1))
def beating(ctx: RunContext, input: None) -> dict[str, Any]:
    """Work for :data:`RUN_SECONDS`, reporting progress with a heartbeat after each
    step; a heartbeat that fails is the runner's to tolerate."""
    for step in range(STEPS):
        if ctx.cancelled.wait(RUN_SECONDS / STEPS):
            return {"ok": False, "cancelled_at": step}
        ctx.heartbeat({"step": step})
    return {"ok": True, "steps": STEPS}


@notification_handler
def record_delivery(notification: Notification) -> None:
    """The receiver: one line per delivery, appended to the file the harness reads."""
    line = json.dumps(
        {
            "t": time.time(),
            "key": notification.idempotency_key,
            "id": str(notification.id),
            "attempt": notification.attempts,
        }
    )
    with open(os.environ[ENV_DELIVERIES], "a") as deliveries:
        deliveries.write(line + "\n")
