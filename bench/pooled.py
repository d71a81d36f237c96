"""The PgBouncer benchmark (``python -m bench pgbouncer``): many ``jobstate_worker``
processes (``--concurrency 1``) sharing one PostgreSQL through a PgBouncer of the
harness's own in transaction mode (:mod:`bench.pgbouncer`), against fewer workers
connected directly.

Each arm drains the same number of tasks, each of which appends its number to a file,
so a task that never ran or ran twice is seen on the file, not on jobstate's own rows:

1. The tasks are enqueued with their queue paused
   (``get_state_store().pause_queue``), so no worker starts on them while the others are
   still starting.
2. The arm's worker processes start: through the pooler with the settings a host behind
   PgBouncer in transaction mode sets (``JOBSTATE["CONNECTION_POOLER"] = "transaction"``,
   no prepared statements, no LISTEN, no server-side cursors), or straight to the server
   with the benchmark's own settings. With ``--max-prepared-statements`` (PgBouncer 1.22
   or newer, ``--pgbouncer``) the pooled workers keep jobstate's prepared statements, as
   a host behind such a PgBouncer may. Once every one has registered, the queue is
   resumed.
3. While they drain, the server connections of the database are counted; in the arm
   that asks for it, PgBouncer is killed with SIGKILL once a share of the tasks is done
   and started again on the same port.
4. Once every task is done the workers are stopped with SIGTERM. None may have exited
   before, and each must exit 0.

The rate is work time, from the first task's start to the last task's end on jobstate's
own timestamps, as in ``python -m bench tasks``. Beside it, each arm's CPU time per task,
by who spent it (the workers, PgBouncer, the database's server processes), and how busy
the machine's cores were while it drained (:mod:`bench.cpu_share`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psycopg

from bench import cpu_share
from bench.pg import ROOT, BenchError, load_average
from bench.pgbouncer import PGBOUNCER, PgBouncer
from bench.tasks import WORK_SQL

#: The jobstate task backend's alias in ``bench.settings``, its target and its queue.
_TARGET, _QUEUE = "tasks:jobstate", "default"

#: Tasks enqueued per transaction.
_ENQUEUE_CHUNK = 1000

#: The database's server processes other than the asking connection's own.
_SERVER_PIDS_SQL = "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"

#: The tasks that ended: done, and ended otherwise (failed: a claim cut off by the kill
#: and never run, say, with no attempt left).
_ENDED_SQL = """
    SELECT count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status <> 'done')
    FROM jobstate_job WHERE target = %s AND status = ANY(%s)
