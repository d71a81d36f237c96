"""The task benchmark (``python -m bench tasks``): jobstate's django.tasks backend and
``jobstate_worker`` against django-tasks-db's ``db_worker`` and procrastinate's worker.

- **Drain**: the same no-op tasks, enqueued with each contender's own API (Django's
  ``enqueue`` for the two django.tasks backends, ``defer`` for procrastinate), drained by
  N worker processes started with each contender's own command. The figure is work time:
  from the first task's start to the last task's end, read from each contender's own
  timestamps, so process start-up is not counted.
- **Concurrency**: one ``jobstate_worker --concurrency 8`` and eight 1-second tasks: how
  far apart the eight starts are, and the wall time of the eight.
- **Latency**: an idle worker, and tasks enqueued one at a time (each in its own
  transaction) a little apart: the time from just before ``enqueue`` to the task's start,
  woken by LISTEN/NOTIFY, then with polling only (``LISTEN_NOTIFY = False``, the default
  one-second ``--interval``).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench.pg import ROOT, BenchError, load_average, percentile

#: Tasks enqueued per transaction while loading a drain.
_ENQUEUE_CHUNK = 500

#: The drain's contenders, in the order the table lists them.
DRAIN_CONTENDERS = ("jobstate", "django-tasks-db", "procrastinate")

#: The issue's targets: jobstate's work time against each peer's (speed-up factor).
TARGETS = {"django-tasks-db": 2.5, "procrastinate": 2.0}


@dataclass
class Drain:
    contender: str
    workers: int
    tasks: int
    runs: list[float] = field(default_factory=list)
    """Work time of each repeat, in seconds."""

    @property
    def seconds(self) -> float:
        return statistics.median(self.runs) if self.runs else float("nan")

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds if self.runs else 0.0


# --- processes --------------------------------------------------------------------------


def _command(url: str, *args: str, **env: str) -> subprocess.Popen[str]:
    """``python -m django <args>`` on the benchmark database, with ``bench.settings``."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", *args],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "bench.settings",
            "JOBSTATE_BENCH_DATABASE_URL": url,
            "PYTHONUNBUFFERED": "1",
            **env,
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_all(processes: list[subprocess.Popen[str]], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for process in processes:
        try:
            _out, err = process.communicate(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for other in processes:
                other.kill()
            raise BenchError(f"{what}: not done after {timeout} s") from None
        if process.returncode != 0:
            raise BenchError(f"{what}: a worker exited with {process.returncode}: {err[-2000:]}")


@contextmanager
def _running(process: subprocess.Popen[str]) -> Iterator[subprocess.Popen[str]]:
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


# --- the drain ----------------------------------------------------------------------------


def _truncate(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE jobstate_job, django_tasks_database_dbtaskresult, procrastinate_jobs CASCADE"
        )
        conn.execute("TRUNCATE procrastinate_events")


def _load(contender: str, url: str, tasks: int) -> None:
    from django.db import transaction

    from bench.loading import PAYLOAD_PAD
    from bench.peer_tasks import jobstate_noop, procrastinate_noop, tasks_db_noop

    enqueue: Callable[[int], Any] = {
        "jobstate": lambda n: jobstate_noop.enqueue(n=n, pad=PAYLOAD_PAD),
        "django-tasks-db": lambda n: tasks_db_noop.enqueue(n=n, pad=PAYLOAD_PAD),
        "procrastinate": lambda n: procrastinate_noop.defer(n=n, pad=PAYLOAD_PAD),
    }[contender]
    for start in range(0, tasks, _ENQUEUE_CHUNK):
        with transaction.atomic():
            for n in range(start, min(start + _ENQUEUE_CHUNK, tasks)):
                enqueue(n)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
        conn.execute("CHECKPOINT")


def _worker(contender: str, url: str, index: int, concurrency: int) -> subprocess.Popen[str]:
    if contender == "jobstate":
        return _command(
            url,
            "jobstate_worker",
            "--backend",
            "jobstate",
            "--batch",
            "--concurrency",
            str(concurrency),
            "--worker-id",
            f"bench-{index}",
        )
    if contender == "django-tasks-db":
        return _command(
            url,
            "db_worker",
            "--batch",
            "--no-startup-delay",
            "--interval",
            "0.01",
            "--worker-id",
            f"bench-{index}",
        )
    return _command(
        url,
        "procrastinate",
        "worker",
        "--one-shot",
        "--queues",
        "bench",
        "--no-listen-notify",
        "--name",
        f"bench-{index}",
    )


#: Each contender's first start and last end, on its own timestamps, and its done count.
_WORK_SQL = {
    "jobstate": """
        SELECT min((attempt_log -> 0 ->> 'started_at')::timestamptz), max(updated_at), count(*)
        FROM jobstate_job WHERE target = 'tasks:jobstate' AND status = 'done'
    """,
    "django-tasks-db": """
        SELECT min(started_at), max(finished_at), count(*)
        FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'
    """,
    "procrastinate": """
        SELECT min(e.at) FILTER (WHERE e.type = 'started'),
               max(e.at) FILTER (WHERE e.type = 'succeeded'),
               (SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded')
        FROM procrastinate_events AS e
    """,
}


def drain(
    url: str,
    *,
    contenders: list[str],
    workers: int,
    tasks: int,
    repeats: int,
    concurrency: int,
    log: Callable[[str], None],
) -> list[Drain]:
    results = []
    for contender in contenders:
        result = Drain(contender, workers, tasks)
        for repeat in range(repeats):
            _truncate(url)
            _load(contender, url, tasks)
            processes = [_worker(contender, url, n, concurrency) for n in range(workers)]
            _wait_all(processes, contender, timeout=900)
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(_WORK_SQL[contender]).fetchone()
            assert row is not None
            first, last, done = row
            if done != tasks or first is None or last is None:
                raise BenchError(f"{contender}: {done} of {tasks} tasks done")
            result.runs.append((last - first).total_seconds())
            log(
                f"  {contender}, run {repeat + 1}: {tasks} tasks in "
                f"{result.runs[-1]:.2f} s ({tasks / result.runs[-1]:.0f}/s); "
                f"load {load_average()}"
            )
        results.append(result)
    return results


# --- concurrency and latency ------------------------------------------------------------


def concurrency(url: str, *, log: Callable[[str], None]) -> dict[str, float]:
    """Eight 1-second tasks and one worker with eight threads."""
    from bench.peer_tasks import jobstate_sleep

    _truncate(url)
    ids = [jobstate_sleep.enqueue(1.0).id for _ in range(8)]
    began = time.monotonic()
    worker = _command(
        url, "jobstate_worker", "--backend", "jobstate", "--batch", "--concurrency", "8"
    )
    _wait_all([worker], "concurrency", timeout=120)
    starts = [jobstate_sleep.get_result(result_id).return_value for result_id in ids]
    figures = {
        "start_spread_seconds": max(starts) - min(starts),
        "wall_seconds_with_start_up": time.monotonic() - began,
    }
    log(
        f"  eight 1 s tasks started within {figures['start_spread_seconds'] * 1000:.1f} ms of "
        f"each other (the worker's whole run, start-up included: "
        f"{figures['wall_seconds_with_start_up']:.1f} s)"
    )
    return figures


def latency(
    url: str, *, samples: int, listen: bool, log: Callable[[str], None]
) -> dict[str, float]:
    """Enqueue → start, for ``samples`` tasks enqueued one at a time to an idle worker."""
    from bench.peer_tasks import jobstate_started

    _truncate(url)
    env = {} if listen else {"JOBSTATE_BENCH_LISTEN_NOTIFY": "0"}
    worker = _command(url, "jobstate_worker", "--backend", "jobstate", "--concurrency", "4", **env)
    delays: list[float] = []
    with _running(worker):
        time.sleep(3)  # the worker is up and idle (and listening)
        pending = []
        for _ in range(samples):
            enqueued = time.time()
            pending.append((enqueued, jobstate_started.enqueue().id))
            # Apart enough that each task finds the worker idle again.
            time.sleep(0.05)
        deadline = time.monotonic() + 60
        for enqueued, result_id in pending:
            while True:
                result = jobstate_started.get_result(result_id)
                if result.is_finished:
                    break
                if time.monotonic() > deadline:
                    raise BenchError("latency: tasks did not run within a minute")
                time.sleep(0.05)
            delays.append(result.return_value - enqueued)
    figures = {
        "p50_ms": percentile(delays, 0.5) * 1000,
        "p99_ms": percentile(delays, 0.99) * 1000,
        "max_ms": max(delays) * 1000,
    }
    mode = "LISTEN/NOTIFY" if listen else "polling every 1 s"
    log(
        f"  {mode}: enqueue -> start p50 {figures['p50_ms']:.1f} ms, "
        f"p99 {figures['p99_ms']:.1f} ms, max {figures['max_ms']:.1f} ms ({samples} tasks)"
    )
    return figures


# --- the report -------------------------------------------------------------------------


def table(drains: list[Drain]) -> str:
    lines = [
        "| contender | workers | tasks | work time (median) | tasks/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for result in drains:
        lines.append(
            f"| {result.contender} | {result.workers} | {result.tasks} | "
            f"{result.seconds:.2f} s | {result.rate:.0f} |"
        )
    return "\n".join(lines)


def targets(drains: list[Drain], spread: dict[str, float], notify: dict[str, float]) -> list[str]:
    by_name = {result.contender: result for result in drains}
    lines = []
    ours = by_name.get("jobstate")
    for peer, factor in TARGETS.items():
        if ours is None or peer not in by_name:
            continue
        speedup = by_name[peer].seconds / ours.seconds
        verdict = "met" if speedup >= factor else "MISSED"
        lines.append(f"{verdict}: {speedup:.2f}x as fast as {peer} (target {factor}x)")
    if spread:
        gap = spread["start_spread_seconds"]
        verdict = "met" if gap <= 1.0 else "MISSED"
        lines.append(
            f"{verdict}: eight 1 s tasks started within {gap * 1000:.1f} ms of each other "
            "(target 1 s)"
        )
    if notify:
        ok = notify["p50_ms"] <= 20 and notify["p99_ms"] <= 100
        lines.append(
            f"{'met' if ok else 'MISSED'}: LISTEN/NOTIFY latency p50 {notify['p50_ms']:.1f} ms "
            f"(target 20), p99 {notify['p99_ms']:.1f} ms (target 100)"
        )
    return lines
