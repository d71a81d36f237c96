"""Each rule the one-statement claims write as SQL text selects the same rows as its ORM
twin beside it in :mod:`jobstate.models.jobs`: the per-thread gate, the paused-queue
probe, the claim's ``WHERE`` and order, and the task claim's due order. Both run on the
same rows, on every backend (the text filled in by the backend's operations object)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.db.models import Exists
from django.utils import timezone

from jobstate.core.states import NO_QUEUE, JobStatus
from jobstate.models import Job, QueuePause, thread_blockers
from jobstate.models.claim_sql import (
    CLAIM_ORDER_SQL,
    PAUSED_SQL,
    READY_SQL,
    TASK_CLAIM_ORDER_SQL,
    TASK_READY_SQL,
    THREAD_BLOCKERS_SQL,
    UNPAUSED_SQL,
)
from jobstate.stores.database.backends import database_ops

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

TARGETS = ["twins:a", "twins:b"]
TASKS = "twins:tasks"


def _job(name: str, **fields: Any) -> Job:
    fields.setdefault("target", TARGETS[0])
    fields.setdefault("status", JobStatus.QUEUED)
    return Job.objects.create(request_id=f"twins-{name}", **fields)


@pytest.fixture
def rows() -> dict[str, uuid.UUID]:
    """Jobs in every case the rules tell apart: each status, due, delayed and never
    delayed, paused and unpaused queues of two targets, threads blocked by a claimed
    sibling, by a ready sibling ahead (also on a tie of ``created_at``), and not by a
    delayed one; tasks of several priorities and due instants."""
    now = timezone.now()
    hour = timedelta(hours=1)
    QueuePause.objects.create(target=TARGETS[0], queue_name="paused", paused_by="test")
    QueuePause.objects.create(target=TARGETS[1], queue_name=NO_QUEUE, paused_by="test")
    QueuePause.objects.create(target=TASKS, queue_name="paused", paused_by="test")
    made = [
        _job("plain"),
        _job("due", run_after=now - hour),
        _job("delayed", run_after=now + hour),
        _job("other-target", target=TARGETS[1], queue_name="q"),
        _job("paused-queue", queue_name="paused"),
        _job("paused-no-queue", target=TARGETS[1]),
        _job("unlisted-target", target="twins:elsewhere"),
        _job("running", status=JobStatus.RUNNING),
        _job("done", status=JobStatus.DONE),
        # Thread 1: a running job blocks its queued siblings.
        _job("t1-running", thread_id=1, status=JobStatus.RUNNING),
        _job("t1-queued", thread_id=1),
        # Thread 2: the older ready job goes first; the newer waits behind it.
        _job("t2-first", thread_id=2, created_at=now - 2 * hour),
        _job("t2-second", thread_id=2, created_at=now - hour),
        # Thread 3: a delayed job ahead does not block.
        _job("t3-delayed", thread_id=3, created_at=now - 2 * hour, run_after=now + hour),
        _job("t3-ready", thread_id=3, created_at=now - hour),
        # Thread 4: a tie on created_at is broken by id.
        _job("t4-low-id", thread_id=4, created_at=now - hour),
        _job("t4-high-id", thread_id=4, created_at=now - hour),
        # Thread 5: a dispatched job blocks, a finished one does not.
        _job("t5-dispatched", thread_id=5, status=JobStatus.DISPATCHED),
        _job("t5-queued", thread_id=5),
        _job("t6-done", thread_id=6, status=JobStatus.DONE),
        _job("t6-queued", thread_id=6, queue_name="q"),
        # Tasks: priority first, then when due (run_after, or enqueued), then enqueue order.
        _job("task-low", target=TASKS, task_path="m.f", queue_name="q", priority=-5),
        _job("task-high", target=TASKS, task_path="m.f", queue_name="q", priority=10),
        _job(
            "task-retry",
            target=TASKS,
            task_path="m.f",
            queue_name="q",
            # Enqueued first, but due after task-old: it waits behind it.
            created_at=now - 5 * hour,
            run_after=now - hour / 2,
        ),
        _job("task-old", target=TASKS, task_path="m.f", queue_name="q", created_at=now - hour),
        _job("task-deferred", target=TASKS, task_path="m.f", queue_name="q", run_after=now + hour),
        _job("task-tie-1", target=TASKS, task_path="m.f", created_at=now - 4 * hour),
        _job("task-tie-2", target=TASKS, task_path="m.f", created_at=now - 4 * hour),
        _job("task-running", target=TASKS, task_path="m.f", status=JobStatus.RUNNING),
        _job("task-paused", target=TASKS, task_path="m.f", queue_name="paused"),
        _job("not-a-task", target=TASKS),
    ]
    return {job.request_id.removeprefix("twins-"): job.id for job in made}


def _select(where: str, params: Sequence[Any] = (), order: str = "") -> list[uuid.UUID]:
    """The ids of the jobs ``c`` the SQL text ``where`` selects, in ``order`` if given."""
    ops = database_ops(connection.alias)
    sql = ops.sql(f"SELECT c.id FROM {{job}} AS c WHERE {where}")
    if order:
        sql += f" ORDER BY {order}"
    with connection.cursor() as cursor:
        cursor.execute(sql, list(params))
        return [uuid.UUID(str(row[0])) for row in cursor.fetchall()]


def _names(rows: dict[str, uuid.UUID], ids: Sequence[uuid.UUID]) -> list[str]:
    by_id = {pk: name for name, pk in rows.items()}
    return [by_id[pk] for pk in ids]


def test_the_thread_gate_selects_what_thread_blockers_selects(rows: dict[str, uuid.UUID]) -> None:
    sql = _select(f"c.thread_id IS NOT NULL AND NOT EXISTS ({THREAD_BLOCKERS_SQL})")
    orm = Job.objects.filter(thread_id__isnull=False).filter(~Exists(thread_blockers()))
    assert sorted(_names(rows, sql)) == sorted(_names(rows, list(orm.values_list("id", flat=True))))
    # The rows tell the cases apart: each kind of blocker holds a job back, and the
    # ones that should not, do not.
    passed = set(_names(rows, sql))
    assert {"t2-first", "t3-delayed", "t3-ready", "t4-low-id", "t6-queued"} <= passed
    assert not {"t1-queued", "t2-second", "t4-high-id", "t5-queued"} & passed


def test_the_paused_queue_probe_selects_what_unpaused_leaves_out(
    rows: dict[str, uuid.UUID],
) -> None:
    sql = _select(f"NOT EXISTS ({PAUSED_SQL})")
    orm = Job.objects.unpaused().values_list("id", flat=True)
    assert sorted(_names(rows, sql)) == sorted(_names(rows, list(orm)))
    assert not {"paused-queue", "paused-no-queue", "task-paused"} & set(_names(rows, sql))
    assert {"plain", "other-target"} <= set(_names(rows, sql))


def test_the_claims_unpaused_form_selects_what_unpaused_selects_with_and_without_pauses(
    rows: dict[str, uuid.UUID],
) -> None:
    # With pauses: the per-candidate probe decides.
    sql = _names(rows, _select(UNPAUSED_SQL))
    assert sorted(sql) == sorted(
        _names(rows, list(Job.objects.unpaused().values_list("id", flat=True)))
    )
    assert not {"paused-queue", "paused-no-queue", "task-paused"} & set(sql)
    # One pause left, of a queue no job is in: only its jobs would be held back.
    QueuePause.objects.exclude(target=TARGETS[0]).delete()
    QueuePause.objects.filter(target=TARGETS[0]).update(queue_name="no-such-queue")
    assert sorted(_names(rows, _select(UNPAUSED_SQL))) == sorted(rows)
    # No pause at all: every job passes (the probe per candidate is never run).
    QueuePause.objects.all().delete()
    assert sorted(_names(rows, _select(UNPAUSED_SQL))) == sorted(rows)
    # A pause added again is seen by the next statement.
    QueuePause.objects.create(target=TARGETS[1], queue_name=NO_QUEUE, paused_by="test")
    assert "paused-no-queue" not in _names(rows, _select(UNPAUSED_SQL))


def test_the_claims_where_selects_what_ready_selects(rows: dict[str, uuid.UUID]) -> None:
    sql = _select(READY_SQL)
    orm = Job.objects.ready().values_list("id", flat=True)
    assert sorted(_names(rows, sql)) == sorted(_names(rows, list(orm)))
    assert "due" in _names(rows, sql)
    assert "delayed" not in _names(rows, sql)


def test_the_whole_claim_selects_what_claimable_selects_in_its_order(
    rows: dict[str, uuid.UUID],
) -> None:
    placeholders = ", ".join(["%s"] * len(TARGETS))
    where = (
        f"{READY_SQL} AND c.target IN ({placeholders}) AND {UNPAUSED_SQL}"
        f" AND (c.thread_id IS NULL OR NOT EXISTS ({THREAD_BLOCKERS_SQL}))"
    )
    sql = _select(where, TARGETS, order=CLAIM_ORDER_SQL)
    orm = list(Job.objects.claimable(TARGETS).values_list("id", flat=True))
    assert _names(rows, sql) == _names(rows, orm)
    assert len(sql) > 5


def test_the_task_claims_due_order_is_the_orm_order(rows: dict[str, uuid.UUID]) -> None:
    sql = _select(TASK_READY_SQL, [TASKS], order=TASK_CLAIM_ORDER_SQL)
    orm = list(Job.objects.due_tasks(TASKS).in_task_claim_order().values_list("id", flat=True))
    assert _names(rows, sql) == _names(rows, orm)
    assert _names(rows, sql) == [
        "task-high",
        "task-tie-1",
        "task-tie-2",
        "task-old",
        "task-retry",
        "task-paused",
        "task-low",
    ]


def test_every_placeholder_of_the_rules_is_filled_in() -> None:
    ops = database_ops(connection.alias)
    for text in (READY_SQL, THREAD_BLOCKERS_SQL, PAUSED_SQL, UNPAUSED_SQL, TASK_READY_SQL):
        filled = ops.sql(text)
        assert "{" not in filled
        assert "}" not in filled