"""


@dataclass
class Arm:
    """One drain: ``workers`` processes, through the pooler or not, PgBouncer killed once
    ``kill_at`` of the tasks are done (``None``: never)."""

    name: str
    workers: int
    pooled: bool
    kill_at: float | None = None
    #: The pooled workers keep jobstate's prepared statements (PgBouncer's
    #: ``max_prepared_statements`` is above 0).
    prepared: bool = False
    tasks: int = 0
    seconds: float = float("nan")
    most_server_connections: int = 0
    lost: int = 0
    not_done: int = 0
    ran_twice: int = 0
    exited_early: list[str] = field(default_factory=list)
    exited_badly: list[str] = field(default_factory=list)
    retries_logged: int = 0
    tracebacks: int = 0
    kills: int = 0
    #: CPU milliseconds per task by group (:data:`bench.cpu_share.GROUPS`); empty where
    #: ``/proc`` cannot be read.
    cpu_ms_per_task: dict[str, float] = field(default_factory=dict)
    #: How busy the machine's cores were while the arm drained (1.0: all, all the time).
    cores_busy: float = float("nan")

    @property
    def rate(self) -> float:
        return self.tasks / self.seconds if self.seconds > 0 else 0.0

    @property
    def label(self) -> str:
        how = "through PgBouncer" if self.pooled else "direct"
        if self.pooled and self.prepared:
            how += ", statements prepared"
        text = f"{self.workers} workers x 1 thread, {how}"
        if self.kill_at is not None:
            text += f", PgBouncer killed at {self.kill_at:.0%}"
        return text


def arms(*, workers: int, direct: int, kill_at: float | None, prepared: bool = False) -> list[Arm]:
    chosen = [Arm("pooled", workers, True, prepared=prepared), Arm("direct", direct, False)]
    if kill_at is not None:
        chosen.append(Arm("pooled-killed", workers, True, kill_at, prepared=prepared))
    return chosen


# --- one drain ----------------------------------------------------------------------------


def _reset(url: str) -> None:
    from jobstate.models import Job, QueuePause, Worker

    tables = ", ".join(model._meta.db_table for model in (Job, QueuePause, Worker))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {tables} CASCADE")


def _load(url: str, tasks: int, runs: Path) -> None:
    from django.db import transaction

    from bench.loading import PAYLOAD_PAD
    from bench.peer_tasks import jobstate_recorded

    for start in range(0, tasks, _ENQUEUE_CHUNK):
        with transaction.atomic():
            for n in range(start, min(start + _ENQUEUE_CHUNK, tasks)):
                jobstate_recorded.enqueue(n=n, runs=str(runs), pad=PAYLOAD_PAD)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE)")
        conn.execute("CHECKPOINT")


def _start_worker(
    url: str, worker_id: str, *, arm: Arm, lease: float, log: IO[str]
) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "bench.settings",
        "JOBSTATE_BENCH_DATABASE_URL": url,
        "JOBSTATE_BENCH_LEASE": str(lease),
        "JOBSTATE_BENCH_WORKER_LOG": "1",
        "PYTHONUNBUFFERED": "1",
    }
    if arm.pooled:
        env["JOBSTATE_BENCH_POOLER"] = "transaction-prepared" if arm.prepared else "transaction"
    # Its log goes to a file: a long drain's log would fill a pipe nobody reads.
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "jobstate_worker",
            "--backend",
            "jobstate",
            "--concurrency",
            "1",
            "--no-schedules",
            "--worker-id",
            worker_id,
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(condition: Callable[[], bool], *, timeout: float, what: str, every: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not after {timeout:.0f} s")
        time.sleep(every)


@contextmanager
def _fleet(
    arm: Arm, url: str, directory: Path, *, lease: float
) -> Iterator[list[subprocess.Popen[str]]]:
    """The arm's worker processes, each logging to its own file; stopped at the end."""
    with ExitStack() as stack:
        workers = []
        for n in range(arm.workers):
            log = stack.enter_context((directory / f"{arm.name}-{n}.log").open("w"))
            workers.append(_start_worker(url, f"{arm.name}-{n}", arm=arm, lease=lease, log=log))
        try:
            yield workers
        finally:
            for worker in workers:
                if worker.poll() is None:
                    worker.kill()
                    worker.wait()


def _stop(arm: Arm, workers: list[subprocess.Popen[str]]) -> None:
    arm.exited_early = [f"{arm.name}-{n}" for n, w in enumerate(workers) if w.poll() is not None]
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
    for n, worker in enumerate(workers):
        try:
            code = worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            code = worker.wait()
        if code != 0:
            arm.exited_badly.append(f"{arm.name}-{n} ({code})")


def _cpu_meter(
    arm: Arm, pooler: PgBouncer, workers: list[subprocess.Popen[str]]
) -> cpu_share.CpuMeter | None:
    """What measures the CPU ``arm`` spends: its workers, the pooler when the arm goes
    through it, and the database's server processes (found through the harness's own
    connection, which is left out); ``None`` without ``/proc``."""
    if not cpu_share.available():
        return None
    from django.db import connection

    def groups() -> dict[str, list[int]]:
        with connection.cursor() as cursor:
            cursor.execute(_SERVER_PIDS_SQL, [pooler.database])
            server = [int(pid) for (pid,) in cursor.fetchall()]
        running = pooler.process is not None and pooler.process.poll() is None
        return {
            "workers": [worker.pid for worker in workers],
            "pgbouncer": [pooler.process.pid] if arm.pooled and running and pooler.process else [],
            "server": server,
        }

    return cpu_share.CpuMeter(groups)


