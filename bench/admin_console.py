"""The console's jobs pages at scale, run by ``python -m bench.admin_scale``: the jobs
list with each search kind, a job's page with its timeline, and a bulk requeue over a
filter of the list.

After the seeding of ``bench.admin_scale``, :func:`seed_tasks` turns a share of the
newest jobs into django.tasks tasks (task path, queue, an attempt log naming a worker),
so the ``task:``, ``queue:`` and ``worker:`` searches have something to find among the
rows they look at. The pages are measured like the others (cold, then warm requests;
queries; the slowest statement). Each search page is set against the unfiltered jobs
list of the same run, and the goals are checked: under 500 ms and at most 20 queries.

The bulk requeue runs a :class:`~jobstate.models.BulkOperation` over
``status = done, target = reports`` (about 10% of the jobs: 100,000 at a million) to
its end with :func:`jobstate.console.bulk.advance_bulk_operation`, timing every statement with
``connection.execute_wrapper``; it reports the jobs requeued, the wall time, the
statements, the slowest one (the goal: none over 1 s) and the time per job beside one
single-job requeue of the same run.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

#: Goals the pages are checked against.
PAGE_LIMIT_MS = 500.0
QUERY_LIMIT = 20
STATEMENT_LIMIT_MS = 1000.0

#: The share of the newest jobs that become tasks, and how many newest jobs that is
#: drawn from (the search window of jobstate.console.job_search is 100,000).
TASK_SHARE = 0.5
TASK_POOL = 300_000

#: The bulk requeue's filter.
BULK_FILTER = {"status__exact": "done", "target": "reports"}

_SEED_TASKS_SQL = """
UPDATE jobstate_job AS j SET
    task_path = (ARRAY['app.tasks.send_email', 'app.tasks.charge', 'app.reports.build'])[
        1 + (abs(hashtext(j.request_id)) %% 3)],
    queue_name = (ARRAY['emails', 'default', 'reports'])[1 + (abs(hashtext(j.request_id)) %% 3)],
    max_attempts = 3,
    attempt_log = jsonb_build_array(jsonb_build_object(
        'worker_id', 'worker-' || (1 + abs(hashtext(j.request_id || 'w')) %% 16),
        'started_at', j.created_at, 'finished_at', j.updated_at,
        'outcome', CASE WHEN j.status = 'error' THEN 'failed' ELSE 'successful' END))
WHERE j.created_at >= (
    SELECT created_at FROM jobstate_job ORDER BY created_at DESC OFFSET %(pool)s LIMIT 1
) AND abs(hashtext(j.request_id || 't')) %% 100 < %(percent)s
"""


def seed_tasks(connection: Any, jobs: int) -> None:
    """Make tasks of a share of the newest jobs (see the module docstring)."""
    pool = min(TASK_POOL, jobs) - 1
    with connection.cursor() as cursor:
        cursor.execute(_SEED_TASKS_SQL, {"pool": pool, "percent": int(TASK_SHARE * 100)})


@dataclass(frozen=True)
class ConsolePage:
    key: str
    label: str
    url: str
    uses_index: str


def console_pages(connection: Any) -> list[ConsolePage]:
    """The jobs list with each search kind, and a retried task's page."""
    from urllib.parse import urlencode

    from django.urls import reverse

    jobs = reverse("admin:jobstate_job_changelist")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id, request_id, (input ->> 'n') FROM jobstate_job "
            "WHERE task_path IS NOT NULL AND status = 'error' ORDER BY created_at DESC LIMIT 1"
        )
        row = cursor.fetchone()
        if row is None:
            cursor.execute("SELECT id, request_id, (input ->> 'n') FROM jobstate_job LIMIT 1")
            row = cursor.fetchone()
    job_id, request_id, number = row
    searches = [
        ("search_request", "search: request id", request_id, "unique request id"),
        ("search_task", "search: task exact", "task:app.tasks.send_email", "recent window"),
        ("search_task_prefix", "search: task prefix", "task:app.tasks.*", "recent window"),
        ("search_queue", "search: queue", "queue:emails", "recent window"),
        ("search_error", "search: error text", "error:RuntimeError", "recent window"),
        ("search_error_rare", "search: rare error", 'error:"bench row 17)"', "recent window"),
        ("search_input", "search: input key", f"input:n={number}", "GIN (input)"),
        ("search_input_common", "search: input, every row", "input:kind=bench", "GIN (input)"),
        ("search_worker", "search: worker", "worker:worker-3", "recent window"),
        (
            "search_combined",
            "search: task + error",
            "task:app.tasks.charge error:RuntimeError",
            "recent window",
        ),
    ]
    pages = [
        ConsolePage(key, label, f"{jobs}?{urlencode({'q': term})}", index)
        for key, label, term, index in searches
    ]
    pages.append(
        ConsolePage(
            "job_page",
            "job page with timeline",
            reverse("admin:jobstate_job_change", args=[job_id]),
            "primary key, audit job_id",
        )
    )
    return pages


