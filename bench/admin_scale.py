"""How the jobstate admin answers at scale, beside the stock Django admin configuration.

Run it from the repository root against a PostgreSQL server::

    python -m bench.admin_scale --jobs 1000000 --audit 1000000
    python -m bench.admin_scale --quick                       # 20,000 rows, a smoke run

It creates its own database (``jobstate_bench_admin`` unless ``--url`` names another;
the name must contain ``bench``, and an existing database of that name is dropped
first), migrates it, seeds the jobs and audit entries inside PostgreSQL with
``INSERT ... SELECT generate_series`` (statuses, targets, threads and ages spread the
way a live queue's history is), runs ``VACUUM ANALYZE``, and then requests each page
with Django's test ``Client`` logged in as a superuser:

- the jobs changelist, unfiltered and filtered by status (``error``);
- the audit changelist;
- the Overview page (with its two finished-jobs charts);
- the Workers page (16 registered workers, the executors of the seeded claimed jobs,
  some lost and some stopped) and the Queues page (one queue paused);
- the job runs, notifications, schedules, runtime locks and bulk operations lists and
  the pages of one run, notification, schedule and worker (``bench.admin_pages``);
- the console's jobs pages (``bench.admin_console``): the jobs list with each search
  kind, a job's page with its timeline, and a bulk requeue over a filter (``--no-bulk``
  leaves it out);

and it times the 24-hour throughput chart's query on its own
(``jobstate.admin.dashboard.finished_per_hour``).

Every page is requested once cold (the first request of this process for that page)
and then ``--warm`` more times; it reports the cold time, the median and the minimum of
the warm ones, the number of SQL queries and the time spent in them
(``CaptureQueriesContext``). The same pages are measured on the stock configuration
(``bench.stock_admin``: plain ``ModelAdmin`` classes, Django's default paginator, full
result counts). The stock admin has no dashboard; its nearest page — counts per status
and per target — is the jobs changelist with facets (``?_facets=1``). It has no Workers
or Queues page either; those are measured on their own.

Server time is measured around ``Client.get``: URL resolution, middleware, the view,
every query and template rendering, but no network and no browser.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.admin_console import PAGE_LIMIT_MS, QUERY_LIMIT, print_console
from bench.admin_pages import over_budget
from bench.pg import (
    BenchError,
    connect,
    database_name,
    drop_database,
    manifest,
    recreate_database,
)

DEFAULT_URL = "postgres://postgres@127.0.0.1:5432/jobstate_bench_admin"
FULL_ROWS = 1_000_000
QUICK_ROWS = 20_000

#: How far back the seeded history reaches; the newest rows are "now".
HISTORY_DAYS = 30
#: The newest share of the jobs is the live queue (queued, running, dispatched and
#: recently finished); everything older is finished history.
LIVE_SHARE = 0.03
#: Distinct conversation threads among the jobs that have one (70% of them).
THREADS = 50_000

#: The PostgreSQL settings recorded with every run.
RECORDED_SETTINGS = (
    "shared_buffers",
    "work_mem",
    "effective_cache_size",
    "random_page_cost",
    "effective_io_concurrency",
    "max_parallel_workers_per_gather",
    "jit",
    "synchronous_commit",
    "default_statistics_target",
)

TARGETS = (
    "email",
    "billing",
    "reports",
    "exports",
    "webhooks",
    "search-index",
    "thumbnails",
    "sms",
)
SOURCES = ("api", "web", "cron", "celery")

# Status of a row from its age and one random draw: the newest LIVE_SHARE of the rows
# is the live queue, the rest is history. Targets are skewed (squared draw), so a few
# targets carry most of the traffic, as in practice.
_SEED_JOBS_SQL = """
INSERT INTO jobstate_job (
    id, request_id, status, target, source, thread_id, session_id, input, input_preview,
    result, report, usage, error, metadata, callback_url, attempts, run_after, claimed_at,
    lease_until, executor_id, dispatched_at, claim_token, created_at, updated_at
)
SELECT
    md5('bench-job-' || g.i)::uuid,
    'bench-' || g.i,
    g.status,
    (%(targets)s::text[])[1 + floor(g.r_target ^ 2 * %(target_count)s)::int],
    (%(sources)s::text[])[1 + floor(g.r_source * %(source_count)s)::int],
    CASE WHEN g.r_thread < 0.7 THEN 1 + floor(g.r_thread / 0.7 * %(threads)s)::bigint END,
    NULL,
    jsonb_build_object('n', g.i, 'kind', 'bench'),
    'bench job ' || g.i,
    CASE WHEN g.status = 'done' THEN jsonb_build_object('ok', true) END,
    NULL,
    NULL,
    CASE WHEN g.status = 'error'
         THEN 'RuntimeError: upstream answered 503 (bench row ' || g.i || ')' END,
    '{}'::jsonb,
    NULL,
    CASE WHEN g.status = 'queued' THEN 0 WHEN g.status = 'error' THEN 3 ELSE 1 END,
    CASE WHEN g.status = 'queued' AND g.r_aux < 0.2
         THEN now() + make_interval(mins => 1 + floor(g.r_aux * 300)::int) END,
    CASE WHEN g.status IN ('running', 'dispatched') THEN g.created END,
    -- A quarter of the claimed jobs hold a lease that has already run out.
    CASE WHEN g.status IN ('running', 'dispatched')
         THEN now() + make_interval(secs => (g.r_aux - 0.25) * 600) END,
    CASE WHEN g.status IN ('running', 'dispatched')
         THEN 'worker-' || (1 + floor(g.r_aux * 16)::int) END,
    CASE WHEN g.status = 'dispatched' THEN g.created END,
    CASE WHEN g.status IN ('running', 'dispatched') THEN gen_random_uuid() END,
    g.created,
    CASE WHEN g.status IN ('done', 'error', 'rejected')
         THEN LEAST(now(), g.created + make_interval(secs => 1 + g.r_aux * 120))
         ELSE g.created END
