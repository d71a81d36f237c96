"""Maintenance and observability at scale: heartbeat cost, reaping stale leases and
pruning the audit ledger on million-row tables while live traffic continues, and the
metrics snapshot.

Reap and prune run through the same functions the management commands and Celery tasks
call (:mod:`jobstate.maintenance`), in their default batches. While they run, a separate
process keeps claiming and completing jobs (or appending audit entries) and records the
latency of every call; the same process first runs alone for a baseline window. Each
statement of the sweep is timed through a Django execute wrapper, and each batch (one
transaction, so the longest time any row lock is held) from the sweep's progress
callback.
"""

from __future__ import annotations

import multiprocessing
import statistics
import time
from datetime import timedelta
from typing import Any

import psycopg

from bench.pg import BenchError, percentile, setup_django

LIVE_TARGET = "live"
#: How long the traffic runs alone before a sweep starts: long enough that its p99 rests
#: on a few thousand calls, not on the handful of slowest ones.
BASELINE_SECONDS = 10.0


# --- fixtures -----------------------------------------------------------------------------


def load_jobs(url: str, rows: int, stale: int, live: int) -> None:
    """``rows`` jobs in total: ``stale`` dispatched ones whose lease expired an hour ago,
    ``live`` queued ones of target ``live`` for the claimer, the rest finished (done,
    error, rejected) over the last 30 days, the mix a long-lived queue's history has."""
    finished = rows - stale - live
    if finished < 0:
        raise BenchError("rows must be at least stale + live")
    common = (
        "id, request_id, status, target, source, input, input_preview, metadata, "
        "attempts, created_at, updated_at"
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO jobstate_job ({common}) "
            "SELECT gen_random_uuid(), 'done-' || g, "
            "(ARRAY['done','done','done','done','error','rejected'])[1 + g %% 6], "
            "'t' || (g %% 8), 'bench', jsonb_build_object('n', g), '', '{}'::jsonb, 1, "
            "now() - (g %% 2592000) * interval '1 second', "
            "now() - (g %% 2592000) * interval '1 second' "
            "FROM generate_series(1, %s) AS g",
            [finished],
        )
        conn.execute(
            f"INSERT INTO jobstate_job ({common}, executor_id, claimed_at, dispatched_at, "
            "lease_until, claim_token) "
            "SELECT gen_random_uuid(), 'stale-' || g, 'dispatched', 't' || (g %% 8), 'bench', "
            "jsonb_build_object('n', g), '', '{}'::jsonb, 1, now() - interval '2 hours', "
            "now() - interval '2 hours', 'exec-' || (g %% 50), now() - interval '2 hours', "
            "now() - interval '2 hours', now() - interval '1 hour', gen_random_uuid() "
            "FROM generate_series(1, %s) AS g",
            [stale],
        )
        conn.execute(
            f"INSERT INTO jobstate_job ({common}) "
            "SELECT gen_random_uuid(), 'live-' || g, 'queued', %s, 'bench', "
            "jsonb_build_object('n', g), '', '{}'::jsonb, 0, clock_timestamp(), "
            "clock_timestamp() FROM generate_series(1, %s) AS g",
            [LIVE_TARGET, live],
        )
        conn.execute("VACUUM (ANALYZE) jobstate_job")


def load_audit(url: str, old: int, recent: int) -> None:
    """``old`` audit entries from 100-130 days ago (past the default retention) and
    ``recent`` ones from the last day."""
    columns = "request_id, event, stage, severity, title, summary, detail, ts"
    with psycopg.connect(url, autocommit=True) as conn:
        for count, age in (
            (old, "interval '100 days' + (g %% 2592000) * interval '1 second'"),
            (recent, "(g %% 86400) * interval '1 second'"),
        ):
            conn.execute(
                f"INSERT INTO jobstate_auditentry ({columns}) "
                "SELECT 'req-' || g, 'enqueued', 'launch', 'info', 'Enqueued', '', "
                f"jsonb_build_object('n', g), now() - {age} "
                "FROM generate_series(1, %s) AS g",
                [count],
            )
        conn.execute("VACUUM (ANALYZE) jobstate_auditentry")


# --- load generators (separate processes) -------------------------------------------------


def _claimer(url: str, seconds: float, started: Any, stop: Any, results: Any) -> None:
    setup_django(url)
    from jobstate.stores import get_state_store

    store = get_state_store()
    latencies: list[tuple[float, float]] = []
    store.claim_next_inhub_job([LIVE_TARGET], "claimer")  # connect and warm
    started.set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not stop.is_set():
        begin = time.monotonic()
        job = store.claim_next_inhub_job([LIVE_TARGET], "claimer")
        latencies.append((time.time(), time.monotonic() - begin))
        if job is None:
            break
        store.complete_claimed_job(job.id, job.claim_token or "", "done")
    results.put(latencies)


