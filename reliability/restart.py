"""Restart run: PostgreSQL is restarted under load and every jobstate component must
reconnect by itself and carry on.

    python -m reliability.restart --duration 90 --restarts 3
    python -m reliability.restart --duration 3600 --restarts 60 --workers 4 --json

The run never touches a shared server: it makes a private PostgreSQL cluster in a
temporary directory (``initdb``; as root the server runs as the ``postgres`` user), on a
free port, migrates a database there and starts the components, one process each: a
producer enqueueing jobs, ``--workers`` job-queue workers (claim, complete with a
notification), the relay (``manage.py deliver_notifications --loop``, delivering to a
callable that records each delivery in a file), the operations-job runner (runs with
heartbeats) and a reaper running every reaping sweep once a second. During
``--duration`` seconds of load it restarts the cluster ``--restarts`` times, evenly
spaced (``pg_ctl restart -m fast``, one of them ``-m immediate``: a crash and recovery),
taking a snapshot of what is committed just before each. Then it stops the producer and
the runner, lets the others drain, stops them, and checks (see
:mod:`reliability._restart_checks`): nothing committed lost, no notification skipped
(repeats are reported: delivery is at least once), no run left RUNNING, every component
alive, progressing after the last restart and stopping cleanly.

It prints a summary (``--json``: one JSON object) and exits 0 when there was no
violation, 1 when there was, 2 when the run could not be made (no PostgreSQL server
binaries, a cluster that would not start).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from reliability._restart_cluster import ClusterError, PrivateCluster, find_server_binaries
from reliability._restart_common import (
    ENV_DATABASE_URL,
    ENV_DELIVERIES,
    ENV_PROCESS_NAME,
    read_events,
)

ROOT = Path(__file__).resolve().parent.parent
DATABASE = "jobstate_restart"
SETTINGS = "reliability._restart_settings"
#: How long the components may take to start and show their first progress.
WARM_UP_SECONDS = 120.0
#: How long the drain may take: orphaned claims wait for their lease or the stale-run
#: threshold, then the reaper's next pass.
DRAIN_SECONDS = 120.0
#: How long a component may take to stop after SIGTERM (a worker finishes its job).
STOP_SECONDS = 90.0
RELAY_OPTIONS = ("--loop", "--interval", "0.2", "--limit", "20", "--json")


@dataclass
class Restart:
    number: int
    mode: str
    began_at: float
    away_seconds: float


@dataclass
class Summary:
    duration: float
    restarts: list[Restart] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    violations: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["reconnects"] = self.figures.get("reconnects", {})
        return data


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m reliability.restart",
        description="Restart a private PostgreSQL cluster under load and check that every "
        "jobstate component reconnects and nothing is lost.",
    )
    parser.add_argument("--duration", type=_positive_seconds, required=True, metavar="SECONDS")
    parser.add_argument("--restarts", type=_count, default=3, metavar="N")
    parser.add_argument("--workers", type=_count, default=2, metavar="N")
    parser.add_argument("--json", action="store_true", help="Print the summary as JSON.")
    parser.add_argument("--pg-bindir", help="Directory of initdb, pg_ctl and postgres.")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="Keep the temporary directory (logs, events); it is kept anyway after a violation.",
    )
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    return args


def restart_modes(count: int) -> list[str]:
    """``fast`` restarts with one ``immediate`` one (a crash) in the middle."""
    return ["immediate" if number == count // 2 else "fast" for number in range(count)]


class Components:
    """The component processes, their logs and event files."""

    def __init__(self, root: Path, url: str) -> None:
        self.root = root
        self.url = url
        self.events_dir = root / "events"
        self.events_dir.mkdir()
        self.deliveries = root / "deliveries.jsonl"
        self.deliveries.touch()
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.roles: dict[str, str] = {}

    def start(self, name: str, role: str) -> None:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": SETTINGS,
            ENV_DATABASE_URL: self.url,
            ENV_PROCESS_NAME: name,
            ENV_DELIVERIES: str(self.deliveries),
            "PYTHONUNBUFFERED": "1",
        }
        if role == "relay":
            command = [sys.executable, "-m", "django", "deliver_notifications", *RELAY_OPTIONS]
        else:
            events = str(self.events_dir / f"{name}.jsonl")
            command = [sys.executable, "-m", "reliability._restart_roles", role, name, events]
        with (
            (self.root / f"{name}.out").open("wb") as out,
            (self.root / f"{name}.err").open("wb") as err,
        ):
            self.processes[name] = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=err
            )
        self.roles[name] = role

    def events(self) -> dict[str, Path]:
        return {
            name: self.events_dir / f"{name}.jsonl"
            for name, role in self.roles.items()
            if role != "relay"
        }

    def progressing(self) -> set[str]:
        """The components that have shown progress so far."""
        from reliability._restart_checks import PROGRESS

        done = set()
        for name, role in self.roles.items():
            if role == "relay":
                if read_events(self.deliveries):
                    done.add(name)
                continue
            wanted = PROGRESS[role]
            if any(e["event"] == wanted for e in read_events(self.events_dir / f"{name}.jsonl")):
                done.add(name)
        return done

    def alive(self) -> dict[str, bool]:
        return {name: process.poll() is None for name, process in self.processes.items()}

    def stop(self, *names: str) -> None:
        """SIGTERM, then wait; a component that will not stop is killed."""
        for name in names:
            if self.processes[name].poll() is None:
                self.processes[name].send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_SECONDS
        for name in names:
            try:
                self.processes[name].wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.processes[name].kill()
                self.processes[name].wait()

    def kill_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()

    def stderr_tail(self, name: str) -> str:
        lines = (self.root / f"{name}.err").read_text(errors="replace").strip().splitlines()
        return " | ".join(lines[-3:])

    def relay_totals(self, name: str) -> dict[str, int] | None:
        text = (self.root / f"{name}.out").read_text().strip()
        if not text:
            return None
        totals: dict[str, int] = json.loads(text.splitlines()[-1])
        return totals


def _note(message: str) -> None:
    print(f"restart run: {message}", file=sys.stderr, flush=True)


def _fresh_connections() -> None:
    # The harness's own connection died with the last restart; the next query reconnects.
    from django.db import connections

    connections.close_all()


def _wait_for(predicate: Any, seconds: float, pause: float = 0.5) -> bool:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
    return True


def run_load(args: argparse.Namespace, cluster: PrivateCluster, components: Components) -> Summary:
    from reliability._restart_checks import Process, check, outstanding, snapshot

    summary = Summary(duration=args.duration)
    names = {"producer": "producer", "runner": "runner", "reaper": "reaper", "relay": "relay"}
    for name, role in names.items():
        components.start(name, role)
    workers = [f"worker-{number}" for number in range(1, args.workers + 1)]
    for name in workers:
        components.start(name, "worker")
    everyone = [*names, *workers]

    if not _wait_for(lambda: components.progressing() >= set(everyone), WARM_UP_SECONDS):
        missing = sorted(set(everyone) - components.progressing())
        summary.violations.append(f"never started working: {', '.join(missing)}")
    _note(f"load running; {args.restarts} restarts in {args.duration:g} s")
    load_started = time.monotonic()
    snapshots = []
    last_restart_at: float | None = None
    for number, mode in enumerate(restart_modes(args.restarts), start=1):
        due = load_started + args.duration * number / (args.restarts + 1)
        time.sleep(max(0.0, due - time.monotonic()))
        _fresh_connections()
        snapshots.append(snapshot(number))
        began = time.time()
        away = cluster.restart(mode)
        last_restart_at = time.time()
        summary.restarts.append(Restart(number, mode, began, round(away, 2)))
        _note(f"restart {number}/{args.restarts} ({mode}): server back after {away:.1f} s")
    time.sleep(max(0.0, load_started + args.duration - time.monotonic()))
    alive = components.alive()

    _note("load stopped; draining")
    components.stop("producer", "runner")
    _fresh_connections()
    drained = _wait_for(lambda: not any(outstanding().values()), DRAIN_SECONDS, pause=1.0)
    if not drained:
        summary.violations.append(f"the drain did not finish: {outstanding()} left")
    components.stop(*workers, "relay", "reaper")

    processes = [
        Process(
            name=name,
            role=components.roles[name],
            alive_at_end_of_load=alive[name],
            exit_code=components.processes[name].returncode,
            stderr_tail=components.stderr_tail(name),
        )
        for name in everyone
    ]
    _fresh_connections()
    findings = check(
        events=components.events(),
        roles=components.roles,
        deliveries=components.deliveries,
        processes=processes,
        snapshots=snapshots,
        last_restart_at=last_restart_at,
        relay_totals=components.relay_totals("relay"),
    )
    summary.violations.extend(findings.violations)
    summary.figures = findings.figures
    return summary


def describe(summary: Summary) -> str:
    figures = summary.figures
    jobs = figures.get("jobs", {})
    notes = figures.get("notifications", {})
    runs = figures.get("runs", {})
    modes = ", ".join(restart.mode for restart in summary.restarts) or "none"
    longest = max((restart.away_seconds for restart in summary.restarts), default=0.0)
    reconnects = ", ".join(
        f"{name} {count}" for name, count in figures.get("reconnects", {}).items()
    )
    lines = [
        f"duration:      {summary.duration:g} s of load",
        f"restarts:      {len(summary.restarts)} ({modes}); longest outage {longest:.1f} s",
        f"jobs:          {jobs.get('acknowledged', 0)} acknowledged, {jobs.get('done', 0)} done, "
        f"{jobs.get('lost', 0)} lost; {jobs.get('enqueue_retries', 0)} enqueue retries, "
        f"{jobs.get('stale_completions', 0)} completions fenced off",
        f"notifications: {notes.get('created', 0)} created, {notes.get('delivered', 0)} delivered, "
        f"{notes.get('received', 0)} received; {notes.get('sent_more_than_once', 0)} sent more "
        "than once (at-least-once delivery)",
        f"runs:          {runs.get('reported', 0)} reported {runs.get('by_status', {})}, "
        f"{runs.get('superseded', 0)} superseded, {runs.get('orphaned_claims_reaped', 0)} "
        f"orphaned claims reaped, {runs.get('left_running', 0)} left RUNNING",
        f"reconnects:    {reconnects or 'none'}",
        f"violations:    {len(summary.violations) or 'none'}",
        *(f"  - {violation}" for violation in summary.violations),
    ]
    return "\n".join(lines)


def _prepare(cluster: PrivateCluster) -> str:
    """Create and migrate the run's database; set Django up on it. Returns its URL."""
    import django
    import psycopg

    url = cluster.url(DATABASE)
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    os.environ[ENV_DATABASE_URL] = url
    os.environ[ENV_PROCESS_NAME] = "harness"
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    return url


