"""Python work per job on the hot paths, counted rather than timed.

A drain's jobs/s moves with whatever else the machine runs; the number of Python
function calls one process makes to claim and complete a job does not. This counts them
(``cProfile``'s total) for the one-job path (``claim_next_inhub_job`` then
``complete_claimed_job``), the batch path (``claim_next_inhub_jobs`` then
``complete_claimed_jobs``) and the seed's outbox path (``claim_next_inhub_job`` then
``complete_job_with_notifications`` with 0 and with 2 notifications), one process, one
connection, and prints calls and CPU microseconds per job. Run it at two revisions to
compare what a change costs in Python::

    python -m bench calls --jobs 5000

The worker's rows (a real task worker draining no-op tasks) are :mod:`bench.worker_calls`'.
"""

from __future__ import annotations

import cProfile
import functools
import pstats
import time
from collections.abc import Callable, Sequence
from typing import Any


def _seed(jobs: int, target: str) -> None:
    from jobstate.models import Job

    Job.objects.bulk_create(
        [Job(request_id=f"calls-{target}-{n}", target=target, input={"n": n}) for n in range(jobs)],
        batch_size=5000,
    )


def _one_job(store: Any, target: str) -> int:
    done = 0
    while (job := store.claim_next_inhub_job([target], "calls")) is not None:
        store.complete_claimed_job(job.id, job.claim_token, "done")
        done += 1
    return done


def _batch(store: Any, target: str, batch: int) -> int:
    from jobstate.stores.base import ClaimReport

    done = 0
    while jobs := store.claim_next_inhub_jobs([target], "calls", limit=batch):
        store.complete_claimed_jobs([ClaimReport(j.id, j.claim_token, "done") for j in jobs])
        done += len(jobs)
    return done


def _seed_path(store: Any, target: str, notifications: int) -> int:
    from jobstate.stores.base import NotificationRequest

    done = 0
    while (job := store.claim_next_inhub_job([target], "calls")) is not None:
        requests = [
            NotificationRequest("webhook", "https://hooks.example.com/jobs", {"job": done}),
            NotificationRequest("email", "ops@example.com", {"subject": "done", "body": "ok"}),
        ][:notifications]
        store.complete_job_with_notifications(
            job, {"status": "done", "result": {"n": done, "ok": True}}, requests
        )
        done += 1
    return done


def _measure(drain: Callable[[], int]) -> dict[str, float]:
    profile = cProfile.Profile()
    cpu = time.process_time()
    profile.enable()
    done = drain()
    profile.disable()
    cpu = time.process_time() - cpu
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return {"jobs": done, "calls_per_job": calls / done, "cpu_us_per_job": cpu / done * 1e6}


#: The store's paths this module counts (:mod:`bench.worker_calls` counts the worker's).
PATHS = ("one-job", "batch", "seed", "seed-2")


def run(
    *, jobs: int, batch: int, paths: Sequence[str] = PATHS, log: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    """Seed ``jobs`` jobs per path of ``paths``, drain them in this process, return the
    counts."""
    from jobstate.stores.database import DatabaseStateStore

    store = DatabaseStateStore()
    results: dict[str, dict[str, float]] = {}
    drains: dict[str, Callable[[str], int]] = {
        "one-job": lambda target: _one_job(store, target),
        "batch": lambda target: _batch(store, target, batch),
        "seed": lambda target: _seed_path(store, target, 0),
        "seed-2": lambda target: _seed_path(store, target, 2),
    }
    for path, drain in drains.items():
        if path not in paths:
            continue
        target = f"calls-{path}"
        _seed(jobs, target)
        results[path] = _measure(functools.partial(drain, target))
        row = results[path]
        log(
            f"{path:>8}: {row['calls_per_job']:.1f} Python calls per job, "
            f"{row['cpu_us_per_job']:.0f} us CPU per job under the profiler "
            f"({int(row['jobs'])} jobs)"
        )
    return results
