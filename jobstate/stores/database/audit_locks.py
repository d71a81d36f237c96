"""The audit ledger and runtime locks on the Django ORM.

Audit entries are append-only rows stamped by the database clock unless the caller
recorded an instant; pruning deletes in short batches. A runtime lock is one row per key
whose primary key settles concurrent takers: the insert that wins holds the lock.
Every function takes values the state store has already validated.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Q
from django.db.models.functions import Now

from jobstate.models import RUNTIME_LOCK_PKEY, AuditEntry, RuntimeLock
from jobstate.stores.contracts.audit import AuditFields, complete_audit_fields
from jobstate.stores.database.batched_delete import BatchedDeleter
from jobstate.stores.integrity import violates

__all__ = [
    "acquire_lock",
    "append_audit_entry",
    "audit_row",
    "list_audit",
    "prune_audit",
    "record_audit",
    "release_lock",
]


# --- audit ledger ----------------------------------------------------------------------


def audit_row(
    job_id: uuid.UUID | None, request_id: str, event: str, fields: AuditFields
) -> AuditEntry:
    """An unsaved entry with completed ``fields``; the database clock stamps it."""
    return AuditEntry(
        job_id=job_id,
        request_id=request_id,
        event=event,
        stage=fields.stage,
        severity=fields.severity,
        title=fields.title,
        summary=fields.summary,
        detail=fields.detail,
    )


def append_audit_entry(
    using: str,
    job_id: uuid.UUID | None,
    request_id: str,
    event: str,
    fields: AuditFields,
    at: datetime | None,
) -> AuditEntry:
    """Insert one entry; without ``at`` the database clock stamps it."""
    entry = audit_row(job_id, request_id, event, fields)
    if at is not None:
        entry.ts = at
    entry.save(using=using, force_insert=True)
    if at is None and not connections[using].features.can_return_columns_from_insert:
        # Without INSERT ... RETURNING the database-stamped ts is not known yet.
        entry.refresh_from_db(using=using, fields=["ts"])
    return entry


def record_audit(
    using: str,
    *,
    job_id: Any,
    request_id: str = "",
    event: str,
    summary: str = "",
    detail: dict[str, Any] | None = None,
) -> AuditEntry:
    """An entry the database store writes for a transition of its own (a finished job, a
    dead letter, a replay), with the stage, severity and title the event implies."""
    fields = complete_audit_fields(
        event=event, stage=None, severity=None, title="", summary=summary, detail=detail
    )
    return append_audit_entry(using, job_id, request_id, event, fields, None)


def list_audit(
    using: str, job_id: uuid.UUID | None, request_id: str | None, limit: int
) -> list[AuditEntry]:
    rows = AuditEntry.objects.using(using).all()
    if job_id is not None:
        rows = rows.filter(job_id=job_id)
    if request_id is not None:
        rows = rows.filter(request_id=request_id)
    return list(rows.order_by("ts", "id")[:limit])


def prune_audit(using: str, cutoff: datetime, batch: int) -> int:
    entries = AuditEntry.objects.using(using).older_than(cutoff)
    # Each batch its own short transaction, starting after the last entry deleted, so
    # a large backlog never holds locks on the whole table nor rescans what is gone.
    deleter = BatchedDeleter(using)
    total = 0
    while True:
        deleted = deleter.delete_batch(entries, "ts", batch)
        total += deleted
        if deleted < batch:
            return total


# --- runtime locks ---------------------------------------------------------------------


def acquire_lock(using: str, lock_key: str, owner: str, ttl: timedelta) -> bool:
    locks = RuntimeLock.objects.using(using)
    # Three rounds at most: the row can vanish (a release) between a failed insert and
    # the update; after that the key is contended and "held" is the honest answer.
    for _ in range(3):
        try:
            with transaction.atomic(using=using):
                locks.create(lock_key=lock_key, owner=owner, expires_at=Now() + ttl)
            return True
        except IntegrityError as exc:
            if not violates(
                exc,
                constraint=RUNTIME_LOCK_PKEY,
                table=RuntimeLock._meta.db_table,
                columns=["lock_key"],
            ):
                raise
        taken = (
            locks.filter(lock_key=lock_key)
            .filter(Q(owner=owner) | Q(expires_at__lte=Now()))
            .update(owner=owner, expires_at=Now() + ttl, updated_at=Now())
        )
        if taken:
            return True
        if locks.filter(lock_key=lock_key).exists():
            return False
    return False


def release_lock(using: str, lock_key: str, owner: str) -> None:
    RuntimeLock.objects.using(using).filter(lock_key=lock_key, owner=owner).delete()
