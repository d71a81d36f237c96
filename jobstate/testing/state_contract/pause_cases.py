"""State-store contract cases of the ``pauses`` area: a paused queue is passed over by
every claim (executor, in-hub, batch and task claims) while other queues are claimed as
usual, a resume makes its jobs claimable again, and a second pause or resume changes
nothing. Stores without ``supports_queue_pauses`` are held to refusing the calls."""

from __future__ import annotations

from datetime import timedelta

from jobstate.core.states import NewTask, task_target
from jobstate.exceptions import InvalidJobState, UnsupportedStoreOperation
from jobstate.models import Job
from jobstate.stores.base import JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    CaseTable,
    Kit,
    check,
    check_status,
    present,
    queue_jobs,
    raises,
)

CASES = CaseTable("pauses")

LEASE = timedelta(minutes=5)


@CASES.case("a paused target is claimed by no executor or in-hub claim until resumed")
def _pause_target(kit: Kit, store: StateStore) -> None:
    area, paused, other = "pauses", kit.name("target"), kit.name("target")
    if not store.supports_queue_pauses:
        raises(
            area,
            UnsupportedStoreOperation,
            lambda: store.pause_queue(target=paused, by="operator"),
            "pause_queue without supports_queue_pauses",
        )
        return
    (held,) = queue_jobs(kit, store, paused)
    (free,) = queue_jobs(kit, store, other)
    check(store.pause_queue(target=paused, by="operator"), area, "a first pause answers True.")
    check(
        not store.pause_queue(target=paused, by="operator"),
        area,
        "pausing a paused queue answers False.",
    )
    check((paused, "") in store.paused_queues(), area, "paused_queues lists the pause.")
    claimed = present(area, store.claim_next_job([paused, other], kit.name("exec")), "claim")
    check(claimed.id == free.id, area, "a claim over both targets must take the unpaused one.")
    check(
        store.claim_next_job([paused], kit.name("exec")) is None,
        area,
        "claim_next_job must pass over a paused target's jobs.",
    )
    check(
        store.claim_next_inhub_job([paused], kit.name("worker")) is None,
        area,
        "claim_next_inhub_job must pass over a paused target's jobs.",
    )
    if store.supports_batch_claims:
        check(
            store.claim_next_inhub_jobs([paused], kit.name("worker"), limit=5) == [],
            area,
            "claim_next_inhub_jobs must pass over a paused target's jobs.",
        )
    check_status(area, store, held.id, JobStatus.QUEUED, "a paused job stays queued.")
    check(store.resume_queue(target=paused, by="operator"), area, "a resume answers True.")
    check(
        not store.resume_queue(target=paused, by="operator"),
        area,
        "resuming a queue that is not paused answers False.",
    )
    again = present(area, store.claim_next_inhub_job([paused], kit.name("worker")), "claim")
    check(again.id == held.id, area, "after the resume the job is claimed.")
    raises(
        area,
        InvalidJobState,
        lambda: store.pause_queue(target="", by="operator"),
        "pause_queue with an empty target",
    )


@CASES.case("claim_tasks passes over a paused queue and still claims the other queues")
def _pause_task_queue(kit: Kit, store: StateStore) -> None:
    area = "pauses"
    if not (store.supports_queue_pauses and store.supports_tasks):
        return
    target = task_target(kit.name("backend"))

    def task(queue: str) -> Job:
        return store.enqueue_task(
            NewTask(
                target=target,
                task_path="contract.task",
                queue_name=queue,
                priority=0,
                args=[],
                kwargs={},
                max_attempts=1,
            )
        )

    slow, fast = kit.name("queue"), kit.name("queue")
    held, free = task(slow), task(fast)
    store.pause_queue(target=target, queue=slow, by="operator")

    def claim(queues: list[str] | None) -> list[object]:
        jobs = store.claim_tasks(
            target=target, queues=queues, worker_id=kit.name("worker"), lease=LEASE, limit=5
        )
        return [job.id for job in jobs]

    check(claim([slow]) == [], area, "claim_tasks of the paused queue alone claims nothing.")
    check(claim(None) == [free.id], area, "a claim of any queue takes the unpaused one only.")
    check(claim([slow, fast]) == [], area, "the paused queue's task stays where it is.")
    store.resume_queue(target=target, queue=slow, by="operator")
    check(claim([slow, fast]) == [held.id], area, "after the resume its task is claimed.")
