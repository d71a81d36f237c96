"""State-store contract cases of the ``threads`` area: the per-thread FIFO gate: one job of
a thread in flight at a time, taken from the head of its queue, and the in-flight count
the quota reads."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from jobstate.stores.base import JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    HOUR,
    CaseTable,
    Kit,
    check,
    job_in,
    present,
    queue_jobs,
    token_of,
)

CASES = CaseTable("threads")


@CASES.case("a thread with running work holds its next job until that work finishes")
def _thread_running_blocks(kit: Kit, store: StateStore) -> None:
    area, target, worker = "threads", kit.name("target"), kit.name("worker")
    thread = kit.thread()
    first, second = queue_jobs(kit, store, target, 2, thread_id=thread)
    (free,) = queue_jobs(kit, store, target)
    claimed = present(area, store.claim_next_inhub_job([target], worker), "claim")
    check(claimed.id == first.id, area, "the head of the thread must be claimed first.")
    other = store.claim_next_inhub_job([target], worker)
    check(
        other is not None and other.id == free.id,
        area,
        "while a thread runs, its next job must be passed over for other work.",
    )
    check(
        store.claim_next_inhub_job([target], worker) is None,
        area,
        "a thread's next job must not be claimed while the thread has running work.",
    )
    store.complete_claimed_job(first.id, token_of(claimed), JobStatus.DONE)
    follow = store.claim_next_inhub_job([target], worker)
    check(
        follow is not None and follow.id == second.id,
        area,
        "once the running job finished the thread's next job must be claimable.",
    )


@CASES.case("a thread's jobs are claimed strictly from the head of its queue")
def _thread_fifo(kit: Kit, store: StateStore) -> None:
    area, target, worker = "threads", kit.name("target"), kit.name("worker")
    thread = kit.thread()
    jobs = queue_jobs(kit, store, target, 3, thread_id=thread)
    seen = []
    for _ in jobs:
        claimed = present(area, store.claim_next_inhub_job([target], worker), "claim")
        seen.append(claimed.id)
        check(
            store.claim_next_inhub_job([target], worker) is None,
            area,
            "a second claim in a thread with running work must return None.",
        )
        store.complete_claimed_job(claimed.id, token_of(claimed), JobStatus.DONE)
    check(seen == [job.id for job in jobs], area, "a thread's jobs must run in queue order.")


@CASES.case("dispatched work blocks its thread for in-hub workers too")
def _thread_dispatched_blocks(kit: Kit, store: StateStore) -> None:
    area, target = "threads", kit.name("target")
    thread = kit.thread()
    queue_jobs(kit, store, target, 2, thread_id=thread)
    present(area, store.claim_next_job([target], kit.name("exec")), "claim_next_job")
    check(
        store.claim_next_inhub_job([target], kit.name("worker")) is None,
        area,
        "a thread with dispatched work must not start another job.",
    )


@CASES.case("a delayed job does not hold up the ready jobs behind it")
def _thread_delay(kit: Kit, store: StateStore) -> None:
    area, target, worker = "threads", kit.name("target"), kit.name("worker")
    thread = kit.thread()
    (delayed,) = queue_jobs(kit, store, target, thread_id=thread, run_after=timezone.now() + HOUR)
    (ready,) = queue_jobs(kit, store, target, thread_id=thread)
    claimed = present(area, store.claim_next_inhub_job([target], worker), "claim")
    check(claimed.id == ready.id, area, "a delayed head must not block a ready job behind it.")
    store.update_job(delayed.id, run_after=timezone.now() - timedelta(seconds=1))
    check(
        store.claim_next_inhub_job([target], worker) is None,
        area,
        "a job that became due must still wait for its thread's running work.",
    )


@CASES.case("count_inflight_by_thread counts queued, running and dispatched jobs only")
def _thread_count(kit: Kit, store: StateStore) -> None:
    area, target = "threads", kit.name("target")
    thread, other = kit.thread(), kit.thread()
    for status in JobStatus:
        job_in(kit, store, target, status, thread_id=thread)
    job_in(kit, store, target, JobStatus.QUEUED, thread_id=other)
    count = store.count_inflight_by_thread(thread)
    check(count == 3, area, f"expected 3 in-flight jobs, counted {count}.")
    check(store.count_inflight_by_thread(kit.thread()) == 0, area, "an empty thread counts 0.")