def _inserter(url: str, seconds: float, started: Any, stop: Any, results: Any) -> None:
    setup_django(url)
    from jobstate.stores import get_state_store

    store = get_state_store()
    latencies: list[tuple[float, float]] = []
    store.append_audit(request_id="warm", event="enqueued")
    started.set()
    deadline = time.monotonic() + seconds
    counter = 0
    while time.monotonic() < deadline and not stop.is_set():
        counter += 1
        begin = time.monotonic()
        store.append_audit(request_id=f"live-{counter}", event="enqueued", detail={"n": counter})
        latencies.append((time.time(), time.monotonic() - begin))
        time.sleep(0.002)
    results.put(latencies)


def _under_load(
    url: str, traffic: Any, sweep: Any, budget: float, baseline: float = BASELINE_SECONDS
) -> dict[str, Any]:
    """Run ``traffic`` in its own process: a baseline window alone, then ``sweep()`` in
    this process while it continues. Returns latency figures before and during, and
    the sweep's own figures."""
    context = multiprocessing.get_context("spawn")
    started = context.Event()
    stop = context.Event()
    results = context.Queue()
    process = context.Process(
        target=traffic, args=(url, baseline + budget, started, stop, results), daemon=True
    )
    process.start()
    if not started.wait(120):
        process.kill()
        raise BenchError("the traffic process did not start")
    time.sleep(baseline)
    sweep_start = time.time()
    figures = sweep()
    sweep_end = time.time()
    stop.set()
    latencies = results.get(timeout=baseline + budget + 120)
    process.join()
    before = [lat for at, lat in latencies if at < sweep_start]
    during = [lat for at, lat in latencies if sweep_start <= at <= sweep_end]

    def summary(values: list[float]) -> dict[str, float]:
        return {
            "calls": len(values),
            "p50_ms": percentile(values, 0.5) * 1000,
            "p99_ms": percentile(values, 0.99) * 1000,
            "max_ms": (max(values) * 1000) if values else float("nan"),
        }

    base, load = summary(before), summary(during)
    figures.update(
        {
            "traffic_before": base,
            "traffic_during": load,
            "p99_ratio": load["p99_ms"] / base["p99_ms"] if base["p99_ms"] else float("nan"),
            "sweep_seconds": sweep_end - sweep_start,
        }
    )
    return figures


