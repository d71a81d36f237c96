"""State-store contract cases of the ``completion`` area: reports of claimed jobs, fenced
by the claim token and written once, and the claim holder's lease extension."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone

from jobstate.exceptions import InvalidJobState, InvalidPatch
from jobstate.stores.base import CompletionOutcome, JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    HOUR,
    CaseTable,
    Kit,
    check,
    claim_fields,
    present,
    queue_jobs,
    raises,
    reread,
    token_of,
    unclaimed,
)

CASES = CaseTable("completion")


@CASES.case("the claim holder's report lands and clears the claim fields")
def _complete(kit: Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    queue_jobs(kit, store, target)
    claimed = present(area, store.claim_next_job([target], kit.name("exec")), "claim")
    result = store.complete_claimed_job(
        claimed.id,
        str(claimed.claim_token),
        JobStatus.DONE,
        result={"answer": 42},
        usage={"duration_ms": 12},
    )
    check(result.outcome is CompletionOutcome.COMPLETED, area, f"got {result.outcome}.")
    job = present(area, result.job, "the completed job")
    check(
        job.status == JobStatus.DONE and job.result == {"answer": 42},
        area,
        "a current claim's report must write its status and patch.",
    )
    check(
        unclaimed(job),
        area,
        f"a terminal report must clear the claim fields; left {claim_fields(job)}.",
    )


@CASES.case("a report with a stale claim token changes nothing")
def _complete_stale_token(kit: Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    queue_jobs(kit, store, target)
    claimed = present(area, store.claim_next_inhub_job([target], kit.name("w")), "claim")
    result = store.complete_claimed_job(claimed.id, uuid.uuid4(), JobStatus.DONE, result={})
    check(result.outcome is CompletionOutcome.STALE_CLAIM, area, f"got {result.outcome}.")
    stored = reread(area, store, claimed.id)
    check(
        stored.status == JobStatus.RUNNING
        and stored.claim_token == claimed.claim_token
        and stored.result is None,
        area,
        "a report with a wrong token must not change the job.",
    )


@CASES.case("a report that arrives after the job was requeued changes nothing")
def _complete_after_requeue(kit: Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    queue_jobs(kit, store, target)
    old = present(area, store.claim_next_job([target], kit.name("exec")), "claim")
    store.update_job(old.id, lease_until=timezone.now() - HOUR)
    moved = store.requeue_stale_dispatched(HOUR, 10 * HOUR, targets=[target])
    check(moved == 1, area, f"the expired dispatch must be requeued, moved {moved}.")
    late = store.complete_claimed_job(old.id, token_of(old), JobStatus.DONE)
    check(late.outcome is CompletionOutcome.STALE_CLAIM, area, f"got {late.outcome}.")
    check(
        late.job is not None and late.job.status == JobStatus.QUEUED,
        area,
        "a late report must leave the requeued job queued.",
    )
    fresh = present(area, store.claim_next_job([target], kit.name("exec")), "reclaim")
    late_again = store.complete_claimed_job(old.id, token_of(old), JobStatus.ERROR)
    check(
        late_again.outcome is CompletionOutcome.STALE_CLAIM,
        area,
        "the first claim's token must stay stale after another executor claimed the job.",
    )
    current = store.complete_claimed_job(fresh.id, token_of(fresh), JobStatus.DONE)
    check(current.outcome is CompletionOutcome.COMPLETED, area, "the new claim must report.")


@CASES.case("a second report of the same claim is refused")
def _complete_twice(kit: Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    queue_jobs(kit, store, target)
    claimed = present(area, store.claim_next_inhub_job([target], kit.name("w")), "claim")
    store.complete_claimed_job(claimed.id, token_of(claimed), JobStatus.DONE, result={"n": 1})
    second = store.complete_claimed_job(
        claimed.id, token_of(claimed), JobStatus.ERROR, error="late"
    )
    check(second.outcome is CompletionOutcome.STALE_CLAIM, area, f"got {second.outcome}.")
    stored = reread(area, store, claimed.id)
    check(
        stored.status == JobStatus.DONE and stored.error is None and stored.result == {"n": 1},
        area,
        "a second report must not overwrite the first.",
    )


@CASES.case("giving a claimed job back requeues it for a retry")
def _complete_requeue(kit: Kit, store: StateStore) -> None:
    area, target, worker = "completion", kit.name("target"), kit.name("w")
    queue_jobs(kit, store, target)
    claimed = present(area, store.claim_next_inhub_job([target], worker), "claim")
    result = store.complete_claimed_job(
        claimed.id,
        token_of(claimed),
        JobStatus.QUEUED,
        attempts=1,
        run_after=timezone.now() + HOUR,
        error="transient",
    )
    job = present(area, result.job, "the requeued job")
    check(
        result.completed and job.status == JobStatus.QUEUED and job.attempts == 1,
        area,
        "a claim holder must be able to give the job back with a retry patch.",
    )
    check(unclaimed(job), area, "giving a job back must clear the claim fields.")
    check(
        store.claim_next_inhub_job([target], worker) is None,
        area,
        "the retry's run_after must keep it from being claimed at once.",
    )


@CASES.case("unknown jobs answer NOT_FOUND and bad reports raise")
def _complete_errors(kit: Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    missing = store.complete_claimed_job(uuid.uuid4(), uuid.uuid4(), JobStatus.DONE)
    check(
        missing.outcome is CompletionOutcome.NOT_FOUND and missing.job is None,
        area,
        "a report on an unknown job must answer NOT_FOUND.",
    )
    queue_jobs(kit, store, target)
    claimed = present(area, store.claim_next_inhub_job([target], kit.name("w")), "claim")
    token = token_of(claimed)
    bad: list[tuple[Callable[[], Any], type[Exception], str]] = [
        (
            lambda: store.complete_claimed_job(claimed.id, token, JobStatus.RUNNING),
            InvalidJobState,
            "status running",
        ),
        (
            lambda: store.complete_claimed_job(claimed.id, token, "finished"),
            InvalidJobState,
            "an unknown status",
        ),
        (
            lambda: store.complete_claimed_job(claimed.id, token, JobStatus.DONE, executor_id="x"),
            InvalidPatch,
            "a claim field in the patch",
        ),
        (
            lambda: store.complete_claimed_job(claimed.id, "nope", JobStatus.DONE),
            InvalidJobState,
            "a malformed token",
        ),
    ]
    for call, error, what in bad:
        raises(area, error, call, f"complete_claimed_job with {what}")
    stored = reread(area, store, claimed.id)
    check(stored.status == JobStatus.RUNNING, area, "a refused report must write nothing.")


@CASES.case("extend_claim_lease renews only under the current token")
def _extend_claim_lease(kit: Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    queue_jobs(kit, store, target)
    claimed = present(
        area, store.claim_next_inhub_job([target], kit.name("w"), timedelta(minutes=1)), "claim"
    )
    check(
        store.extend_claim_lease(claimed.id, token_of(claimed), HOUR),
        area,
        "the claim holder must be able to extend its lease.",
    )
    renewed = reread(area, store, claimed.id)
    assert renewed.lease_until is not None and claimed.lease_until is not None
    check(
        renewed.lease_until > claimed.lease_until + timedelta(minutes=30),
        area,
        "extend_claim_lease must move lease_until to the store's clock plus the lease.",
    )
    check(
        not store.extend_claim_lease(claimed.id, uuid.uuid4(), HOUR),
        area,
        "a stale token must not extend the lease.",
    )
    store.complete_claimed_job(claimed.id, token_of(claimed), JobStatus.DONE)
    check(
        not store.extend_claim_lease(claimed.id, token_of(claimed)),
        area,
        "a finished job's lease must not be extended.",
    )
