"""``manage.py reap_stale``: settle work whose process is gone.

Moves every RUNNING operations-job run whose heartbeat is older than the liveness budget
(``JOBSTATE["STALE_RUN_AFTER"]``) to TIMED_OUT, across all jobs and overlap keys, which
frees their keys. Safe to run from cron every minute on several machines at once: each
stale row is moved by exactly one reaper and counted once. Prints nothing when nothing
was reaped.
"""

from __future__ import annotations

import argparse
import json
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from jobstate.exceptions import JobStateError
from jobstate.models import JobRun
from jobstate.runner import FROM_SETTINGS, JobRunner
from jobstate.stores import get_run_store


def reap_stale(
    *,
    database: str = DEFAULT_DB_ALIAS,
    stale_after: timedelta | None = None,
    limit: int | None = None,
    dry_run: bool = False,
) -> dict[str, int]:
    """Reap everything stale and return how many rows of each kind this call moved
    (``{"runs": n}``). ``stale_after`` and ``limit`` default to ``STALE_RUN_AFTER`` and
    ``REAP_LIMIT``; ``stale_after`` must be at least twice ``HEARTBEAT_INTERVAL``.

    With ``dry_run`` nothing is written and the counts are the rows that would move
    now, read from jobstate's own ``JobRun`` table.
    """
    runner = JobRunner(
        store=get_run_store(using=database),
        stale_run_after=FROM_SETTINGS if stale_after is None else stale_after,
    )
    if dry_run:
        cap = runner.reap_limit if limit is None else limit
        stale = JobRun.objects.using(database).stale(runner.stale_run_after).count()
        return {"runs": stale if cap is None else min(stale, cap)}
    return {"runs": runner.reap_stale_runs(limit=limit)}


def _positive_seconds(text: str) -> timedelta:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not seconds > 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return timedelta(seconds=seconds)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


class Command(BaseCommand):
    help = (
        "Move RUNNING job runs whose heartbeat went stale to TIMED_OUT (all jobs), freeing "
        "their overlap keys. Safe to run from cron every minute on several machines; "
        "prints nothing when nothing was reaped."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--stale-after",
            type=_positive_seconds,
            metavar="SECONDS",
            help="Liveness budget in seconds (default: JOBSTATE['STALE_RUN_AFTER']).",
        )
        parser.add_argument(
            "--limit",
            type=_positive_int,
            metavar="N",
            help="Move at most N rows (default: JOBSTATE['REAP_LIMIT']).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Count what would be reaped; write nothing."
        )
        parser.add_argument("--json", action="store_true", help="Print the counts as JSON.")
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="The database holding the run records (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            counts = reap_stale(
                database=options["database"],
                stale_after=options["stale_after"],
                limit=options["limit"],
                dry_run=options["dry_run"],
            )
        except JobStateError as exc:
            raise CommandError(str(exc)) from exc
        if options["json"]:
            self.stdout.write(json.dumps({**counts, "dry_run": options["dry_run"]}))
            return
        runs = counts["runs"]
        if runs == 0 and options["verbosity"] < 2:
            return
        noun = "stale job run" if runs == 1 else "stale job runs"
        if options["dry_run"]:
            self.stdout.write(f"Would reap {runs} {noun} (dry run: nothing was written).")
        else:
            self.stdout.write(f"Reaped {runs} {noun} (RUNNING -> TIMED_OUT).")
