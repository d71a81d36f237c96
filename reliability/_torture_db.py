"""The torture run's database: created fresh for each run, migrated, given the
harness's own ledger tables, and loaded with jobs.

The ledger tables belong to the harness, not to jobstate. Workers write to them in the
same transaction as the store call they witness where that matters (a fenced
completion and its ledger row commit together or not at all), so the checks at the end
compare what jobstate stored with what its callers were told.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from bench.pg import database_name, database_url
from reliability._torture_config import NAME_GUARD, REQUEST_PREFIX, TARGET

#: The harness's tables. None has a unique constraint on the job: a second claim or
#: completion of one job must be recorded, so the checks can see it, not refused here.
LEDGER_DDL = (
    # Every job the controller loaded: the reference for "nothing lost".
    "CREATE TABLE torture_loaded (job_id uuid PRIMARY KEY)",
    # Every claim claim_next_inhub_job made, written in its transaction.
    """CREATE TABLE torture_claim (
        id bigserial PRIMARY KEY,
        claim_token uuid NOT NULL,
        job_id uuid NOT NULL,
        worker text NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    "CREATE INDEX torture_claim_job ON torture_claim (job_id, at)",
    "CREATE INDEX torture_claim_token ON torture_claim (claim_token)",
    # Every fenced report complete_claimed_job accepted, written in its transaction.
    """CREATE TABLE torture_completion (
        id bigserial PRIMARY KEY,
        job_id uuid NOT NULL,
        claim_token uuid NOT NULL,
        status text NOT NULL,
        worker text NOT NULL,
        pid integer NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    "CREATE INDEX torture_completion_job ON torture_completion (job_id)",
    # Reports and lease renewals the store refused (the claim was gone).
    """CREATE TABLE torture_refusal (
        id bigserial PRIMARY KEY,
        kind text NOT NULL,
        job_id uuid NOT NULL,
        claim_token uuid NOT NULL,
        outcome text NOT NULL,
        worker text NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    # What JobRunner.execute told each worker about its run.
    """CREATE TABLE torture_run_outcome (
        run_id uuid PRIMARY KEY,
        job_key text NOT NULL,
        status text NOT NULL,
        recorded text NOT NULL,
        reason text,
        worker text NOT NULL,
        at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    # One row per reaper pass: how long it took and what each sweep moved.
    """CREATE TABLE torture_reap_pass (
        id bigserial PRIMARY KEY,
        at timestamptz NOT NULL DEFAULT clock_timestamp(),
        seconds double precision NOT NULL,
        counts jsonb NOT NULL)""",
)

LEDGER_TABLES = (
    "torture_loaded",
    "torture_claim",
    "torture_completion",
    "torture_refusal",
    "torture_run_outcome",
    "torture_reap_pass",
)


class TortureDatabaseError(RuntimeError):
    """The run's database cannot be made (no server, or a name it must not drop)."""


def _guarded_name(url: str) -> str:
    name = database_name(url)
    if NAME_GUARD not in name or not name.replace("_", "").isalnum():
        raise TortureDatabaseError(
            f"refusing to recreate database {name!r}: its name must contain "
            f"{NAME_GUARD!r} and only letters, digits and underscores."
        )
    return name


def recreate_database(url: str) -> None:
    """Drop (if present) and create the database ``url`` names; only a name that
    contains ``torture`` is accepted."""
    name = _guarded_name(url)
    try:
        with psycopg.connect(database_url(url, "postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as exc:
        raise TortureDatabaseError(f"cannot reach PostgreSQL at {url}: {exc}") from exc


def drop_database(url: str) -> None:
    name = _guarded_name(url)
    with psycopg.connect(database_url(url, "postgres"), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_ledger(conn: psycopg.Connection[Any]) -> None:
    """Create the harness's tables (in a database that has none yet)."""
    with conn.transaction():
        for statement in LEDGER_DDL:
            conn.execute(statement)


def migrate() -> None:
    """Apply every migration to the run's database (Django must be set up)."""
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def load_jobs(count: int, log: Callable[[str], None], batch: int = 1000) -> None:
    """Queue ``count`` jobs through the public ``enqueue`` and note each one in
    ``torture_loaded`` in the same transaction (Django must be set up)."""
    from django.db import connection, transaction

    from jobstate.stores import get_state_store

    store = get_state_store()
    for start in range(0, count, batch):
        with transaction.atomic(), connection.cursor() as cursor:
            ids = []
            for number in range(start, min(start + batch, count)):
                job, _ = store.enqueue(
                    request_id=f"{REQUEST_PREFIX}{number}", target=TARGET, input={"n": number}
                )
                ids.append((job.id,))
            cursor.executemany("INSERT INTO torture_loaded (job_id) VALUES (%s)", ids)
        if count > batch:
            log(f"  loaded {min(start + batch, count)} of {count} jobs")
