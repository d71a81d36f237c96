"""The contenders of the drain benchmark: how one of each contender's worker processes
drains the jobs :mod:`bench.loading` loaded, and under which settings it runs.

Every worker runs :func:`worker_main` in its own process: it takes the environment of its
cell's setting (:mod:`bench.variants`), sets Django up, opens its connection and warms
it, waits at the barrier with the others, drains until its queue answers empty, and
reports what it did.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from bench.loading import (
    RAW_TABLE,
    TARGET,
    load_jobstate,
    load_jobstate_paused,
    load_procrastinate,
    load_raw,
    load_tasks_db,
)
from bench.pg import StatementCounter, setup_django
from bench.variants import (
    CLIENT_BINDING_SETTINGS,
    DJANGO_POOL_SETTINGS,
    JOBSTATE_SETTINGS,
    RAW_SETTINGS,
    SETTINGS,
    prepare_jobstate_seed,
)

#: psutil is optional: without it worker memory is not sampled.
try:
    import psutil
except ImportError:  # pragma: no cover - psutil is in the bench dependency group
    psutil = None


def rss_bytes() -> int:
    if psutil is None:
        return 0
    return int(psutil.Process().memory_info().rss)


@dataclass(frozen=True)
class Contender:
    name: str
    label: str
    table: str
    done_sql: str
    #: (url, jobs, batch) -> None, run in the parent with Django set up.
    load: Callable[[str, int, int], None]
    #: (url, index, batch) -> drain function, run in the worker before the barrier.
    prepare: Callable[[str, int, int], Callable[[Callable[[int], None]], int]]
    #: The settings (names in ``bench.variants.SETTINGS``) its cells run under.
    settings: tuple[str, ...]
    #: Besides ``done_sql``: (SQL counting rows, rows expected per job) after a cell.
    checks: tuple[tuple[str, int], ...] = ()


# --- draining -----------------------------------------------------------------------------

_RAW_CLAIM = f"""
    UPDATE {RAW_TABLE} SET status = 'running', worker = %s, claim_token = %s,
        claimed_at = now(), lease_until = now() + interval '5 minutes', updated_at = now()
    WHERE id = (SELECT id FROM {RAW_TABLE} WHERE status = 'queued'
                ORDER BY created_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)
    RETURNING id, claim_token, payload
"""
_RAW_COMPLETE = f"""
    UPDATE {RAW_TABLE} SET status = 'done', claim_token = NULL, worker = NULL,
        claimed_at = NULL, lease_until = NULL, updated_at = now()
    WHERE id = %s AND claim_token = %s AND status = 'running'
"""
_RAW_CLAIM_BATCH = f"""
    UPDATE {RAW_TABLE} AS j SET status = 'running', worker = %s, claim_token = gen_random_uuid(),
        claimed_at = now(), lease_until = now() + interval '5 minutes', updated_at = now()
    FROM (SELECT id FROM {RAW_TABLE} WHERE status = 'queued'
          ORDER BY created_at, id LIMIT %s FOR UPDATE SKIP LOCKED) AS picked
    WHERE j.id = picked.id
    RETURNING j.id, j.claim_token, j.payload
"""
_RAW_COMPLETE_BATCH = f"""
    UPDATE {RAW_TABLE} AS j SET status = 'done', claim_token = NULL, worker = NULL,
        claimed_at = NULL, lease_until = NULL, updated_at = now()
    FROM unnest(%s::bigint[], %s::uuid[]) AS v(id, token)
    WHERE j.id = v.id AND j.claim_token = v.token AND j.status = 'running'
