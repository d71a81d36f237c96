"""``manage.py enqueue_due_schedules``: one evaluation of the periodic schedules, for
cron (a deployment whose ``jobstate_worker`` processes evaluate them needs none).

It brings the schedule rows in step with ``JOBSTATE["SCHEDULES"]``, then enqueues every
due slot (:func:`jobstate.schedules.enqueue_due`). Run it as often as you like, from as
many machines as you like: each slot is enqueued once. Prints nothing when all went
well, so cron mails only on trouble (``--verbosity 2``: one line per occurrence it
enqueued; ``--json``: one object).

A broken schedule (a declaration ``manage.py check`` refuses, a task that no longer
imports) does not stop the others: they are enqueued, the broken one is named on stderr
and the exit status is 1.

Exit status: 0 done; 1 the database failed or a schedule could not be enqueued (named
on stderr; the others were); 2 invalid options or settings.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from jobstate.exceptions import InvalidJobState, JobStateError
from jobstate.schedules import evaluate_schedules, sync_schedules

from ._common import EXIT_FAILED, JobStateCommand, add_output_options, command_error, known_database


class Command(JobStateCommand):
    help = (
        "Enqueue the due slots of the periodic schedules (JOBSTATE['SCHEDULES']) once; "
        "safe to run from cron on several machines at once. Exit status: 0 done, 1 a "
        "database failure or a schedule that could not be enqueued, 2 invalid options or "
        "settings."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        add_output_options(parser, json="Print what was enqueued as one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        using = known_database(options["database"])
        try:
            sync_schedules(using=using)
            result = evaluate_schedules(using=using, by="enqueue_due_schedules")
        except (InvalidJobState, ImproperlyConfigured) as exc:
            raise command_error(exc) from exc
        except (JobStateError, DatabaseError) as exc:
            raise CommandError(
                f"the schedules were not evaluated: {command_error(exc)}", returncode=EXIT_FAILED
            ) from exc
        if options["json"]:
            self.stdout.write(
                json.dumps(
                    {
                        "now": result.now.isoformat(),
                        "enqueued": [
                            {
                                "schedule": item.schedule,
                                "slot": item.slot.isoformat(),
                                "result_id": item.result_id,
                            }
                            for item in result.enqueued
                        ],
                        "next_slot": None
                        if result.next_slot is None
                        else result.next_slot.isoformat(),
                        "failures": result.failures,
                    }
                )
            )
        elif options["verbosity"] >= 2:
            for item in result.enqueued:
                self.stdout.write(
                    f"Enqueued {item.schedule} for {item.slot.isoformat()} as {item.result_id}"
                )
        if result.failures:
            raise CommandError(
                " ".join(result.failures.values()),
                returncode=EXIT_FAILED,
            )
