"""The task the torture run's task workers run (imported by its dotted path)."""

from __future__ import annotations

import os
import time
from typing import Any

from django.db import connection

from jobstate.tasks.compat import TaskContext, task
from reliability._torture_sql import dialect_of_django


@task(takes_context=True)
def double(context: TaskContext[Any, Any], n: int, work_ms: int) -> int:
    """Works for ``work_ms`` milliseconds, notes in ``torture_task_run`` that this
    attempt ran to its end, and returns ``2 * n``. A worker killed after the note but
    before its report leaves a note whose attempt the job never records as successful:
    that is the at-least-once delivery the run measures, not a violation."""
    time.sleep(work_ms / 1000)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO torture_task_run (result_id, attempt, worker_pid) VALUES (%s, %s, %s)",
            [dialect_of_django().uuid_value(context.task_result.id), context.attempt, os.getpid()],
        )
    return 2 * n
