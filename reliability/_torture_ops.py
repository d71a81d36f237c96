"""The operations jobs the torture workers run: one body registered under each of the
few shared overlap keys, so runs of one key keep colliding (a SKIPPED run each time)
and a killed worker's run holds its key until the reaper times it out."""

from __future__ import annotations

import random
from datetime import timedelta

from jobstate.runner import RunContext, operations_job
from reliability._torture_config import OVERLAP_KEYS


def hold_the_key(ctx: RunContext, input: None) -> dict[str, object]:
    """Hold an overlap key for a moment, as a short maintenance job would."""
    seconds = random.uniform(0.1, 0.6)
    # Waiting on ``cancelled`` rather than sleeping: a run whose claim was lost stops
    # at once instead of working on without its key.
    cancelled = ctx.cancelled.wait(seconds)
    return {"ok": True, "held_seconds": round(seconds, 3), "cancelled": cancelled}


for _key in OVERLAP_KEYS:
    operations_job(_key, overlap="forbid", timeout=timedelta(seconds=30))(hold_the_key)
