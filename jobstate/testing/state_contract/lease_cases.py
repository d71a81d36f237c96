"""State-store contract cases of the ``leases`` area: executor lease renewals and the
sweeps that read leases: requeues of expired dispatches, the expired-lease listing and
the expiry of stale queued jobs."""

from __future__ import annotations

import time
from datetime import timedelta

from django.utils import timezone

from jobstate.stores.base import EXPIRED_QUEUED_ERROR, JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    AGE,
    HOUR,
    SETTLE,
    CaseTable,
    Kit,
    check,
    check_status,
    job_in,
    present,
    queue_jobs,
    reread,
    unclaimed,
)

CASES = CaseTable("leases")


@CASES.case("extend_executor_leases renews the dispatched jobs of that executor only")
def _extend_executor(kit: Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    mine, theirs = kit.name("exec"), kit.name("exec")
    queue_jobs(kit, store, target, 4)
    own = [present(area, store.claim_next_job([target], mine), "claim") for _ in range(2)]
    other = present(area, store.claim_next_job([target], theirs), "claim")
    running = present(area, store.claim_next_inhub_job([target], mine), "in-hub claim")
    soon = timezone.now() + timedelta(minutes=1)
    for job in [*own, other, running]:
        store.update_job(job.id, lease_until=soon)
    renewed = store.extend_executor_leases(mine, HOUR)
    check(renewed == 2, area, f"expected 2 dispatched leases renewed, renewed {renewed}.")
    for job in own:
        lease_until = reread(area, store, job.id).lease_until
        check(
            lease_until is not None and lease_until > soon + timedelta(minutes=30),
            area,
            "the executor's dispatched leases must move to clock + lease.",
        )
    for job in (other, running):
        check(
            reread(area, store, job.id).lease_until == soon,
            area,
            "other executors' jobs and running jobs must keep their leases.",
        )
    check(store.extend_executor_leases(kit.name("idle")) == 0, area, "no jobs, no renewals.")


@CASES.case("requeue_stale_dispatched hands back jobs whose lease expired")
def _requeue_expired(kit: Kit, store: StateStore) -> None:
    area, target, executor = "leases", kit.name("target"), kit.name("e")
    queue_jobs(kit, store, target, 2)
    expired = present(area, store.claim_next_job([target], executor), "claim")
    fresh = present(area, store.claim_next_job([target], executor), "claim")
    store.update_job(expired.id, lease_until=timezone.now() - HOUR)
    moved = store.requeue_stale_dispatched(HOUR, 10 * HOUR, targets=[target])
    check(moved == 1, area, f"exactly the expired job must be requeued; moved {moved}.")
    back = reread(area, store, expired.id)
    check(back.status == JobStatus.QUEUED, area, "an expired dispatch must be queued again.")
    check(unclaimed(back), area, "a requeued job must have its claim fields cleared.")
    check_status(
        area,
        store,
        fresh.id,
        JobStatus.DISPATCHED,
        "a dispatch with a live lease must stay dispatched.",
    )
    check(
        store.requeue_stale_dispatched(HOUR, 10 * HOUR, targets=[target]) == 0,
        area,
        "a second sweep must find nothing left to move.",
    )


@CASES.case("requeue_stale_dispatched applies the hard cap even to a renewed lease")
def _requeue_hard_cap(kit: Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    queue_jobs(kit, store, target)
    job = present(area, store.claim_next_job([target], kit.name("e"), HOUR), "claim")
    store.update_job(job.id, dispatched_at=timezone.now() - 3 * HOUR)
    moved = store.requeue_stale_dispatched(HOUR, 2 * HOUR, targets=[target])
    check(moved == 1, area, "a dispatch older than the hard cap must be requeued.")


@CASES.case("a dispatched job without a lease is handed back once silent for dead_after")
def _requeue_no_lease(kit: Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    queue_jobs(kit, store, target, 2)
    silent = present(area, store.claim_next_job([target], kit.name("e")), "claim")
    store.update_job(silent.id, lease_until=None)
    time.sleep(SETTLE)
    recent = present(area, store.claim_next_job([target], kit.name("e")), "claim")
    store.update_job(recent.id, lease_until=None)
    moved = store.requeue_stale_dispatched(AGE, 10 * HOUR, targets=[target])
    check(moved == 1, area, f"only the silent lease-less dispatch must move; moved {moved}.")
    check_status(
        area,
        store,
        recent.id,
        JobStatus.DISPATCHED,
        "a lease-less dispatch written recently must stay.",
    )


@CASES.case("list_expired_leases returns expired leases and lease-less jobs past the fallback")
def _list_expired(kit: Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    now = timezone.now()
    expired = job_in(kit, store, target, JobStatus.RUNNING, lease_until=now - HOUR)
    job_in(kit, store, target, JobStatus.RUNNING, lease_until=now + HOUR)
    old_no_lease = job_in(kit, store, target, JobStatus.RUNNING)
    job_in(kit, store, target, JobStatus.DISPATCHED, lease_until=now - HOUR)
    time.sleep(SETTLE)
    job_in(kit, store, target, JobStatus.RUNNING)
    listed = store.list_expired_leases([JobStatus.RUNNING], AGE, targets=[target])
    check(
        [job.id for job in listed] == [expired.id, old_no_lease.id],
        area,
        "list_expired_leases must return the expired lease and the old lease-less job, "
        f"oldest first; got {[job.request_id for job in listed]}.",
    )


@CASES.case("expire_stale_queued fails old queued jobs and leaves the rest")
def _expire_queued(kit: Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    old_queued, old_running = queue_jobs(kit, store, target, 2)
    store.update_job(old_running.id, status=JobStatus.RUNNING)
    time.sleep(SETTLE)
    (fresh,) = queue_jobs(kit, store, target)
    moved = store.expire_stale_queued(AGE, targets=[target])
    check(moved == 1, area, f"exactly the old queued job must expire; moved {moved}.")
    expired = reread(area, store, old_queued.id)
    check(
        expired.status == JobStatus.ERROR and expired.error == EXPIRED_QUEUED_ERROR,
        area,
        "an expired job must be in error with the queue-timeout message.",
    )
    for job, status in ((old_running, JobStatus.RUNNING), (fresh, JobStatus.QUEUED)):
        check_status(
            area, store, job.id, status, "running jobs and young queued jobs must not expire."
        )
