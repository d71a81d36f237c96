"""``manage.py reap_stale``: settle work whose owner is gone (every reaping sweep).

Runs :func:`jobstate.maintenance.run_reaping_sweeps`: stale operations-job runs ->
TIMED_OUT, queued jobs past their time to live -> error, dispatched jobs of silent
executors -> queued, running jobs whose worker lease expired -> queued (or error on the
last attempt), notifications whose relay lease ended -> pending (or dead on the last
attempt), expired runtime locks deleted. Safe to run from cron every minute on
several machines at once: each row is moved by exactly one of them and counted once.
Prints nothing when nothing was done.

Exit status: 0 done (also when nothing was stale, or a sweep stopped at its time budget
and left the rest for the next run), 1 the database or store failed, 2 invalid options
or settings.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from django.core.management.base import CommandParser

from jobstate.core.conf import jobstate_settings
from jobstate.maintenance import SweepReport, SweepResult, run_reaping_sweeps

from ._common import ProgressLine, SweepCommand, known_database
from ._numbers import plain, positive_int, positive_seconds

#: How each sweep's count reads: (one, many, done verb, dry-run verb, what moved).
_WORDING: dict[str, tuple[str, str, str, str, str]] = {
    "runs": ("stale job run", "stale job runs", "Reaped", "Would reap", "RUNNING -> TIMED_OUT"),
    "queued": (
        "job that waited too long in the queue",
        "jobs that waited too long in the queue",
        "Expired",
        "Would expire",
        "queued -> error",
    ),
    "dispatched": (
        "job whose executor stopped renewing its lease",
        "jobs whose executor stopped renewing their lease",
        "Requeued",
        "Would requeue",
        "dispatched -> queued",
    ),
    "leases": (
        "job whose worker lease expired",
        "jobs whose worker lease expired",
        "Recovered",
        "Would recover",
        "running -> queued, or error on the last attempt",
    ),
    "tasks": (
        "task whose worker was lost",
        "tasks whose worker was lost",
        "Recovered",
        "Would recover",
        "running -> queued, or error after the last attempt",
    ),
    "outbox": (
        "notification whose relay lease ended",
        "notifications whose relay lease ended",
        "Recovered",
        "Would recover",
        "delivering -> pending, or dead after the last attempt",
    ),
    "locks": (
        "expired runtime lock",
        "expired runtime locks",
        "Released",
        "Would release",
        "deleted",
    ),
}


def describe(result: SweepResult) -> str:
    """One line saying what a sweep did (or would do, in a dry run)."""
    one, many, done, would, moved = _WORDING.get(
        result.sweep, (f"{result.sweep} row", f"{result.sweep} rows", "Swept", "Would sweep", "")
    )
    noun = one if result.count == 1 else many
    if result.dry_run:
        return f"{would} {result.count} {noun} (dry run: nothing was written)."
    if result.detail:
        moved = ", ".join(f"{count} {outcome}" for outcome, count in result.detail.items())
    return f"{done} {result.count} {noun}" + (f" ({moved})." if moved else ".")


def report_lines(report: SweepReport, *, verbosity: int) -> list[str]:
    """What a maintenance command prints: one line per sweep that did something (every
    sweep at verbosity 2 or more), and a note when a sweep stopped early."""
    lines = [describe(r) for r in report.results if r.count or verbosity >= 2]
    if not report.complete:
        lines.append("Some sweeps stopped at their time budget or --limit; the next run continues.")
    return lines


def _stale_after(text: str) -> timedelta:
    """``--stale-after``: positive seconds, at least twice ``HEARTBEAT_INTERVAL``, as the
    runs' own liveness budget must be (checked here so the error names the option)."""
    budget = positive_seconds(text)
    beat = jobstate_settings.HEARTBEAT_INTERVAL
    if budget < 2 * beat:
        raise argparse.ArgumentTypeError(
            f"{plain(text)} s is less than twice JOBSTATE['HEARTBEAT_INTERVAL'] "
            f"({beat.total_seconds():g} s): a live run whose heartbeat is a little late "
            "would be reaped"
        )
    return budget


class Command(SweepCommand):
    help = (
        "Settle work whose owner is gone: stale job runs -> TIMED_OUT, queued jobs past "
        "QUEUED_TTL -> error, dispatched jobs of silent executors -> queued, expired "
        "worker leases -> queued (error on the last attempt), tasks of lost workers -> "
        "queued (error after their last attempt), notifications whose relay "
        "lease ended -> pending (dead on the last attempt), expired runtime locks "
        "deleted. Safe from cron every minute on several machines; prints nothing when "
        "nothing was stale. Exit status: 0 done, 1 database or store failure, 2 invalid "
        "options or settings."
    )

    action = "Reaping"
    rows = "Rows per statement"
    would = "reaped"
    batch_setting = "SWEEP_BATCH_SIZE"

    def add_sweep_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--stale-after",
            type=_stale_after,
            metavar="SECONDS",
            help="Liveness budget of job runs in seconds (default: JOBSTATE['STALE_RUN_AFTER']).",
        )
        parser.add_argument(
            "--limit",
            type=positive_int,
            metavar="N",
            help="Move at most N rows per sweep in this run (default: no cap beyond the "
            "time budget).",
        )

    def sweep(self, options: dict[str, Any], on_batch: ProgressLine) -> SweepReport:
        return run_reaping_sweeps(
            using=known_database(options["database"]),
            stale_after=options["stale_after"],
            limit=options["limit"],
            batch_size=options["batch_size"],
            time_budget=options["time_budget"],
            dry_run=options["dry_run"],
            on_batch=on_batch,
        )

    def report_lines(self, report: SweepReport, *, verbosity: int) -> list[str]:
        return report_lines(report, verbosity=verbosity)