FROM (
    SELECT
        raw.*,
        CASE
            WHEN raw.age < %(live_share)s THEN
                CASE WHEN raw.r_status < 0.40 THEN 'queued'
                     WHEN raw.r_status < 0.50 THEN 'running'
                     WHEN raw.r_status < 0.60 THEN 'dispatched'
                     WHEN raw.r_status < 0.90 THEN 'done'
                     WHEN raw.r_status < 0.98 THEN 'error'
                     ELSE 'rejected' END
            ELSE
                CASE WHEN raw.r_status < 0.90 THEN 'done'
                     WHEN raw.r_status < 0.97 THEN 'error'
                     ELSE 'rejected' END
        END AS status
    FROM (
        SELECT
            i,
            (%(n)s - i)::float / %(n)s AS age,
            now() - make_interval(secs => (%(n)s - i + random()) * %(span)s / %(n)s) AS created,
            random() AS r_status,
            random() AS r_target,
            random() AS r_source,
            random() AS r_thread,
            random() AS r_aux
        FROM generate_series(1, %(n)s) AS i
    ) AS raw
) AS g
"""

# Audit entries belong to the seeded jobs (ids derive from the same row number), a few
# seconds after their job was created; a second round per job when there are more
# entries than jobs.
_SEED_AUDIT_SQL = """
WITH events (idx, event, stage, severity, title) AS (
    VALUES
        (0, 'received', 'launch', 'info', 'Request received'),
        (1, 'started', 'execution', 'info', 'Started'),
        (2, 'finished', 'summary', 'info', 'Finished'),
        (3, 'retry_scheduled', 'recovery', 'warning', 'Retry scheduled'),
        (4, 'delivery_queued', 'delivery', 'info', 'Delivery queued'),
        (5, 'delivery_error', 'delivery', 'error', 'Delivery failed')
)
INSERT INTO jobstate_auditentry (ts, job_id, request_id, event, stage, severity, title,
                                 summary, detail)
