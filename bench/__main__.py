"""Command line of the benchmark harness::

    python -m bench drain --workers 4 --jobs 20000 --repeats 3
    python -m bench sweeps --rows 1000000
    python -m bench tasks --workers 4 --tasks 5000 --repeats 3 --concurrency 1,4 --mysql
    python -m bench pgbouncer --workers 64 --direct 16 --tasks 50000 --kill-at 0.5
    python -m bench all
    python -m bench calls --jobs 5000
    python -m bench calls --paths worker,worker-policy --tasks 500 --top 30
    python -m bench --server mysql://root@127.0.0.1:3306/ drain --workers 4 --jobs 20000

On a ``mysql://`` server (MariaDB 10.6+ / MySQL 8.0+) only ``drain`` runs: jobstate
beside a raw MariaDB floor (:mod:`bench.mysql_drain`).

See ``docs/benchmarks.md`` for what each measures and the figures of a real run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from bench import tasks_command
from bench.bytecode import byte_compile, describe
from bench.contenders import CONTENDERS
from bench.pg import (
    DEFAULT_SERVER,
    ROOT,
    BenchError,
    connect,
    database_url,
    drop_database,
    load_average,
    manifest,
    recreate_database,
    setup_django,
)


def _prepare(url: str, *, django: bool = True) -> dict[str, Any]:
    recreate_database(url)
    if not django:
        # The command sets Django up itself, under the settings it measures.
        _migrate_in_a_subprocess(url)
        with connect(url) as conn:
            return manifest(conn)
    setup_django(url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    with connect(url) as conn:
        return manifest(conn)


def _byte_compile() -> dict[str, Any]:
    """Before any worker starts: see :mod:`bench.bytecode`."""
    figures = byte_compile(ROOT)
    print(describe(figures), flush=True)
    return figures


def _migrate_in_a_subprocess(url: str) -> None:
    import subprocess

    code = "from bench.pg import setup_django; from django.core.management import call_command; "
    code += f"setup_django({url!r}); call_command('migrate', verbosity=0, interactive=False)"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def _drain(args: argparse.Namespace, url: str, result: dict[str, Any]) -> None:
    from bench import drain
    from bench.variants import SELECTABLE

    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = set(contenders) - set(drain.CONTENDERS)
    if unknown:
        raise BenchError(
            f"unknown contender(s) {sorted(unknown)}; known: {', '.join(drain.CONTENDERS)}"
        )
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if not settings or set(settings) - set(SELECTABLE):
        raise BenchError(f"--settings takes some of {', '.join(SELECTABLE)}, got {args.settings!r}")
    workers = [int(w) for w in str(args.workers).split(",")]
    print(
        f"drain: {args.jobs} jobs, workers {workers}, {args.repeats} repeats, "
        f"batch k={args.batch}, settings {', '.join(settings)}; "
        f"load average {load_average()}",
        flush=True,
    )
    summaries = drain.run(
        url,
        contenders=contenders,
        settings=settings,
        workers=workers,
        jobs=args.jobs,
        repeats=args.repeats,
        batch=args.batch,
        memory_every=args.memory_every,
        log=lambda line: print(line, flush=True),
    )
    text = drain.table(summaries, args.batch)
    side_by_side = drain.settings_table(summaries, args.batch)
    checks = drain.targets(summaries, workers=4 if 4 in workers else workers[-1])
    print()
    print(text)
    print()
    print(side_by_side)
    print()
    for line in checks:
        print(line)
    print(f"load average at the end: {load_average()}")
    result["drain"] = {
        "table": text,
        "settings_table": side_by_side,
        "targets": checks,
        "cells": [vars(c) for s in summaries.values() for c in s.cells],
    }


def _mysql_drain(args: argparse.Namespace, url: str, result: dict[str, Any]) -> None:
    from bench import mysql, mysql_drain

    mysql.recreate_database(url)
    with mysql.connected(url) as conn:
        result["manifest"] = mysql.manifest(conn)
    setup_django(url)
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    chosen = [c.strip() for c in args.contenders.split(",") if c.strip()]
    contenders = chosen if args.contenders != ",".join(CONTENDERS) else []
    contenders = contenders or list(mysql_drain.DEFAULT_CONTENDERS)
    workers = [int(w) for w in str(args.workers).split(",")]
    print(
        f"drain on {result['manifest']['mysql']}: {args.jobs} jobs, workers {workers}, "
        f"{args.repeats} repeats, batch k={args.batch}, contenders {', '.join(contenders)}; "
        f"load average {load_average()}",
        flush=True,
    )
    summaries = mysql_drain.run(
        url,
        contenders=contenders,
        workers=workers,
        jobs=args.jobs,
        repeats=args.repeats,
        batch=args.batch,
        log=lambda line: print(line, flush=True),
    )
    text = mysql_drain.table(summaries, args.batch)
    checks = mysql_drain.ratios(summaries)
    print()
    print(text)
    print()
    for line in checks:
        print(line)
    print(f"load average at the end: {load_average()}")
    result["drain"] = {
        "table": text,
        "targets": checks,
        "cells": [vars(c) for s in summaries.values() for c in s.cells],
    }


def _run_mysql(args: argparse.Namespace, argv: list[str] | None) -> int:
    """``drain`` on a MariaDB / MySQL server; every other command is PostgreSQL's."""
    from bench import mysql

    url = database_url(args.server, args.database)
    if args.command != "drain":
        print(f"error: on a mysql:// server only drain runs, not {args.command}", file=sys.stderr)
        return 1
    result: dict[str, Any] = {"command": " ".join(["python -m bench", *(argv or sys.argv[1:])])}
    result["bytecode"] = _byte_compile()
    try:
        _mysql_drain(args, url, result)
        result["load_average_at_end"] = load_average()
        if args.output:
            args.output.write_text(json.dumps(result, indent=2, default=str))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            try:
                mysql.drop_database(url)
            except BenchError as exc:
                print(f"warning: could not drop {url}: {exc}", file=sys.stderr)
    return 0


