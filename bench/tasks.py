"""The task benchmark (``python -m bench tasks``): jobstate's django.tasks backend and
``jobstate_worker`` against django-tasks-db's ``db_worker`` and procrastinate's worker.

- **Drain**: the same no-op tasks, enqueued with each contender's own API (Django's
  ``enqueue`` for the two django.tasks backends, ``defer`` for procrastinate), drained by
  N worker processes started with each contender's own command: ``jobstate_worker`` once
  per ``--concurrency`` (threads per process; 1 and 4 by default), ``db_worker --batch
  --interval 0`` and ``procrastinate worker`` with one each. ``jobstate-policy`` is
  ``jobstate`` again, on the same no-op task declared with a policy (``max_attempts``,
  ``timeout``, ``retry_on``), which the worker reads from each claimed job, at the same
  thread counts. The figure is work time: from
  the first task's start to the last task's end, read from each contender's own
  timestamps, so process start-up is not counted. Every contender keeps its connections
  (``CONN_MAX_AGE = None``; procrastinate's worker its own pool), and the connections each
  drain opened are counted on the server. The contenders take turns: each round drains
  once per contender, the order turning by one every round, so a change in the machine's
  load falls on all of them alike.
- **Start-up**: one task, and one ``jobstate_worker --batch`` or ``db_worker --batch``
  started for it: from just before the process is started to the task's start on its
  own timestamp, the two taking turns.
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

#: The drain's contenders ``--contenders`` chooses from, in the order the table lists them.
DRAIN_CONTENDERS = ("jobstate", "django-tasks-db", "procrastinate")

#: ``jobstate`` on the no-op task with a policy (the ``policy`` part of the command).
POLICY = "jobstate-policy"

#: The contenders run by ``jobstate_worker``, once per ``--concurrency``.
_JOBSTATE = ("jobstate", POLICY)

#: Every contender of the drain, in the order the table lists them.
_ORDER = ("jobstate", POLICY, "django-tasks-db", "procrastinate")

#: What each contender's worker process is called in the tables.
_COMMANDS = {
    "jobstate": "jobstate_worker",
    POLICY: "jobstate_worker",
    "django-tasks-db": "db_worker",
    "procrastinate": "procrastinate worker",
}


@dataclass(frozen=True)
class Entry:
    """One contender of the drain: its worker command, how many processes, and how many
    tasks each process runs at once."""

    contender: str
    processes: int
    threads: int

    @property
    def label(self) -> str:
        command = _COMMANDS[self.contender]
        if self.contender in _JOBSTATE:
            command += f" --concurrency {self.threads}"
        thread = "thread" if self.threads == 1 else "threads"
        label = f"`{command}` ({self.processes} processes x {self.threads} {thread})"
        return f"{label}, a task with a policy" if self.contender == POLICY else label


def lineup(contenders: list[str], *, workers: int, concurrencies: list[int]) -> list[Entry]:
    """The drain's entries, in the table's order whatever order ``contenders`` has:
    jobstate (with and without a policy) once per thread count, each peer once (their
    workers run one task at a time)."""
    entries = []
    for contender in sorted(set(contenders), key=_ORDER.index):
        counts = concurrencies if contender in _JOBSTATE else [1]
        entries.extend(Entry(contender, workers, threads) for threads in counts)
    return entries


@dataclass
class Drain:
    contender: str
    workers: int
    threads: int
    tasks: int
    runs: list[float] = field(default_factory=list)
    """Work time of each round, in seconds."""
    connections: list[int] = field(default_factory=list)
    """Connections the worker processes opened in each round."""

    @property
    def entry(self) -> Entry:
        return Entry(self.contender, self.workers, self.threads)

    @property
    def seconds(self) -> float:
        return statistics.median(self.runs) if self.runs else float("nan")

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds if self.runs else 0.0

    @property
    def rates(self) -> list[float]:
        return [self.tasks / seconds for seconds in self.runs]


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


def _load(contender: str, url: str, tasks: int, *, settle: bool = True) -> None:
    from django.db import transaction

    from bench.loading import PAYLOAD_PAD
    from bench.peer_tasks import (
        jobstate_noop,
        jobstate_policy_noop,
        procrastinate_noop,
        tasks_db_noop,
    )

    enqueue: Callable[[int], Any] = {
        "jobstate": lambda n: jobstate_noop.enqueue(n=n, pad=PAYLOAD_PAD),
        POLICY: lambda n: jobstate_policy_noop.enqueue(n=n, pad=PAYLOAD_PAD),
        "django-tasks-db": lambda n: tasks_db_noop.enqueue(n=n, pad=PAYLOAD_PAD),
        "procrastinate": lambda n: procrastinate_noop.defer(n=n, pad=PAYLOAD_PAD),
    }[contender]
    for start in range(0, tasks, _ENQUEUE_CHUNK):
        with transaction.atomic():
            for n in range(start, min(start + _ENQUEUE_CHUNK, tasks)):
                enqueue(n)
    if settle:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("VACUUM (ANALYZE)")
            conn.execute("CHECKPOINT")


def _worker(contender: str, url: str, index: int, concurrency: int) -> subprocess.Popen[str]:
    if contender in _JOBSTATE:
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
            "0",
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
WORK_SQL = {
    "jobstate": """
        SELECT min((attempt_log -> 0 ->> 'started_at')::timestamptz), max(updated_at), count(*)
        FROM jobstate_job WHERE target = 'tasks:jobstate' AND status = 'done'
    """,
    # The same, counting only the jobs that carry their policy.
    POLICY: """
        SELECT min((attempt_log -> 0 ->> 'started_at')::timestamptz), max(updated_at), count(*)
        FROM jobstate_job
        WHERE target = 'tasks:jobstate' AND status = 'done' AND policy IS NOT NULL
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


