"""How each contender of the drain benchmark loads the same no-op jobs: one job through
the contender's own API, copied inside the server, then the table vacuumed, analyzed and
checkpointed. The payload of every job is the same ~200-byte JSON object."""

from __future__ import annotations

from typing import Any

import psycopg

PAYLOAD_PAD = "x" * 150
TARGET = "bench"

RAW_TABLE = "bench_raw_job"

#: The target whose queue the paused cells pause: none of the jobs a drain loads.
OTHER_TARGET = "bench-elsewhere"


def _clone(
    conn: psycopg.Connection[Any], table: str, template: str, count: int, overrides: dict[str, str]
) -> None:
    """Copy the row ``template`` selects ``count - 1`` times inside the server, with the
    columns in ``overrides`` replaced by SQL expressions (``g`` is the copy's number)."""
    if count <= 1:
        return
    columns = [
        row[0]
        for row in conn.execute(
            "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
            "AND table_schema = current_schema() ORDER BY ordinal_position",
            [table],
        ).fetchall()
    ]
    kept = [c for c in columns if overrides.get(c) != "DEFAULT"]
    exprs = [overrides.get(c, f'src."{c}"') for c in kept]
    names = ", ".join(f'"{c}"' for c in kept)
    conn.execute(
        f'INSERT INTO "{table}" ({names}) SELECT {", ".join(exprs)} '
        f'FROM (SELECT * FROM "{table}" WHERE {template}) AS src, generate_series(2, %s) AS g',
        [count],
    )


def _finish_load(conn: psycopg.Connection[Any], table: str) -> None:
    conn.execute(f'VACUUM (ANALYZE) "{table}"')
    conn.execute("CHECKPOINT")


def load_raw(url: str, jobs: int, batch: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"""
            CREATE TABLE IF NOT EXISTS {RAW_TABLE} (
                id bigserial PRIMARY KEY,
                status text NOT NULL DEFAULT 'queued',
                payload jsonb NOT NULL,
                worker text,
                claim_token uuid,
                claimed_at timestamptz,
                lease_until timestamptz,
                created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
            )""")
        conn.execute(
            f"CREATE INDEX IF NOT EXISTS {RAW_TABLE}_claim_idx ON {RAW_TABLE} "
            "(created_at, id) WHERE status = 'queued'"
        )
        conn.execute(f"TRUNCATE {RAW_TABLE}")
        conn.execute(
            f"INSERT INTO {RAW_TABLE} (payload) SELECT jsonb_build_object('n', g, 'pad', %s::text) "
            "FROM generate_series(1, %s) AS g",
            [PAYLOAD_PAD, jobs],
        )
        _finish_load(conn, RAW_TABLE)


def load_jobstate(url: str, jobs: int, batch: int) -> None:
    """``jobs`` queued jobs of :data:`TARGET`, and no queue paused."""
    from jobstate.models import AuditEntry, Job, QueuePause
    from jobstate.stores import get_state_store

    table = Job._meta.db_table
    audit = AuditEntry._meta.db_table
    with psycopg.connect(url, autocommit=True) as conn:
        # The audit ledger has no foreign key to the jobs (entries outlive their job), so
        # the cascade that empties the outbox does not reach it.
        conn.execute(f'TRUNCATE "{table}", "{audit}", "{QueuePause._meta.db_table}" CASCADE')
    template = get_state_store().create_job(
        request_id="bench-1", target=TARGET, source="bench", input={"n": 1, "pad": PAYLOAD_PAD}
    )
    with psycopg.connect(url, autocommit=True) as conn:
        _clone(
            conn,
            table,
            f"id = '{template.id}'",
            jobs,
            {
                "id": "gen_random_uuid()",
                "request_id": "'bench-' || g",
                "input": f"jsonb_build_object('n', g, 'pad', '{PAYLOAD_PAD}')",
                "created_at": "clock_timestamp()",
                "updated_at": "clock_timestamp()",
            },
        )
        _finish_load(conn, table)


def load_jobstate_paused(url: str, jobs: int, batch: int) -> None:
    """As :func:`load_jobstate`, then the queue of another target paused: the claims
    find the pause table non-empty, so they probe it for each candidate they look at."""
    from jobstate.stores import get_state_store

    load_jobstate(url, jobs, batch)
    get_state_store().pause_queue(target=OTHER_TARGET, by="bench")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM (ANALYZE) jobstate_queuepause")


def load_procrastinate(url: str, jobs: int, batch: int) -> None:
    from bench.peer_tasks import procrastinate_noop

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE procrastinate_jobs CASCADE")
    procrastinate_noop.defer(n=1, pad=PAYLOAD_PAD)
    with psycopg.connect(url, autocommit=True) as conn:
        first = conn.execute("SELECT min(id) FROM procrastinate_jobs").fetchone()
        _clone(
            conn,
            "procrastinate_jobs",
            f"id = {first[0] if first else 0}",
            jobs,
            {
                "id": "DEFAULT",
                "args": f"jsonb_build_object('n', g, 'pad', '{PAYLOAD_PAD}')",
            },
        )
        _finish_load(conn, "procrastinate_jobs")


def load_tasks_db(url: str, jobs: int, batch: int) -> None:
    from django_tasks_db.models import DBTaskResult

    from bench.peer_tasks import tasks_db_noop

    table = DBTaskResult._meta.db_table
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'TRUNCATE "{table}" CASCADE')
    result = tasks_db_noop.enqueue(n=1, pad=PAYLOAD_PAD)
    with psycopg.connect(url, autocommit=True) as conn:
        _clone(
            conn,
            table,
            f"id = '{result.id}'",
            jobs,
            {
                "id": "gen_random_uuid()",
                "enqueued_at": "clock_timestamp()",
            },
        )
        _finish_load(conn, table)