SELECT
    LEAST(now(), now() - make_interval(secs => (%(jobs)s - s.j)::float * %(span)s / %(jobs)s)
                 + make_interval(secs => 1 + s.round * 5)),
    md5('bench-job-' || s.j)::uuid,
    'bench-' || s.j,
    e.event,
    e.stage,
    e.severity,
    e.title,
    '',
    jsonb_build_object('bench', true)
FROM (
    SELECT 1 + (i - 1) %% %(jobs)s AS j, (i - 1) / %(jobs)s AS round,
           floor(random() * 6)::int AS e
    FROM generate_series(1, %(n)s) AS i
) AS s
JOIN events AS e ON e.idx = s.e
"""


@dataclass(frozen=True)
class Page:
    key: str
    label: str
    url: str


@dataclass
class Measurement:
    config: str
    page: str
    label: str
    url: str
    cold_ms: float
    median_ms: float
    min_ms: float
    queries: int
    sql_ms: float
    slowest_sql_ms: float
    slowest_sql: str
    bytes: int
    warm_ms: list[float] = field(default_factory=list)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    default_rows = QUICK_ROWS if args.quick else FULL_ROWS
    jobs = default_rows if args.jobs is None else args.jobs
    audit = default_rows if args.audit is None else args.audit
    if jobs < 1 or audit < 0:
        raise BenchError("--jobs must be at least 1 and --audit at least 0")
    if args.warm < 1:
        raise BenchError("--warm must be at least 1")
    _check_url(args.url)

    load_before = os.getloadavg()
    # Refuses a database whose name lacks "bench" before touching anything.
    recreate_database(args.url)
    with connect(args.url) as conn:
        run_manifest = manifest(conn)
    _setup_django(args.url)
    try:
        report = _run(jobs=jobs, audit=audit, warm=args.warm, bulk=not args.no_bulk)
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep:
            drop_database(args.url)
    report["manifest"] = run_manifest
    report["machine"]["load_average_before"] = [round(x, 2) for x in load_before]
    report["database"]["name"] = database_name(args.url)
    report["database"]["kept"] = args.keep
    _print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.admin_scale",
        description="Seed PostgreSQL with jobs and audit entries and time the admin pages, "
        "the jobstate admin beside the stock Django admin configuration.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("JOBSTATE_BENCH_POSTGRES_URL", DEFAULT_URL),
        help="PostgreSQL URL of the database to create (dropped first; its name must "
        f"contain 'bench'). Default: $JOBSTATE_BENCH_POSTGRES_URL or {DEFAULT_URL}",
    )
    parser.add_argument("--jobs", type=int, help=f"jobs to seed (default {FULL_ROWS:,})")
    parser.add_argument("--audit", type=int, help=f"audit entries to seed (default {FULL_ROWS:,})")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {QUICK_ROWS:,} rows of each unless --jobs/--audit say otherwise",
    )
    parser.add_argument(
        "--warm", type=int, default=5, help="warm requests per page after the cold one"
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument(
        "--keep", action="store_true", help="leave the database in place afterwards"
    )
    parser.add_argument(
        "--no-bulk", action="store_true", help="skip the bulk requeue (it changes the data)"
    )
    return parser.parse_args(argv)


def _check_url(url: str) -> None:
    scheme = urlsplit(url).scheme
    if scheme not in {"postgres", "postgresql"}:
        raise BenchError(f"--url must be a PostgreSQL URL, not {scheme!r}")


def _setup_django(url: str) -> None:
    # The settings read these at import; DEBUG off so timings are a deployment's.
    os.environ["DATABASE_URL"] = url
    os.environ["DEBUG"] = "false"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    import django

    django.setup()


def _run(*, jobs: int, audit: int, warm: int, bulk: bool = True) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import override_settings

    from bench import admin_console, admin_pages

    started = time.perf_counter()
    call_command("migrate", verbosity=0, interactive=False)
    migrated = time.perf_counter()
    _seed(connection, jobs=jobs, audit=audit)
    admin_console.seed_tasks(connection, jobs)
    admin_pages.seed(connection, jobs)
    seeded = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    analysed = time.perf_counter()

    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench")
    client = Client()
    client.force_login(user)

    measurements: list[Measurement] = []
    with override_settings(ROOT_URLCONF="bench.stock_admin"):
        stock = {page.key: page for page in _stock_pages()}
        # The admin's own imports and template loading are paid once here, so each
        # page's cold request shows that page's own first-time cost.
        _get(client, "/admin/")
        for page in _jobstate_pages():
            measurements.append(_measure(client, "jobstate", page, warm))
            if page.key in stock:
                measurements.append(_measure(client, "stock", stock[page.key], warm))
    for extra_page in admin_pages.pages(connection):
        measurements.append(
            _measure(
                client, "jobstate", Page(extra_page.key, extra_page.label, extra_page.url), warm
            )
        )
    measurements.append(_measure_chart(warm))
    console: dict[str, Any] = {"pages": []}
    for extra in admin_console.console_pages(connection):
        measured = _measure(client, "jobstate", Page(extra.key, extra.label, extra.url), warm)
        console["pages"].append({**asdict(measured), "uses_index": extra.uses_index})
    if bulk:
        console["bulk"] = admin_console.bulk_requeue(connection)

    return {
        "rows": {"jobs": jobs, "audit": audit},
        "seconds": {
            "migrate": round(migrated - started, 2),
            "seed": round(seeded - migrated, 2),
            "vacuum_analyze": round(analysed - seeded, 2),
        },
        "warm_requests": warm,
        "database": _database_facts(connection),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "django": _django_version(),
            "load_average_after": [round(x, 2) for x in os.getloadavg()],
        },
        "measurements": [asdict(m) for m in measurements],
        "console": console,
    }


#: The registered workers: the executors the seeded claimed jobs name (``worker-1`` to
#: ``worker-16``), beating now except two that went silent (lost) and one that stopped.
_SEED_WORKERS_SQL = """
INSERT INTO jobstate_worker (worker_id, kind, host, pid, backend, queues, concurrency, lease,
                             started_at, heartbeat_at, stopped_at, stopped_reason)
