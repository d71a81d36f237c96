"""The figures of the Queues page: per queue (a target and its queue name), the ready,
delayed, running and recently finished jobs, the age of the oldest ready job, and
whether the queue is paused.

Four grouped queries whatever the table sizes, each on an index that holds only the
rows it counts or a narrow range of them: the queued jobs (the partial index of queued
jobs), the claimed ones (the lease index, which only claimed rows are in), the jobs
finished in the last hour (the ``(status, updated_at)`` index), and the pause table.

The concurrency keys at their limit (``policy(concurrency_key=...)``) take two more: the
running tasks under a key, grouped (the lease index again), and the waiting tasks of
the keys at their limit (the concurrency index, by key).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from django.db.models import Count, Max, Min, Q
from django.db.models.functions import Now

from jobstate.core.states import CLAIMED_JOB_STATUSES, NO_QUEUE, TERMINAL_JOB_STATUSES, JobStatus
from jobstate.models import TASK_DUE, Job, QueuePause

__all__ = ["FINISHED_WINDOW", "KeyAtLimit", "QueueRow", "keys_at_limit", "queue_rows"]

#: How far back "finished" counts.
FINISHED_WINDOW = timedelta(hours=1)


@dataclass
class QueueRow:
    target: str
    queue: str
    """The queue name; :data:`~jobstate.core.states.NO_QUEUE` for the jobs without one."""
    ready: int = 0
    delayed: int = 0
    running: int = 0
    finished: int = 0
    oldest_ready_at: datetime | None = None
    paused_at: datetime | None = None
    paused_by: str = ""
    now: datetime | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    @property
    def oldest_ready_seconds(self) -> float:
        if self.oldest_ready_at is None or self.now is None:
            return 0.0
        return max((self.now - self.oldest_ready_at).total_seconds(), 0.0)

    @property
    def key(self) -> str:
        """The row's query string: what the pause and resume pages are given."""
        return urlencode({"target": self.target, "queue": self.queue})

    @property
    def jobs_filter(self) -> str:
        """The jobs changelist's query string for this queue's queued jobs."""
        query: dict[str, str] = {"status__exact": JobStatus.QUEUED.value, "target": self.target}
        if self.queue != NO_QUEUE:
            query["queue"] = self.queue
        return urlencode(query)


def queue_rows(*, target: str | None = None, queue: str | None = None) -> list[QueueRow]:
    """Every queue that holds queued, claimed or recently finished jobs, or is paused,
    ordered by target and queue name; only ``(target, queue)`` when both are given."""
    rows: dict[tuple[str, str], QueueRow] = {}
    now: datetime | None = None

    def row(key_target: str | None, key_queue: str | None) -> QueueRow:
        key = (key_target or "", key_queue or NO_QUEUE)
        if key not in rows:
            rows[key] = QueueRow(target=key[0], queue=key[1])
        return rows[key]

    jobs = Job.objects.all()
    pauses = QueuePause.objects.all()
    if target is not None and queue is not None:
        jobs = jobs.filter(target=target)
        jobs = (
            jobs.filter(queue_name__isnull=True)
            if queue == NO_QUEUE
            else jobs.filter(queue_name=queue)
        )
        pauses = pauses.filter(target=target, queue_name=queue)
    delayed = Q(run_after__gt=Now())
    queued: Any = (
        jobs.queued()
        .order_by()
        .values_list("target", "queue_name")
        .annotate(
            total=Count("id"),
            late=Count("id", filter=delayed),
            # When each ready job became due: its run_after, or when it was queued.
            oldest=Min(TASK_DUE, filter=~delayed),
            now=Max(Now()),
        )
    )
    for key_target, key_queue, total, late, oldest, clock in queued:
        entry = row(key_target, key_queue)
        entry.ready, entry.delayed, entry.oldest_ready_at = total - late, late, oldest
        now = clock
    claimed: Any = (
        jobs.with_status(CLAIMED_JOB_STATUSES)
        .order_by()
        .values_list("target", "queue_name")
        .annotate(n=Count("id"))
    )
    for key_target, key_queue, n in claimed:
        row(key_target, key_queue).running = n
    finished: Any = (
        jobs.with_status(TERMINAL_JOB_STATUSES)
        .filter(updated_at__gte=Now() - FINISHED_WINDOW)
        .order_by()
        .values_list("target", "queue_name")
        .annotate(n=Count("id"))
    )
    for key_target, key_queue, n in finished:
        row(key_target, key_queue).finished = n
    for pause in pauses:
        entry = row(pause.target, pause.queue_name)
        entry.paused_at, entry.paused_by = pause.paused_at, pause.paused_by
    for entry in rows.values():
        entry.now = now
    return [rows[key] for key in sorted(rows)]


@dataclass(frozen=True)
class KeyAtLimit:
    """A concurrency key with as many tasks running as its limit: its other tasks wait."""

    target: str
    key: str
    running: int
    limit: int
    waiting: int

    @property
    def jobs_filter(self) -> str:
        """The jobs changelist's query string for the key's tasks."""
        return urlencode({"q": f'key:"{self.key}"'})


def keys_at_limit() -> list[KeyAtLimit]:
    """The concurrency keys whose running tasks reach their limit, by target and key."""
    running: Any = (
        Job.objects.filter(
            status=JobStatus.RUNNING, lease_until__isnull=False, concurrency_digest__isnull=False
        )
        .order_by()
        .values_list("target", "concurrency_digest")
        .annotate(n=Count("id"), most=Max("concurrency_limit"))
    )
    full = [entry for entry in running if entry[2] >= (entry[3] or 1)]
    if not full:
        return []
    digests = [digest for _target, digest, _n, _most in full]
    waiting = dict(
        Job.objects.filter(concurrency_digest__in=digests, status=JobStatus.QUEUED)
        .order_by()
        .values_list("concurrency_digest")
        .annotate(n=Count("id"))
        .values_list("concurrency_digest", "n")
    )
    # The key as declared, from the policy of one of its running tasks (at most the
    # limits' worth of rows).
    names: dict[str, str] = {}
    for digest, policy in Job.objects.filter(
        concurrency_digest__in=digests, status=JobStatus.RUNNING
    ).values_list("concurrency_digest", "policy"):
        if digest and isinstance(policy, dict) and isinstance(policy.get("concurrency_key"), str):
            names.setdefault(digest, policy["concurrency_key"])
    keys = [
        KeyAtLimit(
            target=target,
            key=names.get(digest, digest),
            running=n,
            limit=most or 1,
            waiting=waiting.get(digest, 0),
        )
        for target, digest, n, most in full
    ]
    return sorted(keys, key=lambda entry: (entry.target, entry.key))
