"""The rows of the task benchmark's table (``python -m bench tasks``): each a ratio of
two figures measured in the same interleaved rounds, with the issue's goal and whether
it was met. Every side of a row names its processes and the threads of each.

- **Worker drains** (:mod:`bench.tasks`): each ``jobstate_worker`` thread count against
  ``db_worker`` and procrastinate's worker, and the start-up against ``db_worker``'s.
- **Policy** (the worker drains' ``jobstate-policy``): at each thread count, the no-op
  task declared with a policy against the same task without one; at 0.95 or more the
  policy the worker reads from the claimed row costs no round trip.
- **Store drains** (the drain of :mod:`bench.drain` with the contenders of
  :mod:`bench.contenders`): N processes of one thread each, every one on the connection
  it opened before the drain, under Django's default connection settings:

  - the seed path (``claim_next_inhub_job`` + ``complete_job_with_notifications``, no
    notification) against the faster of procrastinate's worker loop and django-tasks-db's
    ``Worker``;
  - ``claim_next_inhub_job`` + ``complete_claimed_job`` against the raw psycopg floor (a
    ``SKIP LOCKED`` claim and a guarded update);
  - the pause probe: those one-job claims with another target's queue paused against the
    same claims with no queue paused (no goal: the figure of the guarded probe).

- **MariaDB** (``--mysql``): the MariaDB drain (:mod:`bench.mysql_drain`) run as ``python
  -m bench --server mysql://... drain`` in a process of its own (a process sets Django up
  once, on one database): jobstate one job at a time and in batches, each against the raw
  floor of its kind.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import drain, mysql_drain
from bench.drain import Cell, Summary
from bench.pg import ROOT, BenchError
from bench.tasks import POLICY, Drain, spread

#: The parts of ``python -m bench tasks`` that ``--skip`` can leave out.
PARTS = ("workers", "policy", "seed", "floor", "pause", "startup", "concurrency", "latency")

#: The worker drains' goals: jobstate's rate over each peer's, by jobstate's threads per
#: process (``None``: at any thread count).
GOALS: dict[tuple[str, int | None], float] = {
    ("django-tasks-db", 1): 2.5,
    ("django-tasks-db", 4): 4.0,
    ("procrastinate", None): 2.0,
}
POLICY_GOAL = 0.95
SEED_GOAL = 2.0
FLOOR_GOAL = 0.6
MARIADB_GOAL = 0.5
MARIADB_BATCH_GOAL = 0.3

#: The worker drain's contenders the policy part needs.
POLICY_CONTENDERS = ("jobstate", POLICY)

#: The store drain's contenders each of its parts needs.
STORE_PARTS = {
    "seed": ("jobstate-seed", "procrastinate", "django-tasks-db"),
    "floor": ("raw", "jobstate"),
    "pause": ("jobstate", "jobstate-paused"),
}

Summaries = dict[tuple[str, str, int], Summary]


@dataclass(frozen=True)
class Row:
    """One row of the table: ``ours`` against ``theirs``, one figure per round."""

    path: str
    ours: list[float]
    theirs: list[float]
    unit: str
    goal: float | None
    #: The goal bounds the ratio from above (a time, where less is better).
    at_most: bool = False
    digits: int = 0

    @property
    def ratio(self) -> float:
        return statistics.median(self.ours) / statistics.median(self.theirs)

    @property
    def round_ratios(self) -> list[float]:
        """The ratio within each round (both sides ran in the same round)."""
        return [ours / theirs for ours, theirs in zip(self.ours, self.theirs, strict=True)]

    @property
    def met(self) -> bool | None:
        if self.goal is None:
            return None
        return self.ratio <= self.goal if self.at_most else self.ratio >= self.goal

    @property
    def goal_text(self) -> str:
        if self.goal is None:
            return "no goal"
        return f"{'<=' if self.at_most else '>='} {self.goal:g}x"

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ours": self.ours,
            "theirs": self.theirs,
            "unit": self.unit,
            "ratio": self.ratio,
            "round_ratios": self.round_ratios,
            "goal": self.goal_text,
            "met": self.met,
        }


def processes(count: int, threads: int = 1) -> str:
    return f"{count} process{'es' if count != 1 else ''} x {threads} thread{'s' * (threads != 1)}"


# --- the worker drains --------------------------------------------------------------------


def worker_rows(drains: list[Drain]) -> list[Row]:
    """Every ``jobstate_worker`` entry against every peer's."""
    ours = [result for result in drains if result.contender == "jobstate"]
    peers = [result for result in drains if result.contender not in POLICY_CONTENDERS]
    return [
        Row(
            f"{mine.entry.label} vs {peer.entry.label}",
            mine.rates,
            peer.rates,
            "tasks/s",
            GOALS.get((peer.contender, mine.threads), GOALS.get((peer.contender, None))),
        )
        for peer in peers
        for mine in ours
    ]


