"""Torture run: worker processes claim and complete jobs and run operations jobs, and
``jobstate_worker`` processes run django.tasks tasks, while a reaper runs every second
and a controller kills random workers with SIGKILL (and pauses some job workers with
SIGSTOP) mid-job, then restarts them.

    python -m reliability.torture --duration 60 --workers 8
    python -m reliability.torture --duration 3600 --workers 8 --jobs 200000 --report run.json
    python -m reliability.torture --duration 60 \
        --database-url mysql://root@127.0.0.1:3306/jobstate_torture

The run gets a fresh database on PostgreSQL or, with a ``mysql://`` URL, on MariaDB
10.6+ / MySQL 8.0+ (dropped and created; its name must contain ``torture``), migrates
it, loads the jobs and runs for ``--duration`` seconds. Then it
stops the workers gracefully, lets the reaper take back what dead workers held, runs
one last reap and checks:

- nothing is lost: every loaded job exists, and is terminal or queued;
- fencing: no job is claimed while its previous claim is live, no report is accepted
  from a claim that a later one replaced, no job is completed twice, every terminal job
  is explained by the one report that finished it (or by the lease sweep's last
  attempt), and no run the runner says it settled was settled by someone else;
- overlap: no overlap key ever had two RUNNING runs (watched while running);
- recovery: every job or run a killed worker held was recovered within lease (or the
  stale-run threshold) + reap interval + slack;
- tasks: every task ended SUCCESSFUL or FAILED, none lost, none finished twice, every
  started attempt recorded once, every task a killed task worker held recovered with
  that worker's lost attempt (:mod:`reliability._torture_tasks`).

It prints a summary table, with what jobstate's system checks say the database cannot
guarantee, and exits 1 when any violation was found (2 when the run could not be made
at all).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from reliability._torture_checks import (
    Findings,
    check_claims,
    check_database,
    check_watch,
    figures,
    jobstate_tables,
)
from reliability._torture_config import DEFAULT_DATABASE, DEFAULT_SERVER, Timing, setup_django
from reliability._torture_controller import Controller, RunFacts, RunOptions
from reliability._torture_db import (
    TortureDatabaseError,
    create_ledger,
    drop_database,
    load_jobs,
    migrate,
    recreate_database,
)
from reliability._torture_pool import PoolError
from reliability._torture_report import build, table
from reliability._torture_sql import connect
from reliability._torture_tasks import check_tasks, create_task_ledger, load_tasks, task_figures

#: Jobs loaded per second of ``--duration`` when ``--jobs`` is not given: more than
#: eight workers on a small machine get through, so the queue does not run dry.
JOBS_PER_SECOND = 30

#: Tasks loaded per second of ``--duration`` when ``--tasks`` is not given.
TASKS_PER_SECOND = 10


def _positive(kind: type[float] | type[int]) -> Any:
    def parse(text: str) -> float | int:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def _share(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m reliability.torture",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--duration", type=_positive(float), default=60.0, help="seconds")
    parser.add_argument("--workers", type=_positive(int), default=8)
    parser.add_argument(
        "--jobs",
        type=_positive(int),
        help=f"jobs to load (default: {JOBS_PER_SECOND} per second of --duration)",
    )
    parser.add_argument(
        "--database-url",
        default=DEFAULT_SERVER + DEFAULT_DATABASE,
        help="the run's database, postgres://... or mysql://...; it is dropped and created "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--kill-every", type=_positive(float), default=1.5, help="mean seconds between faults"
    )
    parser.add_argument(
        "--pause-share",
        type=_share,
        default=0.2,
        help="share of the faults that pause a worker instead of killing it",
    )
    parser.add_argument("--lease", type=_positive(float), default=2.0, help="WORKER_LEASE, s")
    parser.add_argument(
        "--stale-after", type=_positive(float), default=2.0, help="STALE_RUN_AFTER, s"
    )
    parser.add_argument("--reap-interval", type=_positive(float), default=1.0, help="seconds")
    parser.add_argument(
        "--slack",
        type=float,
        default=2.0,
        help="seconds a loaded machine may add to the recovery bound",
    )
    parser.add_argument(
        "--task-workers",
        type=_non_negative,
        default=2,
        help="jobstate_worker processes running tasks (0: no tasks)",
    )
    parser.add_argument(
        "--tasks",
        type=_positive(int),
        help=f"tasks to load (default: {TASKS_PER_SECOND} per second of --duration)",
    )
    parser.add_argument("--seed", type=int, help="seed of the fault schedule")
    parser.add_argument("--report", type=Path, help="also write the summary as JSON here")
    parser.add_argument(
        "--drop", action="store_true", help="drop the database at the end (kept by default)"
    )
    return parser.parse_args(argv)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _prepare(url: str, timing: Timing, jobs: int, tasks: int) -> None:
    """A fresh, migrated database with the ledger tables, ``jobs`` queued jobs and
    ``tasks`` queued tasks."""
    recreate_database(url)
    setup_django(url, timing, "torture-controller")
    _log(f"migrating {url}")
    migrate()
    with connect(url, "torture-controller") as conn:
        create_ledger(conn)
        create_task_ledger(conn)
    _log(f"loading {jobs} jobs")
    load_jobs(jobs, _log)
    if tasks:
        load_tasks(tasks, _log)


def _verdict(url: str, facts: RunFacts) -> tuple[Findings, dict[str, Any]]:
    """Every check on the settled database and the live watch, and the figures."""
    findings = Findings()
    tables = jobstate_tables()
    with connect(url, "torture-controller") as conn:
        check_database(conn, tables, findings)
        check_claims(conn, tables, findings)
        check_tasks(conn, findings.add)
        counts = figures(conn, tables, facts.paused_workers)
        counts.update(task_figures(conn, facts.task_worker_kills))
    check_watch(facts.monitor, findings)
    findings.add("process_error", [f"{f.name}: exit {f.exitcode}" for f in facts.failures])
    findings.add("process_error", facts.task_failures)
    return findings, counts


def _declared_gaps() -> list[str]:
    """What jobstate's own system checks say this database cannot guarantee (for
    example no partial unique index for one RUNNING run per key): a violation of such a
    guarantee is then the backend's declared gap, not a surprise."""
    from django.core.checks import run_checks

    return [
        f"{message.id}: {message.msg}"
        for message in run_checks(databases=["default"])
        if message.id and message.id.startswith("jobstate.")
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = args.jobs or max(100, round(JOBS_PER_SECOND * args.duration))
    tasks = 0
    if args.task_workers:
        tasks = args.tasks or max(50, round(TASKS_PER_SECOND * args.duration))
    timing = Timing(
        lease=args.lease,
        stale_after=args.stale_after,
        reap_interval=args.reap_interval,
        slack=args.slack,
    )
    options = RunOptions(
        database_url=args.database_url,
        duration=args.duration,
        workers=args.workers,
        kill_every=args.kill_every,
        pause_share=args.pause_share,
        timing=timing,
        seed=args.seed,
        task_workers=args.task_workers,
    )
    url = args.database_url
    try:
        _prepare(url, timing, jobs, tasks)
        facts = Controller(options, _log).run()
    except (TortureDatabaseError, PoolError) as exc:
        _log(f"torture: {exc}")
        return 2
    findings, counts = _verdict(url, facts)
    report = build(options, jobs, facts, counts, findings)
    report["jobstate_checks"] = _declared_gaps()
    print(table(report), flush=True)
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.drop:
        from django.db import connections

        connections.close_all()
        drop_database(url)
    else:
        _log(f"the run's database is kept for inspection: {url}")
    return 1 if findings.total else 0


if __name__ == "__main__":
    sys.exit(main())
