"""State-store contract cases of the ``jobs`` area: creating and enqueueing jobs: every
given field round-trips, a request id is an idempotency key, the per-thread in-flight
quota holds, and unknown ids answer None."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from django.conf import settings
from django.test import override_settings
from django.utils import timezone

from jobstate.exceptions import (
    DuplicateRequestId,
    IdempotencyConflict,
    InvalidJobState,
    InvalidPatch,
    ThreadQuotaExceeded,
)
from jobstate.stores.base import JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    HOUR,
    CaseTable,
    Kit,
    check,
    present,
    raises,
    unclaimed,
)

CASES = CaseTable("jobs")


@CASES.case("create_job stores every given field and fills the defaults")
def _create_round_trip(kit: Kit, store: StateStore) -> None:
    area = "jobs"
    run_after = timezone.now() + HOUR
    payload = {"prompt": "hello", "nested": {"flags": [True, False], "n": 1.5}, "none": None}
    fields: dict[str, Any] = {
        "request_id": kit.name("full"),
        "target": kit.name("target"),
        "source": "api",
        "thread_id": kit.thread(),
        "session_id": "session-1",
        "input": payload,
        "input_preview": "hello",
        "metadata": {"tenant": "acme"},
        "callback_url": "https://example.com/hook",
        "attempts": 2,
        "run_after": run_after,
    }
    created = store.create_job(**fields)
    stored = present(area, store.get_job(created.id), "get_job(id of a created job)")
    for name, value in fields.items():
        check(
            getattr(stored, name) == value,
            area,
            f"{name} came back as {getattr(stored, name)!r}, stored {value!r}.",
        )
    check(stored.status == JobStatus.QUEUED, area, "a new job's status must default to queued.")
    check(isinstance(stored.id, uuid.UUID), area, "job ids must be UUIDs.")
    check(
        stored.created_at is not None and stored.updated_at is not None,
        area,
        "created_at and updated_at must be stamped by the store.",
    )
    check(unclaimed(stored), area, "a new job must carry no claim fields.")
    found = present(area, store.find_by_request_id(fields["request_id"]), "find_by_request_id")
    check(found.id == created.id, area, "find_by_request_id returned another job.")

    bare = store.create_job(request_id=kit.name("bare"))
    check(
        (bare.status, bare.source, bare.input_preview, bare.attempts, bare.metadata)
        == (JobStatus.QUEUED, "", "", 0, {}),
        area,
        "a job created with only a request_id must get status queued, source '', "
        "input_preview '', attempts 0 and metadata {}.",
    )
    check(bare.target is None and bare.input is None, area, "absent nullable fields are None.")
    done = store.create_job(request_id=kit.name("done"), status=JobStatus.DONE)
    check(done.status == JobStatus.DONE, area, "create_job must accept an explicit status.")


@CASES.case("create_job refuses a duplicate request_id and leaves the first job as it was")
def _create_duplicate(kit: Kit, store: StateStore) -> None:
    area = "jobs"
    request_id = kit.name("dup")
    first = store.create_job(request_id=request_id, input={"n": 1})
    error = raises(
        area,
        DuplicateRequestId,
        lambda: store.create_job(request_id=request_id, input={"n": 2}),
        "create_job with an existing request_id",
    )
    check(getattr(error, "request_id", None) == request_id, area, "the error names the key.")
    stored = present(area, store.find_by_request_id(request_id), "find_by_request_id")
    check(
        stored.id == first.id and stored.input == {"n": 1},
        area,
        "a refused duplicate must not change the existing job.",
    )


@CASES.case("enqueue returns the existing job when the same request comes again")
def _enqueue_idempotent(kit: Kit, store: StateStore) -> None:
    area = "jobs"
    request_id, target, thread = kit.name("enq"), kit.name("target"), kit.thread()
    job, created = store.enqueue(
        request_id=request_id, target=target, thread_id=thread, input={"q": [1, 2]}
    )
    check(created, area, "the first enqueue of a request must report created=True.")
    check(job.status == JobStatus.QUEUED, area, "enqueue must queue the job.")
    again, created_again = store.enqueue(
        request_id=request_id,
        target=target,
        thread_id=thread,
        input={"q": [1, 2]},
        metadata={"retry_of_request": True},
        session_id="another-session",
    )
    check(not created_again, area, "a repeated enqueue must report created=False.")
    check(again.id == job.id, area, "a repeated enqueue must return the existing job.")
    check(
        store.count_inflight_by_thread(thread) == 1,
        area,
        "a repeated enqueue must not create a second job.",
    )
    claimed = present(area, store.claim_next_inhub_job([target], kit.name("w")), "claim")
    replay, created_late = store.enqueue(
        request_id=request_id, target=target, thread_id=thread, input={"q": [1, 2]}
    )
    check(
        not created_late and replay.status == JobStatus.RUNNING and replay.id == claimed.id,
        area,
        "a repeated enqueue of a job that already runs must return it as it is now.",
    )


@CASES.case("enqueue refuses a different payload under the same request_id")
def _enqueue_conflict(kit: Kit, store: StateStore) -> None:
    area = "jobs"
    request_id, target = kit.name("enq"), kit.name("target")
    store.enqueue(request_id=request_id, target=target, input={"amount": 1})
    for change in ({"input": {"amount": 2}}, {"input": {"amount": 1.0}}, {"target": "other"}):
        fields = {"request_id": request_id, "target": target, "input": {"amount": 1}, **change}
        error = raises(
            area,
            IdempotencyConflict,
            partial(store.enqueue, **fields),
            f"enqueue of a known request_id with {change}",
        )
        differing = getattr(error, "fields", ())
        check(
            set(change) <= set(differing),
            area,
            f"the conflict must name {sorted(change)}, named {differing}.",
        )
    stored = present(area, store.find_by_request_id(request_id), "find_by_request_id")
    check(stored.input == {"amount": 1}, area, "a refused enqueue must not change the job.")


@CASES.case("enqueue queues an unclaimed job and refuses state and claim fields")
def _enqueue_fields(kit: Kit, store: StateStore) -> None:
    area = "jobs"
    for name, value in (
        ("status", JobStatus.RUNNING),
        ("claim_token", uuid.uuid4()),
        ("result", {"x": 1}),
    ):
        request_id = kit.name("enq")
        raises(
            area,
            InvalidPatch,
            partial(store.enqueue, request_id=request_id, **{name: value}),
            f"enqueue(..., {name}=...)",
        )
        check(
            store.find_by_request_id(request_id) is None,
            area,
            f"enqueue with {name} must write nothing.",
        )
    raises(area, InvalidPatch, lambda: store.enqueue(target="x"), "enqueue without request_id")


@CASES.case("enqueue enforces the per-thread in-flight quota")
def _enqueue_quota(kit: Kit, store: StateStore) -> None:
    area = "jobs"
    target, thread, other_thread = kit.name("target"), kit.thread(), kit.thread()
    config = {**getattr(settings, "JOBSTATE", {}), "THREAD_INFLIGHT_QUOTA": 2}
    with override_settings(JOBSTATE=config):
        first, _ = store.enqueue(request_id=kit.name("q"), target=target, thread_id=thread)
        store.enqueue(request_id=kit.name("q"), target=target, thread_id=thread)
        refused = kit.name("q")
        error = raises(
            area,
            ThreadQuotaExceeded,
            lambda: store.enqueue(request_id=refused, target=target, thread_id=thread),
            "a third enqueue in a thread with a quota of 2",
        )
        check(
            (getattr(error, "inflight", None), getattr(error, "quota", None)) == (2, 2),
            area,
            "ThreadQuotaExceeded must carry the in-flight count and the quota.",
        )
        check(store.find_by_request_id(refused) is None, area, "a refused job is not written.")
        replay, created = store.enqueue(
            request_id=first.request_id, target=target, thread_id=thread
        )
        check(
            not created and replay.id == first.id,
            area,
            "a repeated request in a full thread must still return the existing job.",
        )
        _, created_other = store.enqueue(
            request_id=kit.name("q"), target=target, thread_id=other_thread
        )
        check(created_other, area, "another thread's quota must be independent.")
        _, created_free = store.enqueue(request_id=kit.name("q"), target=target)
        check(created_free, area, "jobs without a thread are not subject to the quota.")
        store.update_job(first.id, status=JobStatus.DONE)
        _, created_after = store.enqueue(request_id=refused, target=target, thread_id=thread)
        check(created_after, area, "finished jobs must not count against the quota.")


@CASES.case("unknown ids answer None and malformed ids raise")
def _unknown_ids(kit: Kit, store: StateStore) -> None:
    area = "jobs"
    check(store.get_job(uuid.uuid4()) is None, area, "get_job of an unknown id must be None.")
    check(
        store.find_by_request_id(kit.name("missing")) is None,
        area,
        "find_by_request_id of an unknown key must be None.",
    )
    check(
        store.update_job(str(uuid.uuid4()), error="x") is None,
        area,
        "update_job of an unknown id must be None.",
    )
    raises(area, InvalidJobState, lambda: store.get_job("not-a-uuid"), "get_job('not-a-uuid')")
