"""Unique tasks on the Django ORM: an enqueue whose key a job already holds returns that
job and writes nothing.

The database decides, through the unique index ``jobstate_job_unique_task`` (a partial
index on PostgreSQL and SQLite, the ``unique_hold`` generated column's index on MariaDB
and MySQL, see migration ``0017_task_policy``): the insert either lands or meets the
holder's key. PostgreSQL's insert is ``ON CONFLICT DO NOTHING`` in the enqueue's one
statement; elsewhere the insert runs in a savepoint whose violation of that index (and
only that one) is the answer "held". Either waits for a holder's uncommitted
transaction to end, then the holder is read with a statement of its own. A holder can
leave its states between the two (it finished); then the insert is tried again.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, connections, transaction

from jobstate.exceptions import StoreConflict
from jobstate.models import JOB_UNIQUE_TASK, Job, unique_hold
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.intake import create_job
from jobstate.stores.database.tables import job_rows
from jobstate.stores.integrity import violates

__all__ = ["enqueue_unique_task"]

#: How many times an enqueue tries again when the holder it met is gone when read: each
#: miss means a holder finished in between, which a burst of enqueues cannot repeat long.
_TRIES = 5


def enqueue_unique_task(using: str, cleaned: dict[str, Any]) -> Job:
    """The new job, or the job of ``cleaned["target"]`` that holds the key of
    ``cleaned["unique_digest"]``."""
    for _ in range(_TRIES):
        job = _insert(using, cleaned)
        if job is not None:
            return job
        holder = _holder(using, cleaned["target"], cleaned["unique_digest"])
        if holder is not None:
            return holder
    raise StoreConflict(
        f"the unique task {cleaned['task_path']} met a holder of its key {_TRIES} times, "
        "and each had left the states the key covers when read; try again."
    )


def _insert(using: str, cleaned: dict[str, Any]) -> Job | None:
    ops = database_ops(using)
    if ops.hot_statements:
        return ops.enqueue_task(cleaned)
    try:
        return create_job(using, cleaned)
    except IntegrityError as exc:
        if violates(
            exc,
            constraint=JOB_UNIQUE_TASK,
            table=Job._meta.db_table,
            columns=("target", "unique_digest"),
        ):
            return None
        raise


def _holder(using: str, target: str, digest: str) -> Job | None:
    """The job holding the key: read with a locking read on MariaDB and MySQL, whose
    plain reads in a caller's ``REPEATABLE READ`` transaction would not see a holder
    committed after its first read, and through the ``unique_hold`` column's index."""
    connection = connections[using]
    if connection.features.supports_partial_indexes:
        return (
            job_rows(using)
            .filter(target=target, unique_digest=digest)
            .filter(unique_hold())
            .first()
        )
    table = connection.ops.quote_name(Job._meta.db_table)
    with transaction.atomic(using=using), connection.cursor() as cursor:
        cursor.execute(
            f"SELECT `id` FROM {table} WHERE `target` = %s AND `unique_hold` = %s "
            "LOCK IN SHARE MODE",
            [target, digest],
        )
        row = cursor.fetchone()
    return None if row is None else job_rows(using).filter(id=row[0]).first()
