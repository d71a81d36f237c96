"""A worker's own page: the jobs it holds now, the jobs it finished lately with their
outcome, and how many it finished and failed in the last hour of its beat.

Three queries, each bounded whatever the size of the jobs table: the jobs it holds (a
worker holds at most its concurrency, an executor its claims; the list stops at
:data:`CURRENT_SHOWN`), and over the jobs finished in the hour before its last beat
(``status`` and ``updated_at``: the ``jobstate_job_metrics_idx`` index), the latest
:data:`RECENT_SHOWN` and the counts. A finished job keeps its workers in its attempt
log only (a task's); a job claimed through ``claim_next_job`` or
``claim_next_inhub_job`` is released with its ``executor_id`` cleared, so an executor's
page lists what it holds now, not what it finished.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Q
from django.utils.safestring import SafeString

from jobstate.admin.display import choice_badge, job_link, moment
from jobstate.admin.page_bases import admin_change_url
from jobstate.admin.status_words import status_name
from jobstate.console.job_search import attempted_by
from jobstate.core.states import CLAIMED_JOB_STATUSES, JobStatus, WorkerKind
from jobstate.models import Job, Worker

__all__ = ["CURRENT_SHOWN", "RECENT_SHOWN", "RECENT_WINDOW", "WorkerJobs", "worker_jobs"]

#: How many of the jobs a worker holds its page lists.
CURRENT_SHOWN = 50
#: How many of the jobs it finished lately its page lists.
RECENT_SHOWN = 20
#: The span its counts and recent jobs cover, ending at its last beat (now, while live).
RECENT_WINDOW = timedelta(hours=1)

_FINISHED = [JobStatus.DONE, JobStatus.ERROR, JobStatus.REJECTED]


@dataclass(frozen=True)
class JobRow:
    link: SafeString
    """Its name and short id, linked to its page (as on the Workers page)."""
    status: SafeString
    at: SafeString | str


@dataclass(frozen=True)
class WorkerJobs:
    current: list[JobRow]
    current_more: bool
    recent: list[JobRow]
    done: int
    failed: int
    since: SafeString | str
    records_finished: bool
    """Whether its finished jobs can be told: a task worker's attempts are logged."""
    runs_jobs: bool
    """A relay delivers notifications and runs no job."""


def _row(job: Job, at: datetime | None, site: str) -> JobRow:
    name = job.task_path or job.target or job.request_id
    return JobRow(
        link=job_link(admin_change_url(Job, job.pk, site), job.pk, name),
        status=choice_badge(job.status, status_name(job)),
        at=moment(at),
    )


def worker_jobs(worker: Worker, now: datetime, site: str = "admin") -> WorkerJobs:
    """What ``worker``'s page shows of its jobs, judged at ``now`` (the database's
    clock)."""
    fields = ("id", "request_id", "task_path", "target", "status", "claimed_at", "updated_at")
    held = list(
        Job.objects.filter(status__in=list(CLAIMED_JOB_STATUSES), executor_id=worker.worker_id)
        .order_by("claimed_at", "id")
        .only(*fields)[: CURRENT_SHOWN + 1]
    )
    end = now if worker.stopped_at is None else worker.heartbeat_at
    start = max(worker.started_at, end - RECENT_WINDOW)
    records_finished = worker.kind == WorkerKind.TASKS
    recent: list[Job] = []
    counts: dict[str, Any] = {"done": 0, "failed": 0}
    if records_finished:
        finished = attempted_by(
            Job.objects.filter(status__in=_FINISHED, updated_at__gte=start, updated_at__lte=end),
            worker.worker_id,
        )
        recent = list(finished.order_by("-updated_at", "-id").only(*fields)[:RECENT_SHOWN])
        counts = finished.aggregate(
            done=Count("id", filter=Q(status=JobStatus.DONE)),
            failed=Count("id", filter=Q(status=JobStatus.ERROR)),
        )
    return WorkerJobs(
        current=[_row(job, job.claimed_at, site) for job in held[:CURRENT_SHOWN]],
        current_more=len(held) > CURRENT_SHOWN,
        recent=[_row(job, job.updated_at, site) for job in recent],
        done=counts["done"] or 0,
        failed=counts["failed"] or 0,
        since=moment(start, now),
        records_finished=records_finished,
        runs_jobs=worker.kind != WorkerKind.RELAY,
    )