def _timed_sweep(run: Any) -> dict[str, Any]:
    """Run ``run(on_batch)`` timing every statement (execute wrapper) and every batch."""
    from django.db import connection

    statements: list[float] = []
    marks: list[float] = []

    def timer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        begin = time.monotonic()
        try:
            return execute(sql, params, many, context)
        finally:
            statements.append(time.monotonic() - begin)

    def on_batch(sweep: str, total: int) -> None:
        marks.append(time.monotonic())

    begin = time.monotonic()
    with connection.execute_wrapper(timer):
        result = run(on_batch)
    batches = [b - a for a, b in zip([begin, *marks], marks, strict=False)]
    # Whether later batches cost more than early ones (a sweep that rescans what it has
    # already deleted slows down as it goes): the median of the first and last tenth.
    tenth = max(len(batches) // 10, 1)
    return {
        "rows": result.count,
        "batches": result.batches,
        "complete": result.complete,
        "longest_statement_ms": max(statements) * 1000 if statements else 0.0,
        "longest_batch_transaction_ms": max(batches) * 1000 if batches else 0.0,
        "first_tenth_batch_ms": percentile(batches[:tenth], 0.5) * 1000 if batches else 0.0,
        "last_tenth_batch_ms": percentile(batches[-tenth:], 0.5) * 1000 if batches else 0.0,
        "statements": len(statements),
    }


# --- the measurements -----------------------------------------------------------------------


def heartbeat(url: str, leased: int = 1000, calls: int = 2000) -> dict[str, Any]:
    """Per-job lease extension (``extend_claim_lease``) and one executor's renewal of all
    its dispatched jobs in one statement (``extend_executor_leases``)."""
    from jobstate.stores import get_state_store

    store = get_state_store()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO jobstate_job (id, request_id, status, target, source, input, "
            "input_preview, metadata, attempts, created_at, updated_at) "
            "SELECT gen_random_uuid(), 'hb-' || g, 'queued', 'hb', 'bench', '{}'::jsonb, '', "
            "'{}'::jsonb, 0, clock_timestamp(), clock_timestamp() "
            "FROM generate_series(1, %s) AS g",
            [2 * leased],
        )
    jobs = store.claim_next_inhub_jobs(["hb"], "hb-worker", limit=leased)
    for _ in range(leased):
        store.claim_next_job(["hb"], "hb-executor")
    timings = []
    for index in range(calls):
        job = jobs[index % len(jobs)]
        begin = time.perf_counter()
        if not store.extend_claim_lease(job.id, job.claim_token or "", timedelta(minutes=5)):
            raise BenchError("a current claim's lease extension was refused")
        timings.append(time.perf_counter() - begin)
    renewals = []
    for _ in range(20):
        begin = time.perf_counter()
        renewed = store.extend_executor_leases("hb-executor", timedelta(minutes=5))
        renewals.append(time.perf_counter() - begin)
    return {
        "extend_claim_lease_ms": {
            "median": statistics.median(timings) * 1000,
            "p99": percentile(timings, 0.99) * 1000,
            "per_second_one_connection": len(timings) / sum(timings),
        },
        "extend_executor_leases": {
            "jobs": renewed,
            "median_ms": statistics.median(renewals) * 1000,
            "max_ms": max(renewals) * 1000,
        },
    }


def metrics(repeats: int = 7) -> dict[str, Any]:
    """The metrics snapshot as a scrape gets it (finished jobs estimated from table
    statistics once the table is large) and with every count exact: the first call
    of the process and the median and maximum of ``repeats`` warm ones."""
    from jobstate.stores import get_state_store

    store = get_state_store()
    figures: dict[str, Any] = {}
    for name, exact in (("estimated", False), ("exact", True)):
        timings = []
        for _ in range(repeats + 1):
            begin = time.perf_counter()
            snapshot = store.operational_metrics_snapshot(exact=exact)
            timings.append(time.perf_counter() - begin)
        warm = timings[1:]
        figures[name] = {
            "first_ms": timings[0] * 1000,
            "warm_median_ms": statistics.median(warm) * 1000,
            "warm_max_ms": max(warm) * 1000,
            "estimated_statuses": list(snapshot.estimated_statuses),
        }
    return figures


def targets(result: dict[str, Any]) -> list[str]:
    """The issue's sweep and metrics targets, each as measured and whether it was met."""
    lines = []
    for sweep in ("reap", "prune"):
        figures = result.get(sweep)
        if not figures:
            continue
        longest = max(figures["longest_statement_ms"], figures["longest_batch_transaction_ms"])
        lines.append(
            f"{sweep}: longest statement or batch transaction {longest:.0f} ms (target < 1000) "
            f"- {'met' if longest < 1000 else 'NOT met'}"
        )
        ratio = figures["p99_ratio"]
        traffic = "claim" if sweep == "reap" else "audit insert"
        lines.append(
            f"{sweep}: {traffic} p99 during / before {ratio:.2f} (target <= 3) "
            f"- {'met' if ratio <= 3 else 'NOT met'}"
        )
    snapshot = result.get("metrics_snapshot", {}).get("estimated")
    if snapshot:
        warm = snapshot["warm_median_ms"]
        lines.append(
            f"metrics snapshot at {result['rows']:,} jobs, warm: {warm:.0f} ms (target < 100) "
            f"- {'met' if warm < 100 else 'NOT met'}"
        )
    return lines


def run(
    url: str,
    *,
    rows: int,
    stale: int,
    audit: int,
    baseline: float = BASELINE_SECONDS,
    log: Any = print,
) -> dict[str, Any]:
    from jobstate import maintenance

    live = min(200_000, max(rows // 5, 1000))
    result: dict[str, Any] = {"rows": rows, "stale": stale, "audit": audit}
    log(f"sweeps: loading {rows} jobs ({stale} stale leases, {live} queued) ...")
    begin = time.monotonic()
    load_jobs(url, rows, stale, live)
    log(f"  loaded in {time.monotonic() - begin:.0f} s")

    result["metrics_snapshot"] = metrics()
    log(f"  metrics snapshot at {rows} jobs: {result['metrics_snapshot']}")

    result["heartbeat"] = heartbeat(url)
    log(f"  heartbeat: {result['heartbeat']}")

    budget = 600.0
    result["reap"] = _under_load(
        url,
        _claimer,
        lambda: _timed_sweep(
            lambda on_batch: maintenance.requeue_stale_dispatched(
                on_batch=on_batch, time_budget=timedelta(seconds=budget)
            )
        ),
        budget,
        baseline,
    )
    log(f"  reap of {stale} stale leases among {rows}: {result['reap']}")

    log(f"sweeps: loading {audit} old audit entries and {audit // 10} recent ones ...")
    begin = time.monotonic()
    load_audit(url, audit, audit // 10)
    log(f"  loaded in {time.monotonic() - begin:.0f} s")
    result["prune"] = _under_load(
        url,
        _inserter,
        lambda: _timed_sweep(
            lambda on_batch: maintenance.prune_audit(
                on_batch=on_batch, time_budget=timedelta(seconds=budget)
            )
        ),
        budget,
        baseline,
    )
    log(f"  prune of {audit} audit entries: {result['prune']}")
    return result
