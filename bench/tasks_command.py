"""``python -m bench tasks``: the worker drains (and the task with a policy), the store
drains, MariaDB's (with ``--mysql``), the start-up, concurrency and latency, then the
issue's table of ratios (:mod:`bench.task_rows`)."""

from __future__ import annotations

import argparse
from typing import Any

from bench import drain, mysql_drain, task_rows, tasks
from bench.mysql import is_mysql
from bench.pg import BenchError, load_average

#: The MariaDB server ``--mysql`` alone means.
DEFAULT_MYSQL_SERVER = "mysql://root@127.0.0.1:3306/"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``tasks`` beside ``--workers`` and ``--tasks``."""
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds; each drains once per contender"
    )
    parser.add_argument(
        "--concurrency",
        default="1,4",
        help="threads of each jobstate_worker, one drain each: e.g. 1,4",
    )
    parser.add_argument(
        "--startups",
        type=int,
        default=5,
        help="starts of each worker for the start-up row (0: none)",
    )
    parser.add_argument("--contenders", default="jobstate,django-tasks-db,procrastinate")
    parser.add_argument(
        "--samples", type=int, default=200, help="tasks of each latency measurement"
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=10000,
        help="jobs of each store drain (seed path, raw floor, pause probe); "
        "--workers processes of one thread each drain them",
    )
    parser.add_argument(
        "--mysql",
        nargs="?",
        const=DEFAULT_MYSQL_SERVER,
        metavar="URL",
        help="also the MariaDB rows, on this server (alone: "
        f"{DEFAULT_MYSQL_SERVER}); its database is --database",
    )
    parser.add_argument("--mysql-jobs", type=int, default=4000, help="jobs of each MariaDB drain")
    parser.add_argument("--batch", type=int, default=50, help="k of the MariaDB batch claims")
    parser.add_argument(
        "--skip",
        default="",
        help=f"parts left out, separated by commas: some of {', '.join(task_rows.PARTS)}",
    )


def chosen_parts(skip: str) -> list[str]:
    skipped = [part.strip() for part in skip.split(",") if part.strip()]
    unknown = set(skipped) - set(task_rows.PARTS)
    if unknown:
        raise BenchError(
            f"--skip takes some of {', '.join(task_rows.PARTS)}, got {sorted(unknown)}"
        )
    return [part for part in task_rows.PARTS if part not in skipped]


def counts(text: str, option: str) -> list[int]:
    """A comma-separated list of positive counts, e.g. ``1,4``."""
    try:
        found = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        found = []
    if not found or min(found) < 1:
        raise BenchError(f"{option} takes positive counts separated by commas, got {text!r}")
    return found


def check(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The worker drains' contenders (``--contenders`` for the workers part, jobstate with
    and without a policy for the policy part) and the parts to run, or
    :class:`BenchError` for an option the command cannot run with (checked before the
    database is made)."""
    contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = set(contenders) - set(tasks.DRAIN_CONTENDERS)
    if unknown:
        raise BenchError(
            f"unknown contender(s) {sorted(unknown)}; known: {', '.join(tasks.DRAIN_CONTENDERS)}"
        )
    counts(args.concurrency, "--concurrency")
    for option in ("workers", "tasks", "repeats", "jobs", "mysql_jobs", "batch"):
        if getattr(args, option) < 1:
            raise BenchError(f"--{option.replace('_', '-')} takes a positive count")
    if args.mysql and not is_mysql(args.mysql):
        raise BenchError(f"--mysql takes a mysql:// or mariadb:// URL, got {args.mysql!r}")
    parts = chosen_parts(args.skip)
    if not args.startups:
        parts = [part for part in parts if part != "startup"]
    drained = [
        *(contenders if "workers" in parts else []),
        *(task_rows.POLICY_CONTENDERS if "policy" in parts else []),
    ]
    return drained, parts


def _print(*blocks: str) -> None:
    for block in blocks:
        if block:
            print()
            print(block)


def run(args: argparse.Namespace, url: str, result: dict[str, Any]) -> None:
    from django.conf import settings

    contenders, parts = check(args)
    entries = tasks.lineup(
        contenders, workers=args.workers, concurrencies=counts(args.concurrency, "--concurrency")
    )

    def log(line: str) -> None:
        print(line, flush=True)

    stores = task_rows.store_contenders(parts)
    log(
        f"tasks: {', '.join(parts)}{' and MariaDB' if args.mysql else ''}; rounds: {args.repeats}, "
        f"taking turns; load average {load_average()}\n"
        f"  worker drains of {args.tasks} no-op tasks: "
        f"{'; '.join(e.label for e in entries) or 'skipped'}; "
        f"CONN_MAX_AGE = {settings.DATABASES['default']['CONN_MAX_AGE']} for every Django "
        "contender (procrastinate: its worker's pool)\n"
        f"  store drains of {args.jobs} jobs, {task_rows.processes(args.workers)} each, "
        f"every process on the connection it opened first, Django's default settings: "
        f"{', '.join(stores) or 'skipped'}"
    )
    drains = []
    if entries:
        drains = tasks.drain(url, entries=entries, tasks=args.tasks, repeats=args.repeats, log=log)
    if stores:
        log("store drains:")
    store = task_rows.store_drain(
        url, parts=parts, workers=args.workers, jobs=args.jobs, repeats=args.repeats, log=log
    )
    mysql: task_rows.Summaries = {}
    if args.mysql:
        log(f"MariaDB drains of {args.mysql_jobs} jobs, {task_rows.processes(args.workers)}:")
        mysql, result["mysql_manifest"] = task_rows.mariadb_drain(
            args.mysql,
            args.database,
            workers=args.workers,
            jobs=args.mysql_jobs,
            repeats=args.repeats,
            batch=args.batch,
            keep=args.keep,
            log=log,
        )
    started: dict[str, list[float]] = {}
    if "startup" in parts:
        log("start-up:")
        started = tasks.startup(url, samples=args.startups, log=log)
    spread: dict[str, float] = {}
    if "concurrency" in parts:
        log("concurrency:")
        spread = tasks.concurrency(url, log=log)
    notify: dict[str, float] = {}
    polling: dict[str, float] = {}
    if "latency" in parts:
        log("latency:")
        notify = tasks.latency(url, samples=args.samples, listen=True, log=log)
        polling = tasks.latency(url, samples=args.samples, listen=False, log=log)
    rows = [
        *task_rows.worker_rows(drains),
        *task_rows.policy_rows(drains),
        *task_rows.store_rows(store, args.workers),
        *task_rows.mariadb_rows(mysql, args.workers, args.batch),
        *task_rows.startup_rows(started),
    ]
    text = task_rows.table(drains) if drains else ""
    stores_text = drain.table(store, 1) if store else ""
    mysql_text = mysql_drain.table(mysql, args.batch) if mysql else ""
    compared = task_rows.markdown(rows)
    checks = task_rows.targets(rows, spread, notify)
    _print(text, stores_text, mysql_text, compared, "\n".join(checks))
    log(f"load average at the end: {load_average()}")
    result["tasks"] = {
        "parts": parts,
        "table": text,
        "store_table": stores_text,
        "mysql_table": mysql_text,
        "rows": compared,
        "goals": [row.as_dict() for row in rows],
        "targets": checks,
        "drain": [vars(d) for d in drains],
        "store_cells": [vars(c) for s in store.values() for c in s.cells],
        "mysql_cells": [vars(c) for s in mysql.values() for c in s.cells],
        "startup_seconds": started,
        "concurrency": spread,
        "latency_listen_notify": notify,
        "latency_polling": polling,
    }
