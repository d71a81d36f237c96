"""State-store contract cases of the ``concurrency`` area: bursts on real threads released
together: every job is claimed once, a lock has one winner, a request id makes one job."""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

from django.db import connections

from jobstate.stores.base import CompletionOutcome, JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    HOUR,
    CaseTable,
    Kit,
    check,
    queue_jobs,
    reread,
    token_of,
)

CASES = CaseTable("concurrency")

_T = TypeVar("_T")


def _burst(kit: Kit, call: Callable[[int], _T]) -> list[_T]:
    """Run ``call(i)`` on ``kit.concurrency`` threads released together; re-raise the
    first error."""
    barrier = threading.Barrier(kit.concurrency)
    results: list[Any] = [None] * kit.concurrency
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[index] = call(index)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(kit.concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def _check_claimed_once(ids: list[Any], jobs: list[Any], rule: str) -> None:
    """Fail unless ``ids`` (the claimed jobs' ids) name each of ``jobs`` exactly once."""
    check(
        sorted(ids) == sorted(job.id for job in jobs),
        "concurrency",
        f"{len(ids)} claims ({len(set(ids))} distinct) for {len(jobs)} jobs: {rule}",
    )


@CASES.case("a burst of {n} concurrent claims on {n} jobs claims each job once")
def _burst_claims(kit: Kit, store: StateStore) -> None:
    target = kit.name("target")
    jobs = queue_jobs(kit, store, target, kit.concurrency)
    claimed = _burst(kit, lambda i: store.claim_next_job([target], f"{kit.ns}.exec-{i}"))
    ids = [job.id for job in claimed if job is not None]
    _check_claimed_once(
        ids,
        jobs,
        "every job must be claimed exactly once. Claim with one atomic conditional write.",
    )


@CASES.case("a burst of {n} concurrent batch claims claims each job once")
def _burst_batch_claims(kit: Kit, store: StateStore) -> None:
    target = kit.name("target")
    jobs = queue_jobs(kit, store, target, 3 * kit.concurrency)
    batches = _burst(
        kit, lambda i: store.claim_next_inhub_jobs([target], f"{kit.ns}.w-{i}", limit=5)
    )
    ids = [job.id for batch in batches for job in batch]
    ids += [job.id for job in store.claim_next_inhub_jobs([target], kit.name("w"), limit=1000)]
    _check_claimed_once(ids, jobs, "concurrent batches must claim every job exactly once.")


@CASES.case("a burst of {n} acquisitions of one free lock has exactly one winner")
def _burst_locks(kit: Kit, store: StateStore) -> None:
    area, key = "concurrency", kit.name("lock")
    won = _burst(kit, lambda i: store.acquire_runtime_lock(key, f"owner-{i}", HOUR))
    check(
        sum(1 for result in won if result) == 1,
        area,
        f"{sum(1 for result in won if result)} owners acquired one lock; expected exactly 1.",
    )


@CASES.case("a burst of {n} enqueues of one request creates one job")
def _burst_enqueue(kit: Kit, store: StateStore) -> None:
    area = "concurrency"
    request_id, target = kit.name("req"), kit.name("target")
    outcomes = _burst(
        kit, lambda i: store.enqueue(request_id=request_id, target=target, input={"n": 1})
    )
    ids = {job.id for job, _ in outcomes}
    created = sum(1 for _, was_created in outcomes if was_created)
    check(
        len(ids) == 1 and created == 1,
        area,
        f"{created} of {kit.concurrency} concurrent enqueues created a job ({len(ids)} "
        "distinct ids); exactly one may create it, the rest must get it back.",
    )


@CASES.case("a cancel and the claim holder's report racing: exactly one is written")
def _cancel_races_report(kit: Kit, store: StateStore) -> None:
    area, target = "concurrency", kit.name("target")
    rounds = max(kit.concurrency, 4)
    queue_jobs(kit, store, target, rounds)
    for _ in range(rounds):
        claimed = store.claim_next_inhub_job([target], kit.name("w"))
        assert claimed is not None
        cancel, report = _race(
            partial(store.cancel_job, claimed.id, by="op"),
            partial(store.complete_claimed_job, claimed.id, token_of(claimed), "done"),
        )
        cancelled = cancel is not None
        reported = report.outcome == CompletionOutcome.COMPLETED
        final = reread(area, store, claimed.id)
        check(cancelled != reported, area, "exactly one of cancel and report must win.")
        expected = JobStatus.REJECTED if cancelled else JobStatus.DONE
        check(final.status == expected, area, f"the winner's status must stay, not {final.status}.")
        cancels = [e for e in store.list_audit(job=claimed.id) if e.event == "cancelled"]
        check(len(cancels) == int(cancelled), area, "only a cancel that won is audited.")


def _race(*calls: Callable[[], Any]) -> list[Any]:
    """Run ``calls`` on threads released together; their answers, in order."""
    barrier = threading.Barrier(len(calls))
    answers: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def body(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            answers[index] = calls[index]()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    if errors:
        raise errors[0]
    return answers