def _interrupt(signum: int, frame: FrameType | None) -> None:
    # SIGTERM ends the run like Ctrl-C, so the cluster and the components are stopped.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        bindir = find_server_binaries(args.pg_bindir)
    except ClusterError as exc:
        _note(str(exc))
        return 2
    signal.signal(signal.SIGTERM, _interrupt)
    root = Path(tempfile.mkdtemp(prefix="jobstate-restart-"))
    cluster = PrivateCluster(bindir, root)
    components: Components | None = None
    summary: Summary | None = None
    try:
        cluster.create()
        cluster.start()
        _note(f"private cluster on port {cluster.port} in {root}")
        components = Components(root, _prepare(cluster))
        summary = run_load(args, cluster, components)
    except ClusterError as exc:
        _note(str(exc))
        return 2
    except KeyboardInterrupt:
        _note("interrupted; nothing was checked")
        return 2
    finally:
        if components is not None:
            components.kill_all()
        try:
            cluster.stop()
        except ClusterError as exc:
            _note(f"could not stop the private cluster: {exc}")
        # The logs explain a violation: keep them whenever there is one.
        if args.keep or (summary is not None and summary.violations):
            _note(f"kept {root} (component logs, event files, server log)")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(summary.as_dict()) if args.json else describe(summary), flush=True)
    return 1 if summary.violations else 0


if __name__ == "__main__":
    sys.exit(main())
