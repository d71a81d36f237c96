"""``manage.py jobstate_ready``: a readiness probe for containers and orchestrators.

Exit status 0 when the database answers, every jobstate migration is applied, the
tables exist (:meth:`~jobstate.stores.base.StateStore.schema_readiness`) and none of
jobstate's system checks reports an error (a bad setting, schedule, task backend or
operations module); 1 otherwise, with the reason on stderr, once. Any failure,
including an unknown ``--database`` or a store that cannot be loaded, answers 1 without
a traceback: a probe must never mistake an error for readiness. Only unparsable options
exit 2 (argparse). Silent when ready, unless ``--verbosity 2``; ``--json`` prints the
:class:`~jobstate.stores.base.Readiness` as one JSON object in both cases.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.checks import run_checks
from django.core.management.base import CommandError, CommandParser

from jobstate.checks import JOBSTATE_CHECKS
from jobstate.stores import get_state_store
from jobstate.stores.base import Readiness

from ._common import EXIT_FAILED, JobStateCommand, add_output_options


def check_errors() -> list[str]:
    """The errors jobstate's system checks report (settings, databases, task backends,
    schedules, operations modules), silenced ones left out; ``[]`` when none."""
    return [
        f"{message.id}: {message.msg}"
        for message in run_checks(tags=JOBSTATE_CHECKS)
        if message.is_serious() and not message.is_silenced()
    ]


def check_readiness(using: str) -> Readiness:
    """The store's readiness on database ``using``, then jobstate's system checks; never
    raises."""
    try:
        readiness = get_state_store(using=using).schema_readiness()
        if not readiness.ready:
            return readiness
        errors = check_errors()
    # Fail closed: whatever went wrong (a store path that does not import, a store that
    # raises), this process is not ready.
    except Exception as exc:
        detail = f"the state store failed: {type(exc).__name__}: {exc}"
        return Readiness(
            ready=False, database="failed", migrations="failed", pending=0, detail=detail
        )
    if not errors:
        return readiness
    return Readiness(
        ready=False,
        database=readiness.database,
        migrations=readiness.migrations,
        pending=0,
        detail=f"{len(errors)} system check error(s): {' '.join(errors)}",
    )


class Command(JobStateCommand):
    help = (
        "Exit 0 when jobstate's database answers, its migrations are applied and its "
        "system checks report no error, else 1 with the reason on stderr. For container "
        "readiness probes."
    )
    # Not the project-wide system checks, which would fail the probe for reasons that do
    # not concern jobstate; jobstate's own run in check_readiness, whose errors are a
    # reason like any other.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add_output_options(parser, json="Print the readiness as one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        readiness = check_readiness(options["database"])
        if options["json"]:
            self.stdout.write(json.dumps(asdict(readiness)))
        if not readiness.ready:
            hint = "; run manage.py migrate" if readiness.migrations == "pending" else ""
            raise CommandError(
                f"jobstate is not ready: {readiness.detail}{hint}", returncode=EXIT_FAILED
            )
        if options["verbosity"] >= 2 and not options["json"]:
            self.stdout.write("jobstate is ready.")