SELECT 'worker-' || i, 'tasks', 'app-' || (1 + mod(i, 4)), 1000 + i, 'default',
       '["default"]'::jsonb, 8, interval '1 minute', now() - interval '3 hours',
       CASE WHEN i IN (15, 16) THEN now() - interval '10 minutes' ELSE now() END,
       CASE WHEN i = 14 THEN now() END, CASE WHEN i = 14 THEN 'SIGTERM' ELSE '' END
FROM generate_series(1, 16) AS i
"""


def _seed(connection: Any, *, jobs: int, audit: int) -> None:
    span = HISTORY_DAYS * 86_400
    with connection.cursor() as cursor:
        cursor.execute(
            _SEED_JOBS_SQL,
            {
                "n": jobs,
                "span": span,
                "live_share": LIVE_SHARE,
                "threads": THREADS,
                "targets": list(TARGETS),
                "target_count": len(TARGETS),
                "sources": list(SOURCES),
                "source_count": len(SOURCES),
            },
        )
        if audit:
            cursor.execute(_SEED_AUDIT_SQL, {"n": audit, "jobs": jobs, "span": span})
        cursor.execute(_SEED_WORKERS_SQL)
        cursor.execute(
            "INSERT INTO jobstate_queuepause (target, queue_name, paused_at, paused_by) "
            "VALUES ('sms', '', now(), 'bench')"
        )


def _jobstate_pages() -> list[Page]:
    from django.urls import reverse

    jobs = reverse("admin:jobstate_job_changelist")
    return [
        Page("jobs", "jobs changelist", jobs),
        Page("jobs_error", "jobs, status = error", f"{jobs}?status__exact=error"),
        Page("audit", "audit changelist", reverse("admin:jobstate_auditentry_changelist")),
        Page("dashboard", "dashboard", reverse("admin:jobstate_dashboard")),
        Page("workers", "workers page", reverse("admin:jobstate_worker_changelist")),
        Page("queues", "queues page", reverse("admin:jobstate_queuepause_changelist")),
    ]


def _stock_pages() -> list[Page]:
    from django.urls import reverse

    jobs = reverse("stock_admin:jobstate_job_changelist")
    return [
        Page("jobs", "jobs changelist", jobs),
        Page("jobs_error", "jobs, status = error", f"{jobs}?status__exact=error"),
        Page("audit", "audit changelist", reverse("stock_admin:jobstate_auditentry_changelist")),
        Page("dashboard", "jobs changelist with facets", f"{jobs}?_facets=1"),
    ]


def _get(client: Any, url: str) -> Any:
    response = client.get(url)
    if response.status_code != 200:
        raise BenchError(f"GET {url} answered {response.status_code}, not 200")
    return response


def _measure(client: Any, config: str, page: Page, warm: int) -> Measurement:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    times: list[float] = []
    size = 0
    queries = 0
    timer = _QueryTimer()
    for _ in range(1 + warm):
        timer = _QueryTimer()
        with CaptureQueriesContext(connection) as context, connection.execute_wrapper(timer):
            start = time.perf_counter()
            response = _get(client, page.url)
            times.append((time.perf_counter() - start) * 1000)
        size = len(response.content)
        queries = len(context.captured_queries)
    sql_times = timer.elapsed_ms
    slowest = max(range(len(sql_times)), key=lambda i: sql_times[i], default=None)
    warm_times = times[1:]
    return Measurement(
        config=config,
        page=page.key,
        label=page.label,
        url=page.url,
        cold_ms=round(times[0], 1),
        median_ms=round(statistics.median(warm_times), 1),
        min_ms=round(min(warm_times), 1),
        queries=queries,
        sql_ms=round(sum(sql_times), 1),
        slowest_sql_ms=round(sql_times[slowest], 1) if slowest is not None else 0.0,
        slowest_sql=timer.statements[slowest][:300] if slowest is not None else "",
        bytes=size,
        warm_ms=[round(t, 1) for t in warm_times],
    )


def _measure_chart(warm: int) -> Measurement:
    """The 24-hour throughput chart's query alone, timed like a page."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from jobstate.admin.dashboard import finished_per_hour

    times: list[float] = []
    queries = 0
    timer = _QueryTimer()
    for _ in range(1 + warm):
        timer = _QueryTimer()
        with CaptureQueriesContext(connection) as context, connection.execute_wrapper(timer):
            start = time.perf_counter()
            finished_per_hour()
            times.append((time.perf_counter() - start) * 1000)
        queries = len(context.captured_queries)
    warm_times = times[1:]
    return Measurement(
        config="jobstate",
        page="throughput",
        label="throughput chart (24 h)",
        url="",
        cold_ms=round(times[0], 1),
        median_ms=round(statistics.median(warm_times), 1),
        min_ms=round(min(warm_times), 1),
        queries=queries,
        sql_ms=round(sum(timer.elapsed_ms), 1),
        slowest_sql_ms=round(max(timer.elapsed_ms, default=0.0), 1),
        slowest_sql=timer.statements[0][:300] if timer.statements else "",
        bytes=0,
        warm_ms=[round(t, 1) for t in warm_times],
    )


