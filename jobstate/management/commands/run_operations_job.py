"""``manage.py run_operations_job KEY [--input JSON]``: run one operations job now.

Exit status: 0 when the run SUCCEEDED or was SKIPPED (another run held the key), 1 when
it FAILED or TIMED_OUT or the run store failed, 2 for an unknown job, rejected input, a
module of ``JOBSTATE["OPERATIONS_JOB_MODULES"]`` that does not import (``--list`` too), or
any other bad option (a ``--database`` not in ``settings.DATABASES``, a blank or
over-long ``--triggered-by``, ``--list`` together with a job to run).
Quiet on success (cron-friendly) unless ``--verbosity 2`` or ``--json``.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from jobstate.core.jsonvalues import ensure_json
from jobstate.exceptions import (
    InvalidPayload,
    JobStateError,
    OperationsJobInputError,
    StoreError,
    UnknownOperationsJob,
)
from jobstate.operations.job_registry import operations_module_problems
from jobstate.operations.job_runner import JobExecutionResult, JobRunner, registry
from jobstate.stores import get_run_store
from jobstate.stores.base import Trigger

from ._common import (
    EXIT_FAILED,
    EXIT_USAGE,
    JobStateCommand,
    add_output_options,
    checked_name,
    known_database,
    require_migrated,
)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_input(text: str | None) -> Any:
    """The ``--input`` value as JSON (``None`` when absent). Strict: ``NaN`` and
    ``Infinity`` are rejected like any other invalid JSON."""
    if text is None:
        return None
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise CommandError(
            "--input is nested more than 31 levels deep (lists and objects), too deep to read.",
            returncode=EXIT_USAGE,
        ) from exc
    except ValueError as exc:
        raise CommandError(
            f"--input is not valid JSON ({exc}). Pass one JSON value, for example "
            """--input '{"seconds": 2}'.""",
            returncode=EXIT_USAGE,
        ) from exc


class Command(JobStateCommand):
    stopped_note = "A run it had started is recorded as failed (interrupted), which frees its key."
    help = (
        "Run one registered operations job now and record the run. Exit status: 0 when it "
        "succeeded or was skipped (another run held its key), 1 when it failed or timed "
        "out, 2 for an unknown job or rejected input."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "key", nargs="?", metavar="KEY", help="The key of the job to run (see --list)."
        )
        parser.add_argument(
            "--input", metavar="JSON", help="The job's input as one JSON value (an object)."
        )
        parser.add_argument(
            "--triggered-by",
            metavar="WHO",
            help="Who started the run (stored on the row; at most 200 characters).",
        )
        add_output_options(
            parser, json="Print the result (or the job list) as JSON.", holding="the run records"
        )
        parser.add_argument(
            "--list", action="store_true", help="List the registered jobs and exit."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        problems = operations_module_problems()
        if problems:
            raise CommandError(" ".join(problems), returncode=EXIT_USAGE)
        try:
            registry.autodiscover()
        # An installed app's ``operations`` module that raises as it runs (a declaration
        # refused as it registers, among others) does not import either.
        except Exception as exc:
            raise CommandError(
                f"An installed app's operations module does not import: "
                f"{type(exc).__name__}: {exc}",
                returncode=EXIT_USAGE,
            ) from exc
        if options["list"]:
            given = [
                name
                for name, option in (
                    ("KEY", "key"),
                    ("--input", "input"),
                    ("--triggered-by", "triggered_by"),
                )
                if options[option] is not None
            ]
            if given:
                raise CommandError(
                    f"--list runs nothing, so it takes no {' or '.join(given)}.",
                    returncode=EXIT_USAGE,
                )
            self._list(as_json=options["json"])
            return
        key = options["key"]
        if not key:
            raise CommandError(
                "Name the job to run: run_operations_job KEY (see --list).", returncode=EXIT_USAGE
            )
        job_input = parse_input(options["input"])
        who = options["triggered_by"]
        if who is not None:
            checked_name(who, option="--triggered-by")
        trigger = Trigger("CLI", triggered_by=who)
        using = known_database(options["database"])
        try:
            # Checked here as the runner will, so a bad job or input exits 2 before the
            # database is asked whether it is migrated.
            job = registry.get(key)
            ensure_json(job_input, field=f"{job.key}: input")
            job.parse_input(job_input)
            require_migrated(using)
            runner = JobRunner(store=get_run_store(using=using))
            result = runner.execute(key, job_input, trigger)
        except UnknownOperationsJob as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        except (OperationsJobInputError, InvalidPayload) as exc:
            raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
        except StoreError as exc:
            cause = exc.__cause__
            detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
            raise CommandError(f"{exc}{detail}", returncode=EXIT_FAILED) from exc
        except JobStateError as exc:
            raise CommandError(str(exc), returncode=EXIT_FAILED) from exc
        self._report(result, as_json=options["json"], verbosity=options["verbosity"])

    def _list(self, *, as_json: bool) -> None:
        jobs = list(registry)
        if as_json:
            entries = [
                {
                    "key": job.key,
                    "overlap": job.overlap,
                    "timeout_seconds": job.timeout.total_seconds() if job.timeout else None,
                    "takes_input": job.input_schema is not None,
                    "description": job.description,
                }
                for job in jobs
            ]
            self.stdout.write(json.dumps(entries, indent=2))
            return
        width = max((len(job.key) for job in jobs), default=0)
        for job in jobs:
            self.stdout.write(f"{job.key:<{width}}  {job.overlap:<6}  {job.description}".rstrip())

    def _report(self, result: JobExecutionResult, *, as_json: bool, verbosity: int) -> None:
        if as_json:
            self.stdout.write(json.dumps(result.as_dict(), indent=2))
        line = (
            f"{result.job_key} {result.status.value} in {result.duration_ms} ms "
            f"(run {result.run_id}, {result.recorded})"
        )
        if result.recorded != "settled":
            self.stderr.write(
                f"{line}: the outcome was not recorded as above; see the run's row for the "
                "stored outcome."
            )
        if not result.ok:
            first_line = (result.error or "").splitlines()[0:1]
            raise CommandError(
                f"{line}: {first_line[0] if first_line else result.status.value}",
                returncode=EXIT_FAILED,
            )
        if verbosity >= 2 and not as_json:
            self.stdout.write(line)
