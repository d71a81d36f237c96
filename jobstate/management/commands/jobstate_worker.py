"""``manage.py jobstate_worker``: run the django.tasks tasks of a ``JobStateBackend``.

Any number of workers may run at once, on one machine or several; each task runs once
at a time (at least once overall: a task whose worker dies runs again). The worker logs
a banner and one line per task attempt on the ``jobstate.tasks.worker`` logger: at INFO by
default (``-v 0``: warnings only, ``-v 2``: debug), on stderr unless the project's
``LOGGING`` already sends that logger somewhere.

Shutdown: the first SIGTERM or SIGINT stops claiming, lets the running tasks finish
within ``--grace`` seconds, hands back the rest and exits 0. A second signal exits at
once with status 128 + the signal number; the tasks it ran are recovered when their
leases run out.

``--reload`` (on by default when ``settings.DEBUG``, except with ``--batch``;
``--no-reload`` turns it off) runs the worker in a child process and starts a fresh one
when the code changes, after the running tasks have finished (within ``--grace``); see
:mod:`jobstate.tasks.worker.reloading`.

Every worker also evaluates the periodic schedules (``JOBSTATE["SCHEDULES"]``) at each
slot, unless ``--no-schedules``: however many workers do, each slot is enqueued once.

Each worker registers itself on the console's Workers page, beats on its lease-renewal
beat and records that it stopped on a graceful exit; it claims nothing of a queue
paused in the console (the Queues page) until the queue is resumed.

Exit status: 0 the worker stopped as asked (``--batch``, ``--max-tasks``, a signal);
1 the database or the store failed in a way retrying cannot cure; 2 invalid options or
settings; 4 a task ran past ``TIMEOUT`` and its thread did not stop within ``--grace``
of the interrupt, so the worker stopped for its supervisor to restart it (a thread
cannot be killed, only its process); 128 + the signal's number (130 for SIGINT, 143
for SIGTERM) a second signal made it exit at once.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser
from django.db import DEFAULT_DB_ALIAS, DatabaseError

from jobstate.core.conf import jobstate_settings
from jobstate.exceptions import ImproperlyConfiguredStore, InvalidJobState, JobStateError

from ._common import (
    EXIT_FAILED,
    EXIT_USAGE,
    JobStateCommand,
    backend_named,
    checked_name,
    command_error,
    require_migrated,
)
from ._numbers import decimal, integer, interval_seconds, plain, positive_int, quoted

#: The worker stopped because a timed-out task's thread did not stop (3 is the
#: reloader's "restart me").
EXIT_STUCK = 4
#: The default ``--interval``, and the shorter one of a worker that cannot LISTEN behind
#: a pooler in transaction mode (``JOBSTATE["CONNECTION_POOLER"]``): polling is then how
#: it learns of a new task.
DEFAULT_INTERVAL = 1.0
POOLED_INTERVAL = 0.25
#: The loggers of what runs in a worker process: its own, and the schedules' it
#: evaluates (a broken schedule's line).
_WORKER_LOGGERS = ("jobstate.worker", "jobstate.schedules")
#: Most threads one worker process runs tasks in.
CONCURRENCY_LIMIT = 1000
#: Longest ``--grace``: a day.
GRACE_LIMIT_SECONDS = 86_400.0


def _concurrency(text: str) -> int:
    value = integer(text)
    if not 1 <= value <= CONCURRENCY_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be from 1 to {CONCURRENCY_LIMIT}, got {plain(value)}"
        )
    return value


def _grace(text: str) -> float:
    seconds = decimal(text, unit="seconds")
    if not 0 <= seconds <= GRACE_LIMIT_SECONDS:
        raise argparse.ArgumentTypeError(
            f"must be from 0 to {GRACE_LIMIT_SECONDS:g} seconds, got {plain(text)}"
        )
    return seconds


def _queue_names(text: str) -> list[str] | None:
    if text.strip() == "*":
        return None
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(
            f"{quoted(text)} is not a comma-separated list of queue names (or '*')"
        )
    return list(dict.fromkeys(names))


def _default_interval() -> float:
    pooled = jobstate_settings.CONNECTION_POOLER == "transaction"
    return POOLED_INTERVAL if pooled else DEFAULT_INTERVAL


class _LateSchedulePass:
    """The worker's evaluation of the schedules, importing :mod:`jobstate.schedules` on
    its first call: the worker makes that call after its first claim, so a worker's
    first task does not wait for the schedules' code to load."""

    def __init__(self, *, using: str, worker_id: str) -> None:
        self.using = using
        self.worker_id = worker_id
        self._pass: Callable[[], tuple[int, float]] | None = None

    def __call__(self) -> tuple[int, float]:
        if self._pass is None:
            from jobstate.schedules import WorkerSchedulePass

            self._pass = WorkerSchedulePass(using=self.using, worker_id=self.worker_id)
        return self._pass()