class _QueryTimer:
    """An execute wrapper timing each statement to the microsecond (the captured
    queries' own ``time`` is rounded to the millisecond)."""

    def __init__(self) -> None:
        self.statements: list[str] = []
        self.elapsed_ms: list[float] = []

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        self.statements.append(sql)
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.elapsed_ms.append((time.perf_counter() - start) * 1000)


def _database_facts(connection: Any) -> dict[str, Any]:
    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        version = cursor.fetchone()[0]
        cursor.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s) "
            "ORDER BY name",
            [list(RECORDED_SETTINGS)],
        )
        settings = dict(cursor.fetchall())
        cursor.execute(
            "SELECT relname, pg_total_relation_size(oid) FROM pg_class "
            "WHERE relname IN ('jobstate_job', 'jobstate_auditentry') ORDER BY relname"
        )
        sizes = {name: _mib(size) for name, size in cursor}
        cursor.execute("SELECT status, count(*) FROM jobstate_job GROUP BY status ORDER BY 1")
        by_status = dict(cursor.fetchall())
    return {
        "server_version": version,
        "settings": settings,
        "table_sizes": sizes,
        "jobs_by_status": by_status,
    }


def _mib(size: int) -> str:
    return f"{size / 1_048_576:.1f} MiB"


def _django_version() -> str:
    import django

    return django.get_version()


