"""The shared refire transition (``requeue_job``) and exactly-once approval continuation
(``requeue_approved_job_once``) on the database store and the in-memory reference store,
including races between real PostgreSQL connections."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest

from jobstate.exceptions import InvalidJobState
from jobstate.models import ApprovalDecision, AuditEntry, Job
from jobstate.stores.base import (
    ApprovalRequeueOutcome,
    CompletionOutcome,
    JobStatus,
    StateStore,
)
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore
from tests.support.threads import WORKERS, in_parallel

Outcome = ApprovalRequeueOutcome
LATER = datetime(2031, 1, 1, tzinfo=UTC)


@pytest.fixture
def store(any_store: StateStore) -> StateStore:
    """Every test here runs on the database store and on the in-memory one."""
    return any_store


def finished_job(store: StateStore, request_id: str = "r1", **fields: Any) -> Job:
    """A job that was claimed, ran and failed: every field a refire must reset is set."""
    fields.setdefault("target", "llm")
    store.create_job(request_id=request_id, **fields)
    claimed = store.claim_next_inhub_job([fields["target"]], "worker-1")
    assert claimed is not None and claimed.request_id == request_id
    result = store.complete_claimed_job(
        claimed.id,
        claimed.claim_token,
        "error",
        error="tool crashed",
        attempts=3,
        run_after=LATER,
        metadata={"no_delivery": True, "route": "ops"},
    )
    assert result.completed
    assert result.job is not None
    return result.job


def events(store: StateStore, job: Job) -> list[str]:
    return [entry.event for entry in store.list_audit(job=job)]


# --- requeue_job: the shared refire transition --------------------------------------------


def test_requeue_job_puts_a_finished_job_back_in_the_queue_fresh(store: StateStore) -> None:
    job = finished_job(store)

    refired = store.requeue_job(job.id, from_statuses=["error", "done"], by="alice", via="console")

    assert refired is not None
    assert refired.status == JobStatus.QUEUED
    assert refired.attempts == 0
    assert refired.error is None
    assert refired.run_after is None
    assert refired.metadata == {"route": "ops"}
    assert (refired.executor_id, refired.claimed_at, refired.lease_until) == (None, None, None)
    assert (refired.dispatched_at, refired.claim_token) == (None, None)
    assert refired.updated_at >= job.updated_at
    assert store.get_job(job.id) == refired
    rerun = store.list_audit(job=job)[-1]
    assert rerun.event == "rerun"
    assert rerun.stage == "recovery"
    assert rerun.detail == {"by": "alice", "via": "console", "prev_status": "error"}
    # It is claimable again at once (run_after cleared).
    assert store.claim_next_inhub_job(["llm"], "worker-2") is not None


def test_requeue_job_keeps_metadata_without_the_no_delivery_flag(store: StateStore) -> None:
    job = store.create_job(request_id="r1", status="done", metadata={"route": "ops"})

    refired = store.requeue_job(job.id, from_statuses=["done"], by="cron", via="sweep")

    assert refired is not None and refired.metadata == {"route": "ops"}


def test_requeue_job_writes_nothing_when_the_job_moved_on(store: StateStore) -> None:
    job = store.create_job(request_id="r1", status="done", error="kept")

    assert store.requeue_job(job.id, from_statuses=["error"], by="a", via="b") is None
    assert store.requeue_job(job.id, from_statuses=[], by="a", via="b") is None
    assert store.requeue_job(uuid.uuid4(), from_statuses=["done"], by="a", via="b") is None
    after = store.get_job(job.id)
    assert after is not None and after.status == "done" and after.error == "kept"
    assert events(store, job) == []


def test_requeue_job_fences_off_the_old_claim_holder(store: StateStore) -> None:
    store.create_job(request_id="r1", target="llm")
    claimed = store.claim_next_inhub_job(["llm"], "worker-1")
    assert claimed is not None

    assert store.requeue_job(claimed.id, from_statuses=["running"], by="reaper", via="stale")
    late = store.complete_claimed_job(claimed.id, claimed.claim_token, "done", result={"x": 1})

    assert late.outcome is CompletionOutcome.STALE_CLAIM
    assert late.job is not None and late.job.status == "queued" and late.job.result is None


@pytest.mark.parametrize(
    "arguments",
    [
        {"from_statuses": "error", "by": "a", "via": "b"},
        {"from_statuses": ["finished"], "by": "a", "via": "b"},
        {"from_statuses": ["error"], "by": "", "via": "b"},
        {"from_statuses": ["error"], "by": "a", "via": "b" * 251},
        {"from_statuses": ["error"], "by": "a", "via": "b", "event": ""},
    ],
)
def test_requeue_job_refuses_bad_arguments_and_writes_nothing(
    store: StateStore, arguments: dict[str, Any]
) -> None:
    job = store.create_job(request_id="r1", status="error")

    with pytest.raises(InvalidJobState):
        store.requeue_job(job.id, **arguments)

    after = store.get_job(job.id)
    assert after is not None and after.status == "error"
    assert events(store, job) == []


# --- requeue_approved_job_once --------------------------------------------------------------


def test_approval_requeues_a_terminal_job_and_records_who_decided(store: StateStore) -> None:
    job = finished_job(store)

    outcome = store.requeue_approved_job_once(
        job_id=job.id, decision_id="d-1", approver="carol", comment="looks safe"
    )

    assert outcome is Outcome.REQUEUED
    after = store.get_job(job.id)
    assert after is not None
    assert (after.status, after.attempts, after.error, after.claim_token) == (
        "queued",
        0,
        None,
        None,
    )
    approved, rerun = store.list_audit(job=job)[-2:]
    assert approved.event == "approved"
    assert approved.stage == "approval"
    assert approved.detail == {"decision_id": "d-1", "approver": "carol", "comment": "looks safe"}
    assert "carol" in approved.summary and "looks safe" in approved.summary
    assert rerun.event == "rerun"
    assert rerun.detail == {"by": "carol", "via": "approval:d-1", "prev_status": "error"}


def test_approval_writes_a_permanent_decision_marker(db: None) -> None:
    store = DatabaseStateStore()
    job = finished_job(store)

    store.requeue_approved_job_once(job_id=job.id, decision_id="d-1", approver="carol")

    marker = ApprovalDecision.objects.get(decision_id="d-1")
    assert (marker.job_id, marker.approver, marker.comment) == (job.id, "carol", "")
    # The marker outlives the job it requeued.
    Job.objects.filter(id=job.id).delete()
    assert ApprovalDecision.objects.filter(decision_id="d-1").exists()


def test_the_same_decision_never_requeues_twice(store: StateStore) -> None:
    job = finished_job(store)
    assert store.requeue_approved_job_once(job_id=job.id, decision_id="d-1", approver="carol")

    # The job runs and fails again; replaying the same decision must not refire it.
    claimed = store.claim_next_inhub_job(["llm"], "worker-2")
    assert claimed is not None
    store.complete_claimed_job(claimed.id, claimed.claim_token, "error", error="again")
    trail = events(store, job)

    outcome = store.requeue_approved_job_once(job_id=job.id, decision_id="d-1", approver="carol")

    assert outcome is Outcome.ALREADY_REQUEUED
    after = store.get_job(job.id)
    assert after is not None and after.status == "error" and after.error == "again"
    assert events(store, job) == trail


def test_a_decision_reused_for_another_job_is_a_conflict(store: StateStore) -> None:
    first = finished_job(store, "r1")
    second = store.create_job(request_id="r2", status="rejected")
    assert store.requeue_approved_job_once(job_id=first.id, decision_id="d-1", approver="carol")

    outcome = store.requeue_approved_job_once(job_id=second.id, decision_id="d-1", approver="dan")

    assert outcome is Outcome.DECISION_CONFLICT
    after = store.get_job(second.id)
    assert after is not None and after.status == "rejected"
    assert events(store, second) == []


@pytest.mark.parametrize("status", ["queued", "running", "dispatched"])
def test_a_job_in_flight_is_left_to_consume_the_approval(store: StateStore, status: str) -> None:
    job = store.create_job(request_id="r1", status=status, attempts=2)

    outcome = store.requeue_approved_job_once(job_id=job.id, decision_id="d-1", approver="carol")

    assert outcome is Outcome.JOB_IN_FLIGHT
    after = store.get_job(job.id)
    assert after is not None and (after.status, after.attempts) == (status, 2)
    assert events(store, job) == []
    # No marker was written: the decision can still requeue the job once it finishes.
    store.update_job(job.id, status="done")
    assert (
        store.requeue_approved_job_once(job_id=job.id, decision_id="d-1", approver="carol")
        is Outcome.REQUEUED
    )


def test_an_unknown_job_is_not_found_and_burns_no_decision(store: StateStore) -> None:
    assert (
        store.requeue_approved_job_once(job_id=uuid.uuid4(), decision_id="d-1", approver="carol")
        is Outcome.NOT_FOUND
    )
    job = finished_job(store)
    assert (
        store.requeue_approved_job_once(job_id=job.id, decision_id="d-1", approver="carol")
        is Outcome.REQUEUED
    )


@pytest.mark.parametrize(
    "arguments",
    [
        {"decision_id": "", "approver": "carol"},
        {"decision_id": "d" * 201, "approver": "carol"},
        {"decision_id": "d-1", "approver": "   "},
        {"decision_id": "d-1", "approver": "carol", "comment": None},
        {"decision_id": "d-1", "approver": "carol", "comment": "x" * 2001},
        {"decision_id": "d-1", "approver": "carol", "comment": "nul\x00"},
        {"decision_id": "d-1", "approver": "carol", "job_id": "not-a-uuid"},
    ],
)
def test_approval_refuses_bad_arguments_and_writes_nothing(
    store: StateStore, arguments: dict[str, Any]
) -> None:
    job = finished_job(store)
    trail = events(store, job)
    arguments = {"job_id": job.id, **arguments}

    with pytest.raises(InvalidJobState):
        store.requeue_approved_job_once(**arguments)

    after = store.get_job(job.id)
    assert after is not None and after.status == "error"
    assert events(store, job) == trail


def test_both_stores_answer_an_approval_scenario_identically(db: None) -> None:
    """The reference store and the database store, driven through the same steps, give
    the same outcomes, the same job states and the same audit trail."""

    def scenario(store: StateStore) -> list[Any]:
        first = finished_job(store, "r1")
        second = store.create_job(request_id="r2", status="running")
        third = store.create_job(request_id="r3", status="done", metadata={"no_delivery": 1})
        answers: list[Any] = [
            store.requeue_approved_job_once(job_id=first.id, decision_id="a", approver="x"),
            store.requeue_approved_job_once(job_id=first.id, decision_id="a", approver="x"),
            store.requeue_approved_job_once(job_id=first.id, decision_id="b", approver="y"),
            store.requeue_approved_job_once(job_id=second.id, decision_id="c", approver="y"),
            store.requeue_approved_job_once(job_id=third.id, decision_id="a", approver="z"),
            store.requeue_job(third.id, from_statuses=["done"], by="z", via="console") is None,
            store.requeue_job(third.id, from_statuses=["done"], by="z", via="console") is None,
        ]
        for job in (first, second, third):
            stored = store.get_job(job.id)
            assert stored is not None
            answers.append(
                (
                    stored.status,
                    stored.attempts,
                    stored.error,
                    stored.metadata,
                    stored.claim_token,
                    [(e.event, e.stage, e.detail) for e in store.list_audit(job=job)],
                )
            )
        return answers

    assert scenario(DatabaseStateStore()) == scenario(MemoryStateStore())


# --- races between real connections ------------------------------------------------------


def _terminal_job(request_id: str) -> Job:
    return DatabaseStateStore().create_job(request_id=request_id, status="error", error="failed")


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("same_decision", [True, False], ids=["same-decision", "other-decisions"])
def test_concurrent_approvals_of_one_job_requeue_it_once(same_decision: bool) -> None:
    job = _terminal_job("r1")

    def approve(index: int) -> Outcome:
        decision = "d-1" if same_decision else f"d-{index}"
        return DatabaseStateStore().requeue_approved_job_once(
            job_id=job.id, decision_id=decision, approver=f"approver-{index}"
        )

    outcomes = Counter(in_parallel(WORKERS, approve))

    losing = Outcome.ALREADY_REQUEUED if same_decision else Outcome.JOB_IN_FLIGHT
    assert outcomes == {Outcome.REQUEUED: 1, losing: WORKERS - 1}
    assert ApprovalDecision.objects.filter(job_id=job.id).count() == 1
    reruns = AuditEntry.objects.filter(job_id=job.id, event="rerun")
    assert reruns.count() == 1
    approved = AuditEntry.objects.get(job_id=job.id, event="approved")
    assert approved.detail["approver"] == reruns.get().detail["by"]
    assert Job.objects.get(id=job.id).status == JobStatus.QUEUED


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_one_decision_raced_for_many_jobs_requeues_exactly_one() -> None:
    jobs = [_terminal_job(f"r{index}") for index in range(WORKERS)]

    def approve(index: int) -> Outcome:
        return DatabaseStateStore().requeue_approved_job_once(
            job_id=jobs[index].id, decision_id="shared", approver=f"approver-{index}"
        )

    outcomes = in_parallel(WORKERS, approve)

    assert Counter(outcomes) == {Outcome.REQUEUED: 1, Outcome.DECISION_CONFLICT: WORKERS - 1}
    winner = jobs[outcomes.index(Outcome.REQUEUED)]
    assert ApprovalDecision.objects.get(decision_id="shared").job_id == winner.id
    statuses = dict(Job.objects.values_list("id", "status"))
    assert [job.id for job in jobs if statuses[job.id] == "queued"] == [winner.id]
    assert AuditEntry.objects.filter(event__in=["approved", "rerun"]).count() == 2


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_concurrent_refires_of_one_job_requeue_it_once() -> None:
    job = _terminal_job("r1")

    def refire(index: int) -> bool:
        requeued = DatabaseStateStore().requeue_job(
            job.id, from_statuses=["error"], by=f"operator-{index}", via="console"
        )
        return requeued is not None

    assert Counter(in_parallel(WORKERS, refire)) == {True: 1, False: WORKERS - 1}
    assert AuditEntry.objects.filter(job_id=job.id, event="rerun").count() == 1
