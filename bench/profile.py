"""Where the time of one job goes: one worker on the seed's completion path, alone.

One process drains ``--jobs`` jobs one at a time with ``claim_next_inhub_job`` and
``complete_job_with_notifications`` (``--notifications`` per job), on one connection,
under one of the drain's settings (:mod:`bench.variants`), and splits each job's wall
time into the worker's CPU (its own process), its backend's CPU (read from ``/proc``
before and after) and the rest: waiting for the network round trips and for the CPU
other processes hold. ``--cprofile N`` also runs the worker under ``cProfile`` (a
second, separate drain, since the profiler slows the worker) and prints the N functions
with the most time of their own.

The worker and its backend share the machine with whatever else runs, so the load
average is printed beside the figures.
"""

from __future__ import annotations

import cProfile
import io
import os
import pstats
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.contenders import CONTENDERS
from bench.pg import BenchError, StatementCounter, load_average
from bench.variants import SETTINGS


def _backend_cpu(pid: int) -> float:
    """User plus system CPU seconds of the backend process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _drain(
    url: str, jobs: int, contender: str, wrap: Callable[[Callable[[], int]], int]
) -> dict[str, float]:
    from django.db import connection

    spec = CONTENDERS[contender]
    spec.load(url, jobs, 1)
    drain = spec.prepare(url, 0, 1)
    connection.ensure_connection()
    pid = connection.connection.info.backend_pid
    statements = StatementCounter.count
    server = _backend_cpu(pid)
    cpu = time.process_time()
    wall = time.perf_counter()
    done = wrap(lambda: drain(lambda _: None))
    wall = time.perf_counter() - wall
    cpu = time.process_time() - cpu
    server = _backend_cpu(pid) - server
    if done != jobs:
        raise BenchError(f"{contender}: {done} of {jobs} jobs done")
    return {
        "jobs": done,
        "wall_us": wall / done * 1e6,
        "worker_cpu_us": cpu / done * 1e6,
        "server_cpu_us": server / done * 1e6,
        "statements": (StatementCounter.count - statements) / done,
    }


def run(
    url: str,
    *,
    jobs: int,
    notifications: int,
    setting: str,
    cprofile: int,
    log: Any = print,
) -> dict[str, Any]:
    """Measure (and optionally profile) one worker; Django must not be set up yet."""
    from bench.pg import setup_django

    contender = {0: "jobstate-seed", 2: "jobstate-seed-2"}.get(notifications)
    if contender is None:
        raise BenchError("--notifications takes 0 or 2 (the drain's seed contenders)")
    os.environ.update(SETTINGS[setting].env)
    setup_django(url)
    StatementCounter.install()
    log(f"profile: {contender}, {setting}, {jobs} jobs; load average {load_average()}")
    # A short warm-up drain: imports, the connection, the statements' preparation.
    _drain(url, 50, contender, lambda body: body())
    figures = _drain(url, jobs, contender, lambda body: body())
    rest = figures["wall_us"] - figures["worker_cpu_us"] - figures["server_cpu_us"]
    log(
        f"  per job: wall {figures['wall_us']:.0f} µs = worker CPU "
        f"{figures['worker_cpu_us']:.0f} + backend CPU {figures['server_cpu_us']:.0f} + "
        f"other {rest:.0f} (round trips, waiting); {figures['statements']:.2f} "
        f"statements/job; load average {load_average()}"
    )
    result: dict[str, Any] = {"setting": setting, "contender": contender, **figures}
    if cprofile:
        # CPU time, not wall time: the waits for the server would drown everything else.
        profiler = cProfile.Profile(time.process_time)

        def profiled(body: Callable[[], int]) -> int:
            profiler.enable()
            try:
                return body()
            finally:
                profiler.disable()

        _drain(url, jobs, contender, profiled)
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats("tottime").print_stats(cprofile)
        result["cprofile"] = out.getvalue()
        log(result["cprofile"])
    return result
