"""Demo operations jobs.

Found by :meth:`jobstate.runner.Registry.autodiscover`, which imports the ``operations``
module of every installed app. Try them with::

    python manage.py run_operations_job --list
    python manage.py run_operations_job demo.nightly-close --input '{"seconds": 2}'
    python manage.py run_operations_job demo.report-build --input '{"rows": 1000}' --json
    python manage.py run_operations_job demo.always-fails
"""

from __future__ import annotations

import hashlib
import time
from datetime import timedelta
from typing import Any

from jobstate.runner import RunContext, operations_job

#: How often the nightly close reports progress while it waits.
_PROGRESS_EVERY_SECONDS = 0.5


class NightlyCloseInput:
    """``{"seconds": <number between 0 and 3600>}``; ``seconds`` defaults to 0."""

    @staticmethod
    def parse(value: Any) -> float:
        if not isinstance(value, dict):
            raise ValueError(f"expected an object like {{'seconds': 2}}, got {value!r}")
        unknown = set(value) - {"seconds"}
        if unknown:
            raise ValueError(f"unknown field(s): {', '.join(sorted(unknown))}")
        seconds = value.get("seconds", 0)
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError(f"seconds must be a number, got {seconds!r}")
        if not 0 <= seconds <= 3600:
            raise ValueError(f"seconds must be between 0 and 3600, got {seconds!r}")
        return float(seconds)


@operations_job(
    "demo.nightly-close",
    overlap="forbid",
    timeout=timedelta(minutes=5),
    input_schema=NightlyCloseInput,
)
def nightly_close(ctx: RunContext, seconds: float) -> dict[str, Any]:
    """Close the demo business day (one run at a time; takes {"seconds": n} to wait)."""
    start = time.monotonic()
    while (left := seconds - (time.monotonic() - start)) > 0:
        # Waiting on the event instead of sleeping ends the body as soon as the runner
        # gives the run up (deadline, lost claim).
        if ctx.cancelled.wait(min(left, _PROGRESS_EVERY_SECONDS)):
            waited = round(time.monotonic() - start, 3)
            return {"ok": False, "closed": False, "waited_seconds": waited}
        ctx.heartbeat({"waited_seconds": round(min(time.monotonic() - start, seconds), 3)})
    ctx.logger.info("demo business day closed")
    return {"ok": True, "closed": True, "waited_seconds": seconds}


def report_rows(value: Any) -> int:
    """``{"rows": <int between 1 and 1000000>}``; ``rows`` defaults to 100."""
    if not isinstance(value, dict) or set(value) - {"rows"}:
        raise ValueError(f"expected an object like {{'rows': 100}}, got {value!r}")
    rows = value.get("rows", 100)
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= 1_000_000:
        raise ValueError(f"rows must be an integer between 1 and 1000000, got {rows!r}")
    return rows


@operations_job("demo.report-build", overlap="allow", input_schema=report_rows)
def report_build(ctx: RunContext, rows: int) -> dict[str, Any]:
    """Build a demo report; several builds may run at once."""
    digest = hashlib.sha256()
    for row in range(rows):
        digest.update(row.to_bytes(4, "big"))
    return {"rows": rows, "checksum": digest.hexdigest()[:16]}


@operations_job("demo.always-fails")
def always_fails(ctx: RunContext, input: None) -> None:
    """Fail on purpose, to show how a failed run is recorded."""
    raise RuntimeError("demo.always-fails failed on purpose")