def _read_logs(arm: Arm, directory: Path) -> None:
    for n in range(arm.workers):
        text = (directory / f"{arm.name}-{n}.log").read_text(errors="replace")
        arm.retries_logged += text.count("trying again")
        arm.tracebacks += text.count("Traceback")


def drain_arm(
    arm: Arm,
    url: str,
    pooler: PgBouncer,
    directory: Path,
    *,
    tasks: int,
    lease: float,
    log: Callable[[str], None],
) -> Arm:
    """Drains ``tasks`` with ``arm``'s workers and fills in what it saw. While they
    drain, the harness has one connection to the database, Django's, which the count of
    server connections leaves out."""
    from django.db import connection

    from jobstate.core.states import TERMINAL_JOB_STATUSES
    from jobstate.models import Worker
    from jobstate.stores import get_state_store

    store = get_state_store()
    terminal = [str(status) for status in TERMINAL_JOB_STATUSES]
    runs = directory / f"{arm.name}.runs"
    runs.unlink(missing_ok=True)
    _reset(url)
    store.pause_queue(target=_TARGET, queue=_QUEUE, by="bench")
    _load(url, tasks, runs)
    arm.tasks = tasks
    worker_url = pooler.url if arm.pooled else url
    with _fleet(arm, worker_url, directory, lease=lease) as workers:

        def registered() -> bool:
            if any(worker.poll() is not None for worker in workers):
                raise BenchError(f"{arm.label}: a worker exited while starting; see its log")
            return Worker.objects.filter(stopped_at__isnull=True).count() >= arm.workers

        _wait(registered, timeout=60 + 2 * arm.workers, what=f"{arm.label}: every worker up")
        log(f"  {arm.label}: {arm.workers} workers up; load {load_average()}")
        meter = _cpu_meter(arm, pooler, workers)
        if meter is not None:
            meter.start()
        store.resume_queue(target=_TARGET, queue=_QUEUE, by="bench")

        def drained() -> bool:
            with connection.cursor() as cursor:
                arm.most_server_connections = max(
                    arm.most_server_connections, pooler.count_server_connections(cursor)
                )
                cursor.execute(_ENDED_SQL, [_TARGET, terminal])
                finished, arm.not_done = cursor.fetchone()
            if arm.kill_at is not None and not arm.kills and finished >= arm.kill_at * tasks:
                pooler.kill()
                time.sleep(0.3)
                pooler.start()
                arm.kills += 1
                log(f"  {arm.label}: PgBouncer killed and started again at {finished} done")
            return finished + arm.not_done >= tasks

        # A claim whose reply the kill cut off comes back once its lease has run out.
        _wait(drained, timeout=300 + tasks / 20 + 2 * lease, what=f"{arm.label}: every task ended")
        if meter is not None:
            share = meter.stop()
            arm.cpu_ms_per_task = {
                group: round(share.per_task_ms(group, tasks), 3) for group in cpu_share.GROUPS
            }
            arm.cores_busy = round(share.busy_share, 3)
            log(f"  {arm.label}: {share.summary(tasks)}")
        _stop(arm, workers)
    with connection.cursor() as cursor:
        # The same work time as the task benchmark's, on jobstate's own timestamps.
        cursor.execute(WORK_SQL["jobstate"])
        row = cursor.fetchone()
    assert row is not None and row[0] is not None
    arm.seconds = (row[1] - row[0]).total_seconds()
    ran = Counter(int(line) for line in runs.read_text().split())
    arm.lost = sum(1 for n in range(tasks) if n not in ran)
    arm.ran_twice = sum(1 for times in ran.values() if times > 1)
    _read_logs(arm, directory)
    log(
        f"  {arm.label}: {tasks} tasks in {arm.seconds:.2f} s ({arm.rate:.0f}/s), "
        f"at most {arm.most_server_connections} server connections, {arm.not_done} not done, "
        f"{arm.lost} never ran, "
        f"{arm.ran_twice} ran twice, {len(arm.exited_early)} workers exited early; "
        f"load {load_average()}"
    )
    return arm


