"""``manage.py jobstate_ready``: a readiness probe for containers and orchestrators.

Exit status 0 when the database answers, every jobstate migration is applied and the
tables exist (:meth:`~jobstate.stores.base.StateStore.schema_readiness`); 1 otherwise,
with the reason on stderr. Any failure, including an unknown ``--database`` or a store
that cannot be loaded, answers 1 without a traceback: a probe must never mistake an
error for readiness. Only unparsable options exit 2 (argparse). Silent when ready,
unless ``--verbosity 2``; ``--json`` prints the
:class:`~jobstate.stores.base.Readiness` as one JSON object in both cases.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS

from jobstate.stores import get_state_store
from jobstate.stores.base import Readiness

from ._common import EXIT_FAILED


def check_readiness(using: str) -> Readiness:
    """The store's readiness on database ``using``; never raises."""
    try:
        return get_state_store(using=using).schema_readiness()
    # Fail closed: whatever went wrong (a store path that does not import, a store that
    # raises), this process is not ready.
    except Exception as exc:
        detail = f"the state store failed: {type(exc).__name__}: {exc}"
        return Readiness(
            ready=False, database="failed", migrations="failed", pending=0, detail=detail
        )


class Command(BaseCommand):
    help = (
        "Exit 0 when jobstate's database answers and its migrations are applied, else 1 "
        "with the reason on stderr. For container readiness probes."
    )
    # A probe answers about the database only, fast: the project-wide system checks
    # would slow every probe and fail it for reasons that do not concern readiness.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", help="Print the readiness as one JSON object."
        )
        parser.add_argument(
            "--database",
            default=DEFAULT_DB_ALIAS,
            help="The database holding jobstate's tables (default: %(default)s).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        readiness = check_readiness(options["database"])
        if options["json"]:
            self.stdout.write(json.dumps(asdict(readiness)))
        if not readiness.ready:
            raise CommandError(f"jobstate is not ready: {readiness.detail}", returncode=EXIT_FAILED)
        if options["verbosity"] >= 2 and not options["json"]:
            self.stdout.write("jobstate is ready.")
