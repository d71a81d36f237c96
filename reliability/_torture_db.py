"""The torture run's database: created fresh for each run, migrated, given the
harness's own ledger tables, and loaded with jobs.

The ledger tables belong to the harness, not to jobstate. Workers write to them in the
same transaction as the store call they witness where that matters (a fenced
completion and its ledger row commit together or not at all), so the checks at the end
compare what jobstate stored with what its callers were told.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.pg import database_name
from reliability._torture_config import NAME_GUARD, REQUEST_PREFIX, TARGET
from reliability._torture_sql import (
    MYSQL_SESSION_DDL,
    Connection,
    MySQLDialect,
    connect,
    dialect_of,
)

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

#: The same tables on MariaDB / MySQL: uuids in the type Django gives them there
#: (``{uuid}``: see :class:`MySQLDialect`), instants in microseconds on the database
#: clock (the statement's start, which the row lock orders as it does PostgreSQL's
#: clock_timestamp()).
MYSQL_LEDGER_DDL = (
    "CREATE TABLE torture_loaded (job_id {uuid} PRIMARY KEY)",
    """CREATE TABLE torture_claim (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        claim_token {uuid} NOT NULL,
        job_id {uuid} NOT NULL,
        worker VARCHAR(64) NOT NULL,
        at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        KEY torture_claim_job (job_id, at),
        KEY torture_claim_token (claim_token))""",
    """CREATE TABLE torture_completion (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        job_id {uuid} NOT NULL,
        claim_token {uuid} NOT NULL,
        status VARCHAR(32) NOT NULL,
        worker VARCHAR(64) NOT NULL,
        pid INTEGER NOT NULL,
        at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        KEY torture_completion_job (job_id),
        KEY torture_completion_token (claim_token))""",
    """CREATE TABLE torture_refusal (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        kind VARCHAR(32) NOT NULL,
        job_id {uuid} NOT NULL,
        claim_token {uuid} NOT NULL,
        outcome VARCHAR(64) NOT NULL,
        worker VARCHAR(64) NOT NULL,
        at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))""",
    """CREATE TABLE torture_run_outcome (
        run_id {uuid} PRIMARY KEY,
        job_key VARCHAR(255) NOT NULL,
        status VARCHAR(32) NOT NULL,
        recorded VARCHAR(32) NOT NULL,
        reason VARCHAR(64),
        worker VARCHAR(64) NOT NULL,
        at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))""",
    """CREATE TABLE torture_reap_pass (
        id BIGINT AUTO_INCREMENT PRIMARY KEY,
        at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
        seconds DOUBLE NOT NULL,
        counts JSON NOT NULL)""",
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
    contains ``torture`` is accepted. On MariaDB, also the session table every later
    connection notes itself in."""
    name = _guarded_name(url)
    mysql = isinstance(dialect_of(url), MySQLDialect)
    try:
        with connect(url, "torture-setup", database=False) as conn:
            if mysql:
                conn.execute(f"DROP DATABASE IF EXISTS `{name}`")
                conn.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
            else:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{name}"')
        if mysql:
            with connect(url, "torture-setup") as conn:
                conn.execute(MYSQL_SESSION_DDL)
    except _connection_errors() as exc:
        raise TortureDatabaseError(f"cannot reach the database server at {url}: {exc}") from exc


def _connection_errors() -> tuple[type[Exception], ...]:
    """What either driver raises for a connection that could not be made."""
    import psycopg

    errors: tuple[type[Exception], ...] = (psycopg.OperationalError,)
    try:
        import MySQLdb
    except ImportError:
        return errors
    return (*errors, MySQLdb.OperationalError)


def drop_database(url: str) -> None:
    name = _guarded_name(url)
    with connect(url, "torture-setup", database=False) as conn:
        if isinstance(conn.dialect, MySQLDialect):
            conn.execute(f"DROP DATABASE IF EXISTS `{name}`")
        else:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_ledger(conn: Connection) -> None:
    """Create the harness's tables (in a database that has none yet)."""
    d = conn.dialect
    if isinstance(d, MySQLDialect):
        for statement in MYSQL_LEDGER_DDL:
            conn.execute(statement.format(uuid=d.uuid_type))
        return
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
    from reliability._torture_sql import dialect_of_django

    store = get_state_store()
    dialect = dialect_of_django()
    for start in range(0, count, batch):
        with transaction.atomic(), connection.cursor() as cursor:
            ids = []
            for number in range(start, min(start + batch, count)):
                job, _ = store.enqueue(
                    request_id=f"{REQUEST_PREFIX}{number}", target=TARGET, input={"n": number}
                )
                ids.append((dialect.uuid_value(job.id),))
            cursor.executemany("INSERT INTO torture_loaded (job_id) VALUES (%s)", ids)
        if count > batch:
            log(f"  loaded {min(start + batch, count)} of {count} jobs")