class Command(JobStateCommand):
    # Its own stop: the running tasks finish first (jobstate.tasks.worker).
    stops_on_signals = False
    help = (
        "Run the tasks of a jobstate task backend (django.tasks) until stopped: claim, "
        "run in threads, retry, time out, recover crashed workers' tasks. The first "
        "SIGTERM/SIGINT finishes the running tasks (up to --grace) and exits 0; a second "
        "exits at once. Exit status: 0 stopped as asked, 1 database or store failure, "
        "2 invalid options or settings, 4 a timed-out task's thread did not stop, "
        "128 + the signal's number (130 SIGINT, 143 SIGTERM) a second signal."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--backend",
            default="default",
            metavar="ALIAS",
            help="The TASKS alias whose tasks to run (default: %(default)s).",
        )
        parser.add_argument(
            "--queue-name",
            type=_queue_names,
            default=["default"],
            metavar="NAMES",
            help="Comma-separated queues to run, or '*' for every queue of the backend "
            "(default: default).",
        )
        parser.add_argument(
            "--concurrency",
            type=_concurrency,
            default=1,
            metavar="N",
            help="Tasks run at once, each in a thread of this process (default: 1).",
        )
        parser.add_argument(
            "--batch",
            action="store_true",
            help="Exit once no task of the queues is ready and none of this worker's is "
            "running (tasks delayed to later are not waited for).",
        )
        parser.add_argument(
            "--max-tasks",
            type=positive_int,
            metavar="N",
            help="Exit after starting N tasks, once they have finished.",
        )
        parser.add_argument(
            "--interval",
            type=interval_seconds,
            metavar="SECONDS",
            help="How often an idle worker looks for tasks (default: 1; 0.25 when "
            "JOBSTATE['CONNECTION_POOLER'] is 'transaction'). On PostgreSQL a new task also "
            "wakes it at once, unless JOBSTATE['LISTEN_NOTIFY'] is False or the worker is "
            "behind a pooler in transaction mode.",
        )
        parser.add_argument(
            "--worker-id",
            metavar="ID",
            help="The name recorded in the tasks this worker runs; unique among running "
            "workers (default: <host>:<pid>:<random>).",
        )
        parser.add_argument(
            "--grace",
            type=_grace,
            default=30.0,
            metavar="SECONDS",
            help="On SIGTERM/SIGINT, how long the running tasks may take to finish before "
            "they are handed back, or failed when no attempt is left (default: 30). Keep "
            "it below your supervisor's stop "
            "timeout. Also how long a task interrupted past TIMEOUT has to stop before the "
            "worker exits with status 4.",
        )
        parser.add_argument(
            "--no-schedules",
            action="store_true",
            help="Do not evaluate the periodic schedules of JOBSTATE['SCHEDULES'] (by "
            "default every worker does; each slot is enqueued once however many do).",
        )
        parser.add_argument(
            "--reload",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="Start a fresh worker when the code changes, once the running tasks have "
            "finished (default: on when settings.DEBUG, except with --batch). For "
            "development; --no-reload turns it off.",
        )

    #: How many tasks the worker gave up on, once it ran: ``run_from_argv`` reads it.
    _gave_up_on_tasks = 0
    #: How many announcements the worker could not make as it stopped (see
    #: :mod:`~jobstate.tasks.worker.announcer`).
    _unannounced = 0

    def run_from_argv(self, argv: list[str]) -> None:
        """``manage.py jobstate_worker``: once the worker has stopped, a thread of a
        task it gave up on no longer holds the process (see
        :func:`~jobstate.tasks.worker.shutdown.exit_leaving_given_up_threads`)."""
        try:
            super().run_from_argv(argv)
        except SystemExit as exc:
            self._leave_given_up_threads(exc.code)
            raise
        self._leave_given_up_threads(0)

    def _leave_given_up_threads(self, code: Any) -> None:
        if not (self._gave_up_on_tasks or self._unannounced):
            return
        from jobstate.tasks.worker.shutdown import (
            exit_leaving_given_up_threads,
            exit_past_a_stuck_announcer,
        )

        status = code if isinstance(code, int) else int(code is not None)
        if self._unannounced:
            exit_past_a_stuck_announcer(status)
        exit_leaving_given_up_threads(status, self._gave_up_on_tasks)

    def handle(self, *args: Any, **options: Any) -> None:
        # Imported here, so the other commands work on Django 5.2 without the backport;
        # the reloader only when asked for, the schedules once the first claim is made
        # (_LateSchedulePass): a worker imports what its first claim needs first.
        from jobstate.tasks.backend import JobStateBackend
        from jobstate.tasks.worker import TaskWorker, WorkerConfig, default_worker_id

        self._configure_logging(options["verbosity"])
        # Before the reloader starts a child that would refuse it in turn.
        worker_id = options["worker_id"]
        if worker_id is not None:
            checked_name(worker_id, option="--worker-id")
        reload = options["reload"]
        if reload is None:
            reload = bool(settings.DEBUG) and not options["batch"]
        elif reload and options["batch"]:
            raise CommandError(
                "--reload and --batch cannot be used together: a --batch worker exits once "
                "its queues are empty.",
                returncode=EXIT_USAGE,
            )
        if reload:
            from jobstate.tasks.worker.reloading import (
                RELOAD_EXIT,
                CodeWatcher,
                is_reloaded_child,
                supervise,
            )

            if not is_reloaded_child():
                status = supervise()
                if status:
                    raise SystemExit(status)
                return
        backend = backend_named(options["backend"])
        if not isinstance(backend, JobStateBackend):
            raise CommandError(
                f"TASKS[{options['backend']!r}] is {type(backend).__module__}."
                f"{type(backend).__qualname__}, not jobstate.tasks.JobStateBackend; "
                "jobstate_worker runs only jobstate's tasks.",
                returncode=EXIT_USAGE,
            )
        errors = [message for message in backend.configuration_messages() if message.is_serious()]
        if errors:
            raise CommandError(
                " ".join(f"({message.id}) {message.msg}" for message in errors),
                returncode=EXIT_USAGE,
            )
        queues = options["queue_name"]
        unknown = [name for name in queues or () if backend.queues and name not in backend.queues]
        if unknown:
            raise CommandError(
                f"--queue-name names {', '.join(map(quoted, unknown))}, not in "
                f"TASKS[{backend.alias!r}]['QUEUES'] ({', '.join(sorted(backend.queues))}).",
                returncode=EXIT_USAGE,
            )
        worker_id = default_worker_id() if worker_id is None else worker_id
        interval = options["interval"]
        require_migrated(DEFAULT_DB_ALIAS)
        try:
            config = WorkerConfig(
                backend=backend.alias,
                queues=None if queues is None else tuple(queues),
                concurrency=options["concurrency"],
                batch=options["batch"],
                max_tasks=options["max_tasks"],
                interval=_default_interval() if interval is None else interval.total_seconds(),
                worker_id=worker_id,
                grace=options["grace"],
                schedules=not options["no_schedules"],
            )
            worker = TaskWorker(
                config, backend, _LateSchedulePass(using=config.using, worker_id=worker_id)
            )
            watcher = CodeWatcher(worker.request_stop) if reload else None
            summary = worker.run()
            self._gave_up_on_tasks = summary.interrupted + summary.stuck
            self._unannounced = summary.unannounced
            if watcher is not None:
                watcher.stop()
        except (InvalidJobState, ImproperlyConfigured, ImproperlyConfiguredStore) as exc:
            raise command_error(exc) from exc
        except (JobStateError, DatabaseError) as exc:
            raise CommandError(
                f"the worker stopped: {command_error(exc)}", returncode=EXIT_FAILED
            ) from exc
        if summary.stuck:
            raise CommandError(
                f"the worker stopped: {summary.stuck} task(s) ran past TIMEOUT (or were "
                "cancelled) and their thread did not stop within --grace of the interrupt; "
                "restart the worker",
                returncode=EXIT_STUCK,
            )
        if watcher is not None and watcher.changed:
            raise SystemExit(RELOAD_EXIT)

    def _configure_logging(self, verbosity: int) -> None:
        """Show the worker's log, and the schedules' it evaluates, at the level
        ``verbosity`` asks for, unless the project configured those loggers itself;
        print them on stderr, with the time and level, when no handler up the logger
        tree would."""
        level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        for name in _WORKER_LOGGERS:
            logger = logging.getLogger(name)
            if logger.level == logging.NOTSET:
                logger.setLevel(level)
            if not logger.hasHandlers():
                logger.addHandler(handler)