"""


def prepare_raw(url: str, index: int, batch: int) -> Callable[[Callable[[int], None]], int]:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SELECT 1")
    worker = f"raw-{index}"

    def drain(tick: Callable[[int], None]) -> int:
        done = 0
        with conn:
            while True:
                row = conn.execute(_RAW_CLAIM, [worker, uuid.uuid4()]).fetchone()
                if row is None:
                    return done
                conn.execute(_RAW_COMPLETE, [row[0], row[1]])
                done += 1
                tick(done)

    return drain


def prepare_raw_batch(url: str, index: int, batch: int) -> Callable[[Callable[[int], None]], int]:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SELECT 1")
    worker = f"raw-batch-{index}"

    def drain(tick: Callable[[int], None]) -> int:
        done = 0
        with conn:
            while True:
                rows = conn.execute(_RAW_CLAIM_BATCH, [worker, batch]).fetchall()
                if not rows:
                    return done
                conn.execute(_RAW_COMPLETE_BATCH, [[r[0] for r in rows], [r[1] for r in rows]])
                done += len(rows)
                tick(done)

    return drain


def prepare_raw_jobstate_sql(
    url: str, index: int, batch: int
) -> Callable[[Callable[[int], None]], int]:
    """jobstate's own claim and report statements (the text its store sends), run by raw
    psycopg on jobstate's table, returning every column but building no ``Job``: what
    the schema and the SQL cost without jobstate's and Django's Python around them."""
    from django.db import connections

    from jobstate.core.conf import jobstate_settings
    from jobstate.models import Job, JobStatus
    from jobstate.stores.database.backends.postgresql_statements import (
        claim_statement,
        complete_statement,
    )

    django_connection = connections["default"]
    claim = claim_statement(django_connection, 1, JobStatus.RUNNING)
    complete, _ = complete_statement(django_connection, (), 1)
    # The claim returns the picked id, then every column in model order.
    token_at = 1 + [field.attname for field in Job._meta.concrete_fields].index("claim_token")
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET TimeZone = 'UTC'")
    worker = f"raw-jobstate-sql-{index}"
    lease = jobstate_settings.WORKER_LEASE  # what claim_next_inhub_job uses

    def drain(tick: Callable[[int], None]) -> int:
        done = 0
        with conn:
            while True:
                params = [TARGET, JobStatus.RUNNING.value, worker, lease, uuid.uuid4()]
                row = conn.execute(claim, params).fetchone()
                if row is None:
                    return done
                if row[1] is None:
                    raise RuntimeError("the bench jobs have no thread; nothing should be gated")
                written = conn.execute(complete, [row[1], row[token_at], "done"]).fetchall()
                if not written:
                    raise RuntimeError("a fresh claim's report bounced")
                done += 1
                tick(done)

    return drain


def prepare_raw_jobstate_seed_sql(
    url: str, index: int, batch: int
) -> Callable[[Callable[[int], None]], int]:
    """The seed path's statements as jobstate sends them (the claim, then the outbox
    completion with its audit entry and no notification), run by raw psycopg on
    jobstate's tables, building no ``Job``: the schema-and-SQL share of ``jobstate-seed``."""
    from django.db import connections
    from psycopg.types.json import Jsonb

    from jobstate.core.conf import jobstate_settings
    from jobstate.models import Job, JobStatus
    from jobstate.stores.contracts.audit import complete_audit_fields
    from jobstate.stores.database.backends.postgresql_statements import (
        claim_statement,
        finish_statement,
    )

    django_connection = connections["default"]
    claim = claim_statement(django_connection, 1, JobStatus.RUNNING)
    finish, _ = finish_statement(django_connection, ("result", "status"), True, 0)
    names = [field.attname for field in Job._meta.concrete_fields]
    token_at, input_at = 1 + names.index("claim_token"), 1 + names.index("input")
    audit = complete_audit_fields(
        event="finished",
        stage=None,
        severity=None,
        title="",
        summary="",
        detail={"status": "done", "previous_status": "running", "notifications": 0},
    )
    entry = [audit.stage.value, audit.severity.value, audit.title, audit.summary]
    conn = psycopg.connect(url, autocommit=True)
    conn.execute("SET TimeZone = 'UTC'")
    worker = f"raw-jobstate-seed-sql-{index}"
    lease = jobstate_settings.WORKER_LEASE

    def drain(tick: Callable[[int], None]) -> int:
        done = 0
        with conn:
            while True:
                params = [TARGET, JobStatus.RUNNING.value, worker, lease, uuid.uuid4()]
                row = conn.execute(claim, params).fetchone()
                if row is None:
                    return done
                result = Jsonb({"n": row[input_at]["n"], "ok": True})
                finished = conn.execute(
                    finish,
                    [result, "done", row[1], "running", row[token_at], *entry, Jsonb(audit.detail)],
                ).fetchall()
                if not finished:
                    raise RuntimeError("a fresh claim's completion was refused")
                done += 1
                tick(done)

    return drain


