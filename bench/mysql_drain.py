"""The drain benchmark on MariaDB / MySQL (``python -m bench drain --server mysql://...``):
jobstate's claim and report beside a raw floor in plain SQL over a comparable table,
both through mysqlclient, drained by N worker processes released behind a barrier.

The floor is the cheapest correct loop MariaDB allows: it has ``FOR UPDATE SKIP LOCKED``
(10.6+) but no ``UPDATE ... RETURNING``, so a claim is a locking ``SELECT`` of the next
queued row, an ``UPDATE`` of that row to running with a fresh claim token, and a
commit; the completion is one autocommitted ``UPDATE`` guarded by id, token and status.
``raw-batch`` does the same for k rows at a time. The peers of the PostgreSQL drain
(procrastinate, django-tasks-db) are not measured here.

Per cell: wall time from the barrier's release to the last worker's end, statements and
transaction-control calls per job (counted in each worker's MySQLdb), worker CPU, and
the CPU of the local server process over the cell (the whole server: other databases'
clients count too).
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.contenders import prepare_jobstate, prepare_jobstate_batch, rss_bytes
from bench.drain import Cell, Summary
from bench.loading import PAYLOAD_PAD, RAW_TABLE, TARGET
from bench.mysql import RoundTrips, connect, execute, load_average, server_cpu_seconds
from bench.pg import BenchError, setup_django

#: The contenders a MariaDB drain runs by default, and the only ones it knows.
DEFAULT_CONTENDERS = ("raw", "raw-batch", "jobstate", "jobstate-batch")

#: The one setting of each cell: mysqlclient prepares nothing, so nothing varies.
SETTING = "mysqlclient"

Drain = Callable[[Callable[[int], None]], int]


# --- loading ------------------------------------------------------------------------------

_RAW_DDL = f"""
    CREATE TABLE IF NOT EXISTS {RAW_TABLE} (
        id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        status VARCHAR(16) NOT NULL DEFAULT 'queued',
        payload JSON NOT NULL,
        worker VARCHAR(64),
        claim_token CHAR(32),
        claimed_at DATETIME(6),
        lease_until DATETIME(6),
        created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        updated_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        KEY {RAW_TABLE}_claim_idx (status, created_at, id)
    ) ENGINE=InnoDB
