"""Option types, exit codes, error mapping and the terminal progress line shared by
jobstate's management commands. (A leading underscore keeps Django from listing this
module as a command.)"""

from __future__ import annotations

import argparse
import json
import unicodedata
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import (
    BaseCommand,
    CommandError,
    CommandParser,
    OutputWrapper,
    SystemCheckError,
)
from django.db import DEFAULT_DB_ALIAS, DatabaseError, ProgrammingError, connections

from jobstate.checks import MAINTENANCE_CHECKS
from jobstate.core.messages import shown
from jobstate.exceptions import (
    ImproperlyConfiguredStore,
    InvalidJobState,
    JobStateError,
    StoreError,
)
from jobstate.stores.contracts.validation import require_text

from ._numbers import option_text, positive_int, positive_seconds, quoted
from ._stops import exit_stopped, interrupted_by_stop_signals

if TYPE_CHECKING:
    from jobstate.maintenance import SweepReport

#: Exit status of a maintenance command when the store or database failed.
EXIT_FAILED = 1
#: Exit status for invalid options or settings (argparse uses it too).
EXIT_USAGE = 2


def checked_name(value: str, *, option: str) -> str:
    """A name option (``--worker-id``, ``--relay-id``, ``--triggered-by``): a non-blank
    string of at most 200 characters that every backend's text columns hold, without a
    control character or a direction override, else exit status 2. Checked in
    ``handle`` rather than by argparse, so ``call_command`` callers get status 2 as well.
    A name is written into log lines and the console: a newline in one would split a
    log line (or forge one), an escape sequence would colour the operator's terminal."""
    try:
        name = require_text(value, field=option)
    except InvalidJobState as exc:
        raise CommandError(str(exc), returncode=EXIT_USAGE) from exc
    odd = next((char for char in name if _control(char)), None)
    if odd is not None:
        raise CommandError(
            f"{option} must not hold a control character, got U+{ord(odd):04X} in "
            f"{shown(ascii(name))}.",
            returncode=EXIT_USAGE,
        )
    return name


def _control(char: str) -> bool:
    # Controls (a newline, a tab, ESC), format characters (the direction overrides and
    # isolates, which reorder the text around them; zero-width characters) and the line
    # and paragraph separators, which end a line of a log as a newline does.
    return unicodedata.category(char) in {"Cc", "Cf", "Zl", "Zp"}


def known_database(alias: str) -> str:
    """``--database``: an alias from ``settings.DATABASES``, else exit status 2."""
    if alias not in connections:
        raise CommandError(
            f"--database {quoted(alias)} is not in settings.DATABASES "
            f"(known: {', '.join(connections)}).",
            returncode=EXIT_USAGE,
        )
    return alias


def backend_named(alias: str) -> Any:
    """``--backend``: the task backend of that ``TASKS`` alias, else exit status 2
    naming the aliases there are."""
    from jobstate.tasks.compat import task_backends

    known = list(task_backends.settings)
    if alias not in known:
        raise CommandError(
            f"--backend {quoted(alias)} is not in settings.TASKS "
            f"(known: {', '.join(known) or 'none'}).",
            returncode=EXIT_USAGE,
        )
    try:
        return task_backends[alias]
    except ImproperlyConfigured as exc:  # its BACKEND does not import
        raise CommandError(f"TASKS[{alias!r}]: {exc}", returncode=EXIT_USAGE) from exc


def command_error(exc: Exception) -> CommandError:
    """The ``CommandError`` (and exit status) for an error a sweep, the relay or a store
    raised: 2 for invalid options or settings, 1 for a database or store failure."""
    if isinstance(exc, ValueError | ImproperlyConfigured | ImproperlyConfiguredStore):
        return CommandError(str(exc), returncode=EXIT_USAGE)
    if isinstance(exc, DatabaseError):
        return CommandError(f"the database failed: {exc}", returncode=EXIT_FAILED)
    return CommandError(str(exc), returncode=EXIT_FAILED)


def _plain(text: str) -> str:
    # Commands style stderr as errors on a terminal; progress is not an error.
    return text


class ProgressLine:
    """A one-line progress display that rewrites itself on a terminal.

    Shown only when ``stream`` is a terminal, so cron mail, logs and pipes (and the
    JSON on stdout) never see it; :meth:`clear` wipes it before the final output.
    """

    def __init__(self, stream: OutputWrapper, *, action: str) -> None:
        self.stream = stream
        self.action = action
        self.enabled = stream.isatty()
        self.shown = False

    def __call__(self, sweep: str, count: int) -> None:
        self.show(f"{sweep}: {count} rows so far")

    def show(self, text: str) -> None:
        """Replace the line with ``<action> <text>`` (on a terminal only)."""
        if not self.enabled:
            return
        self.stream.write(f"\r\033[K{self.action} {text}", style_func=_plain, ending="")
        self.stream.flush()
        self.shown = True

    def clear(self) -> None:
        if self.shown:
            self.stream.write("\r\033[K", style_func=_plain, ending="")
            self.stream.flush()
            self.shown = False


