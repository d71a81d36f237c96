"""``manage.py jobstate_metrics``: print the operational metrics once.

Prometheus text by default (the same exposition as the metrics endpoint, for the node
exporter's textfile collector or a push gateway); ``--json`` prints the snapshot
(:class:`~jobstate.stores.base.JobOperationalMetrics`) as one JSON object.

Exit status: 0 printed, 1 the database or store failed (nothing is printed on stdout, so
a half-written file never looks like a scrape of zeros), 2 invalid options or settings.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandParser
from django.db import DatabaseError

from jobstate.exceptions import JobStateError
from jobstate.observability.metrics import render_metrics
from jobstate.stores import get_state_store

from ._common import JobStateCommand, add_output_options, command_error, known_database


class Command(JobStateCommand):
    help = (
        "Print jobstate's operational metrics: Prometheus text, or --json for the snapshot. "
        "Exit status: 0 printed, 1 database or store failure, 2 invalid options or settings."
    )
    # Read-only and often scheduled every few seconds: skip the project-wide system checks.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        add_output_options(parser, json="Print the snapshot as one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            store = get_state_store(using=known_database(options["database"]))
            if options["json"]:
                text = json.dumps(asdict(store.operational_metrics_snapshot()))
            else:
                text = render_metrics(store).decode("utf-8").rstrip("\n")
        except (JobStateError, ImproperlyConfigured, DatabaseError) as exc:
            raise command_error(exc) from exc
        self.stdout.write(text)
