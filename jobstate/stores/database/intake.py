"""Intake and updates on the Django ORM: reading a job, creating it, enqueueing it
idempotently, and conditional patches.

Request-id idempotency rests on the unique constraint ``jobstate_job_unique_request_id``;
only its violation becomes ``DuplicateRequestId`` or an idempotent replay. Every function
takes values the state store has already validated.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from jobstate.core.states import JobStatus
from jobstate.exceptions import UniqueTaskHeld
from jobstate.models import JOB_UNIQUE_REQUEST_ID, JOB_UNIQUE_TASK, Job
from jobstate.stores.contracts.validation import check_thread_quota, duplicate_request
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.tables import job_rows
from jobstate.stores.integrity import violates

__all__ = [
    "create_job",
    "enqueue_job",
    "find_by_request_id",
    "get_job",
    "lock_job",
    "update_job",
]


def find_by_request_id(using: str, request_id: str) -> Job | None:
    return job_rows(using).filter(request_id=request_id).first()


def get_job(using: str, pk: uuid.UUID) -> Job | None:
    return job_rows(using).filter(id=pk).first()


def create_job(using: str, cleaned: dict[str, Any]) -> Job:
    """Insert a job; a taken ``request_id`` raises ``DuplicateRequestId``."""
    try:
        # The savepoint keeps a host's surrounding transaction usable after a duplicate.
        with transaction.atomic(using=using):
            job = job_rows(using).create(**cleaned)
    except IntegrityError as exc:
        if _is_duplicate_request(exc):
            raise duplicate_request(str(cleaned["request_id"])) from exc
        raise
    return job_rows(using).get(id=job.id)


def enqueue_job(using: str, cleaned: dict[str, Any], quota: int | None) -> tuple[Job, bool]:
    """Insert a job unless its ``request_id`` exists: ``(job, True)`` when inserted,
    ``(existing, False)`` otherwise. With a ``quota`` the thread's in-flight jobs are
    counted under the thread's gate, which its claims take too, so the count cannot miss
    a sibling inserted concurrently (the backend's ``lock_thread``: an advisory lock on
    PostgreSQL, the thread gate row on MariaDB and MySQL; SQLite's ``IMMEDIATE``
    transactions already serialise)."""
    request_id = cleaned["request_id"]
    existing = find_by_request_id(using, request_id)
    if existing is not None:
        return existing, False
    thread_id = cleaned.get("thread_id")
    try:
        with transaction.atomic(using=using):
            if quota is not None and thread_id is not None:
                database_ops(using).lock_thread(thread_id)
                existing = find_by_request_id(using, request_id)
                if existing is None:
                    inflight = job_rows(using).filter(thread_id=thread_id).inflight().count()
                    check_thread_quota(thread_id, inflight, quota)
            if existing is None:
                job = job_rows(using).create(**cleaned)
    except IntegrityError as exc:
        if not _is_duplicate_request(exc):
            raise
        # A concurrent enqueue of the same request won the insert.
        existing = find_by_request_id(using, request_id)
        if existing is None:
            raise
    if existing is not None:
        return existing, False
    return job_rows(using).get(id=job.id), True


def update_job(
    using: str, pk: uuid.UUID, cleaned: dict[str, Any], expected: list[JobStatus] | None
) -> Job | None:
    """Write ``cleaned`` and ``updated_at`` in one conditional ``UPDATE`` (narrowed to
    ``expected`` statuses when given) and return the job as written."""
    with unique_key_guard(), transaction.atomic(using=using):
        rows = job_rows(using).filter(id=pk)
        if expected is not None:
            rows = rows.with_status(expected)
        if rows.update(**cleaned, updated_at=Now()) != 1:
            return None
        # Re-read inside the transaction: the row lock taken by the UPDATE means this
        # is exactly what was written.
        return job_rows(using).get(id=pk)


@contextmanager
def unique_key_guard() -> Iterator[None]:
    """Turn a requeue's violation of the unique task index into
    :class:`~jobstate.exceptions.UniqueTaskHeld`; every other error goes on as it is."""
    try:
        yield
    except IntegrityError as exc:
        if violates(
            exc,
            constraint=JOB_UNIQUE_TASK,
            table=Job._meta.db_table,
            columns=("target", "unique_digest"),
        ):
            raise UniqueTaskHeld(
                "a unique task cannot be requeued while another job of its backend holds "
                "its key (enqueued since it finished): finish or cancel that job first."
            ) from exc
        raise


def delete_job(using: str, pk: uuid.UUID, expected: list[JobStatus]) -> bool:
    """Delete the job in one conditional ``DELETE`` (narrowed to ``expected``). Its
    notifications keep their rows with ``job`` cleared (``SET_NULL``); its audit
    entries keep the job's id (no database constraint)."""
    with transaction.atomic(using=using):
        deleted, _by_model = job_rows(using).filter(id=pk).with_status(expected).delete()
        return bool(deleted)


def lock_job(using: str, pk: uuid.UUID, *, lease_ended: bool) -> Job | None:
    """The job, locked (``SELECT ... FOR UPDATE``) until the caller's transaction ends;
    with ``lease_ended`` only while it is claimed and its lease ended on the database
    clock, and not at all while another transaction holds it (``SKIP LOCKED``): its
    holder is acting on it at that moment (a worker reporting, or a task that locked
    its own row and would hold up a recovery sweep until it lets go). On SQLite the
    ``IMMEDIATE`` transaction already keeps other writers out."""
    if not lease_ended:
        return job_rows(using).select_for_update().filter(id=pk).first()
    rows = job_rows(using).filter(id=pk, lease_until__lt=Now()).claimed()
    return database_ops(using).lock_candidates(rows).first()


def _is_duplicate_request(exc: IntegrityError) -> bool:
    return violates(
        exc,
        constraint=JOB_UNIQUE_REQUEST_ID,
        table=Job._meta.db_table,
        columns=["request_id"],
    )
