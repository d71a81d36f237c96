"""State-store contract cases of the ``batches`` area: batch claims and batch reports keep
the one-at-a-time guarantees job by job, one bad report refuses the whole batch, and a
task worker's round (its reports and its next claim in one call) keeps both calls'
guarantees."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import timedelta
from functools import partial
from typing import Any

from django.utils import timezone

from jobstate.core.states import NewTask
from jobstate.exceptions import ImmutableField, InvalidJobState
from jobstate.stores.base import ClaimReport, CompletionOutcome, JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    HOUR,
    CaseTable,
    Kit,
    check,
    fail,
    present,
    queue_jobs,
    raises,
    reread,
    token_of,
    unclaimed,
)

CASES = CaseTable("batches")


def _claimed_job(jobs: Iterable[Any], job_id: uuid.UUID) -> Any:
    for job in jobs:
        if job.id == job_id:
            return job
    raise fail("batches", f"job {job_id} is not in the batch.")


@CASES.case("a batch claim takes up to limit ready jobs, each with its own claim")
def _batch_claim(kit: Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    jobs = queue_jobs(kit, store, target, 5)
    (delayed,) = queue_jobs(kit, store, target, run_after=timezone.now() + HOUR)
    first = store.claim_next_inhub_jobs([target], worker, timedelta(minutes=5), limit=3)
    check(
        [job.id for job in first] == [job.id for job in jobs[:3]],
        area,
        "a batch claim must take the oldest ready jobs, oldest first, up to limit.",
    )
    check(
        all(
            job.status == JobStatus.RUNNING
            and job.executor_id == worker
            and job.claimed_at is not None
            and job.lease_until is not None
            and abs(job.lease_until - job.claimed_at - timedelta(minutes=5)) < timedelta(seconds=1)
            and job.dispatched_at is None
            for job in first
        ),
        area,
        "every job of a batch must be running, owned by the worker, with the lease asked for.",
    )
    tokens = {token_of(job) for job in first}
    check(len(tokens) == 3, area, "every job of a batch must get its own claim_token.")
    rest = store.claim_next_inhub_jobs([target], worker, limit=10)
    check(
        [job.id for job in rest] == [job.id for job in jobs[3:]],
        area,
        "a second batch must take the remaining ready jobs and skip the delayed one.",
    )
    check(
        store.claim_next_inhub_jobs([target], worker, limit=10) == [],
        area,
        "with only a delayed job left a batch claim must return an empty list.",
    )
    stored = reread(area, store, delayed.id)
    check(stored.status == JobStatus.QUEUED, area, "the delayed job must stay queued.")


@CASES.case("a batch claim takes at most one job of a thread, the thread's oldest")
def _batch_claim_threads(kit: Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    thread = kit.thread()
    threaded = queue_jobs(kit, store, target, 3, thread_id=thread)
    loose = queue_jobs(kit, store, target, 2)
    claimed = store.claim_next_inhub_jobs([target], worker, limit=10)
    ids = {job.id for job in claimed}
    check(
        ids == {threaded[0].id, *(job.id for job in loose)},
        area,
        "a batch must take the thread's oldest job and every thread-less job, and leave the "
        f"thread's later jobs queued; took {len(ids)} jobs.",
    )
    for job in threaded[1:]:
        stored = reread(area, store, job.id)
        check(stored.status == JobStatus.QUEUED, area, "a thread's later jobs must wait.")
    store.complete_claimed_job(
        threaded[0].id, token_of(_claimed_job(claimed, threaded[0].id)), "done"
    )
    following = store.claim_next_inhub_jobs([target], worker, limit=10)
    check(
        [job.id for job in following] == [threaded[1].id],
        area,
        "once the thread's job is done the next batch must take exactly its next job.",
    )


@CASES.case("bad batch claim arguments raise and claim nothing")
def _batch_claim_bad_arguments(kit: Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    (job,) = queue_jobs(kit, store, target)
    limits: tuple[Any, ...] = (0, -1, True, "5", None)
    for limit in limits:
        raises(
            area,
            InvalidJobState,
            partial(store.claim_next_inhub_jobs, [target], worker, limit=limit),
            f"claim_next_inhub_jobs(limit={limit!r})",
        )
    raises(
        area,
        InvalidJobState,
        lambda: store.claim_next_inhub_jobs([target], "", limit=1),
        "claim_next_inhub_jobs with an empty worker_id",
    )
    check(
        store.claim_next_inhub_jobs([], worker, limit=5) == [],
        area,
        "empty targets must answer an empty list.",
    )
    stored = reread(area, store, job.id)
    check(stored.status == JobStatus.QUEUED, area, "a refused batch claim must claim nothing.")


@CASES.case("a batch of reports answers per report, in order, each fenced by its token")
def _batch_complete(kit: Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    queue_jobs(kit, store, target, 3)
    first, second, third = store.claim_next_inhub_jobs([target], worker, limit=3)
    missing = uuid.uuid4()
    results = store.complete_claimed_jobs(
        [
            ClaimReport(first.id, token_of(first), JobStatus.DONE, {"result": {"n": 1}}),
            ClaimReport(missing, uuid.uuid4(), JobStatus.DONE),
            ClaimReport(second.id, uuid.uuid4(), JobStatus.DONE, {"result": {"n": 2}}),
            ClaimReport(str(third.id), str(third.claim_token), JobStatus.ERROR, {"error": "x"}),
        ]
    )
    outcomes = [result.outcome for result in results]
    check(
        outcomes
        == [
            CompletionOutcome.COMPLETED,
            CompletionOutcome.NOT_FOUND,
            CompletionOutcome.STALE_CLAIM,
            CompletionOutcome.COMPLETED,
        ],
        area,
        f"expected completed, not_found, stale_claim, completed; got {outcomes}.",
    )
    done = present(area, results[0].job, "the completed job")
    check(
        done.status == JobStatus.DONE and done.result == {"n": 1} and unclaimed(done),
        area,
        "a current report in a batch must write its status and patch and clear the claim.",
    )
    failed = present(area, results[3].job, "the failed job")
    check(
        failed.status == JobStatus.ERROR and failed.error == "x",
        area,
        "each report in a batch must write its own status and patch.",
    )
    stale = reread(area, store, second.id)
    check(
        stale.status == JobStatus.RUNNING
        and stale.result is None
        and stale.claim_token == second.claim_token,
        area,
        "a report with a wrong token must leave its job untouched.",
    )
    check(store.complete_claimed_jobs([]) == [], area, "an empty batch must answer [].")


@CASES.case("a batch with one bad report raises and writes nothing")
def _batch_complete_bad(kit: Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    queue_jobs(kit, store, target, 2)
    first, second = store.claim_next_inhub_jobs([target], worker, limit=2)
    good = ClaimReport(first.id, token_of(first), JobStatus.DONE)
    bad_batches: list[tuple[Any, type[BaseException], str]] = [
        ([good, ClaimReport(second.id, token_of(second), "running")], InvalidJobState, "running"),
        (
            [good, ClaimReport(second.id, token_of(second), "done", {"id": uuid.uuid4()})],
            ImmutableField,
            "a patch of the id",
        ),
        ([good, ClaimReport(second.id, "not-a-uuid", "done")], InvalidJobState, "a bad token"),
        ([good, ClaimReport(first.id, token_of(first), "error")], InvalidJobState, "a job twice"),
        ([good, (second.id, token_of(second), "done")], InvalidJobState, "a tuple"),
    ]
    for batch, error, what in bad_batches:
        raises(
            area,
            error,
            partial(store.complete_claimed_jobs, batch),
            f"complete_claimed_jobs with {what}",
        )
    for job in (first, second):
        stored = reread(area, store, job.id)
        check(
            stored.status == JobStatus.RUNNING and stored.claim_token == job.claim_token,
            area,
            "a refused batch must write nothing, not even its good reports.",
        )


def _tasks(
    kit: Kit, store: StateStore, count: int, queue: str = "default"
) -> tuple[str, list[Any]]:
    target = f"tasks:{kit.name('alias')}"
    jobs = [
        store.enqueue_task(
            NewTask(
                target=target,
                task_path="contract.tasks.noop",
                queue_name=queue,
                priority=0,
                args=[],
                kwargs={},
                max_attempts=3,
            )
        )
        for _ in range(count)
    ]
    return target, jobs


@CASES.case("a worker's round writes its fenced reports and claims the next tasks")
def _complete_and_claim(kit: Kit, store: StateStore) -> None:
    if not store.supports_tasks:
        return
    area, worker, lease = "batches", kit.name("worker"), timedelta(minutes=5)
    target, tasks = _tasks(kit, store, 5)
    first, second = store.claim_tasks(
        target=target, queues=None, worker_id=worker, lease=lease, limit=2
    )
    results, claimed = store.complete_and_claim_tasks(
        [
            ClaimReport(first.id, token_of(first), JobStatus.DONE, {"result": {"n": 1}}),
            ClaimReport(second.id, uuid.uuid4(), JobStatus.DONE, {"result": {"n": 2}}),
        ],
        target=target,
        queues=None,
        worker_id=worker,
        lease=lease,
        limit=2,
    )
    outcomes = [result.outcome for result in results]
    check(
        outcomes == [CompletionOutcome.COMPLETED, CompletionOutcome.STALE_CLAIM],
        area,
        f"a round's reports must answer completed, stale_claim; got {outcomes}.",
    )
    done = present(area, results[0].job, "the completed task")
    check(
        done.status == JobStatus.DONE and done.result == {"n": 1} and unclaimed(done),
        area,
        "a round's current report must write its status and patch and clear the claim.",
    )
    stale = reread(area, store, second.id)
    check(
        stale.status == JobStatus.RUNNING and stale.claim_token == second.claim_token,
        area,
        "a round's report with a wrong token must leave its task untouched.",
    )
    check(
        [job.id for job in claimed] == [job.id for job in tasks[2:4]],
        area,
        "a round must claim the next tasks in claim order, up to limit.",
    )
    check(
        all(
            job.status == JobStatus.RUNNING
            and job.executor_id == worker
            and job.attempts == 1
            and job.lease_until is not None
            and job.claimed_at is not None
            and abs(job.lease_until - job.claimed_at - lease) < timedelta(seconds=1)
            for job in claimed
        ),
        area,
        "a round's claimed tasks must be running, owned by the worker, with one attempt "
        "started and the lease asked for.",
    )
    check(
        len({token_of(job) for job in [*claimed, second]}) == 3,
        area,
        "every task a round claims must get its own claim_token.",
    )
    third, fourth = claimed
    results, claimed = store.complete_and_claim_tasks(
        [ClaimReport(third.id, token_of(third), JobStatus.DONE)],
        target=target,
        queues=["default"],
        worker_id=worker,
        lease=lease,
        limit=5,
    )
    check(
        [result.outcome for result in results] == [CompletionOutcome.COMPLETED]
        and [job.id for job in claimed] == [tasks[4].id],
        area,
        "a round of one queue must write its report and claim what that queue has left.",
    )
    results, claimed = store.complete_and_claim_tasks(
        [ClaimReport(fourth.id, token_of(fourth), JobStatus.DONE)],
        target=target,
        queues=["default", "other"],
        worker_id=worker,
        lease=lease,
        limit=5,
    )
    check(
        results[0].completed and claimed == [],
        area,
        "a round with nothing left to claim must still write its report.",
    )
    check(
        store.complete_and_claim_tasks(
            [], target=target, queues=[], worker_id=worker, lease=lease, limit=1
        )
        == ([], []),
        area,
        "a round without reports or queues must answer ([], []).",
    )


@CASES.case("a worker's round with one bad argument raises, writes nothing, claims nothing")
def _complete_and_claim_bad(kit: Kit, store: StateStore) -> None:
    if not store.supports_tasks:
        return
    area, worker, lease = "batches", kit.name("worker"), timedelta(minutes=5)
    target, (_held, waiting) = _tasks(kit, store, 2)
    (held,) = store.claim_tasks(target=target, queues=None, worker_id=worker, lease=lease, limit=1)
    good = ClaimReport(held.id, token_of(held), JobStatus.DONE)
    claim: dict[str, Any] = {
        "target": target,
        "queues": None,
        "worker_id": worker,
        "lease": lease,
        "limit": 1,
    }
    bad: list[tuple[list[Any], dict[str, Any], str]] = [
        ([good, ClaimReport(held.id, token_of(held), "error")], {}, "a task reported twice"),
        ([ClaimReport(held.id, token_of(held), "running")], {}, "a report of running"),
        ([good], {"limit": 0}, "limit=0"),
        ([good], {"target": "not-tasks"}, "a target that is not a task backend's"),
        ([good], {"worker_id": ""}, "an empty worker_id"),
        ([good], {"queues": "default"}, "queues given as a string"),
    ]
    for reports, changed, what in bad:
        raises(
            area,
            InvalidJobState,
            partial(store.complete_and_claim_tasks, reports, **{**claim, **changed}),
            f"complete_and_claim_tasks with {what}",
        )
    stored = reread(area, store, held.id)
    check(
        stored.status == JobStatus.RUNNING and stored.claim_token == held.claim_token,
        area,
        "a refused round must not write its reports.",
    )
    check(
        reread(area, store, waiting.id).status == JobStatus.QUEUED,
        area,
        "a refused round must claim nothing.",
    )
    raises(
        area,
        InvalidJobState,
        partial(store.complete_and_claim_tasks, [good], **claim, claim_round="round-1"),  # type: ignore[arg-type]
        "complete_and_claim_tasks with a claim_round that is not a UUID",
    )


@CASES.case("a claim's round gives back, uncounted, what that claim took and nothing else")
def _release_task_claim(kit: Kit, store: StateStore) -> None:
    if not store.supports_tasks:
        return
    area, worker, lease = "batches", kit.name("worker"), timedelta(minutes=5)
    target, tasks = _tasks(kit, store, 5)
    claim: dict[str, Any] = {"target": target, "queues": None, "worker_id": worker, "lease": lease}
    lost_round, kept_round = uuid.uuid4(), uuid.uuid4()
    # A claim whose reply the worker never read, then one it did, and a task of the lost
    # claim reported by someone holding its token (as a recovery would settle it).
    lost = store.claim_tasks(**claim, limit=3, claim_round=lost_round)
    kept = store.claim_tasks(**claim, limit=1, claim_round=kept_round)
    check(
        [job.id for job in lost] == [job.id for job in tasks[:3]]
        and [job.id for job in kept] == [tasks[3].id],
        area,
        "claims with a claim_round must claim as claim_tasks does.",
    )
    done = lost[2]
    store.complete_claimed_job(done.id, token_of(done), JobStatus.DONE)
    check(
        store.release_task_claim(worker_id=kit.name("other-worker"), claim_round=lost_round) == 0,
        area,
        "release_task_claim must give back only the tasks of the worker named.",
    )
    released = store.release_task_claim(worker_id=worker, claim_round=lost_round)
    check(
        released == 2,
        area,
        f"release_task_claim must give back the round's tasks still held (2); got {released}.",
    )
    for job in lost[:2]:
        stored = reread(area, store, job.id)
        check(
            stored.status == JobStatus.QUEUED and stored.attempts == 0 and unclaimed(stored),
            area,
            "a task given back must be queued with its attempt uncounted and no claim.",
        )
    check(
        reread(area, store, done.id).status == JobStatus.DONE
        and reread(area, store, kept[0].id).claim_token == kept[0].claim_token,
        area,
        "release_task_claim must leave a reported task and another round's claim alone.",
    )
    again = store.claim_tasks(**claim, limit=5)
    check(
        {job.id for job in again} == {tasks[0].id, tasks[1].id, tasks[4].id},
        area,
        "the tasks given back must be claimable again at once.",
    )
    check(
        store.release_task_claim(worker_id=worker, claim_round=lost_round) == 0
        and store.release_task_claim(worker_id=worker, claim_round=uuid.uuid4()) == 0,
        area,
        "a round given back already, or that claimed nothing, must give back nothing.",
    )
    changes: list[tuple[dict[str, Any], str]] = [
        ({"worker_id": ""}, "an empty worker_id"),
        ({"claim_round": str(lost_round)}, "a claim_round that is not a UUID"),
        ({"claim_round": None}, "no claim_round"),
    ]
    for changed, what in changes:
        raises(
            area,
            InvalidJobState,
            partial(
                store.release_task_claim,
                **{"worker_id": worker, "claim_round": lost_round, **changed},
            ),
            f"release_task_claim with {what}",
        )
