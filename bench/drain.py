"""Drain (burn-down) benchmark: the same no-op jobs loaded into each contender, drained by
N worker processes released together behind a barrier.

Per cell it measures wall time from the barrier's release to the last worker's last
completion, statements sent per job (counted in each worker's psycopg), transactions per
job (the server's ``pg_stat_database`` counter of the benchmark database), CPU seconds of
the worker processes and of their server backends (sampled from ``/proc`` every 0.2 s,
so a backend's last fraction of a second can be missed), and worker memory.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from bench.contenders import CONTENDERS, worker_main
from bench.pg import BenchError, database_name, database_url, load_average

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is in the bench dependency group
    psutil = None

#: The contender every ratio is taken against.
OURS = "jobstate"


@dataclass
class Cell:
    contender: str
    workers: int
    jobs: int
    seconds: float
    done: int
    statements: int
    transactions: int
    worker_cpu: float
    server_cpu: float
    rss_growth: float | None
    load: str

    @property
    def rate(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Summary:
    contender: str
    workers: int
    cells: list[Cell] = field(default_factory=list)

    def _median(self, values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    @property
    def rate(self) -> float:
        return self._median([c.rate for c in self.cells])

    def per_job(self, name: str) -> float:
        return self._median([getattr(c, name) / max(c.done, 1) for c in self.cells])

    def median(self, name: str) -> float:
        return self._median([getattr(c, name) for c in self.cells])


def _backend_cpu(monitor: psycopg.Connection[Any], database: str, seen: dict[int, float]) -> None:
    if psutil is None:
        return
    pids = monitor.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
        [database],
    ).fetchall()
    for (pid,) in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        seen[pid] = max(seen.get(pid, 0.0), times.user + times.system)


def _transactions(monitor: psycopg.Connection[Any], database: str) -> int:
    monitor.execute("SELECT pg_stat_clear_snapshot()")
    row = monitor.execute(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [database]
    ).fetchone()
    return int(row[0]) if row else 0


def run_cell(
    contender: str,
    url: str,
    *,
    workers: int,
    jobs: int,
    batch: int,
    memory_every: int = 0,
    timeout: float = 600,
) -> Cell:
    """Load ``jobs`` into ``contender``, drain them with ``workers`` processes, and check
    that every job was done."""
    spec = CONTENDERS[contender]
    spec.load(url, jobs, batch)
    database = database_name(url)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers + 1)
    results = context.Queue()
    processes = [
        context.Process(
            target=worker_main,
            args=(contender, url, index, batch, barrier, results, memory_every),
            daemon=True,
        )
        for index in range(workers)
    ]
    with psycopg.connect(database_url(url, "postgres"), autocommit=True) as monitor:
        before = {}
        _backend_cpu(monitor, database, before)
        for process in processes:
            process.start()
        try:
            barrier.wait(timeout=180)
        except Exception as exc:
            for process in processes:
                process.kill()
            raise BenchError(
                f"{contender}: workers did not reach the barrier ({_drain_errors(results)})"
            ) from exc
        transactions_before = _transactions(monitor, database)
        seen: dict[int, float] = {}
        deadline = time.monotonic() + timeout
        while any(process.is_alive() for process in processes):
            _backend_cpu(monitor, database, seen)
            if time.monotonic() > deadline:
                for process in processes:
                    process.kill()
                raise BenchError(f"{contender}: not drained after {timeout} s")
            time.sleep(0.2)
        for process in processes:
            process.join()
        reports = [results.get(timeout=10) for _ in processes]
        errors = [r["error"] for r in reports if r.get("error")]
        if errors:
            raise BenchError(f"{contender}: a worker failed: {errors[0]}")
        # Backends flush their counters when they disconnect; give them a moment.
        time.sleep(0.5)
        transactions = _transactions(monitor, database) - transactions_before
        row = psycopg.connect(url, autocommit=True).execute(spec.done_sql).fetchone()
        done = int(row[0]) if row else 0
    if done != jobs:
        raise BenchError(f"{contender}: {done} of {jobs} jobs done after the drain")
    started = min(r["started"] for r in reports)
    ended = max(r["ended"] for r in reports)
    growth = None
    samples = [r for r in reports if r["rss"]]
    if samples:
        growth = max((r["rss_end"] - r["rss"][0][1]) / r["rss"][0][1] for r in samples)
    server_cpu = sum(cpu - before.get(pid, 0.0) for pid, cpu in seen.items())
    return Cell(
        contender=contender,
        workers=workers,
        jobs=jobs,
        seconds=ended - started,
        done=done,
        statements=sum(r["statements"] for r in reports),
        transactions=transactions,
        worker_cpu=sum(r["cpu"] for r in reports),
        server_cpu=server_cpu,
        rss_growth=growth,
        load=load_average(),
    )


def _drain_errors(results: Any) -> str:
    errors = []
    while not results.empty():
        report = results.get_nowait()
        if report.get("error"):
            errors.append(report["error"])
    return "; ".join(errors) or "no error reported"


def run(
    url: str,
    *,
    contenders: list[str],
    workers: list[int],
    jobs: int,
    repeats: int,
    batch: int,
    memory_every: int = 0,
    log: Any = print,
) -> dict[tuple[str, int], Summary]:
    """Every contender at every worker count, ``repeats`` interleaved rounds (the order of
    contenders rotates each round, so none always runs first on a cold cache)."""
    summaries: dict[tuple[str, int], Summary] = {}
    for count in workers:
        for round_index in range(repeats):
            shift = round_index % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                cell = run_cell(
                    contender,
                    url,
                    workers=count,
                    jobs=jobs,
                    batch=batch,
                    memory_every=memory_every if contender == OURS else 0,
                )
                summaries.setdefault((contender, count), Summary(contender, count)).cells.append(
                    cell
                )
                log(
                    f"  round {round_index + 1}/{repeats} {contender:>16} x{count}: "
                    f"{cell.rate:8.0f} jobs/s ({cell.done} jobs in {cell.seconds:.2f} s; "
                    f"load {cell.load})"
                )
    return summaries


def table(summaries: dict[tuple[str, int], Summary], batch: int) -> str:
    """The result table (Markdown)."""
    lines = [
        "| contender | workers | jobs/s median | min | max | ratio to jobstate | "
        "statements/job | transactions/job | worker CPU s | server CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (contender, count), summary in summaries.items():
        ours = summaries.get((OURS, count))
        ratio = summary.rate / ours.rate if ours and ours.rate else float("nan")
        rates = [c.rate for c in summary.cells]
        name = contender + (f" (k={batch})" if contender.endswith("batch") else "")
        lines.append(
            f"| {name} | {count} | {summary.rate:,.0f} | {min(rates):,.0f} | {max(rates):,.0f} "
            f"| {ratio:.2f} | {summary.per_job('statements'):.2f} "
            f"| {summary.per_job('transactions'):.2f} | {summary.median('worker_cpu'):.2f} "
            f"| {summary.median('server_cpu'):.2f} |"
        )
    return "\n".join(lines)


def targets(summaries: dict[tuple[str, int], Summary], workers: int = 4) -> list[str]:
    """The issue's drain targets, each as a measured ratio and whether it was met."""

    def rate(name: str) -> float | None:
        summary = summaries.get((name, workers))
        return summary.rate if summary else None

    ours = rate(OURS)
    lines = []
    checks = [
        ("jobstate / raw", ours, rate("raw"), 0.8),
        ("jobstate / procrastinate", ours, rate("procrastinate"), 2.0),
        ("jobstate / django-tasks-db", ours, rate("django-tasks-db"), 2.0),
        ("jobstate-batch / jobstate", rate("jobstate-batch"), ours, 3.0),
    ]
    for label, numerator, denominator, goal in checks:
        if numerator is None or denominator is None or not denominator:
            continue
        value = numerator / denominator
        verdict = "met" if value >= goal else "NOT met"
        lines.append(f"{label} at {workers} workers: {value:.2f} (target >= {goal}) - {verdict}")
    # No target: how much of the schema-and-SQL rate the Python around it keeps.
    ours_sql = rate("raw-jobstate-sql")
    if ours is not None and ours_sql:
        lines.append(
            f"jobstate / raw-jobstate-sql at {workers} workers: {ours / ours_sql:.2f} "
            "(the share the Python layer keeps; no target)"
        )
    growth = [
        c.rss_growth
        for (name, _), s in summaries.items()
        if name == OURS
        for c in s.cells
        if c.rss_growth is not None
    ]
    if growth:
        lines.append(
            f"jobstate worker memory growth over the drain: max {max(growth) * 100:.1f}% "
            "(target <= 10%)"
        )
    return lines
