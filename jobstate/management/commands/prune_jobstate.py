"""``manage.py prune_jobstate``: delete history past its retention (every retention sweep).

Runs :func:`jobstate.maintenance.run_retention_sweeps`: audit entries older than
``AUDIT_RETENTION``, finished jobs older than ``FINISHED_JOB_RETENTION``, finished job
runs older than ``FINISHED_RUN_RETENTION``, delivered notifications older than
``DELIVERED_NOTIFICATION_RETENTION`` and registered workers whose last beat is older
than ``WORKER_RETENTION`` (``--older-than DAYS`` replaces all of them). Dead
letters are never deleted: they wait for an operator. Deletes in batches, each its own
short transaction, so it can run next to live traffic and on several machines at once.
Prints nothing when nothing was old enough; shows a progress line while it works when
stderr is a terminal.

Exit status: 0 done (also when a sweep stopped at its time budget and left the rest for
the next run), 1 the database or store failed, 2 invalid options or settings.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from jobstate.maintenance import SweepReport, SweepResult, run_retention_sweeps

from ._common import ProgressLine, SweepCommand, known_database
from ._numbers import positive_days

_NOUNS: dict[str, tuple[str, str]] = {
    "audit": ("audit entry", "audit entries"),
    "jobs": ("finished job", "finished jobs"),
    "runs": ("finished job run", "finished job runs"),
    "notifications": ("delivered notification", "delivered notifications"),
    "workers": ("registered worker", "registered workers"),
}


def describe(result: SweepResult) -> str:
    one, many = _NOUNS.get(result.sweep, (f"{result.sweep} row", f"{result.sweep} rows"))
    noun = one if result.count == 1 else many
    if result.dry_run:
        return f"Would delete {result.count} {noun} (dry run: nothing was written)."
    return f"Deleted {result.count} {noun}."


def report_lines(report: SweepReport, *, verbosity: int) -> list[str]:
    """One line per sweep that deleted something (every sweep at verbosity 2 or more),
    and a note when a sweep stopped at its time budget."""
    lines = [describe(r) for r in report.results if r.count or verbosity >= 2]
    if not report.complete:
        lines.append("Some sweeps stopped at their time budget; the next run continues.")
    return lines


class Command(SweepCommand):
    help = (
        "Delete audit entries, finished jobs, finished job runs, delivered notifications "
        "and registered workers past their retention (JOBSTATE['AUDIT_RETENTION'], "
        "['FINISHED_JOB_RETENTION'], ['FINISHED_RUN_RETENTION'], "
        "['DELIVERED_NOTIFICATION_RETENTION'], ['WORKER_RETENTION']), in batches; "
        "dead letters are never deleted. Quiet when nothing was old enough. "
        "Exit status: 0 done, 1 database or store failure, 2 invalid options or settings."
    )

    action = "Pruning"
    rows = "Rows per DELETE"
    would = "deleted"
    batch_setting = "RETENTION_BATCH_SIZE"

    def add_sweep_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--older-than",
            type=positive_days,
            metavar="DAYS",
            help="Delete what is older than DAYS days (fractions allowed), instead of each "
            "kind's retention setting.",
        )

    def sweep(self, options: dict[str, Any], on_batch: ProgressLine) -> SweepReport:
        return run_retention_sweeps(
            options["older_than"],
            options["batch_size"],
            options["dry_run"],
            using=known_database(options["database"]),
            time_budget=options["time_budget"],
            on_batch=on_batch,
        )

    def report_lines(self, report: SweepReport, *, verbosity: int) -> list[str]:
        return report_lines(report, verbosity=verbosity)
