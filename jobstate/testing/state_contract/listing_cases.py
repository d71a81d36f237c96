"""State-store contract cases of the ``listing`` area: listing jobs by status, by age, by
target and with a limit."""

from __future__ import annotations

import time
from datetime import timedelta

from jobstate.exceptions import InvalidJobState
from jobstate.stores.base import JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    AGE,
    SETTLE,
    CaseTable,
    Kit,
    check,
    job_in,
    queue_jobs,
    raises,
)

CASES = CaseTable("listing")


@CASES.case("list_jobs_by_status returns exactly the jobs in the given statuses")
def _list_by_status(kit: Kit, store: StateStore) -> None:
    area, target = "listing", kit.name("target")
    jobs = {status: job_in(kit, store, target, status) for status in JobStatus}
    listed = store.list_jobs_by_status([JobStatus.QUEUED, JobStatus.RUNNING], targets=[target])
    check(
        [job.id for job in listed] == [jobs[JobStatus.QUEUED].id, jobs[JobStatus.RUNNING].id],
        area,
        "list_jobs_by_status(['queued', 'running']) must return the queued and the running "
        f"job, oldest first; got statuses {[job.status for job in listed]}.",
    )


@CASES.case("older_than returns only jobs not written for that long, of those statuses")
def _list_older_than(kit: Kit, store: StateStore) -> None:
    area, target = "listing", kit.name("target")
    old_running = job_in(kit, store, target, JobStatus.RUNNING)
    job_in(kit, store, target, JobStatus.QUEUED)
    touched = job_in(kit, store, target, JobStatus.RUNNING)
    time.sleep(SETTLE)
    store.update_job(touched.id, report={"progress": 1})
    job_in(kit, store, target, JobStatus.RUNNING)
    stale = store.list_jobs_by_status([JobStatus.RUNNING], AGE, targets=[target])
    check(
        [job.id for job in stale] == [old_running.id],
        area,
        "older_than must select only jobs whose updated_at is older than that, and only "
        f"in the given statuses; got {[(job.status, job.request_id) for job in stale]}.",
    )


@CASES.case("an empty status list returns nothing")
def _list_empty(kit: Kit, store: StateStore) -> None:
    area, target = "listing", kit.name("target")
    job_in(kit, store, target, JobStatus.QUEUED)
    check(store.list_jobs_by_status([]) == [], area, "list_jobs_by_status([]) must be [].")
    check(store.list_expired_leases([], timedelta(0)) == [], area, "list_expired_leases([]) == [].")
    check(
        store.list_jobs_by_status([JobStatus.QUEUED], targets=[]) == [],
        area,
        "an empty targets list narrows to nothing.",
    )
    raises(
        area,
        InvalidJobState,
        lambda: store.list_jobs_by_status(["stuck"]),
        "list_jobs_by_status(['stuck'])",
    )


@CASES.case("limit bounds the result to the oldest jobs")
def _list_limit(kit: Kit, store: StateStore) -> None:
    area, target = "listing", kit.name("target")
    jobs = queue_jobs(kit, store, target, 3)
    listed = store.list_jobs_by_status([JobStatus.QUEUED], targets=[target], limit=2)
    check(
        [job.id for job in listed] == [job.id for job in jobs[:2]],
        area,
        "limit=2 must return the two oldest jobs, oldest first.",
    )
    raises(
        area,
        InvalidJobState,
        lambda: store.list_jobs_by_status([JobStatus.QUEUED], limit=0),
        "list_jobs_by_status(limit=0)",
    )
