"""State-store contract cases of the ``claims`` area: claiming one job at a time: due jobs
only, oldest first, a fresh claim token and the lease asked for, and refused arguments
that claim nothing."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.utils import timezone

from jobstate.exceptions import InvalidJobState
from jobstate.stores.base import JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    HOUR,
    CaseTable,
    Kit,
    check,
    check_status,
    present,
    queue_jobs,
    raises,
    reread,
    token_of,
)

CASES = CaseTable("claims")


@CASES.case("claim_next_inhub_job takes the due job and leaves a delayed one queued")
def _claim_inhub(kit: Kit, store: StateStore) -> None:
    area, target, worker = "claims", kit.name("target"), kit.name("worker")
    (delayed,) = queue_jobs(kit, store, target, run_after=timezone.now() + HOUR)
    (due,) = queue_jobs(kit, store, target, run_after=timezone.now() - HOUR)
    claimed = present(area, store.claim_next_inhub_job([target], worker), "claim_next_inhub_job")
    check(claimed.id == due.id, area, "the claim must skip a job whose run_after is ahead.")
    check(
        claimed.status == JobStatus.RUNNING and claimed.executor_id == worker,
        area,
        "an in-hub claim moves the job to running, owned by the worker.",
    )
    check(
        claimed.claimed_at is not None
        and claimed.lease_until is not None
        and claimed.lease_until > claimed.claimed_at,
        area,
        "a claim must set claimed_at and a lease_until after it.",
    )
    check(claimed.claim_token is not None, area, "a claim must set a claim_token.")
    check(claimed.run_after is None, area, "a claim must clear run_after.")
    check(claimed.dispatched_at is None, area, "an in-hub claim sets no dispatched_at.")
    stored = reread(area, store, delayed.id)
    check(
        stored.status == JobStatus.QUEUED and stored.run_after == delayed.run_after,
        area,
        "the delayed job must stay queued with its run_after.",
    )
    check(
        store.claim_next_inhub_job([target], worker) is None,
        area,
        "with only a delayed job left the claim must return None.",
    )


@CASES.case("claim_next_job skips a delayed job and dispatches it once it is due")
def _claim_executor(kit: Kit, store: StateStore) -> None:
    area, target, executor = "claims", kit.name("target"), kit.name("exec")
    (job,) = queue_jobs(kit, store, target, run_after=timezone.now() + HOUR)
    check(
        store.claim_next_job([target], executor) is None,
        area,
        "claim_next_job must skip a job whose run_after is ahead.",
    )
    store.update_job(job.id, run_after=timezone.now() - timedelta(seconds=1))
    claimed = present(area, store.claim_next_job([target], executor), "claim_next_job")
    check(
        claimed.id == job.id
        and claimed.status == JobStatus.DISPATCHED
        and claimed.executor_id == executor,
        area,
        "claim_next_job moves the job to dispatched, owned by the executor.",
    )
    check(
        claimed.dispatched_at is not None
        and claimed.lease_until is not None
        and claimed.lease_until > claimed.dispatched_at
        and claimed.run_after is None
        and claimed.claim_token is not None,
        area,
        "a dispatch sets dispatched_at, a later lease_until and a claim_token, and clears "
        "run_after.",
    )


@CASES.case("the oldest ready job of the given targets is claimed first")
def _claim_order(kit: Kit, store: StateStore) -> None:
    area, worker = "claims", kit.name("worker")
    first_target, second_target = kit.name("target"), kit.name("target")
    (a,) = queue_jobs(kit, store, first_target)
    (b,) = queue_jobs(kit, store, second_target)
    (c,) = queue_jobs(kit, store, first_target)
    order = [
        store.claim_next_inhub_job([first_target], worker),
        store.claim_next_inhub_job([second_target], worker),
        store.claim_next_inhub_job([first_target, second_target], worker),
    ]
    check(
        [job.id if job else None for job in order] == [a.id, b.id, c.id],
        area,
        "claims must take the oldest ready job of the given targets only.",
    )
    check(
        store.claim_next_inhub_job([first_target, second_target], worker) is None,
        area,
        "an empty queue must answer None.",
    )
    (d,) = queue_jobs(kit, store, first_target)
    check(store.claim_next_job([], worker) is None, area, "empty targets must answer None.")
    check(
        store.claim_next_job([kit.name("elsewhere")], worker) is None,
        area,
        "a claim must not take jobs of other targets.",
    )
    check_status(
        area, store, d.id, JobStatus.QUEUED, "a claim that answered None must not move any job."
    )


@CASES.case("every claim gets a fresh claim token and the lease it asked for")
def _claim_tokens(kit: Kit, store: StateStore) -> None:
    area, target, worker = "claims", kit.name("target"), kit.name("worker")
    queue_jobs(kit, store, target)
    first = present(
        area, store.claim_next_inhub_job([target], worker, timedelta(minutes=10)), "claim"
    )
    assert first.lease_until is not None and first.claimed_at is not None
    lease = first.lease_until - first.claimed_at
    check(
        abs(lease - timedelta(minutes=10)) < timedelta(seconds=1),
        area,
        f"lease_until must be the claim instant plus the lease; got a lease of {lease}.",
    )
    store.complete_claimed_job(first.id, token_of(first), JobStatus.QUEUED)
    second = present(area, store.claim_next_inhub_job([target], worker), "claim")
    check(second.id == first.id, area, "a job given back must be claimable again.")
    check(
        second.claim_token not in (None, first.claim_token),
        area,
        "each claim must get a fresh claim_token.",
    )


@CASES.case("bad claim arguments raise and claim nothing")
def _claim_bad_arguments(kit: Kit, store: StateStore) -> None:
    area, target = "claims", kit.name("target")
    (job,) = queue_jobs(kit, store, target)
    calls: list[tuple[Callable[[], Any], str]] = [
        (lambda: store.claim_next_inhub_job(target, "w"), "targets given as a bare string"),
        (lambda: store.claim_next_inhub_job([target], ""), "an empty worker_id"),
        (lambda: store.claim_next_job([target], "e", timedelta(0)), "a zero lease"),
        (
            lambda: store.claim_next_job([target], "e", 30),  # type: ignore[arg-type]
            "a lease that is not a timedelta",
        ),
        (lambda: store.claim_next_job([target, ""], "e"), "an empty target name"),
    ]
    for call, what in calls:
        raises(area, InvalidJobState, call, f"a claim with {what}")
    check_status(area, store, job.id, JobStatus.QUEUED, "a refused claim must not move any job.")