def run(
    url: str,
    *,
    workers: int,
    direct: int,
    tasks: int,
    pool_size: int,
    kill_at: float | None,
    lease: float,
    logs: Path | None,
    log: Callable[[str], None],
    binary: str = PGBOUNCER,
    max_prepared_statements: int = 0,
) -> list[Arm]:
    """Every arm in turn, one PgBouncer (``binary``) for all. The workers' and
    PgBouncer's logs go to ``logs`` (kept), or to a temporary directory removed at the
    end. With ``max_prepared_statements`` above 0 the pooled workers keep their prepared
    statements."""
    with ExitStack() as stack:
        if logs is None:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-")))
        else:
            logs.mkdir(parents=True, exist_ok=True)
            directory = logs
        # Each worker holds a connection for its loop and one for its beat.
        pooler = PgBouncer.for_url(
            directory,
            url,
            pool_size=pool_size,
            max_client_conn=4 * max(workers, direct) + 20,
            binary=binary,
            max_prepared_statements=max_prepared_statements,
        )
        pooler.start()
        stack.callback(pooler.stop)
        return [
            drain_arm(arm, url, pooler, directory, tasks=tasks, lease=lease, log=log)
            for arm in arms(
                workers=workers,
                direct=direct,
                kill_at=kill_at,
                prepared=max_prepared_statements > 0,
            )
        ]


# --- the report -------------------------------------------------------------------------


def table(results: list[Arm]) -> str:
    lines = [
        "| arm | tasks | work time | tasks/s | most server connections | not done | never ran "
        "| ran twice | workers exited | retries logged "
        "| CPU ms per task: workers / PgBouncer / server | cores busy |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    for arm in results:
        exited = len(arm.exited_early) + len(arm.exited_badly)
        lines.append(
            f"| {arm.label} | {arm.tasks} | {arm.seconds:.2f} s | {arm.rate:.0f} | "
            f"{arm.most_server_connections} | {arm.not_done} | {arm.lost} | {arm.ran_twice} | "
            f"{exited} | "
            f"{arm.retries_logged} | {_cpu_cell(arm)} | {arm.cores_busy:.0%} |"
        )
    return "\n".join(lines)


def _cpu_cell(arm: Arm) -> str:
    if not arm.cpu_ms_per_task:
        return "-"
    return " / ".join(f"{arm.cpu_ms_per_task[group]:.2f}" for group in cpu_share.GROUPS)


def targets(results: list[Arm], *, pool_size: int) -> list[str]:
    lines = []
    for arm in results:
        whole = arm.not_done == 0 and arm.lost == 0 and arm.ran_twice == 0
        lines.append(
            f"{'met' if whole else 'MISSED'}: {arm.label}: {arm.not_done} tasks not done, "
            f"{arm.lost} never ran, {arm.ran_twice} ran twice (goal: none)"
        )
        stayed = not arm.exited_early and not arm.exited_badly and not arm.tracebacks
        lines.append(
            f"{'met' if stayed else 'MISSED'}: {arm.label}: workers exited early "
            f"{arm.exited_early or 'none'}, stopped with a non-zero status "
            f"{arm.exited_badly or 'none'}, {arm.tracebacks} tracebacks logged (goal: none)"
        )
        if arm.pooled:
            within = arm.most_server_connections <= pool_size
            lines.append(
                f"{'met' if within else 'MISSED'}: {arm.label}: at most "
                f"{arm.most_server_connections} server connections (pool {pool_size})"
            )
    by_name = {arm.name: arm for arm in results}
    pooled, direct = by_name["pooled"], by_name["direct"]
    ratio = pooled.rate / direct.rate if direct.rate else float("nan")
    lines.append(
        f"{'met' if ratio >= 1 else 'MISSED'}: {pooled.label} drains at {ratio:.2f}x "
        f"{direct.label} (goal: at least 1x)"
    )
    return lines