def add_sweep_options(
    parser: argparse.ArgumentParser, *, rows: str, would: str, batch_setting: str
) -> None:
    """The options every sweep command takes: ``--batch-size`` (``rows`` says what one
    batch is, ``batch_setting`` names its default), ``--time-budget``, ``--dry-run``
    (``would`` names what it counts), ``--json`` and ``--database``."""
    parser.add_argument(
        "--batch-size",
        type=positive_int,
        metavar="N",
        help=f"{rows} (default: JOBSTATE['{batch_setting}']).",
    )
    parser.add_argument(
        "--time-budget",
        type=positive_seconds,
        metavar="SECONDS",
        help="Start no new batch of a sweep after this long "
        "(default: JOBSTATE['SWEEP_TIME_BUDGET']).",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help=f"Count what would be {would}; write nothing."
    )
    add_output_options(parser, json="Print every count as one JSON object.")


def add_output_options(
    parser: argparse.ArgumentParser, *, json: str, holding: str = "jobstate's tables"
) -> None:
    """``--json`` (``json`` says what it prints) and ``--database`` (the database
    ``holding`` what the command reads and writes)."""
    parser.add_argument("--json", action="store_true", help=json)
    parser.add_argument(
        "--database",
        default=DEFAULT_DB_ALIAS,
        help=f"The database holding {holding} (default: %(default)s).",
    )


