"""``manage.py deliver_notifications``: run the outbox relay, once or in a loop.

One pass by default (:func:`jobstate.outbox.relay.deliver_notifications`): claim the due
notifications, send each through its channel, record each attempt. Fit for cron; prints
nothing when nothing was due. ``--loop`` keeps relaying: the next pass starts at once
while passes come back full, otherwise after ``--interval`` seconds. Any number of relays
may run at once, on one machine or several.

Shutdown: the first SIGTERM or SIGINT lets the pass in progress finish the sends of the
notifications it has already claimed (at most ``--limit``, and a pass stops sending once
half of ``OUTBOX_LEASE`` is spent), then the command claims nothing more and exits 0. A
second signal exits at once with status 128 + the signal number, saying so on stderr;
what that pass had claimed but not settled is due again when its lease ends. A signal
the process was started ignoring stays ignored (a background job of a shell script
ignores SIGINT; see :mod:`jobstate.core.stop_signals`).

Exit status: 0 the relay ran, whatever the receivers answered (delivered, failed and
scheduled for a retry, dead-lettered, or left for the next pass); 1 the database or the
store failed; 2 invalid options or settings. Dead letters do not change the status: a
receiver that refuses a notification is the receiver's failure, recorded in the
notification, its attempts and a ``delivery_error`` audit entry. The command prints a
line naming them, so cron mails it.

With ``--loop`` the relay rides out a database restart: a pass that fails with a
retryable store error (the database unavailable, a timeout, a conflict; see
:mod:`jobstate.stores.errors`) is reported on stderr and tried again after
``--interval``, doubled for each failure in a row up to 30 seconds; the rows it held are
due again when their lease ends, and the dead connection has been dropped, so the next
pass reconnects. Any other failure ends the loop with status 1, for the process
supervisor to restart it.

A ``--loop`` relay registers itself on the console's Workers page (kind ``relay``, lease
``OUTBOX_LEASE``) under the id every one of its passes records in the rows, their attempts
and its log lines (its ``--relay-id``, or ``<host>:<pid>:<random>`` drawn once), beats
after its passes (at most every quarter of the lease, so an idle loop does not write
every second) and says it stopped when it exits on a signal.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, fields
from types import FrameType
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import WorkerKind, WorkerRegistration
from jobstate.core.stop_signals import StopAtOnce, handled_stop_signals
from jobstate.core.wakeup import Wakeup
from jobstate.exceptions import JobStateError, StoreError
from jobstate.outbox.relay import DeliveryReport, default_relay_id, deliver_notifications
from jobstate.stores import get_state_store
from jobstate.stores.base import StateStore

from ._common import (
    EXIT_USAGE,
    JobStateCommand,
    ProgressLine,
    add_output_options,
    checked_name,
    command_error,
    known_database,
)
from ._numbers import interval_seconds, positive_int
from ._stops import deferred_stop_signals

#: The outcome counters of a pass, in the order a summary names them.
OUTCOMES: tuple[tuple[str, str], ...] = (
    ("delivered", "delivered"),
    ("retrying", "failed and will be retried"),
    ("dead", "dead-lettered"),
    ("superseded", "taken over by another relay"),
    ("unsent", "left for the next pass"),
)
_COUNTERS = [f.name for f in fields(DeliveryReport) if f.name != "relay_id"]
#: Longest wait of the loop between two failed passes (unless --interval is longer).
_RETRY_CAP_SECONDS = 30.0
#: Enough doublings to reach the cap from any interval worth giving.
_BACKOFF_DOUBLINGS = 20
#: The loop's beat: at most every this share of OUTBOX_LEASE, and at most this long.
_BEAT_SHARE = 4
_BEAT_CAP_SECONDS = 30.0


def describe(counts: Mapping[str, int]) -> str:
    """One line saying what happened to the claimed notifications."""
    claimed = counts["claimed"]
    if not claimed:
        return "Nothing was due."
    noun = "notification" if claimed == 1 else "notifications"
    parts = [f"{counts[key]} {words}" for key, words in OUTCOMES if counts[key]]
    return f"Claimed {claimed} {noun}: {', '.join(parts)}."


class Command(JobStateCommand):
    # Its own stop: a pass finishes the sends it claimed, with --loop or without.
    stops_on_signals = False
    help = (
        "Deliver due notifications from the outbox: one relay pass, or --loop until "
        "SIGTERM/SIGINT (the pass in progress finishes its claimed sends; a second signal "
        "stops at once). Quiet when nothing was due. Exit status: 0 the relay ran (dead "
        "letters included), 1 database or store failure, 2 invalid options or settings."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--loop", action="store_true", help="Keep relaying until SIGTERM or SIGINT."
        )
        parser.add_argument(
            "--interval",
            type=interval_seconds,
            metavar="SECONDS",
            help="With --loop: the wait after a pass that found less than a full batch "
            "(default: 1).",
        )
        parser.add_argument(
            "--limit",
            type=positive_int,
            metavar="N",
            help="Notifications one pass claims (default: JOBSTATE['OUTBOX_BATCH_SIZE']).",
        )
        parser.add_argument(
            "--relay-id",
            metavar="ID",
            help="The name this relay records in the rows and their attempts; it must be "
            "unique among running relays (default: <host>:<pid>:<random>, new each pass; "
            "with --loop, one for the whole loop, its name on the Workers page).",
        )
        add_output_options(
            parser,
            json="Print the pass's counts (with --loop: the totals at exit) as one JSON object.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        if options["interval"] is not None and not options["loop"]:
            raise CommandError("--interval needs --loop.", returncode=EXIT_USAGE)
        if options["relay_id"] is not None:
            checked_name(options["relay_id"], option="--relay-id")
        try:
            store = get_state_store(using=known_database(options["database"]))
        except (JobStateError, ImproperlyConfigured) as exc:
            raise command_error(exc) from exc
        try:
            if options["loop"]:
                self.relay_loop(store, **options)
                return
            with deferred_stop_signals() as received:
                report = self.relay_pass(store, **options)
        except StopAtOnce as stop:
            # The second signal, which does not wait for the sends: say so, as the
            # worker does, and what becomes of the rows the pass held.
            signum = int(stop.code or 0) - 128
            self.stderr.write(
                f"deliver_notifications: {signal.Signals(signum).name} again: stopped at "
                "once. What the pass had claimed and not sent is due again when its lease "
                "ends."
            )
            raise
        if received:
            self.stderr.write(
                f"Stopped by {signal.Signals(received[0]).name} after the pass: it sent "
                "what it had claimed."
            )
        if options["json"]:
            self.stdout.write(json.dumps(asdict(report)))
        elif report.claimed or options["verbosity"] >= 2:
            self.stdout.write(describe(asdict(report)))

    def relay_pass(self, store: StateStore, **options: Any) -> DeliveryReport:
        try:
            return deliver_notifications(
                relay_id=options["relay_id"], limit=options["limit"], store=store
            )
        except (JobStateError, ImproperlyConfigured, DatabaseError) as exc:
            raise command_error(exc) from exc

    def relay_loop(self, store: StateStore, **options: Any) -> None:
        # Set by the signal handler: a threading.Event could hang it (see Wakeup).
        stop = Wakeup()
        interval = 1.0 if options["interval"] is None else options["interval"].total_seconds()
        batch = options["limit"] or jobstate_settings.OUTBOX_BATCH_SIZE
        totals = dict.fromkeys(["passes", "failed_passes", *_COUNTERS], 0)
        failed_in_a_row = 0
        progress = ProgressLine(self.stderr, action="Relaying:")

        def request_stop(signum: int, frame: FrameType | None) -> None:
            if stop.is_set():
                # The second signal: the operator does not want to wait for the sends.
                raise StopAtOnce(128 + signum)
            stop.set()

        previous: dict[int, Any] = {}
        # Signal handlers can only be installed from the main thread.
        if threading.current_thread() is threading.main_thread():
            previous = {sig: signal.signal(sig, request_stop) for sig in handled_stop_signals()}
        # One id for every pass: a pass still settles only the rows it claimed, as its
        # passes run one after another and a row an earlier pass left unsettled is due
        # again only when its lease ends, to be claimed afresh as a new attempt.
        options["relay_id"] = options["relay_id"] or default_relay_id()
        beat = _RelayBeat(store, options["relay_id"])
        try:
            beat.register()
            while not stop.is_set():
                try:
                    report = asdict(self.relay_pass(store, **options))
                except CommandError as error:
                    cause = error.__cause__
                    if not (isinstance(cause, StoreError) and cause.retryable):
                        raise
                    # The store has already dropped a lost connection (see
                    # jobstate.stores.errors): the next pass reconnects.
                    totals["failed_passes"] += 1
                    failed_in_a_row += 1
                    backoff = interval * 2 ** min(failed_in_a_row - 1, _BACKOFF_DOUBLINGS)
                    delay = min(backoff, max(interval, _RETRY_CAP_SECONDS))
                    progress.clear()
                    self.stderr.write(f"Relay pass failed; retrying in {delay:g} s: {cause}")
                    stop.wait(delay)
                    continue
                failed_in_a_row = 0
                beat.maybe_beat()
                totals["passes"] += 1
                for name in _COUNTERS:
                    totals[name] += report[name]
                if report["claimed"] and options["verbosity"] >= 2:
                    progress.clear()
                    self.stdout.write(describe(report))
                progress.show(
                    f"{totals['passes']} passes, {totals['delivered']} delivered, "
                    f"{totals['retrying']} retrying, {totals['dead']} dead"
                )
                # A full batch means more may be due right now.
                if report["claimed"] < batch:
                    stop.wait(interval)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            progress.clear()
            stopped_by = "signal" if stop.is_set() else "error"
            stop.close()
        beat.stopped(stopped_by)
        if options["json"]:
            self.stdout.write(json.dumps(totals))
        elif options["verbosity"] >= 1:
            passes = "pass" if totals["passes"] == 1 else "passes"
            failed = totals["failed_passes"]
            retried = f" {failed} failed and were retried." if failed else ""
            self.stdout.write(
                f"Relay stopped after {totals['passes']} {passes}.{retried} {describe(totals)}"
            )


class _RelayBeat:
    """The relay loop's entry on the console's Workers page."""

    def __init__(self, store: StateStore, relay_id: str) -> None:
        self.store = store
        self.enabled = store.supports_worker_registry
        host = socket.gethostname() or "unknown"
        self.worker_id = relay_id
        self.host = host
        lease = jobstate_settings.OUTBOX_LEASE
        self.lease = lease
        self.every = min(lease.total_seconds() / _BEAT_SHARE, _BEAT_CAP_SECONDS)
        self.last = 0.0

    def register(self) -> None:
        if not self.enabled:
            return
        try:
            self.store.register_worker(
                WorkerRegistration(
                    worker_id=self.worker_id,
                    kind=WorkerKind.RELAY,
                    host=self.host,
                    pid=os.getpid(),
                    lease=self.lease,
                )
            )
        except (JobStateError, DatabaseError) as exc:
            raise command_error(exc) from exc
        self.last = time.monotonic()

    def maybe_beat(self) -> None:
        if not self.enabled or time.monotonic() - self.last < self.every:
            return
        try:
            if not self.store.beat_worker(worker_id=self.worker_id):
                self.register()
        except StoreError as exc:
            if not exc.retryable:
                raise command_error(exc) from exc
            # The next pass fails the same way and is retried; the beat follows it.
            return
        self.last = time.monotonic()

    def stopped(self, reason: str) -> None:
        if not self.enabled:
            return
        try:
            self.store.stop_worker(worker_id=self.worker_id, reason=reason)
        except StoreError:
            # Exiting anyway: the Workers page shows the relay lost once its lease passed.
            return
