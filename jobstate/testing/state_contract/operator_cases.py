"""State-store contract cases of the ``operator`` area: cancel, retry now and discard
take a job only in the state their rule names, write their audit entry, and a cancel
revokes a claim so that its holder's report is refused. (A cancel racing a report is a
``concurrency`` case.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.utils import timezone

from jobstate.core.attempt_log import AttemptOutcome, read_attempt_log
from jobstate.core.states import NewTask
from jobstate.exceptions import InvalidJobState
from jobstate.stores.base import CompletionOutcome, JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    HOUR,
    CaseTable,
    Kit,
    check,
    job_in,
    present,
    queue_jobs,
    raises,
    reread,
    token_of,
    unclaimed,
)

CASES = CaseTable("operator")
AREA = "operator"
_LEASE = timedelta(minutes=5)


def _events(store: StateStore, job: Any) -> list[Any]:
    return [entry for entry in store.list_audit(job=job.id) if entry.event != "received"]


def _task(kit: Kit, store: StateStore) -> tuple[str, Any]:
    target = f"tasks:{kit.name('alias')}"
    job = store.enqueue_task(
        NewTask(
            target=target,
            task_path="contract.tasks.sleepy",
            queue_name="default",
            priority=0,
            args=[],
            kwargs={},
            max_attempts=3,
        )
    )
    return target, job


def _claimed_task(kit: Kit, store: StateStore) -> Any:
    target, _job = _task(kit, store)
    (claimed,) = store.claim_tasks(
        target=target, queues=None, worker_id=kit.name("worker"), lease=_LEASE, limit=1
    )
    return claimed


def _retrying_task(kit: Kit, store: StateStore) -> Any:
    """A task whose first attempt failed and whose retry is an hour away."""
    claimed = _claimed_task(kit, store)
    store.complete_claimed_job(
        claimed.id,
        token_of(claimed),
        JobStatus.QUEUED,
        run_after=timezone.now() + HOUR,
        error="ValueError: first attempt",
    )
    return reread(AREA, store, claimed.id)


@CASES.case("cancel rejects a queued job and audits who cancelled it")
def _cancel_queued(kit: Kit, store: StateStore) -> None:
    (job,) = queue_jobs(kit, store, kit.name("target"))
    cancelled = present(AREA, store.cancel_job(job.id, by="op", reason="wrong input"), "cancel")
    check(cancelled.status == JobStatus.REJECTED, AREA, "a cancelled job must be rejected.")
    check(cancelled.error == "cancelled by op: wrong input", AREA, "error must name who and why.")
    events = [entry.event for entry in _events(store, job)]
    check(events == ["cancelled"], AREA, f"one 'cancelled' audit entry expected, got {events}.")
    check(
        store.cancel_job(job.id, by="op") is None,
        AREA,
        "a second cancel of a finished job must write nothing and return None.",
    )


@CASES.case("cancel of a claimed job revokes its claim: the holder's report is refused")
def _cancel_claimed(kit: Kit, store: StateStore) -> None:
    target = kit.name("target")
    queue_jobs(kit, store, target)
    claimed = present(AREA, store.claim_next_job([target], kit.name("exec")), "claim_next_job")
    cancelled = present(AREA, store.cancel_job(claimed.id, by="op"), "cancel_job")
    check(
        cancelled.status == JobStatus.REJECTED and unclaimed(cancelled),
        AREA,
        "a cancelled dispatched job must be rejected with its claim fields cleared.",
    )
    report = store.complete_claimed_job(claimed.id, token_of(claimed), JobStatus.DONE)
    check(
        report.outcome == CompletionOutcome.STALE_CLAIM,
        AREA,
        "the report of a cancelled claim must be refused as stale.",
    )
    check(
        report.job is not None and report.job.status == JobStatus.REJECTED,
        AREA,
        "a refused report must answer with the job as stored (rejected, so a worker can "
        "tell a cancel from a lost lease).",
    )
    check(
        store.lost_claims([(claimed.id, token_of(claimed))]) == {claimed.id: JobStatus.REJECTED},
        AREA,
        "lost_claims must name a cancelled claim with the job's status now.",
    )
    entry = _events(store, claimed)[-1]
    check(
        entry.event == "cancelled" and entry.detail.get("prev_status") == "dispatched",
        AREA,
        "the cancel's audit entry must say what the job was.",
    )


@CASES.case("cancel of a running task logs its attempt as cancelled")
def _cancel_running_task(kit: Kit, store: StateStore) -> None:
    if not store.supports_tasks:
        return
    claimed = _claimed_task(kit, store)
    check(
        store.lost_claims([(claimed.id, token_of(claimed))]) == {},
        AREA,
        "lost_claims must leave out a claim that is still held.",
    )
    cancelled = present(AREA, store.cancel_job(claimed.id, by="op"), "cancel_job")
    (attempt,) = read_attempt_log(cancelled.attempt_log)
    check(
        attempt.outcome is AttemptOutcome.CANCELLED
        and attempt.exception_class_path == "jobstate.exceptions.TaskCancelled",
        AREA,
        f"the cancelled attempt must be logged as cancelled, got {attempt}.",
    )
    check(
        cancelled.status == JobStatus.REJECTED and "cancelled by op" in (cancelled.error or ""),
        AREA,
        "a cancelled task must be rejected, its error naming who cancelled it.",
    )


@CASES.case("cancel leaves a finished job alone and refuses bad arguments")
def _cancel_refused(kit: Kit, store: StateStore) -> None:
    done = job_in(kit, store, kit.name("target"), JobStatus.DONE)
    check(store.cancel_job(done.id, by="op") is None, AREA, "a done job cannot be cancelled.")
    check(reread(AREA, store, done.id).status == JobStatus.DONE, AREA, "it must stay done.")
    (queued,) = queue_jobs(kit, store, kit.name("target"))
    raises(AREA, InvalidJobState, lambda: store.cancel_job(queued.id, by=""), "cancel by ''")
    raises(
        AREA,
        InvalidJobState,
        lambda: store.cancel_job(queued.id, by="op", reason="x" * 2001),
        "cancel with a reason over 2000 characters",
    )
    check(reread(AREA, store, queued.id).status == JobStatus.QUEUED, AREA, "nothing written.")


@CASES.case("retry now makes a task waiting for its retry claimable at once")
def _retry_now(kit: Kit, store: StateStore) -> None:
    if not store.supports_tasks:
        return
    waiting = _retrying_task(kit, store)
    check(
        store.claim_tasks(target=waiting.target, queues=None, worker_id="w", lease=_LEASE, limit=1)
        == [],
        AREA,
        "a task waiting for its retry must not be claimable yet.",
    )
    moved = present(AREA, store.retry_job_now(waiting.id, by="op"), "retry_job_now")
    check(moved.run_after is None, AREA, "retry now must clear run_after.")
    check(_events(store, waiting)[-1].event == "retry_now", AREA, "retry now must be audited.")
    claimed = store.claim_tasks(
        target=waiting.target, queues=None, worker_id="w", lease=_LEASE, limit=1
    )
    check([job.id for job in claimed] == [waiting.id], AREA, "it must be claimable now.")
    check(
        store.retry_job_now(waiting.id, by="op") is None,
        AREA,
        "retry now of a running task must write nothing.",
    )
    (fresh,) = queue_jobs(kit, store, kit.name("target"), run_after=timezone.now() + HOUR)
    check(
        store.retry_job_now(fresh.id, by="op") is None,
        AREA,
        "retry now applies only to tasks after a failed attempt, not to a delayed job.",
    )


@CASES.case("discard gives up a queued task: error, no more attempts, audited")
def _discard(kit: Kit, store: StateStore) -> None:
    if not store.supports_tasks:
        return
    waiting = _retrying_task(kit, store)
    discarded = present(AREA, store.discard_job(waiting.id, by="op"), "discard_job")
    check(
        discarded.status == JobStatus.ERROR and discarded.error == "discarded by op",
        AREA,
        "a discarded task must be error, its error naming who discarded it.",
    )
    check(_events(store, waiting)[-1].event == "discarded", AREA, "discard must be audited.")
    running = _claimed_task(kit, store)
    check(
        store.discard_job(running.id, by="op") is None,
        AREA,
        "a running task cannot be discarded (it is cancelled instead).",
    )
    (plain,) = queue_jobs(kit, store, kit.name("target"))
    check(store.discard_job(plain.id, by="op") is None, AREA, "only tasks are discarded.")