def prepare_jobstate(url: str, index: int, batch: int) -> Callable[[Callable[[int], None]], int]:
    from django.db import connection

    from jobstate.stores import get_state_store

    store = get_state_store()
    connection.ensure_connection()
    worker = f"jobstate-{index}"

    def drain(tick: Callable[[int], None]) -> int:
        done = 0
        while True:
            job = store.claim_next_inhub_job([TARGET], worker)
            if job is None:
                return done
            assert job.claim_token is not None
            outcome = store.complete_claimed_job(job.id, job.claim_token, "done")
            if not outcome.completed:
                raise RuntimeError(f"a fresh claim's report bounced: {outcome.outcome}")
            done += 1
            tick(done)

    return drain


def prepare_jobstate_batch(
    url: str, index: int, batch: int
) -> Callable[[Callable[[int], None]], int]:
    from django.db import connection

    from jobstate.stores import get_state_store
    from jobstate.stores.base import ClaimReport

    store = get_state_store()
    connection.ensure_connection()
    worker = f"jobstate-batch-{index}"

    def drain(tick: Callable[[int], None]) -> int:
        done = 0
        while True:
            jobs = store.claim_next_inhub_jobs([TARGET], worker, limit=batch)
            if not jobs:
                return done
            results = store.complete_claimed_jobs(
                [ClaimReport(job.id, job.claim_token or "", "done") for job in jobs]
            )
            if not all(result.completed for result in results):
                raise RuntimeError("a fresh claim's report bounced")
            done += len(jobs)
            tick(done)

    return drain


def prepare_procrastinate(
    url: str, index: int, batch: int
) -> Callable[[Callable[[int], None]], int]:
    from procrastinate.contrib.django import app

    import bench.peer_tasks  # noqa: F401 - registers the task

    def drain(tick: Callable[[int], None]) -> int:
        # The worker connector is procrastinate's own psycopg pool, as its
        # ``procrastinate worker`` command uses; wait=False stops once caught up.
        with app.replace_connector(app.connector.get_worker_connector()) as worker_app:
            worker_app.run_worker(
                queues=["bench"],
                concurrency=1,
                wait=False,
                listen_notify=False,
                delete_jobs="never",
                install_signal_handlers=False,
                name=f"procrastinate-{index}",
            )
        return -1

    return drain


def prepare_tasks_db(url: str, index: int, batch: int) -> Callable[[Callable[[int], None]], int]:
    from django.db import connection
    from django_tasks_db.management.commands.db_worker import Worker

    import bench.peer_tasks  # noqa: F401 - the worker imports the task by path anyway

    connection.ensure_connection()
    worker = Worker(
        queue_names=["default"],
        interval=0.01,
        batch=True,
        backend_name="default",
        startup_delay=False,
        max_tasks=None,
        worker_id=f"tasks-db-{index}",
        excluded_queue_names=[],
    )

    def drain(tick: Callable[[int], None]) -> int:
        worker.run()
        return -1

    return drain


_FINISHED_SQL = "SELECT count(*) FROM jobstate_auditentry WHERE event = 'finished'"
_NOTIFICATIONS_SQL = "SELECT count(*) FROM jobstate_notification WHERE state = 'pending'"

