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
from bench.variants import SELECTABLE

try:
    import psutil
except ImportError:  # pragma: no cover - psutil is in the bench dependency group
    psutil = None

#: The contender whose worker memory is sampled.
OURS = "jobstate"

#: The peers whose faster cell the targets are measured against.
PEERS = ("procrastinate", "django-tasks-db")


@dataclass
class Cell:
    contender: str
    setting: str
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
    setting: str
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
    setting: str,
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
            args=(contender, setting, url, index, batch, barrier, results, memory_every),
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
        with psycopg.connect(url, autocommit=True) as conn:
            row = conn.execute(spec.done_sql).fetchone()
            done = int(row[0]) if row else 0
            counted = [(sql, per_job, conn.execute(sql).fetchone()) for sql, per_job in spec.checks]
    if done != jobs:
        raise BenchError(f"{contender}: {done} of {jobs} jobs done after the drain")
    for sql, per_job, found in counted:
        if found is None or found[0] != per_job * jobs:
            raise BenchError(f"{contender}: {sql!r} gave {found}, not {per_job} per job")
    started = min(r["started"] for r in reports)
    ended = max(r["ended"] for r in reports)
    growth = None
    samples = [r for r in reports if r["rss"]]
    if samples:
        growth = max((r["rss_end"] - r["rss"][0][1]) / r["rss"][0][1] for r in samples)
    server_cpu = sum(cpu - before.get(pid, 0.0) for pid, cpu in seen.items())
    return Cell(
        contender=contender,
        setting=setting,
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


def cells_of(contenders: list[str], settings: list[str]) -> list[tuple[str, str]]:
    """(contender, setting) for every cell of one round: each contender under each of
    ``settings`` its statements depend on, or under its own setting when none does."""
    cells: list[tuple[str, str]] = []
    for contender in contenders:
        own = CONTENDERS[contender].settings
        chosen = [name for name in own if name in settings] or (list(own) if len(own) == 1 else [])
        cells.extend((contender, name) for name in chosen)
    return cells


def run(
    url: str,
    *,
    contenders: list[str],
    settings: list[str],
    workers: list[int],
    jobs: int,
    repeats: int,
    batch: int,
    memory_every: int = 0,
    log: Any = print,
) -> dict[tuple[str, str, int], Summary]:
    """Every contender under every chosen setting at every worker count, ``repeats``
    interleaved rounds (the order of the cells rotates each round, so none always runs
    first on a cold cache)."""
    summaries: dict[tuple[str, str, int], Summary] = {}
    cells = cells_of(contenders, settings)
    for count in workers:
        for round_index in range(repeats):
            shift = round_index % len(cells)
            for contender, setting in cells[shift:] + cells[:shift]:
                cell = run_cell(
                    contender,
                    setting,
                    url,
                    workers=count,
                    jobs=jobs,
                    batch=batch,
                    memory_every=memory_every if (contender, setting) == (OURS, "defaults") else 0,
                )
                key = (contender, setting, count)
                summaries.setdefault(key, Summary(contender, setting, count)).cells.append(cell)
                log(
                    f"  round {round_index + 1}/{repeats} {contender:>16} {setting:<10} "
                    f"x{count}: {cell.rate:8.0f} jobs/s ({cell.done} jobs in "
                    f"{cell.seconds:.2f} s; load {cell.load})"
                )
    return summaries


def _name(contender: str, batch: int) -> str:
    return contender + (f" (k={batch})" if contender.endswith("batch") else "")


def _best_peer(
    summaries: dict[tuple[str, str, int], Summary], workers: int, setting: str | None
) -> float | None:
    """The faster peer's median rate, under ``setting`` (or under any setting)."""
    rates = [
        s.rate
        for (name, chosen, count), s in summaries.items()
        if name in PEERS and count == workers and (setting is None or chosen in (setting, "any"))
    ]
    return max(rates) if rates else None


def table(summaries: dict[tuple[str, str, int], Summary], batch: int) -> str:
    """The result table (Markdown): one row per contender and setting."""
    lines = [
        "| contender | setting | workers | jobs/s median | min | max | to raw | to faster peer "
        "| statements/job | transactions/job | worker CPU s | server CPU s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (contender, setting, count), summary in summaries.items():
        raw = summaries.get(("raw", "psycopg", count))
        peer = _best_peer(summaries, count, "defaults")
        to_raw = summary.rate / raw.rate if raw and raw.rate else float("nan")
        to_peer = summary.rate / peer if peer else float("nan")
        rates = [c.rate for c in summary.cells]
        lines.append(
            f"| {_name(contender, batch)} | {setting} | {count} | {summary.rate:,.0f} "
            f"| {min(rates):,.0f} | {max(rates):,.0f} | {to_raw:.2f} | {to_peer:.2f} "
            f"| {summary.per_job('statements'):.2f} | {summary.per_job('transactions'):.2f} "
            f"| {summary.median('worker_cpu'):.2f} | {summary.median('server_cpu'):.2f} |"
        )
    return "\n".join(lines)


def settings_table(summaries: dict[tuple[str, str, int], Summary], batch: int) -> str:
    """Median jobs/s of each contender under each setting, side by side (Markdown); a
    contender no setting changes has its one figure under "own"."""
    columns = [name for name in SELECTABLE if any(key[1] == name for key in summaries)]
    rows: dict[tuple[str, int], dict[str, float]] = {}
    for (contender, setting, count), summary in summaries.items():
        column = setting if setting in SELECTABLE else "own"
        rows.setdefault((contender, count), {})[column] = summary.rate
    columns.append("own")
    lines = [
        "| contender | workers | " + " | ".join(columns) + " |",
        "|---|---:|" + "---:|" * len(columns),
    ]
    for (contender, count), rates in rows.items():
        cells = [f"{rates[name]:,.0f}" if name in rates else "" for name in columns]
        lines.append(f"| {_name(contender, batch)} | {count} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(summaries: dict[tuple[str, str, int], Summary], workers: int = 4) -> list[str]:
    """The drain targets, each as a measured ratio and whether it was met, for every
    setting. "Faster peer" is the faster of procrastinate and django-tasks-db under the
    same connection options (Django's defaults for ``defaults`` and ``unprepared``); the
    seed path at Django's defaults is also held against the faster peer under any
    setting."""

    def rate(name: str, setting: str) -> float | None:
        summary = summaries.get((name, setting, workers))
        return summary.rate if summary else None

    raw = rate("raw", "psycopg")
    lines = []
    checks: list[tuple[str, float | None, float | None, float]] = []
    for setting in ("defaults", "prepared", "unprepared"):
        # The peers prepare nothing at Django's defaults either: "unprepared" is a
        # jobstate setting on top of them.
        peer = _best_peer(summaries, workers, "prepared" if setting == "prepared" else "defaults")
        checks += [
            (
                f"jobstate-seed [{setting}] / faster peer",
                rate("jobstate-seed", setting),
                peer,
                2.0,
            ),
            (
                f"jobstate-seed-2 [{setting}] / faster peer",
                rate("jobstate-seed-2", setting),
                peer,
                1.5,
            ),
            (f"jobstate [{setting}] / raw", rate("jobstate", setting), raw, 0.5),
            (f"jobstate [{setting}] / raw (the 0.8 target)", rate("jobstate", setting), raw, 0.8),
            (
                f"jobstate [{setting}] / faster peer",
                rate("jobstate", setting),
                peer,
                2.0,
            ),
            (
                f"jobstate-batch [{setting}] / jobstate [{setting}]",
                rate("jobstate-batch", setting),
                rate("jobstate", setting),
                3.0,
            ),
        ]
    any_peer = _best_peer(summaries, workers, None)
    checks += [
        (
            "jobstate-seed [defaults] / faster peer [any setting]",
            rate("jobstate-seed", "defaults"),
            any_peer,
            2.0,
        ),
        (
            "jobstate-seed-2 [defaults] / faster peer [any setting]",
            rate("jobstate-seed-2", "defaults"),
            any_peer,
            1.5,
        ),
    ]
    for label, numerator, denominator, goal in checks:
        if numerator is None or denominator is None or not denominator:
            continue
        value = numerator / denominator
        verdict = "met" if value >= goal else "NOT met"
        lines.append(f"{label} at {workers} workers: {value:.2f} (target >= {goal}) - {verdict}")
    # No target: how much of the schema-and-SQL rate the Python around it keeps.
    ours_sql = rate("raw-jobstate-sql", "psycopg")
    for setting in ("defaults", "prepared"):
        ours = rate(OURS, setting)
        if ours is not None and ours_sql:
            lines.append(
                f"jobstate [{setting}] / raw-jobstate-sql at {workers} workers: "
                f"{ours / ours_sql:.2f} (the share the Python layer keeps; no target)"
            )
    growth = [
        c.rss_growth
        for (name, _, _), s in summaries.items()
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
