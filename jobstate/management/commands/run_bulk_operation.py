"""``manage.py run_bulk_operation ID``: run a bulk operation of the console (requeue,
reject or delete over a filter of the jobs list) to its end, batch after batch.

The console's progress page drives an operation while it is open; this command finishes
one without a browser, or resumes one whose driver stopped (a closed tab, a restart).
It is safe beside the page and beside another run of itself: each batch locks the
operation's row, and a job is never handled twice. Prints the counts at the end.

Exit status: 0 the operation is done (or was already finished), 1 the database or store
failed, 2 invalid options or no such operation.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from jobstate.console.bulk import BATCH_SIZE, advance_bulk_operation
from jobstate.models import BulkOperation, BulkState

from ._common import (
    EXIT_FAILED,
    EXIT_USAGE,
    JobStateCommand,
    known_database,
    misconfigured_error,
)
from ._numbers import positive_int


class Command(JobStateCommand):
    help = "Run a bulk operation of the console to its end (or resume one)."
    stopped_note = "Each batch it finished is committed; run it again to go on from there."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("operation", type=positive_int, help="The bulk operation's id.")
        parser.add_argument(
            "--batch-size",
            type=positive_int,
            default=BATCH_SIZE,
            help=f"Jobs per batch, each one transaction (default {BATCH_SIZE}).",
        )
        # Checked in handle: a CommandError raised by an argparse type escapes as a
        # traceback.
        parser.add_argument("--database", default="default")

    def handle(self, *args: Any, **options: Any) -> None:
        using = known_database(options["database"])
        misconfigured = misconfigured_error(using)
        if misconfigured is not None:
            raise misconfigured
        pk = options["operation"]
        try:
            if not BulkOperation.objects.using(using).filter(pk=pk).exists():
                raise CommandError(f"No bulk operation {pk}.", returncode=EXIT_USAGE)
            operation = advance_bulk_operation(
                pk, seconds=0, batch_size=options["batch_size"], using=using
            )
            while operation.state == BulkState.RUNNING:
                operation = advance_bulk_operation(
                    pk, seconds=5, batch_size=options["batch_size"], using=using
                )
        except DatabaseError as exc:
            raise CommandError(f"The database failed: {exc}", returncode=EXIT_FAILED) from exc
        self.stdout.write(
            f"Bulk operation {pk} ({operation.action}) {operation.state}: "
            f"{operation.done} done, {operation.skipped} skipped of {operation.total} matching."
        )