CONTENDERS: dict[str, Contender] = {
    c.name: c
    for c in [
        Contender(
            "raw",
            "raw psycopg (single-statement claim + guarded complete)",
            RAW_TABLE,
            f"SELECT count(*) FROM {RAW_TABLE} WHERE status = 'done'",
            load_raw,
            prepare_raw,
            RAW_SETTINGS,
        ),
        Contender(
            "raw-batch",
            "raw psycopg, batch of k per claim and per complete",
            RAW_TABLE,
            f"SELECT count(*) FROM {RAW_TABLE} WHERE status = 'done'",
            load_raw,
            prepare_raw_batch,
            RAW_SETTINGS,
        ),
        Contender(
            "raw-jobstate-sql",
            "raw psycopg running jobstate's own claim and report statements on its table",
            "jobstate_job",
            "SELECT count(*) FROM jobstate_job WHERE status = 'done' AND target = 'bench'",
            load_jobstate,
            prepare_raw_jobstate_sql,
            RAW_SETTINGS,
        ),
        Contender(
            "raw-jobstate-seed-sql",
            "raw psycopg running the seed path's statements as jobstate sends them",
            "jobstate_job",
            "SELECT count(*) FROM jobstate_job WHERE status = 'done' AND target = 'bench'",
            load_jobstate,
            prepare_raw_jobstate_seed_sql,
            RAW_SETTINGS,
            ((_FINISHED_SQL, 1),),
        ),
        Contender(
            "jobstate",
            "jobstate: claim_next_inhub_job + complete_claimed_job",
            "jobstate_job",
            "SELECT count(*) FROM jobstate_job WHERE status = 'done' AND target = 'bench'",
            load_jobstate,
            prepare_jobstate,
            JOBSTATE_SETTINGS,
        ),
        Contender(
            "jobstate-paused",
            "jobstate: claim_next_inhub_job + complete_claimed_job, another target's queue paused",
            "jobstate_job",
            "SELECT count(*) FROM jobstate_job WHERE status = 'done' AND target = 'bench'",
            load_jobstate_paused,
            prepare_jobstate,
            JOBSTATE_SETTINGS,
        ),
        Contender(
            "jobstate-batch",
            "jobstate: claim_next_inhub_jobs + complete_claimed_jobs (k per call)",
            "jobstate_job",
            "SELECT count(*) FROM jobstate_job WHERE status = 'done' AND target = 'bench'",
            load_jobstate,
            prepare_jobstate_batch,
            JOBSTATE_SETTINGS,
        ),
        Contender(
            "jobstate-seed",
            "jobstate, the seed's path: claim_next_inhub_job + complete_job_with_notifications",
            "jobstate_job",
            "SELECT count(*) FROM jobstate_job WHERE status = 'done' AND target = 'bench'",
            load_jobstate,
            prepare_jobstate_seed(0),
            JOBSTATE_SETTINGS,
            ((_FINISHED_SQL, 1), (_NOTIFICATIONS_SQL, 0)),
        ),
        Contender(
            "jobstate-seed-2",
            "the seed's path with 2 notifications per job (a webhook and an e-mail)",
            "jobstate_job",
            "SELECT count(*) FROM jobstate_job WHERE status = 'done' AND target = 'bench'",
            load_jobstate,
            prepare_jobstate_seed(2),
            JOBSTATE_SETTINGS,
            ((_FINISHED_SQL, 1), (_NOTIFICATIONS_SQL, 2)),
        ),
        Contender(
            "procrastinate",
            "procrastinate (Django integration, sync no-op task)",
            "procrastinate_jobs",
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'",
            load_procrastinate,
            prepare_procrastinate,
            DJANGO_POOL_SETTINGS,
        ),
        Contender(
            "django-tasks-db",
            "django-tasks-db (db_worker Worker, no-op task)",
            "django_tasks_database_dbtaskresult",
            "SELECT count(*) FROM django_tasks_database_dbtaskresult WHERE status = 'SUCCESSFUL'",
            load_tasks_db,
            prepare_tasks_db,
            CLIENT_BINDING_SETTINGS,
        ),
    ]
}


def worker_main(
    contender: str,
    setting: str,
    url: str,
    index: int,
    batch: int,
    barrier: Any,
    results: Any,
    memory_every: int,
) -> None:
    """Body of one worker process (started with the ``spawn`` method)."""
    try:
        os.environ.update(SETTINGS[setting].env)
        setup_django(url)
        StatementCounter.install()
        drain = CONTENDERS[contender].prepare(url, index, batch)
        samples: list[tuple[int, int]] = []

        def tick(done: int) -> None:
            if memory_every and done % memory_every == 0:
                samples.append((done, rss_bytes()))

        barrier.wait(timeout=120)
        started = time.time()
        cpu = time.process_time()
        statements = StatementCounter.count
        done = drain(tick)
        results.put(
            {
                "index": index,
                "pid": os.getpid(),
                "started": started,
                "ended": time.time(),
                "cpu": time.process_time() - cpu,
                "statements": StatementCounter.count - statements,
                "done": done,
                "rss": samples,
                "rss_end": rss_bytes(),
                "error": None,
            }
        )
    except BaseException as exc:
        results.put({"index": index, "error": f"{type(exc).__name__}: {exc}"})
        raise