"""

_NUMBERS = "bench_numbers"


def _numbers(conn: Any, count: int) -> None:
    """``bench_numbers`` holds 1..count (the row generator PostgreSQL's
    ``generate_series`` is on the other side; MySQL 8 has no sequence engine)."""
    execute(conn, f"CREATE TABLE IF NOT EXISTS {_NUMBERS} (n INT NOT NULL PRIMARY KEY)")
    have = execute(conn, f"SELECT COALESCE(MAX(n), 0) FROM {_NUMBERS}")[0][0]
    cursor = conn.cursor()
    for start in range(int(have) + 1, count + 1, 5000):
        rows = [(n,) for n in range(start, min(start + 5000, count + 1))]
        cursor.executemany(f"INSERT INTO {_NUMBERS} (n) VALUES (%s)", rows)
    cursor.close()


def _empty(conn: Any, tables: list[str]) -> None:
    # TRUNCATE refuses a table other tables' foreign keys point at, even when they are
    # emptied in the same breath; the checks are off for this session only.
    execute(conn, "SET FOREIGN_KEY_CHECKS = 0")
    for table in tables:
        execute(conn, f"TRUNCATE TABLE `{table}`")
    execute(conn, "SET FOREIGN_KEY_CHECKS = 1")


def load_raw(url: str, jobs: int, batch: int) -> None:
    conn = connect(url)
    try:
        execute(conn, _RAW_DDL)
        _empty(conn, [RAW_TABLE])
        _numbers(conn, jobs)
        execute(
            conn,
            f"INSERT INTO {RAW_TABLE} (payload, created_at) "
            "SELECT JSON_OBJECT('n', n, 'pad', %s), "
            f"CURRENT_TIMESTAMP(6) + INTERVAL n MICROSECOND FROM {_NUMBERS} WHERE n <= %s",
            [PAYLOAD_PAD, jobs],
        )
        execute(conn, f"ANALYZE TABLE {RAW_TABLE}")
    finally:
        conn.close()


def load_jobstate(url: str, jobs: int, batch: int) -> None:
    """One job through ``create_job``, copied ``jobs - 1`` times inside the server with
    its own id, request id, input and creation instant (in claim order)."""
    from jobstate.models import AuditEntry, Job, Notification
    from jobstate.stores import get_state_store

    table = Job._meta.db_table
    conn = connect(url)
    try:
        _empty(conn, [Notification._meta.db_table, AuditEntry._meta.db_table, table])
        template = get_state_store().create_job(
            request_id="bench-1", target=TARGET, source="bench", input={"n": 1, "pad": PAYLOAD_PAD}
        )
        _numbers(conn, jobs)
        columns = [
            row[0]
            for row in execute(
                conn,
                # Generated columns (the unique hold) compute their own values.
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                "DATABASE() AND TABLE_NAME = %s AND EXTRA NOT LIKE '%%GENERATED%%' "
                "ORDER BY ORDINAL_POSITION",
                [table],
            )
        ]
        overrides = {
            "id": "REPLACE(UUID(), '-', '')",
            "request_id": "CONCAT('bench-', g.n)",
            "input": "JSON_OBJECT('n', g.n, 'pad', %s)",
            "created_at": "src.created_at + INTERVAL g.n MICROSECOND",
            "updated_at": "src.updated_at + INTERVAL g.n MICROSECOND",
        }
        names = ", ".join(f"`{c}`" for c in columns)
        exprs = ", ".join(overrides.get(c, f"src.`{c}`") for c in columns)
        execute(
            conn,
            f"INSERT INTO `{table}` ({names}) SELECT {exprs} FROM `{table}` AS src "
            f"JOIN {_NUMBERS} AS g ON g.n BETWEEN 2 AND %s WHERE src.id = %s",
            [PAYLOAD_PAD, jobs, template.id.hex],
        )
        execute(conn, f"ANALYZE TABLE `{table}`")
    finally:
        conn.close()


# --- the raw floor ------------------------------------------------------------------------

_RAW_PICK = (
    f"SELECT id, payload FROM {RAW_TABLE} WHERE status = 'queued' "
    "ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED"
)
_RAW_TAKE = (
    f"UPDATE {RAW_TABLE} SET status = 'running', worker = %s, claim_token = %s, "
    "claimed_at = CURRENT_TIMESTAMP(6), "
    "lease_until = CURRENT_TIMESTAMP(6) + INTERVAL 5 MINUTE, updated_at = CURRENT_TIMESTAMP(6) "
    "WHERE id IN ({ids})"
)
_RAW_COMPLETE = (
    f"UPDATE {RAW_TABLE} SET status = 'done', claim_token = NULL, worker = NULL, "
    "claimed_at = NULL, lease_until = NULL, updated_at = CURRENT_TIMESTAMP(6) "
    "WHERE claim_token = %s AND status = 'running' AND id IN ({ids})"
)


def _raw(url: str, index: int, limit: int, name: str) -> Drain:
    # Autocommit off: the locking SELECT opens the claim's transaction itself (no BEGIN
    # round trip) and the commit ends it; the completion then commits on its own.
    conn = connect(url, autocommit=False)
    execute(conn, "SELECT 1")
    conn.commit()
    worker = f"{name}-{index}"

    def drain(tick: Callable[[int], None]) -> int:
        done = 0
        cursor = conn.cursor()
        try:
            while True:
                cursor.execute(_RAW_PICK, [limit])
                rows = cursor.fetchall()
                if not rows:
                    conn.commit()
                    return done
                token = uuid.uuid4().hex
                ids = [row[0] for row in rows]
                marks = ", ".join(["%s"] * len(ids))
                cursor.execute(_RAW_TAKE.format(ids=marks), [worker, token, *ids])
                conn.commit()
                cursor.execute(_RAW_COMPLETE.format(ids=marks), [token, *ids])
                if cursor.rowcount != len(ids):
                    raise RuntimeError("a fresh claim's completion was refused")
                conn.commit()
                done += len(ids)
                tick(done)
        finally:
            cursor.close()
            conn.close()

    return drain


def prepare_raw(url: str, index: int, batch: int) -> Drain:
    return _raw(url, index, 1, "raw")


def prepare_raw_batch(url: str, index: int, batch: int) -> Drain:
    return _raw(url, index, batch, "raw-batch")


@dataclass(frozen=True)
class Contender:
    name: str
    label: str
    done_sql: str
    load: Callable[[str, int, int], None]
    prepare: Callable[[str, int, int], Drain]


_JOBS_DONE = "SELECT COUNT(*) FROM jobstate_job WHERE status = 'done' AND target = 'bench'"
_RAW_DONE = f"SELECT COUNT(*) FROM {RAW_TABLE} WHERE status = 'done'"

CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in [
        Contender(
            "raw",
            "raw mysqlclient: SELECT ... FOR UPDATE SKIP LOCKED + UPDATE, guarded complete",
            _RAW_DONE,
            load_raw,
            prepare_raw,
        ),
        Contender(
            "raw-batch",
            "raw mysqlclient, k rows per claim and per complete",
            _RAW_DONE,
            load_raw,
            prepare_raw_batch,
        ),
        Contender(
            "jobstate",
            "jobstate: claim_next_inhub_job + complete_claimed_job",
            _JOBS_DONE,
            load_jobstate,
            prepare_jobstate,
        ),
        Contender(
            "jobstate-batch",
            "jobstate: claim_next_inhub_jobs + complete_claimed_jobs (k per call)",
            _JOBS_DONE,
            load_jobstate,
            prepare_jobstate_batch,
        ),
    ]
}


# --- one cell -----------------------------------------------------------------------------


def worker_main(
    contender: str, url: str, index: int, batch: int, barrier: Any, results: Any
) -> None:
    """Body of one worker process (started with the ``spawn`` method)."""
    try:
        setup_django(url)
        RoundTrips.install()
        drain = CONTENDERS[contender].prepare(url, index, batch)
        barrier.wait(timeout=120)
        started = time.time()
        cpu = time.process_time()
        statements, transactions = RoundTrips.statements, RoundTrips.transactions
        done = drain(lambda done: None)
        results.put(
            {
                "index": index,
                "pid": os.getpid(),
                "started": started,
                "ended": time.time(),
                "cpu": time.process_time() - cpu,
                "statements": RoundTrips.statements - statements,
                "transactions": RoundTrips.transactions - transactions,
                "done": done,
                "rss_end": rss_bytes(),
                "error": None,
            }
        )
    except BaseException as exc:
        results.put({"index": index, "error": f"{type(exc).__name__}: {exc}"})
        raise


def run_cell(
    contender: str, url: str, *, workers: int, jobs: int, batch: int, timeout: float = 600
) -> Cell:
    """Load ``jobs`` into ``contender``, drain them with ``workers`` processes, and check
    that every job was done."""
    spec = CONTENDERS[contender]
    spec.load(url, jobs, batch)
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers + 1)
    results = context.Queue()
    processes = [
        context.Process(
            target=worker_main,
            args=(contender, url, index, batch, barrier, results),
            daemon=True,
        )
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    try:
        barrier.wait(timeout=180)
    except Exception as exc:
        for process in processes:
            process.kill()
        errors = [] if results.empty() else [results.get_nowait().get("error")]
        raise BenchError(f"{contender}: workers did not reach the barrier ({errors})") from exc
    server_before = server_cpu_seconds()
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            for other in processes:
                other.kill()
            raise BenchError(f"{contender}: not drained after {timeout} s")
    server_after = server_cpu_seconds()
    reports = [results.get(timeout=10) for _ in processes]
    errors = [r["error"] for r in reports if r.get("error")]
    if errors:
        raise BenchError(f"{contender}: a worker failed: {errors[0]}")
    conn = connect(url)
    try:
        done = int(execute(conn, spec.done_sql)[0][0])
    finally:
        conn.close()
    if done != jobs:
        raise BenchError(f"{contender}: {done} of {jobs} jobs done after the drain")
    return Cell(
        contender=contender,
        setting=SETTING,
        workers=workers,
        jobs=jobs,
        seconds=max(r["ended"] for r in reports) - min(r["started"] for r in reports),
        done=done,
        statements=sum(r["statements"] for r in reports),
        transactions=sum(r["transactions"] for r in reports),
        worker_cpu=sum(r["cpu"] for r in reports),
        server_cpu=(
            server_after - server_before
            if server_after is not None and server_before is not None
            else float("nan")
        ),
        rss_growth=None,
        load=load_average(),
    )


def run(
    url: str,
    *,
    contenders: list[str],
    workers: list[int],
    jobs: int,
    repeats: int,
    batch: int,
    log: Callable[[str], None] = print,
) -> dict[tuple[str, str, int], Summary]:
    """Every contender at every worker count, ``repeats`` interleaved rounds (the order
    rotates each round, so none always runs first on a cold buffer pool)."""
    unknown = set(contenders) - set(CONTENDERS)
    if unknown:
        raise BenchError(
            f"unknown contender(s) on MariaDB {sorted(unknown)}; known: {', '.join(CONTENDERS)}"
        )
    summaries: dict[tuple[str, str, int], Summary] = {}
    for count in workers:
        for round_index in range(repeats):
            shift = round_index % len(contenders)
            for contender in contenders[shift:] + contenders[:shift]:
                cell = run_cell(contender, url, workers=count, jobs=jobs, batch=batch)
                key = (contender, SETTING, count)
                summaries.setdefault(key, Summary(contender, SETTING, count)).cells.append(cell)
                log(
                    f"  round {round_index + 1}/{repeats} {contender:>16} x{count}: "
                    f"{cell.rate:8.0f} jobs/s ({cell.done} jobs in {cell.seconds:.2f} s; "
                    f"load {cell.load})"
                )
    return summaries


def _name(contender: str, batch: int) -> str:
    return contender + (f" (k={batch})" if contender.endswith("batch") else "")


def table(summaries: dict[tuple[str, str, int], Summary], batch: int) -> str:
    """The result table (Markdown), each contender against the raw floor of its kind
    (one at a time against ``raw``, batches against ``raw-batch``)."""
    lines = [
        "| contender | workers | jobs/s median | min | max | to raw | statements/job "
        "| transaction calls/job | worker CPU s | server CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for (contender, _, count), summary in summaries.items():
        floor = "raw-batch" if contender.endswith("batch") else "raw"
        raw = summaries.get((floor, SETTING, count))
        to_raw = summary.rate / raw.rate if raw and raw.rate else float("nan")
        rates = [c.rate for c in summary.cells]
        lines.append(
            f"| {_name(contender, batch)} | {count} | {summary.rate:,.0f} | {min(rates):,.0f} "
            f"| {max(rates):,.0f} | {to_raw:.2f} | {summary.per_job('statements'):.2f} "
            f"| {summary.per_job('transactions'):.2f} | {summary.median('worker_cpu'):.2f} "
            f"| {summary.median('server_cpu'):.2f} |"
        )
    return "\n".join(lines)


def ratios(summaries: dict[tuple[str, str, int], Summary]) -> list[str]:
    """jobstate against the raw floor at each worker count; no target yet on MariaDB."""
    lines = []
    counts = sorted({count for _, _, count in summaries})
    for count in counts:
        for ours, floor in (("jobstate", "raw"), ("jobstate-batch", "raw-batch")):
            mine = summaries.get((ours, SETTING, count))
            raw = summaries.get((floor, SETTING, count))
            if mine and raw and raw.rate:
                lines.append(
                    f"{ours} / {floor} on MariaDB at {count} workers: "
                    f"{mine.rate / raw.rate:.2f} (no target yet)"
                )
    return lines
