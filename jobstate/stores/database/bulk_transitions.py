"""The console's bulk transitions on the ORM: a batch of jobs requeued, rejected or
deleted in a few set-based statements instead of a few per job.

Each batch first locks its rows (``SELECT ... FOR UPDATE`` in id order, so two batches
never wait on each other crosswise) with the transition's condition in the same
statement. PostgreSQL and MySQL re-check that condition on a row a concurrent writer
held, once it is released, so a job a worker claimed or finished meanwhile is not
selected; on SQLite the ``IMMEDIATE`` transaction keeps every other writer out. The
writes that follow touch only the rows locked, and the audit entries are one
multi-row insert, in the same transaction.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import transaction
from django.db.models import Exists, OuterRef
from django.db.models.functions import Now

from jobstate.core.states import TERMINAL_JOB_STATUSES, JobStatus
from jobstate.models import AuditEntry, unique_hold
from jobstate.stores.contracts.audit import complete_audit_fields
from jobstate.stores.contracts.transitions_part import (
    NO_DELIVERY_KEY,
    REQUEUED,
    delivering_metadata,
    reject_detail,
    requeue_detail,
)
from jobstate.stores.database.audit_locks import audit_row
from jobstate.stores.database.intake import unique_key_guard
from jobstate.stores.database.tables import job_rows

__all__ = ["delete_batch", "reject_batch", "requeue_batch"]


def _entries(using: str, rows: list[tuple[uuid.UUID, str, dict[str, Any]]], event: str) -> None:
    entries = []
    for pk, request_id, detail in rows:
        fields = complete_audit_fields(
            event=event, stage=None, severity=None, title="", summary="", detail=detail
        )
        entries.append(audit_row(pk, request_id, event, fields))
    AuditEntry.objects.using(using).bulk_create(entries)


def requeue_batch(
    using: str, jobs: list[tuple[uuid.UUID, JobStatus]], *, by: str, via: str, event: str
) -> list[uuid.UUID]:
    seen = dict(jobs)
    with unique_key_guard(), transaction.atomic(using=using):
        locked = list(
            job_rows(using)
            .select_for_update()
            .filter(pk__in=list(seen))
            .requeueable()
            .order_by("id")
            .values_list("id", "request_id", "status", "attempt_log", "metadata")
        )
        held = _keys_held_elsewhere(using, [row[0] for row in locked])
        rows = [row for row in locked if row[2] == seen[row[0]] and row[0] not in held]
        if not rows:
            return []
        ids = [row[0] for row in rows]
        # The refire's writes (transitions_part), set-based: the same for every row, then
        # a task's emptied log and the metadata of the rows that name NO_DELIVERY_KEY.
        job_rows(using).filter(pk__in=ids).update(**REQUEUED, updated_at=Now())
        tasks = [row[0] for row in rows if row[3] is not None]
        if tasks:
            job_rows(using).filter(pk__in=tasks).update(attempt_log=[])
        for pk, _request_id, _status, _log, metadata in rows:
            if isinstance(metadata, dict) and NO_DELIVERY_KEY in metadata:
                job_rows(using).filter(pk=pk).update(metadata=delivering_metadata(metadata))
        audit = [
            (pk, request_id, requeue_detail(by, via, status, log))
            for pk, request_id, status, log, _metadata in rows
        ]
        _entries(using, audit, event)
        return ids


def _keys_held_elsewhere(using: str, pks: list[uuid.UUID]) -> set[uuid.UUID]:
    """The unique tasks among ``pks`` whose key another job of their backend holds: a
    requeue leaves them as they are (the index would refuse the whole batch)."""
    holders = (
        job_rows(using)
        .filter(target=OuterRef("target"), unique_digest=OuterRef("unique_digest"))
        .exclude(id=OuterRef("id"))
        .filter(unique_hold())
    )
    return set(
        job_rows(using)
        .filter(pk__in=pks, unique_digest__isnull=False)
        .filter(Exists(holders))
        .values_list("id", flat=True)
    )


def reject_batch(
    using: str, pks: list[uuid.UUID], *, by: str, error: str, via: str
) -> list[uuid.UUID]:
    with transaction.atomic(using=using):
        rows = list(
            job_rows(using)
            .select_for_update()
            .filter(pk__in=pks, status=JobStatus.QUEUED)
            .order_by("id")
            .values_list("id", "request_id")
        )
        if not rows:
            return []
        ids = [pk for pk, _request_id in rows]
        job_rows(using).filter(pk__in=ids).update(
            status=JobStatus.REJECTED, error=error, updated_at=Now()
        )
        detail = reject_detail(by, error, via)
        _entries(using, [(pk, request_id, dict(detail)) for pk, request_id in rows], "rejected")
        return ids


def delete_batch(using: str, pks: list[uuid.UUID], *, by: str, via: str) -> list[uuid.UUID]:
    with transaction.atomic(using=using):
        rows = list(
            job_rows(using)
            .select_for_update()
            .filter(pk__in=pks, status__in=list(TERMINAL_JOB_STATUSES))
            .order_by("id")
            .values_list("id", "request_id", "status")
        )
        if not rows:
            return []
        ids = [row[0] for row in rows]
        # Notifications keep their rows with the job cleared (SET_NULL); audit entries
        # keep the job's id (no database constraint).
        job_rows(using).filter(pk__in=ids).delete()
        _entries(
            using,
            [
                (pk, request_id, {"by": by, "via": via, "prev_status": status})
                for pk, request_id, status in rows
            ],
            "deleted",
        )
        return ids