def _database_failure(exc: BaseException) -> bool:
    """Whether a database error is ``exc`` or among its causes."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, DatabaseError):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


def misconfigured_error(alias: str) -> CommandError | None:
    """Exit status 2 when database ``alias``'s settings are wrong (an option the driver
    refuses, a pool whose package is missing): connecting raises the driver's or
    Django's configuration error then, which no wait cures. A database that is down is
    a ``DatabaseError`` and ``None`` here: the worker waits for it."""
    try:
        connections[alias].ensure_connection()
    # The driver refuses an option it cannot read (connect_timeout "x") as a
    # programming error; a server that cannot be reached is an OperationalError.
    except (ProgrammingError, ImproperlyConfigured, ValueError, TypeError) as exc:
        return CommandError(
            f"database {alias!r} cannot be connected to as configured: {exc}",
            returncode=EXIT_USAGE,
        )
    except DatabaseError:
        return None
    return None


def unmigrated_error(alias: str) -> CommandError | None:
    """The error that tells an operator to migrate, when jobstate's migrations are not
    all applied on database ``alias``; ``None`` when they are or that cannot be read."""
    from jobstate.stores.database.figures import pending_jobstate_migrations

    try:
        pending = pending_jobstate_migrations(connections[alias])
    except DatabaseError:
        return None
    if not pending:
        return None
    command = "manage.py migrate" + ("" if alias == DEFAULT_DB_ALIAS else f" --database {alias}")
    return CommandError(
        f"jobstate's tables on database {alias!r} are not migrated ({len(pending)} "
        f"migration(s) not applied, from {pending[0]}): run {command}.",
        returncode=EXIT_FAILED,
    )


def require_migrated(alias: str) -> None:
    """Before a worker or a job run starts (which would log failures of its own before
    the command's error): exit 1 saying to migrate when jobstate's migrations are not
    all applied on database ``alias``, or, on MariaDB/MySQL, when migration 0009's guards
    are missing (``jobstate.E044``, unless silenced): a worker must not claim where the
    per-thread gate or one RUNNING run per overlap key is not enforced."""
    misconfigured = misconfigured_error(alias)
    if misconfigured is not None:
        raise misconfigured
    unmigrated = unmigrated_error(alias)
    if unmigrated is not None:
        raise unmigrated
    unguarded = unguarded_error(alias)
    if unguarded is not None:
        raise unguarded


def unguarded_error(alias: str) -> CommandError | None:
    """``jobstate.E044`` as a command's error, when database ``alias`` lacks what
    migration 0009 adds on MariaDB/MySQL and the host has not silenced the check;
    ``None`` otherwise, also when the catalogue cannot be read (a database that is down
    is the worker's to wait for, not a reason to exit)."""
    from jobstate.checks import server_guard_errors

    try:
        errors = server_guard_errors(alias)
    except DatabaseError:
        return None
    silenced = set(settings.SILENCED_SYSTEM_CHECKS)
    errors = [error for error in errors if error.id not in silenced]
    if not errors:
        return None
    return CommandError(
        " ".join(f"({error.id}) {error.msg} {error.hint}" for error in errors),
        returncode=EXIT_FAILED,
    )


class JobStateCommand(BaseCommand):
    """The base of jobstate's commands: it runs only the system checks that concern a
    maintenance command (:data:`~jobstate.checks.MAINTENANCE_CHECKS`), so a broken
    schedule or another backend's bad options do not stop it; and a failure on a
    database whose jobstate migrations are not applied says to run ``migrate``, instead
    of the driver's "no such table"."""

    requires_system_checks = MAINTENANCE_CHECKS

    #: Whether the options came from the command line, where argparse applied their
    #: types already (:meth:`run_from_argv`); else they came from ``call_command``.
    _parsed_from_argv = False

    #: Whether the command stops on SIGTERM as on Ctrl-C, in one line (:mod:`._stops`).
    #: The worker and the relay turn it off: they stop gracefully on their own.
    stops_on_signals = True
    #: What stays done when the command is stopped, said in its stop line.
    stopped_note = "What it had committed stays done."

    def run_from_argv(self, argv: list[str]) -> None:
        self._parsed_from_argv = True
        if not self.stops_on_signals:
            super().run_from_argv(argv)
            return
        try:
            with interrupted_by_stop_signals():
                super().run_from_argv(argv)
        except KeyboardInterrupt as exc:
            exit_stopped(self.stderr, argv[1], exc, self.stopped_note)

    def execute(self, *args: Any, **options: Any) -> Any:
        if not self._parsed_from_argv:
            options = self._typed_options(options)
        alias = options.get("database") or DEFAULT_DB_ALIAS
        try:
            return super().execute(*args, **options)
        except SystemCheckError as exc:
            # A setting the checks refuse is a usage error, like a bad option: status 2
            # (Django's own status for it is 1, which jobstate's commands keep for a
            # database or store that failed). Still a SystemCheckError: Django prints
            # that one as it is, where a CommandError would be prefixed a second time.
            raise SystemCheckError(str(exc), returncode=EXIT_USAGE) from exc
        except (CommandError, DatabaseError, StoreError) as exc:
            if not _database_failure(exc) or alias not in connections:
                raise
            unmigrated = unmigrated_error(alias)
            if unmigrated is None:
                raise
            raise unmigrated from exc

    def _typed_options(self, options: dict[str, Any]) -> dict[str, Any]:
        """The options with every text or number put through its option's type, as
        the command line would have. ``call_command(name, interval=-1)`` hands its
        keyword values to the command as they are, past argparse's types: without this
        a wrong value fails deep in the command with a bare ``AttributeError`` or
        ``TypeError``, where from the command line it is refused with status 2. A value
        of the type an option produces (a ``timedelta``, a list) is the caller's own and
        left to the command's checks."""
        name = type(self).__module__.rsplit(".", 1)[-1]
        typed = dict(options)
        for action in self.create_parser("manage.py", name)._actions:
            value = typed.get(action.dest)
            if not callable(action.type) or not isinstance(value, str | int | float):
                continue
            try:
                typed[action.dest] = action.type(option_text(value))
            except argparse.ArgumentTypeError as exc:
                flag = max(action.option_strings, key=len, default=action.dest)
                raise CommandError(f"argument {flag}: {exc}", returncode=EXIT_USAGE) from exc
        return typed


class SweepCommand(JobStateCommand):
    """The base of the sweep commands (``reap_stale``, ``prune_jobstate``): the shared
    options, a progress line on stderr while the sweeps run, a failure turned into its
    exit status, and the report printed as one JSON object (``--json``) or as lines.
    A subclass says what it sweeps."""

    stopped_note = "Each batch it finished is committed; run it again to do the rest."
    #: The progress line's verb ("Reaping").
    action = ""
    #: What one batch is, what a dry run counts and the setting of the batch's default
    #: size (see :func:`add_sweep_options`).
    rows = ""
    would = ""
    batch_setting = ""

    def add_arguments(self, parser: CommandParser) -> None:
        self.add_sweep_arguments(parser)
        add_sweep_options(
            parser, rows=self.rows, would=self.would, batch_setting=self.batch_setting
        )

    def add_sweep_arguments(self, parser: CommandParser) -> None:
        """The command's own options, listed before the shared ones."""

    def sweep(self, options: dict[str, Any], on_batch: ProgressLine) -> SweepReport:
        """Run the sweeps as ``options`` say, reporting each batch to ``on_batch``."""
        raise NotImplementedError

    def report_lines(self, report: SweepReport, *, verbosity: int) -> list[str]:
        """What the command prints of ``report`` without ``--json``."""
        raise NotImplementedError

    def handle(self, *args: Any, **options: Any) -> None:
        progress = ProgressLine(self.stderr, action=self.action)
        try:
            report = self.sweep(options, progress)
        except (JobStateError, ImproperlyConfigured, DatabaseError) as exc:
            raise command_error(exc) from exc
        finally:
            progress.clear()
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict()))
            return
        for line in self.report_lines(report, verbosity=options["verbosity"]):
            self.stdout.write(line)