def policy_rows(drains: list[Drain]) -> list[Row]:
    """At each thread count, the task with a policy against the same task without one."""
    plain = {result.threads: result for result in drains if result.contender == "jobstate"}
    rows = []
    for mine in drains:
        if mine.contender != POLICY or mine.threads not in plain:
            continue
        side = processes(mine.workers, mine.threads)
        rows.append(
            Row(
                "a task with a policy vs the same task without one: `jobstate_worker "
                f"--concurrency {mine.threads}`, with ({side}) vs without ({side})",
                mine.rates,
                plain[mine.threads].rates,
                "tasks/s",
                POLICY_GOAL,
            )
        )
    return rows


def startup_rows(started: dict[str, list[float]]) -> list[Row]:
    """The start-up to the first task against ``db_worker``'s (none when not measured)."""
    if not started:
        return []
    return [
        Row(
            "worker start-up to first task, PostgreSQL: `jobstate_worker` "
            f"({processes(1)}) vs `db_worker` ({processes(1)})",
            started["jobstate"],
            started["django-tasks-db"],
            "s",
            1.0,
            at_most=True,
            digits=2,
        )
    ]


def table(drains: list[Drain]) -> str:
    """The worker drains, one line per contender (Markdown)."""
    lines = [
        "| contender | processes x threads | tasks | work time (median) | tasks/s (rounds) "
        "| connections opened |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for result in drains:
        lines.append(
            f"| {result.entry.label} | {result.workers} x {result.threads} | {result.tasks} | "
            f"{result.seconds:.2f} s | {spread(result.rates, '', 0)} | "
            f"{max(result.connections)} |"
        )
    return "\n".join(lines)


# --- the store drains ---------------------------------------------------------------------


def store_contenders(parts: list[str]) -> list[str]:
    """The store drain's contenders for the chosen parts, each once."""
    return list(dict.fromkeys(name for part in parts for name in STORE_PARTS.get(part, ())))


def store_drain(
    url: str, *, parts: list[str], workers: int, jobs: int, repeats: int, log: Callable[[str], None]
) -> Summaries:
    """The drain benchmark's cells for ``parts``, under Django's default connection
    settings, in interleaved rounds."""
    contenders = store_contenders(parts)
    if not contenders:
        return {}
    return drain.run(
        url,
        contenders=contenders,
        settings=["defaults"],
        workers=[workers],
        jobs=jobs,
        repeats=repeats,
        batch=1,
        log=log,
    )


def _rates(summary: Summary) -> list[float]:
    return [cell.rate for cell in summary.cells]


def store_rows(summaries: Summaries, workers: int) -> list[Row]:
    def get(name: str, setting: str) -> Summary | None:
        return summaries.get((name, setting, workers))

    side = processes(workers)
    rows = []
    seed = get("jobstate-seed", "defaults")
    peers = [s for s in (get("procrastinate", "defaults"), get("django-tasks-db", "any")) if s]
    if seed and peers:
        peer = max(peers, key=lambda summary: summary.rate)
        rows.append(
            Row(
                "seed path: `claim_next_inhub_job` + `complete_job_with_notifications` (no "
                f"notifications), Django's default DB settings ({side}) vs {peer.contender} "
                f"({side}), the faster of procrastinate and django-tasks-db",
                _rates(seed),
                _rates(peer),
                "jobs/s",
                SEED_GOAL,
            )
        )
    ours, raw = get("jobstate", "defaults"), get("raw", "psycopg")
    if ours and raw:
        rows.append(
            Row(
                f"`claim_next_inhub_job` + `complete_claimed_job` ({side}) vs the raw psycopg "
                f"floor: `SKIP LOCKED` claim + guarded update ({side})",
                _rates(ours),
                _rates(raw),
                "jobs/s",
                FLOOR_GOAL,
            )
        )
    paused = get("jobstate-paused", "defaults")
    if ours and paused:
        rows.append(
            Row(
                "pause probe: `claim_next_inhub_job` + `complete_claimed_job` with another "
                f"target's queue paused ({side}) vs no queue paused ({side})",
                _rates(paused),
                _rates(ours),
                "jobs/s",
                None,
            )
        )
    return rows


# --- MariaDB ------------------------------------------------------------------------------


def mariadb_drain(
    server: str,
    database: str,
    *,
    workers: int,
    jobs: int,
    repeats: int,
    batch: int,
    keep: bool,
    log: Callable[[str], None],
) -> tuple[Summaries, dict[str, Any]]:
    """``python -m bench --server <server> drain`` with the MariaDB contenders, in a
    process of its own: its cells as summaries, and its manifest."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DJANGO_SETTINGS_MODULE", "JOBSTATE_BENCH_DATABASE_URL")
    }
    with tempfile.TemporaryDirectory(prefix="bench-mysql-") as directory:
        out = Path(directory) / "drain.json"
        command = [
            *(sys.executable, "-m", "bench", "--server", server, "--database", database),
            *("--output", str(out), *(["--keep"] if keep else []), "drain"),
            *("--workers", str(workers), "--jobs", str(jobs), "--repeats", str(repeats)),
            *("--batch", str(batch), "--contenders", ",".join(mysql_drain.DEFAULT_CONTENDERS)),
        ]
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert process.stdout is not None
        said = []
        for line in process.stdout:
            said.append(line.rstrip())
            if line.startswith(("drain on", "  round")):
                log(f"  MariaDB: {line.strip()}")
        if process.wait() != 0:
            raise BenchError("the MariaDB drain failed: " + "\n".join(said[-20:]))
        result = json.loads(out.read_text())
    summaries: Summaries = {}
    for fields in result["drain"]["cells"]:
        cell = Cell(**fields)
        key = (cell.contender, cell.setting, cell.workers)
        summaries.setdefault(key, Summary(*key)).cells.append(cell)
    return summaries, result["manifest"]


def mariadb_rows(summaries: Summaries, workers: int, batch: int) -> list[Row]:
    def get(name: str) -> Summary | None:
        return summaries.get((name, mysql_drain.SETTING, workers))

    side = processes(workers)
    rows = []
    for ours, floor, path, goal in (
        (
            "jobstate",
            "raw",
            f"MariaDB one-job drain: `claim_next_inhub_job` + `complete_claimed_job` ({side}) "
            f"vs the raw floor: `SKIP LOCKED` SELECT + UPDATE, guarded update ({side})",
            MARIADB_GOAL,
        ),
        (
            "jobstate-batch",
            "raw-batch",
            f"MariaDB batch claims: `claim_next_inhub_jobs` + `complete_claimed_jobs`, k={batch} "
            f"({side}) vs raw batches of k ({side})",
            MARIADB_BATCH_GOAL,
        ),
    ):
        mine, raw = get(ours), get(floor)
        if mine and raw:
            rows.append(Row(path, _rates(mine), _rates(raw), "jobs/s", goal))
    return rows


# --- the report ---------------------------------------------------------------------------


def markdown(rows: list[Row]) -> str:
    """The issue's table: one line per row, its goal and whether it was met."""
    lines = [
        "| path | jobstate | compared with | ratio | goal | met? |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = f"**{row.ratio:.2f}x**"
        if len(row.round_ratios) > 1:
            ratio += f" (rounds {min(row.round_ratios):.2f}-{max(row.round_ratios):.2f})"
        met = {True: "met", False: "**not met**", None: "-"}[row.met]
        lines.append(
            f"| {row.path} | {spread(row.ours, row.unit, row.digits)} | "
            f"{spread(row.theirs, row.unit, row.digits)} | {ratio} | {row.goal_text} | {met} |"
        )
    return "\n".join(lines)


def targets(rows: list[Row], concurrency: dict[str, float], notify: dict[str, float]) -> list[str]:
    """One line per row, then the concurrency and latency targets."""
    lines = []
    for row in rows:
        if row.met is None:
            lines.append(f"no goal: {row.path} at {row.ratio:.2f}x")
            continue
        verdict = "met" if row.met else "NOT met"
        lines.append(f"{verdict}: {row.path} at {row.ratio:.2f}x (goal {row.goal_text})")
    if concurrency:
        gap = concurrency["start_spread_seconds"]
        lines.append(
            f"{'met' if gap <= 1.0 else 'NOT met'}: eight 1 s tasks started within "
            f"{gap * 1000:.1f} ms of each other (target 1 s)"
        )
    if notify:
        ok = notify["p50_ms"] <= 20 and notify["p99_ms"] <= 100
        lines.append(
            f"{'met' if ok else 'NOT met'}: LISTEN/NOTIFY latency p50 {notify['p50_ms']:.1f} ms "
            f"(target 20), p99 {notify['p99_ms']:.1f} ms (target 100)"
        )
    return lines