def _print_report(report: dict[str, Any]) -> None:
    rows, db, machine = report["rows"], report["database"], report["machine"]
    print(f"admin scale: {rows['jobs']:,} jobs, {rows['audit']:,} audit entries")
    print(
        f"PostgreSQL {db['server_version']}; Django {machine['django']}; "
        f"Python {machine['python']}; {machine['cpus']} CPUs; {machine['platform']}"
    )
    print("settings: " + ", ".join(f"{k}={v}" for k, v in db["settings"].items()))
    print("tables: " + ", ".join(f"{k} {v}" for k, v in db["table_sizes"].items()))
    print("jobs by status: " + ", ".join(f"{k} {v:,}" for k, v in db["jobs_by_status"].items()))
    seconds = report["seconds"]
    print(
        f"migrate {seconds['migrate']} s, seed {seconds['seed']} s, "
        f"VACUUM ANALYZE {seconds['vacuum_analyze']} s; load average "
        f"{machine['load_average_before']} before, {machine['load_average_after']} after"
    )
    print(
        f"times in ms: cold = first request, median/min of {report['warm_requests']} warm "
        "ones; queries, sql (their total) and slowest (one statement) of the last request"
    )
    print()
    header = (
        f"{'page':<30} {'config':<9} {'cold':>9} {'median':>9} {'min':>9} "
        f"{'queries':>7} {'sql':>9} {'slowest':>9}"
    )
    print(header)
    print("-" * len(header))
    by_key: dict[str, dict[str, dict[str, Any]]] = {}
    for m in report["measurements"]:
        by_key.setdefault(m["page"], {})[m["config"]] = m
        print(
            f"{m['label']:<30} {m['config']:<9} {m['cold_ms']:>9.1f} {m['median_ms']:>9.1f} "
            f"{m['min_ms']:>9.1f} {m['queries']:>7} {m['sql_ms']:>9.1f} "
            f"{m['slowest_sql_ms']:>9.1f}"
        )
    print()
    print("stock ÷ jobstate (median server time; queries):")
    for configs in by_key.values():
        ours, stock = configs.get("jobstate"), configs.get("stock")
        if ours is None or stock is None:
            continue
        ratio = stock["median_ms"] / ours["median_ms"] if ours["median_ms"] else float("inf")
        print(
            f"  {ours['label']:<28} {ratio:6.1f}x time   "
            f"{stock['queries']} vs {ours['queries']} queries   ({stock['label']})"
        )
    print_console(report)
    print()
    over = over_budget(report["measurements"] + report["console"]["pages"])
    print(
        f"every page under {PAGE_LIMIT_MS:.0f} ms (median) and {QUERY_LIMIT} queries: "
        + ("yes" if not over else "NO: " + "; ".join(over))
    )


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
