"""Queue pauses and the worker registry on the Django ORM.

A pause is a row of ``QueuePause``; the claim statements read the table themselves
(:mod:`.backends.postgresql_statements`, and ``JobQuerySet.claimable`` on the portable path), so
a pause holds for every claim that starts after it commits, with no cache to go stale.
Two operators pausing the same queue at once meet on its unique key: the second insert
fails on ``jobstate_queuepause_unique_queue`` inside a savepoint and answers "already
paused". A worker row is written by the process it describes, except an executor's,
which any process its claims go through may write first: two first writes meet on
``jobstate_worker_unique_worker_id`` inside a savepoint, and the second becomes an update
of the row the first inserted. Instants come from the database clock.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction
from django.db.models.functions import Now

from jobstate.models import QUEUE_PAUSE_UNIQUE, WORKER_UNIQUE_ID, QueuePause, Worker
from jobstate.stores.integrity import violates

__all__ = [
    "beat_worker",
    "pause_queue",
    "paused_queues",
    "register_worker",
    "resume_queue",
    "stop_worker",
]


def pause_queue(using: str, target: str, queue: str, by: str) -> bool:
    try:
        with transaction.atomic(using=using):
            QueuePause.objects.using(using).create(target=target, queue_name=queue, paused_by=by)
    except IntegrityError as exc:
        if violates(
            exc,
            constraint=QUEUE_PAUSE_UNIQUE,
            table=QueuePause._meta.db_table,
            columns=("target", "queue_name"),
        ):
            return False
        raise
    return True


def resume_queue(using: str, target: str, queue: str) -> bool:
    deleted, _ = QueuePause.objects.using(using).filter(target=target, queue_name=queue).delete()
    return deleted > 0


def paused_queues(using: str) -> list[tuple[str, str]]:
    return list(QueuePause.objects.using(using).values_list("target", "queue_name"))


def register_worker(using: str, fields: dict[str, Any]) -> None:
    rows = Worker.objects.using(using)
    restarted = rows.filter(worker_id=fields["worker_id"]).update(
        **fields, started_at=Now(), heartbeat_at=Now(), stopped_at=None, stopped_reason=""
    )
    if restarted:
        return
    try:
        with transaction.atomic(using=using):
            rows.create(**fields)
    except IntegrityError as exc:
        if not violates(
            exc, constraint=WORKER_UNIQUE_ID, table=Worker._meta.db_table, columns=("worker_id",)
        ):
            raise
        rows.filter(worker_id=fields["worker_id"]).update(heartbeat_at=Now())


def beat_worker(using: str, worker_id: str) -> bool:
    rows = Worker.objects.using(using).filter(worker_id=worker_id, stopped_at__isnull=True)
    return rows.update(heartbeat_at=Now()) > 0


def stop_worker(using: str, worker_id: str, reason: str) -> bool:
    rows = Worker.objects.using(using).filter(worker_id=worker_id)
    return rows.update(stopped_at=Now(), heartbeat_at=Now(), stopped_reason=reason) > 0