def _profile(args: argparse.Namespace, url: str, result: dict[str, Any]) -> None:
    from bench import profile

    result["profile"] = profile.run(
        url,
        jobs=args.jobs,
        notifications=args.notifications,
        setting=args.setting,
        cprofile=args.cprofile,
        log=lambda line: print(line, flush=True),
    )


def _sweeps(args: argparse.Namespace, url: str, result: dict[str, Any]) -> None:
    from bench import sweeps

    result["sweeps"] = sweeps.run(
        url,
        rows=args.rows,
        stale=args.stale,
        audit=args.audit,
        baseline=args.baseline,
        log=lambda line: print(line, flush=True),
    )
    result["sweeps"]["targets"] = sweeps.targets(result["sweeps"])
    print()
    for line in result["sweeps"]["targets"]:
        print(line)


def _pgbouncer(args: argparse.Namespace, url: str, result: dict[str, Any]) -> None:
    from bench import pooled

    if args.kill_at is not None and not 0 < args.kill_at < 1:
        raise BenchError(
            f"--kill-at takes a share of the tasks between 0 and 1, got {args.kill_at}"
        )
    from bench.pgbouncer import version

    prepared = (
        f", max_prepared_statements {args.max_prepared_statements} (jobstate's statements prepared)"
        if args.max_prepared_statements
        else " (nothing prepared)"
    )
    print(
        f"pgbouncer: {args.tasks} tasks, {args.workers} workers (--concurrency 1) through "
        f"PgBouncer {'.'.join(map(str, version(args.pgbouncer)))} in transaction mode "
        f"(default_pool_size {args.pool_size}{prepared}) against "
        f"{args.direct} connected directly"
        + (f", then PgBouncer killed at {args.kill_at:.0%}" if args.kill_at else "")
        + f"; lease {args.lease:g} s; load average {load_average()}",
        flush=True,
    )
    results = pooled.run(
        url,
        workers=args.workers,
        direct=args.direct,
        tasks=args.tasks,
        pool_size=args.pool_size,
        kill_at=args.kill_at,
        lease=args.lease,
        logs=args.logs,
        log=lambda line: print(line, flush=True),
        binary=args.pgbouncer,
        max_prepared_statements=args.max_prepared_statements,
    )
    text = pooled.table(results)
    checks = pooled.targets(results, pool_size=args.pool_size)
    print()
    print(text)
    print()
    for line in checks:
        print(line)
    print(f"load average at the end: {load_average()}")
    result["pgbouncer"] = {"table": text, "targets": checks, "arms": [vars(a) for a in results]}