@dataclass
class _StatementTimer:
    """An execute wrapper keeping the count, the total and the slowest statements."""

    keep: int = 5
    count: int = 0
    total_ms: float = 0.0
    slowest: list[tuple[float, int, str]] = field(default_factory=list)

    def __call__(
        self, execute: Callable[..., Any], sql: str, params: Any, many: bool, context: Any
    ) -> Any:
        start = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            elapsed = (time.perf_counter() - start) * 1000
            self.count += 1
            self.total_ms += elapsed
            entry = (elapsed, self.count, sql[:300])
            if len(self.slowest) < self.keep:
                heapq.heappush(self.slowest, entry)
            else:
                heapq.heappushpop(self.slowest, entry)

    @property
    def slowest_ms(self) -> float:
        return max((ms for ms, _n, _sql in self.slowest), default=0.0)

    def slowest_sql(self) -> str:
        return max(self.slowest, default=(0.0, 0, ""))[2]


def bulk_requeue(connection: Any) -> dict[str, Any]:
    """Requeue every job of :data:`BULK_FILTER` through a bulk operation, timing each
    statement; and one single-job requeue first, as the reference."""
    from jobstate.console.bulk import advance_bulk_operation, start_bulk_operation
    from jobstate.models import Job
    from jobstate.stores import get_state_store

    reference_job = (
        Job.objects.filter(status="done", target="email").order_by("-created_at").first()
    )
    single_ms = 0.0
    if reference_job is not None:
        start = time.perf_counter()
        get_state_store().requeue_job(
            reference_job.pk, from_statuses=["done"], by="bench", via="bench"
        )
        single_ms = (time.perf_counter() - start) * 1000

    timer = _StatementTimer()
    started = time.perf_counter()
    with connection.execute_wrapper(timer):
        operation = start_bulk_operation(
            action="requeue", filters=BULK_FILTER, search="", operator="bench"
        )
        confirmed = time.perf_counter()
        steps = 0
        while operation.state == "running":
            operation = advance_bulk_operation(operation.pk)
            steps += 1
    finished = time.perf_counter()
    wall = finished - started
    return {
        "filter": BULK_FILTER,
        "matching": operation.total,
        "done": operation.done,
        "skipped": operation.skipped,
        "state": operation.state,
        "steps": steps,
        "confirm_ms": round((confirmed - started) * 1000, 1),
        "seconds": round(wall, 1),
        "statements": timer.count,
        "sql_seconds": round(timer.total_ms / 1000, 1),
        "slowest_statement_ms": round(timer.slowest_ms, 1),
        "slowest_statement": timer.slowest_sql(),
        "slowest_five_ms": sorted((round(ms, 1) for ms, _n, _s in timer.slowest), reverse=True),
        "ms_per_job": round(wall * 1000 / operation.done, 2) if operation.done else None,
        "single_requeue_ms": round(single_ms, 2),
    }


def print_console(report: dict[str, Any]) -> None:
    """The console section of the benchmark's report."""
    console = report.get("console")
    if not console:
        return
    measurements = {m["page"]: m for m in report["measurements"] if m["config"] == "jobstate"}
    unfiltered = measurements.get("jobs")
    print()
    print(
        f"console pages (goal: under {PAGE_LIMIT_MS:.0f} ms and at most {QUERY_LIMIT} queries); "
        "ratio = median ÷ the unfiltered jobs list's median"
    )
    header = (
        f"{'page':<28} {'index':<26} {'cold':>8} {'median':>8} {'queries':>7} "
        f"{'slowest':>8} {'ratio':>6}  goal"
    )
    print(header)
    print("-" * len(header))
    for m in console["pages"]:
        ratio = m["median_ms"] / unfiltered["median_ms"] if unfiltered else float("nan")
        met = m["median_ms"] < PAGE_LIMIT_MS and m["queries"] <= QUERY_LIMIT
        print(
            f"{m['label']:<28} {m['uses_index']:<26} {m['cold_ms']:>8.1f} {m['median_ms']:>8.1f} "
            f"{m['queries']:>7} {m['slowest_sql_ms']:>8.1f} {ratio:>6.2f}  "
            f"{'met' if met else 'NOT MET'}"
        )
    bulk = console.get("bulk")
    if bulk:
        met = bulk["slowest_statement_ms"] < STATEMENT_LIMIT_MS
        print()
        print(
            f"bulk requeue over {bulk['filter']}: {bulk['done']:,} requeued, "
            f"{bulk['skipped']:,} skipped of {bulk['matching']:,} matching; "
            f"{bulk['seconds']} s in {bulk['steps']} steps (confirmation {bulk['confirm_ms']} ms)"
        )
        print(
            f"  {bulk['statements']:,} statements, {bulk['sql_seconds']} s in SQL; slowest "
            f"{bulk['slowest_statement_ms']} ms (goal under {STATEMENT_LIMIT_MS:.0f} ms: "
            f"{'met' if met else 'NOT MET'}); five slowest {bulk['slowest_five_ms']}"
        )
        print(f"  slowest statement: {bulk['slowest_statement'][:200]}")
        if bulk["ms_per_job"] is not None and bulk["single_requeue_ms"]:
            print(
                f"  {bulk['ms_per_job']} ms per job in bulk vs {bulk['single_requeue_ms']} ms for "
                f"one single requeue ({bulk['single_requeue_ms'] / bulk['ms_per_job']:.1f}x)"
            )
