"""One notification per completion: a job an operator requeues after it notified is
claimed and completed again, and its new outcome notifies again, once; a completion of
the same claim retried does not notify twice. On every backend."""

from __future__ import annotations

from typing import Any

import pytest

from jobstate.exceptions import DuplicateNotification, InvalidJobState
from jobstate.models import Job, Notification
from jobstate.stores.base import JobStatus, NotificationRequest
from jobstate.stores.contracts.validation import default_idempotency_key
from jobstate.stores.database import DatabaseStateStore

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

HOOK = "https://hooks.example.com/jobs"


def webhook(**payload: Any) -> NotificationRequest:
    return NotificationRequest(channel="webhook", destination=HOOK, payload=payload)


def claim(store: DatabaseStateStore) -> Job:
    job = store.claim_next_inhub_job(["llm"], "worker-1")
    assert job is not None and job.claim_token is not None
    return job


def notified(job_id: Any) -> list[dict[str, Any]]:
    rows = Notification.objects.filter(job_id=job_id).order_by("created_at", "id")
    return [row.payload for row in rows]


def test_a_requeued_job_notifies_again_for_its_new_outcome(store: DatabaseStateStore) -> None:
    store.create_job(request_id="r1", target="llm")
    first = claim(store)
    done = store.complete_job_with_notifications(
        first, {"status": "error", "error": "upstream 502"}, [webhook(outcome="error")]
    )
    assert done is not None and done.status == JobStatus.ERROR

    requeued = store.requeue_job(first.id, from_statuses=["error"], by="alice", via="admin")
    assert requeued is not None and requeued.status == JobStatus.QUEUED
    second = claim(store)
    assert second.id == first.id and second.claim_token != first.claim_token
    finished = store.complete_job_with_notifications(
        second, {"status": "done"}, [webhook(outcome="done")]
    )
    assert finished is not None and finished.status == JobStatus.DONE
    assert notified(first.id) == [{"outcome": "error"}, {"outcome": "done"}]

    # The same completion again (a worker that did not hear the commit) changes nothing
    # and notifies nothing more.
    assert store.complete_job_with_notifications(second, {"status": "done"}, [webhook()]) is None
    assert notified(first.id) == [{"outcome": "error"}, {"outcome": "done"}]


def test_requeue_all_matching_then_each_completion_notifies_once(
    store: DatabaseStateStore,
) -> None:
    for number in range(3):
        store.create_job(request_id=f"r{number}", target="llm")
    for _ in range(3):
        store.complete_job_with_notifications(
            claim(store), {"status": "error", "error": "boom"}, [webhook(round=1)]
        )
    errors = list(Job.objects.filter(status=JobStatus.ERROR).values_list("id", flat=True))
    assert len(errors) == 3
    requeued = store.requeue_jobs(
        [(pk, JobStatus.ERROR) for pk in errors], by="alice", via="admin-bulk"
    )
    assert sorted(requeued) == sorted(errors)
    for _ in range(3):
        done = store.complete_job_with_notifications(
            claim(store), {"status": "done"}, [webhook(round=2)]
        )
        assert done is not None and done.status == JobStatus.DONE
    for pk in errors:
        assert notified(pk) == [{"round": 1}, {"round": 2}]


def test_the_default_key_names_the_claim(store: DatabaseStateStore) -> None:
    store.create_job(request_id="r1", target="llm")
    job = claim(store)
    key = default_idempotency_key(job, "webhook", HOOK)
    assert key == f"{job.id}:{job.claim_token}:webhook:{HOOK}"
    assert store.complete_job_with_notifications(job, {"status": "done"}, [webhook()])
    # The key is still unique across the outbox: a completion that names it again (a
    # host replaying the first) is refused whole.
    store.create_job(request_id="r2", target="llm")
    other = claim(store)
    with pytest.raises(DuplicateNotification) as caught:
        store.complete_job_with_notifications(
            other, {"status": "done"}, [webhook(), NotificationRequest("webhook", HOOK, {}, key)]
        )
    assert caught.value.idempotency_key == key
    assert Job.objects.get(id=other.id).status == JobStatus.RUNNING
    assert Notification.objects.count() == 1


def test_a_job_completed_unclaimed_notifies_again_after_a_requeue(
    store: DatabaseStateStore,
) -> None:
    queued = store.create_job(request_id="q1", target="llm")
    assert queued.claim_token is None
    rejected = store.complete_job_with_notifications(
        queued, {"status": "rejected", "error": "kill switch"}, [webhook(round=1)]
    )
    assert rejected is not None
    again = store.requeue_job(queued.id, from_statuses=["rejected"], by="alice", via="admin")
    assert again is not None and again.claim_token is None
    rejected = store.complete_job_with_notifications(
        again, {"status": "rejected", "error": "kill switch"}, [webhook(round=2)]
    )
    assert rejected is not None and rejected.status == JobStatus.REJECTED
    assert notified(queued.id) == [{"round": 1}, {"round": 2}]


def test_an_unclaimed_job_not_read_from_the_store_needs_its_own_key(
    store: DatabaseStateStore,
) -> None:
    queued = store.create_job(request_id="q1", target="llm")
    built = Job(id=queued.id, status=JobStatus.QUEUED)  # no updated_at: not as read
    with pytest.raises(InvalidJobState, match="pass an idempotency_key"):
        store.complete_job_with_notifications(built, {"status": "rejected"}, [webhook()])
    assert Job.objects.get(id=queued.id).status == JobStatus.QUEUED
    assert not Notification.objects.exists()
    done = store.complete_job_with_notifications(
        built, {"status": "rejected"}, [NotificationRequest("webhook", HOOK, {}, "q1-rejected")]
    )
    assert done is not None and done.status == JobStatus.REJECTED
    assert Notification.objects.get().idempotency_key == "q1-rejected"