def _calls(args: argparse.Namespace, url: str, result: dict[str, Any]) -> None:
    from bench import calls, worker_calls

    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = set(paths) - {*calls.PATHS, *worker_calls.ROWS}
    if unknown:
        known = ", ".join([*calls.PATHS, *worker_calls.ROWS])
        raise BenchError(f"unknown path(s) {sorted(unknown)}; known: {known}")
    print(
        f"calls: {args.jobs} jobs per path, batch k={args.batch}; the worker's rows: "
        f"drains of {args.tasks} and {2 * args.tasks} tasks",
        flush=True,
    )

    def log(line: str) -> None:
        print(line, flush=True)

    result["calls"] = calls.run(
        jobs=args.jobs, batch=args.batch, paths=[p for p in paths if p in calls.PATHS], log=log
    )
    rows = [p for p in paths if p in worker_calls.ROWS]
    result["calls"] |= worker_calls.run(tasks=args.tasks, top=args.top, rows=rows, log=log)


def _worker_arguments(parser: argparse.ArgumentParser, *, workers: int, workers_help: str) -> None:
    """``--workers`` (processes) and ``--tasks`` of a command that starts worker processes."""
    parser.add_argument("--workers", type=int, default=workers, help=workers_help)
    parser.add_argument("--tasks", type=int, default=5000, help="tasks of each drain")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--server",
        default=DEFAULT_SERVER,
        help="PostgreSQL server URL, or mysql://... for MariaDB / MySQL (drain only); "
        "its database part is ignored",
    )
    parser.add_argument(
        "--database",
        default="jobstate_bench",
        help="database the harness drops and creates (name must contain 'bench')",
    )
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    parser.add_argument("--output", type=Path, help="write the result (with the manifest) as JSON")
    commands = parser.add_subparsers(dest="command", required=True)
    drain_parser = commands.add_parser("drain", help="drain benchmark, all contenders")
    sweeps_parser = commands.add_parser(
        "sweeps", help="heartbeat, reap, prune and metrics at scale"
    )
    tasks_parser = commands.add_parser(
        "tasks",
        help="the issue's rows: jobstate_worker against db_worker and procrastinate, the seed "
        "path, the raw floor, the pause probe, MariaDB (--mysql); start-up; latency",
    )
    _worker_arguments(tasks_parser, workers=4, workers_help="worker processes of each contender")
    tasks_command.add_arguments(tasks_parser)
    all_parser = commands.add_parser("all", help="drain, then sweeps")
    profile_parser = commands.add_parser(
        "profile", help="one worker on the seed's completion path: where a job's time goes"
    )
    profile_parser.add_argument("--jobs", type=int, default=5000)
    profile_parser.add_argument("--notifications", type=int, default=0, choices=[0, 2])
    profile_parser.add_argument(
        "--setting", default="defaults", choices=["defaults", "prepared", "unprepared"]
    )
    profile_parser.add_argument(
        "--cprofile", type=int, default=0, help="also profile, printing the top N functions"
    )
    pgbouncer_parser = commands.add_parser(
        "pgbouncer",
        help="many workers through PgBouncer in transaction mode against fewer direct ones",
    )
    _worker_arguments(
        pgbouncer_parser, workers=16, workers_help="worker processes through PgBouncer"
    )
    pgbouncer_parser.add_argument(
        "--direct", type=int, default=16, help="worker processes connected directly"
    )
    pgbouncer_parser.add_argument(
        "--pool-size", type=int, default=20, help="PgBouncer's default_pool_size"
    )
    pgbouncer_parser.add_argument(
        "--pgbouncer",
        default="/usr/sbin/pgbouncer",
        help="the pgbouncer binary (default: Debian's, which scripts/ensure-pgbouncer installs)",
    )
    pgbouncer_parser.add_argument(
        "--max-prepared-statements",
        type=int,
        default=0,
        help="PgBouncer's max_prepared_statements; above 0 (PgBouncer 1.22 or newer) the "
        "pooled workers keep jobstate's prepared statements",
    )
    pgbouncer_parser.add_argument(
        "--kill-at",
        type=float,
        help="also drain once more through PgBouncer, killing it (SIGKILL) and starting it "
        "again once this share of the tasks is done, e.g. 0.5",
    )
    pgbouncer_parser.add_argument(
        "--lease",
        type=float,
        default=10.0,
        help="the tasks' LEASE in seconds: how long a claim cut off by the kill waits",
    )
    pgbouncer_parser.add_argument(
        "--logs",
        type=Path,
        help="directory to keep the workers' and PgBouncer's logs in (default: removed)",
    )
    calls_parser = commands.add_parser(
        "calls", help="Python calls and CPU per job on the hot paths, in one process"
    )
    calls_parser.add_argument("--jobs", type=int, default=5000)
    calls_parser.add_argument("--batch", type=int, default=50)
    calls_parser.add_argument(
        "--tasks", type=int, default=500, help="tasks of the worker's smaller drain"
    )
    calls_parser.add_argument(
        "--paths",
        default="one-job,batch,seed,seed-2,worker,worker-policy",
        help="the rows to count, e.g. worker,worker-policy",
    )
    calls_parser.add_argument(
        "--top", type=int, default=0, help="also print the worker's top N functions"
    )
    for sub in (drain_parser, all_parser):
        sub.add_argument("--workers", default="4", help="worker processes, e.g. 4 or 1,4")
        sub.add_argument("--jobs", type=int, default=20000)
        sub.add_argument("--repeats", type=int, default=3)
        sub.add_argument("--batch", type=int, default=50, help="k of the batch contenders")
        sub.add_argument(
            "--contenders",
            default=",".join(CONTENDERS),
        )
        sub.add_argument(
            "--settings",
            default="defaults,prepared,unprepared",
            help="connection settings of the contenders whose statements they change "
            "(some of defaults, prepared, unprepared; see bench/variants.py)",
        )
        sub.add_argument(
            "--memory-every",
            type=int,
            default=1000,
            help="sample jobstate worker memory every N jobs (0: never)",
        )
    for sub in (sweeps_parser, all_parser):
        sub.add_argument("--rows", type=int, default=1_000_000, help="jobs table size")
        sub.add_argument("--stale", type=int, default=100_000, help="expired leases among them")
        sub.add_argument("--audit", type=int, default=1_000_000, help="audit rows to prune")
        sub.add_argument(
            "--baseline",
            type=float,
            default=10.0,
            help="seconds the traffic runs alone before each sweep (its p99 reference)",
        )
    args = parser.parse_args(argv)
    if args.server.startswith(("mysql://", "mariadb://")):
        return _run_mysql(args, argv)
    url = database_url(args.server, args.database)
    if args.command == "pgbouncer":
        # The lease and attempts a task gets are fixed when it is enqueued: the harness
        # enqueues under the same options as the workers it starts.
        os.environ["JOBSTATE_BENCH_LEASE"] = str(args.lease)
    if args.command == "tasks":
        try:
            tasks_command.check(args)
        except BenchError as exc:
            # Before the database is touched: a mistyped option changes nothing.
            print(f"error: {exc}", file=sys.stderr)
            return 1
    try:
        result: dict[str, Any] = {"command": " ".join(["python -m bench", *(argv or sys.argv[1:])])}
        result["bytecode"] = _byte_compile()
        result["manifest"] = _prepare(url, django=args.command != "profile")
        if args.command == "profile":
            _profile(args, url, result)
        if args.command in ("drain", "all"):
            _drain(args, url, result)
        if args.command in ("sweeps", "all"):
            _sweeps(args, url, result)
        if args.command == "tasks":
            tasks_command.run(args, url, result)
        if args.command == "pgbouncer":
            _pgbouncer(args, url, result)
        if args.command == "calls":
            _calls(args, url, result)
        result["load_average_at_end"] = load_average()
        if args.output:
            args.output.write_text(json.dumps(result, indent=2, default=str))
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if not args.keep:
            try:
                drop_database(url)
            except Exception as exc:
                print(f"warning: could not drop {url}: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