def _sessions(conn: psycopg.Connection[Any]) -> int:
    """Connections ever opened to the current database (PostgreSQL 14+ counts them)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute(
        "SELECT sessions FROM pg_stat_database WHERE datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def _drain_once(url: str, entry: Entry, tasks: int) -> tuple[float, int]:
    """One drain of ``tasks`` by ``entry``: its work time, and the connections its worker
    processes opened."""
    _truncate(url)
    _load(entry.contender, url, tasks)
    with psycopg.connect(url, autocommit=True) as conn:
        before = _sessions(conn)
        processes = [
            _worker(entry.contender, url, n, entry.threads) for n in range(entry.processes)
        ]
        _wait_all(processes, entry.contender, timeout=900)
        # A backend counts its session in the statistics it sends as it exits.
        time.sleep(0.5)
        opened = _sessions(conn) - before
        row = conn.execute(WORK_SQL[entry.contender]).fetchone()
    assert row is not None
    first, last, done = row
    if done != tasks or first is None or last is None:
        raise BenchError(f"{entry.label}: {done} of {tasks} tasks done")
    return (last - first).total_seconds(), opened


def drain(
    url: str,
    *,
    entries: list[Entry],
    tasks: int,
    repeats: int,
    log: Callable[[str], None],
) -> list[Drain]:
    """``repeats`` rounds, each draining ``tasks`` once per entry; the order turns by one
    entry every round."""
    results = {
        entry: Drain(entry.contender, entry.processes, entry.threads, tasks) for entry in entries
    }
    for round_ in range(repeats):
        turn = round_ % len(entries)
        for entry in entries[turn:] + entries[:turn]:
            seconds, opened = _drain_once(url, entry, tasks)
            result = results[entry]
            result.runs.append(seconds)
            result.connections.append(opened)
            log(
                f"  round {round_ + 1}, {entry.label}: {tasks} tasks in {seconds:.2f} s "
                f"({tasks / seconds:.0f}/s), {opened} connections opened; "
                f"load {load_average()}"
            )
    return [results[entry] for entry in entries]


# --- start-up ---------------------------------------------------------------------------

#: The start-up's contenders: a worker command started for one waiting task.
STARTUP_CONTENDERS = ("jobstate", "django-tasks-db")


def startup(url: str, *, samples: int, log: Callable[[str], None]) -> dict[str, list[float]]:
    """Seconds from just before a ``--batch`` worker process is started to the start of
    the one task waiting for it, ``samples`` times per contender, taking turns."""
    figures: dict[str, list[float]] = {contender: [] for contender in STARTUP_CONTENDERS}
    for sample in range(samples):
        for contender in STARTUP_CONTENDERS[sample % 2 :] + STARTUP_CONTENDERS[: sample % 2]:
            _truncate(url)
            _load(contender, url, 1, settle=False)
            began = time.time()
            # jobstate_worker's default concurrency (1), as a deployment starts it.
            _wait_all([_worker(contender, url, 0, 1)], f"{contender} start-up", timeout=120)
            with psycopg.connect(url, autocommit=True) as conn:
                row = conn.execute(WORK_SQL[contender]).fetchone()
            if row is None or row[0] is None:
                raise BenchError(f"{contender} start-up: the task did not run")
            figures[contender].append(row[0].timestamp() - began)
    for contender, seconds in figures.items():
        log(
            f"  {_COMMANDS[contender]}: start to first task {spread(seconds, 's', 2)} "
            f"({samples} starts)"
        )
    return figures


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


def spread(values: list[float], unit: str, digits: int) -> str:
    """``low-high unit (median m)`` over the rounds; the value alone after one round."""
    unit = f" {unit}" if unit else ""
    low, high = min(values), max(values)
    if len(values) == 1:
        return f"{low:,.{digits}f}{unit}"
    middle = statistics.median(values)
    return f"{low:,.{digits}f}-{high:,.{digits}f}{unit} (median {middle:,.{digits}f})"
