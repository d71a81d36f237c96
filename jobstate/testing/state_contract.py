"""Contract cases for :class:`~jobstate.stores.base.StateStore` implementations.

``state_store_contract_cases(store)`` returns plain case objects; a host runs them with
any test framework::

    @pytest.mark.django_db(transaction=True)
    @pytest.mark.parametrize("case", state_store_contract_cases(MyStore()), ids=str)
    def test_state_store_contract(case):
        case.run()

A violated guarantee raises :class:`StateStoreContractViolation` (an ``AssertionError``)
whose message starts with ``[StateStore <area>]``.

Each call makes a fresh namespace: every request id, target, executor id, lock key and
thread id a case uses is unique to it, and every sweep a case issues is narrowed to its
own targets. The cases therefore run against a persistent table that other work (or an
earlier pass) has filled, without truncating it. Two cases touch shared state by nature:
``audit: prune ...`` deletes entries stamped before the year 2000, and the thread-quota
case overrides ``JOBSTATE['THREAD_INFLIGHT_QUOTA']`` while it runs.

The concurrency cases start real threads. Against a database store they need a test
that commits (``django_db(transaction=True)``), and on SQLite the ``IMMEDIATE``
transaction mode; each thread closes its own database connections when it ends.
A few cases wait a fraction of a second for instants to age on the store's clock.
"""

from __future__ import annotations

import functools
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from django.conf import settings
from django.db import connections
from django.test import override_settings
from django.utils import timezone

from jobstate.exceptions import (
    DuplicateRequestId,
    IdempotencyConflict,
    ImmutableField,
    InvalidJobState,
    InvalidPatch,
    InvalidPayload,
    LockHeld,
    ThreadQuotaExceeded,
)
from jobstate.stores.base import (
    EXPIRED_QUEUED_ERROR,
    ClaimReport,
    CompletionOutcome,
    JobStatus,
    StateStore,
    runtime_lock,
)
from jobstate.stores.validation import (
    JOB_CLAIM_FIELDS,
)

__all__ = [
    "STATE_CONTRACT_AREAS",
    "StateStoreContractCase",
    "StateStoreContractViolation",
    "state_store_contract_cases",
]

#: The areas cases belong to; ``skip`` names areas.
STATE_CONTRACT_AREAS = (
    "jobs",
    "updates",
    "listing",
    "claims",
    "threads",
    "completion",
    "leases",
    "audit",
    "locks",
    "batches",
    "concurrency",
)

#: How long cases let an instant age on the store's clock, and the age they ask about.
_AGE = timedelta(milliseconds=100)
_SETTLE = 0.2
_HOUR = timedelta(hours=1)

_T = TypeVar("_T")


class StateStoreContractViolation(AssertionError):
    """A state store broke a guarantee of the contract."""


@dataclass(frozen=True)
class StateStoreContractCase:
    """One contract case. ``run()`` raises :class:`StateStoreContractViolation` when the
    store breaks the guarantee the case names."""

    name: str
    area: str
    run: Callable[[], None]

    def __str__(self) -> str:
        return self.name


StoreSource = StateStore | Callable[[], StateStore]


def state_store_contract_cases(
    store_factory_or_store: StoreSource,
    *,
    concurrency: int = 8,
    skip: Iterable[str] = (),
) -> list[StateStoreContractCase]:
    """The contract cases, in a fixed order, for a store instance or a factory called
    once per case. ``concurrency`` is the size of the concurrent bursts (at least 2);
    ``skip`` drops every case of the named areas (see :data:`STATE_CONTRACT_AREAS`)."""
    skipped = set(skip) if not isinstance(skip, str) else {skip}
    unknown = skipped - set(STATE_CONTRACT_AREAS)
    if unknown:
        raise ValueError(
            f"unknown contract area(s) {sorted(unknown)}; known: {', '.join(STATE_CONTRACT_AREAS)}."
        )
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 2:
        raise ValueError(f"concurrency must be an int of at least 2, got {concurrency!r}.")
    kit = _Kit(store_factory_or_store, concurrency)
    return [
        StateStoreContractCase(
            name=name.format(n=concurrency), area=area, run=functools.partial(kit.run, body)
        )
        for name, area, body in _CASES
        if area not in skipped
    ]


class _Kit:
    """What every case of one call shares: the store source and the namespace."""

    def __init__(self, source: StoreSource, concurrency: int) -> None:
        self._source = source
        self.concurrency = concurrency
        self.ns = f"contract-{uuid.uuid4().hex[:12]}"
        # Thread ids are integers; a random 40-bit base keeps them apart per call.
        self._thread_base = secrets.randbits(40) << 16
        self._counter = 0
        self._count_lock = threading.Lock()

    def run(self, body: _Body) -> None:
        # A factory is called once per case: every step of the case uses that store.
        store = self._source if isinstance(self._source, StateStore) else self._source()
        body(self, store)

    def name(self, label: str) -> str:
        with self._count_lock:
            self._counter += 1
            return f"{self.ns}.{label}.{self._counter}"

    def thread(self) -> int:
        with self._count_lock:
            self._counter += 1
            return self._thread_base + self._counter


_Body = Callable[["_Kit", StateStore], None]
_CASES: list[tuple[str, str, _Body]] = []


def _case(area: str, name: str) -> Callable[[_Body], _Body]:
    def register(body: _Body) -> _Body:
        _CASES.append((f"{area}: {name}", area, body))
        return body

    return register


def _fail(area: str, message: str) -> StateStoreContractViolation:
    return StateStoreContractViolation(f"[StateStore {area}] {message}")


def _check(condition: bool, area: str, message: str) -> None:
    if not condition:
        raise _fail(area, message)


def _raises(
    area: str, error: type[BaseException], call: Callable[[], Any], what: str
) -> BaseException:
    try:
        call()
    except error as exc:
        return exc
    except Exception as exc:
        raise _fail(
            area, f"{what} raised {type(exc).__name__}: {exc}; expected {error.__name__}."
        ) from exc
    raise _fail(area, f"{what} did not raise {error.__name__}.")


def _present(area: str, value: _T | None, what: str) -> _T:
    if value is None:
        raise _fail(area, f"{what} returned None.")
    return value


def _now() -> datetime:
    return timezone.now()


def _token(job: Any) -> uuid.UUID:
    token = job.claim_token
    if not isinstance(token, uuid.UUID):
        raise _fail("claims", f"a claimed job must carry a UUID claim_token, got {token!r}.")
    return token


def _claim_fields(job: Any) -> dict[str, Any]:
    return {name: getattr(job, name) for name in JOB_CLAIM_FIELDS}


def _queue(kit: _Kit, store: StateStore, target: str, count: int = 1, **fields: Any) -> list[Any]:
    return [
        store.create_job(request_id=kit.name("job"), target=target, **fields) for _ in range(count)
    ]


# --- jobs ----------------------------------------------------------------------------


@_case("jobs", "create_job stores every given field and fills the defaults")
def _create_round_trip(kit: _Kit, store: StateStore) -> None:
    area = "jobs"
    run_after = _now() + _HOUR
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
    stored = _present(area, store.get_job(created.id), "get_job(id of a created job)")
    for name, value in fields.items():
        _check(
            getattr(stored, name) == value,
            area,
            f"{name} came back as {getattr(stored, name)!r}, stored {value!r}.",
        )
    _check(stored.status == JobStatus.QUEUED, area, "a new job's status must default to queued.")
    _check(isinstance(stored.id, uuid.UUID), area, "job ids must be UUIDs.")
    _check(
        stored.created_at is not None and stored.updated_at is not None,
        area,
        "created_at and updated_at must be stamped by the store.",
    )
    _check(
        all(value is None for value in _claim_fields(stored).values()),
        area,
        "a new job must carry no claim fields.",
    )
    found = _present(area, store.find_by_request_id(fields["request_id"]), "find_by_request_id")
    _check(found.id == created.id, area, "find_by_request_id returned another job.")

    bare = store.create_job(request_id=kit.name("bare"))
    _check(
        (bare.status, bare.source, bare.input_preview, bare.attempts, bare.metadata)
        == (JobStatus.QUEUED, "", "", 0, {}),
        area,
        "a job created with only a request_id must get status queued, source '', "
        "input_preview '', attempts 0 and metadata {}.",
    )
    _check(bare.target is None and bare.input is None, area, "absent nullable fields are None.")
    done = store.create_job(request_id=kit.name("done"), status=JobStatus.DONE)
    _check(done.status == JobStatus.DONE, area, "create_job must accept an explicit status.")


@_case("jobs", "create_job refuses a duplicate request_id and leaves the first job as it was")
def _create_duplicate(kit: _Kit, store: StateStore) -> None:
    area = "jobs"
    request_id = kit.name("dup")
    first = store.create_job(request_id=request_id, input={"n": 1})
    error = _raises(
        area,
        DuplicateRequestId,
        lambda: store.create_job(request_id=request_id, input={"n": 2}),
        "create_job with an existing request_id",
    )
    _check(getattr(error, "request_id", None) == request_id, area, "the error names the key.")
    stored = _present(area, store.find_by_request_id(request_id), "find_by_request_id")
    _check(
        stored.id == first.id and stored.input == {"n": 1},
        area,
        "a refused duplicate must not change the existing job.",
    )


@_case("jobs", "enqueue returns the existing job when the same request comes again")
def _enqueue_idempotent(kit: _Kit, store: StateStore) -> None:
    area = "jobs"
    request_id, target, thread = kit.name("enq"), kit.name("target"), kit.thread()
    job, created = store.enqueue(
        request_id=request_id, target=target, thread_id=thread, input={"q": [1, 2]}
    )
    _check(created, area, "the first enqueue of a request must report created=True.")
    _check(job.status == JobStatus.QUEUED, area, "enqueue must queue the job.")
    again, created_again = store.enqueue(
        request_id=request_id,
        target=target,
        thread_id=thread,
        input={"q": [1, 2]},
        metadata={"retry_of_request": True},
        session_id="another-session",
    )
    _check(not created_again, area, "a repeated enqueue must report created=False.")
    _check(again.id == job.id, area, "a repeated enqueue must return the existing job.")
    _check(
        store.count_inflight_by_thread(thread) == 1,
        area,
        "a repeated enqueue must not create a second job.",
    )
    claimed = _present(area, store.claim_next_inhub_job([target], kit.name("w")), "claim")
    replay, created_late = store.enqueue(
        request_id=request_id, target=target, thread_id=thread, input={"q": [1, 2]}
    )
    _check(
        not created_late and replay.status == JobStatus.RUNNING and replay.id == claimed.id,
        area,
        "a repeated enqueue of a job that already runs must return it as it is now.",
    )


@_case("jobs", "enqueue refuses a different payload under the same request_id")
def _enqueue_conflict(kit: _Kit, store: StateStore) -> None:
    area = "jobs"
    request_id, target = kit.name("enq"), kit.name("target")
    store.enqueue(request_id=request_id, target=target, input={"amount": 1})
    for change in ({"input": {"amount": 2}}, {"input": {"amount": 1.0}}, {"target": "other"}):
        fields = {"request_id": request_id, "target": target, "input": {"amount": 1}, **change}
        error = _raises(
            area,
            IdempotencyConflict,
            lambda fields=fields: store.enqueue(**fields),  # type: ignore[misc]
            f"enqueue of a known request_id with {change}",
        )
        differing = getattr(error, "fields", ())
        _check(
            set(change) <= set(differing),
            area,
            f"the conflict must name {sorted(change)}, named {differing}.",
        )
    stored = _present(area, store.find_by_request_id(request_id), "find_by_request_id")
    _check(stored.input == {"amount": 1}, area, "a refused enqueue must not change the job.")


@_case("jobs", "enqueue queues an unclaimed job and refuses state and claim fields")
def _enqueue_fields(kit: _Kit, store: StateStore) -> None:
    area = "jobs"
    for name, value in (
        ("status", JobStatus.RUNNING),
        ("claim_token", uuid.uuid4()),
        ("result", {"x": 1}),
    ):
        request_id = kit.name("enq")
        _raises(
            area,
            InvalidPatch,
            lambda name=name, value=value, request_id=request_id: store.enqueue(  # type: ignore[misc]
                request_id=request_id, **{name: value}
            ),
            f"enqueue(..., {name}=...)",
        )
        _check(
            store.find_by_request_id(request_id) is None,
            area,
            f"enqueue with {name} must write nothing.",
        )
    _raises(area, InvalidPatch, lambda: store.enqueue(target="x"), "enqueue without request_id")


@_case("jobs", "enqueue enforces the per-thread in-flight quota")
def _enqueue_quota(kit: _Kit, store: StateStore) -> None:
    area = "jobs"
    target, thread, other_thread = kit.name("target"), kit.thread(), kit.thread()
    config = {**getattr(settings, "JOBSTATE", {}), "THREAD_INFLIGHT_QUOTA": 2}
    with override_settings(JOBSTATE=config):
        first, _ = store.enqueue(request_id=kit.name("q"), target=target, thread_id=thread)
        store.enqueue(request_id=kit.name("q"), target=target, thread_id=thread)
        refused = kit.name("q")
        error = _raises(
            area,
            ThreadQuotaExceeded,
            lambda: store.enqueue(request_id=refused, target=target, thread_id=thread),
            "a third enqueue in a thread with a quota of 2",
        )
        _check(
            (getattr(error, "inflight", None), getattr(error, "quota", None)) == (2, 2),
            area,
            "ThreadQuotaExceeded must carry the in-flight count and the quota.",
        )
        _check(store.find_by_request_id(refused) is None, area, "a refused job is not written.")
        replay, created = store.enqueue(
            request_id=first.request_id, target=target, thread_id=thread
        )
        _check(
            not created and replay.id == first.id,
            area,
            "a repeated request in a full thread must still return the existing job.",
        )
        _, created_other = store.enqueue(
            request_id=kit.name("q"), target=target, thread_id=other_thread
        )
        _check(created_other, area, "another thread's quota must be independent.")
        _, created_free = store.enqueue(request_id=kit.name("q"), target=target)
        _check(created_free, area, "jobs without a thread are not subject to the quota.")
        store.update_job(first.id, status=JobStatus.DONE)
        _, created_after = store.enqueue(request_id=refused, target=target, thread_id=thread)
        _check(created_after, area, "finished jobs must not count against the quota.")


@_case("jobs", "unknown ids answer None and malformed ids raise")
def _unknown_ids(kit: _Kit, store: StateStore) -> None:
    area = "jobs"
    _check(store.get_job(uuid.uuid4()) is None, area, "get_job of an unknown id must be None.")
    _check(
        store.find_by_request_id(kit.name("missing")) is None,
        area,
        "find_by_request_id of an unknown key must be None.",
    )
    _check(
        store.update_job(str(uuid.uuid4()), error="x") is None,
        area,
        "update_job of an unknown id must be None.",
    )
    _raises(area, InvalidJobState, lambda: store.get_job("not-a-uuid"), "get_job('not-a-uuid')")


# --- updates -------------------------------------------------------------------------


@_case("updates", "update_job writes only the given fields and None clears a nullable field")
def _update_partial(kit: _Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = _queue(kit, store, kit.name("target"), input={"keep": True}, source="api")
    now = _now()
    claimed = _present(
        area,
        store.update_job(
            job.id,
            status=JobStatus.RUNNING,
            executor_id="worker-1",
            claimed_at=now,
            lease_until=now + _HOUR,
            claim_token=uuid.uuid4(),
            report={"step": 1},
        ),
        "update_job",
    )
    _check(
        claimed.executor_id == "worker-1" and claimed.lease_until == now + _HOUR,
        area,
        "update_job must persist the fields it was given.",
    )
    cleared = _present(
        area,
        store.update_job(
            job.id,
            executor_id=None,
            claimed_at=None,
            lease_until=None,
            claim_token=None,
            result={"ok": True},
        ),
        "update_job with None values",
    )
    stored = _present(area, store.get_job(job.id), "get_job")
    _check(
        all(getattr(stored, name) is None for name in JOB_CLAIM_FIELDS),
        area,
        "None must clear nullable fields (claim fields were not cleared).",
    )
    _check(
        (stored.input, stored.source, stored.report, stored.status, stored.result)
        == ({"keep": True}, "api", {"step": 1}, JobStatus.RUNNING, {"ok": True}),
        area,
        "fields absent from a patch must keep their values.",
    )
    _check(cleared.result == {"ok": True}, area, "update_job must return the job re-read.")


@_case("updates", "updated_at moves on every write and created_at never does")
def _update_clock(kit: _Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = _queue(kit, store, kit.name("target"))
    time.sleep(0.02)
    first = _present(area, store.update_job(job.id), "update_job with an empty patch")
    time.sleep(0.02)
    second = _present(area, store.update_job(job.id, error="x"), "update_job")
    _check(
        job.updated_at < first.updated_at < second.updated_at,
        area,
        "updated_at must move to the store's clock on every write.",
    )
    _check(second.created_at == job.created_at, area, "created_at must never change.")


@_case("updates", "identity and unknown fields are refused and nothing is written")
def _update_refused(kit: _Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = _queue(kit, store, kit.name("target"))
    refused: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"id": uuid.uuid4()}, ImmutableField),
        ({"request_id": "other"}, ImmutableField),
        ({"created_at": _now()}, ImmutableField),
        ({"updated_at": _now()}, ImmutableField),
        ({"bogus": 1}, InvalidPatch),
        ({"status": None}, InvalidPatch),
        ({"metadata": None}, InvalidPatch),
        ({"attempts": None}, InvalidPatch),
        ({"error": "x", "request_id": "other"}, ImmutableField),
    ]
    for patch, error in refused:
        _raises(
            area,
            error,
            lambda patch=patch: store.update_job(job.id, **patch),  # type: ignore[misc]
            f"update_job({patch})",
        )
        _raises(
            area,
            error,
            lambda patch=patch: store.update_job_if_status(  # type: ignore[misc]
                job.id, [JobStatus.QUEUED], **patch
            ),
            f"update_job_if_status({patch})",
        )
    stored = _present(area, store.get_job(job.id), "get_job")
    _check(
        (stored.updated_at, stored.error, stored.request_id)
        == (job.updated_at, None, job.request_id),
        area,
        "a refused patch must write nothing.",
    )


@_case("updates", "values of the wrong kind raise and write nothing")
def _update_bad_values(kit: _Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = _queue(kit, store, kit.name("target"))
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    bad: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"status": "paused"}, InvalidJobState),
        ({"run_after": datetime(2030, 1, 1)}, InvalidJobState),
        ({"lease_until": "tomorrow"}, InvalidJobState),
        ({"input": float("nan")}, InvalidPayload),
        ({"result": cyclic}, InvalidPayload),
        ({"metadata": ["not", "a", "dict"]}, InvalidPatch),
        ({"attempts": -1}, InvalidPatch),
        ({"attempts": True}, InvalidPatch),
        ({"thread_id": "seven"}, InvalidJobState),
        ({"claim_token": "not-a-uuid"}, InvalidJobState),
        ({"target": 5}, InvalidPatch),
        ({"error": "nul\x00byte"}, InvalidPatch),
        ({"error": "fine", "input": float("inf")}, InvalidPayload),
    ]
    for patch, error in bad:
        _raises(
            area,
            error,
            lambda patch=patch: store.update_job(job.id, **patch),  # type: ignore[misc]
            f"update_job({patch!r})",
        )
    stored = _present(area, store.get_job(job.id), "get_job")
    _check(
        (stored.updated_at, stored.error, stored.input) == (job.updated_at, None, None),
        area,
        "a rejected value must write nothing, not even the other fields of its patch.",
    )
    _raises(
        area,
        InvalidJobState,
        lambda: store.create_job(request_id=kit.name("bad"), run_after=datetime(2030, 1, 1)),
        "create_job with a naive run_after",
    )


@_case("updates", "update_job_if_status writes only while the status matches")
def _update_if_status(kit: _Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = _queue(kit, store, kit.name("target"))
    moved = store.update_job_if_status(
        job.id, [JobStatus.QUEUED], status=JobStatus.RUNNING, executor_id="w1"
    )
    moved = _present(area, moved, "update_job_if_status on a matching status")
    _check(
        moved.status == JobStatus.RUNNING and moved.executor_id == "w1",
        area,
        "a matching conditional update must apply its patch.",
    )
    again = store.update_job_if_status(
        job.id, [JobStatus.QUEUED], status=JobStatus.RUNNING, executor_id="w2"
    )
    _check(again is None, area, "a conditional update on a moved-on status must return None.")
    stored = _present(area, store.get_job(job.id), "get_job")
    _check(
        stored.executor_id == "w1" and stored.updated_at == moved.updated_at,
        area,
        "a refused conditional update must leave the job unchanged.",
    )
    _check(
        store.update_job_if_status(uuid.uuid4(), [JobStatus.QUEUED], error="x") is None,
        area,
        "a conditional update of an unknown job must return None.",
    )


@_case("updates", "an empty expected-status list writes nothing")
def _update_if_status_empty(kit: _Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = _queue(kit, store, kit.name("target"))
    _check(
        store.update_job_if_status(job.id, [], status=JobStatus.DONE) is None,
        area,
        "update_job_if_status with no expected statuses must return None.",
    )
    stored = _present(area, store.get_job(job.id), "get_job")
    _check(
        stored.status == JobStatus.QUEUED and stored.updated_at == job.updated_at,
        area,
        "update_job_if_status with no expected statuses must write nothing.",
    )
    _raises(
        area,
        InvalidJobState,
        lambda: store.update_job_if_status(job.id, "queued", error="x"),
        "update_job_if_status with a bare string of statuses",
    )


# --- listing -------------------------------------------------------------------------


def _job_in(kit: _Kit, store: StateStore, target: str, status: JobStatus, **fields: Any) -> Any:
    return store.create_job(request_id=kit.name(status), target=target, status=status, **fields)


@_case("listing", "list_jobs_by_status returns exactly the jobs in the given statuses")
def _list_by_status(kit: _Kit, store: StateStore) -> None:
    area, target = "listing", kit.name("target")
    jobs = {status: _job_in(kit, store, target, status) for status in JobStatus}
    listed = store.list_jobs_by_status([JobStatus.QUEUED, JobStatus.RUNNING], targets=[target])
    _check(
        [job.id for job in listed] == [jobs[JobStatus.QUEUED].id, jobs[JobStatus.RUNNING].id],
        area,
        "list_jobs_by_status(['queued', 'running']) must return the queued and the running "
        f"job, oldest first; got statuses {[job.status for job in listed]}.",
    )


@_case("listing", "older_than returns only jobs not written for that long, of those statuses")
def _list_older_than(kit: _Kit, store: StateStore) -> None:
    area, target = "listing", kit.name("target")
    old_running = _job_in(kit, store, target, JobStatus.RUNNING)
    _job_in(kit, store, target, JobStatus.QUEUED)
    touched = _job_in(kit, store, target, JobStatus.RUNNING)
    time.sleep(_SETTLE)
    store.update_job(touched.id, report={"progress": 1})
    _job_in(kit, store, target, JobStatus.RUNNING)
    stale = store.list_jobs_by_status([JobStatus.RUNNING], _AGE, targets=[target])
    _check(
        [job.id for job in stale] == [old_running.id],
        area,
        "older_than must select only jobs whose updated_at is older than that, and only "
        f"in the given statuses; got {[(job.status, job.request_id) for job in stale]}.",
    )


@_case("listing", "an empty status list returns nothing")
def _list_empty(kit: _Kit, store: StateStore) -> None:
    area, target = "listing", kit.name("target")
    _job_in(kit, store, target, JobStatus.QUEUED)
    _check(store.list_jobs_by_status([]) == [], area, "list_jobs_by_status([]) must be [].")
    _check(
        store.list_expired_leases([], timedelta(0)) == [], area, "list_expired_leases([]) == []."
    )
    _check(
        store.list_jobs_by_status([JobStatus.QUEUED], targets=[]) == [],
        area,
        "an empty targets list narrows to nothing.",
    )
    _raises(
        area,
        InvalidJobState,
        lambda: store.list_jobs_by_status(["stuck"]),
        "list_jobs_by_status(['stuck'])",
    )


@_case("listing", "limit bounds the result to the oldest jobs")
def _list_limit(kit: _Kit, store: StateStore) -> None:
    area, target = "listing", kit.name("target")
    jobs = _queue(kit, store, target, 3)
    listed = store.list_jobs_by_status([JobStatus.QUEUED], targets=[target], limit=2)
    _check(
        [job.id for job in listed] == [job.id for job in jobs[:2]],
        area,
        "limit=2 must return the two oldest jobs, oldest first.",
    )
    _raises(
        area,
        InvalidJobState,
        lambda: store.list_jobs_by_status([JobStatus.QUEUED], limit=0),
        "list_jobs_by_status(limit=0)",
    )


# --- claims --------------------------------------------------------------------------


@_case("claims", "claim_next_inhub_job takes the due job and leaves a delayed one queued")
def _claim_inhub(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "claims", kit.name("target"), kit.name("worker")
    (delayed,) = _queue(kit, store, target, run_after=_now() + _HOUR)
    (due,) = _queue(kit, store, target, run_after=_now() - _HOUR)
    claimed = _present(area, store.claim_next_inhub_job([target], worker), "claim_next_inhub_job")
    _check(claimed.id == due.id, area, "the claim must skip a job whose run_after is ahead.")
    _check(
        claimed.status == JobStatus.RUNNING and claimed.executor_id == worker,
        area,
        "an in-hub claim moves the job to running, owned by the worker.",
    )
    _check(
        claimed.claimed_at is not None
        and claimed.lease_until is not None
        and claimed.lease_until > claimed.claimed_at,
        area,
        "a claim must set claimed_at and a lease_until after it.",
    )
    _check(claimed.claim_token is not None, area, "a claim must set a claim_token.")
    _check(claimed.run_after is None, area, "a claim must clear run_after.")
    _check(claimed.dispatched_at is None, area, "an in-hub claim sets no dispatched_at.")
    stored = _present(area, store.get_job(delayed.id), "get_job")
    _check(
        stored.status == JobStatus.QUEUED and stored.run_after == delayed.run_after,
        area,
        "the delayed job must stay queued with its run_after.",
    )
    _check(
        store.claim_next_inhub_job([target], worker) is None,
        area,
        "with only a delayed job left the claim must return None.",
    )


@_case("claims", "claim_next_job skips a delayed job and dispatches it once it is due")
def _claim_executor(kit: _Kit, store: StateStore) -> None:
    area, target, executor = "claims", kit.name("target"), kit.name("exec")
    (job,) = _queue(kit, store, target, run_after=_now() + _HOUR)
    _check(
        store.claim_next_job([target], executor) is None,
        area,
        "claim_next_job must skip a job whose run_after is ahead.",
    )
    store.update_job(job.id, run_after=_now() - timedelta(seconds=1))
    claimed = _present(area, store.claim_next_job([target], executor), "claim_next_job")
    _check(
        claimed.id == job.id
        and claimed.status == JobStatus.DISPATCHED
        and claimed.executor_id == executor,
        area,
        "claim_next_job moves the job to dispatched, owned by the executor.",
    )
    _check(
        claimed.dispatched_at is not None
        and claimed.lease_until is not None
        and claimed.lease_until > claimed.dispatched_at
        and claimed.run_after is None
        and claimed.claim_token is not None,
        area,
        "a dispatch sets dispatched_at, a later lease_until and a claim_token, and clears "
        "run_after.",
    )


@_case("claims", "the oldest ready job of the given targets is claimed first")
def _claim_order(kit: _Kit, store: StateStore) -> None:
    area, worker = "claims", kit.name("worker")
    first_target, second_target = kit.name("target"), kit.name("target")
    (a,) = _queue(kit, store, first_target)
    (b,) = _queue(kit, store, second_target)
    (c,) = _queue(kit, store, first_target)
    order = [
        store.claim_next_inhub_job([first_target], worker),
        store.claim_next_inhub_job([second_target], worker),
        store.claim_next_inhub_job([first_target, second_target], worker),
    ]
    _check(
        [job.id if job else None for job in order] == [a.id, b.id, c.id],
        area,
        "claims must take the oldest ready job of the given targets only.",
    )
    _check(
        store.claim_next_inhub_job([first_target, second_target], worker) is None,
        area,
        "an empty queue must answer None.",
    )
    (d,) = _queue(kit, store, first_target)
    _check(store.claim_next_job([], worker) is None, area, "empty targets must answer None.")
    _check(
        store.claim_next_job([kit.name("elsewhere")], worker) is None,
        area,
        "a claim must not take jobs of other targets.",
    )
    _check(
        _present(area, store.get_job(d.id), "get_job").status == JobStatus.QUEUED,
        area,
        "a claim that answered None must not move any job.",
    )


@_case("claims", "every claim gets a fresh claim token and the lease it asked for")
def _claim_tokens(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "claims", kit.name("target"), kit.name("worker")
    _queue(kit, store, target)
    first = _present(
        area, store.claim_next_inhub_job([target], worker, timedelta(minutes=10)), "claim"
    )
    assert first.lease_until is not None and first.claimed_at is not None
    lease = first.lease_until - first.claimed_at
    _check(
        abs(lease - timedelta(minutes=10)) < timedelta(seconds=1),
        area,
        f"lease_until must be the claim instant plus the lease; got a lease of {lease}.",
    )
    store.complete_claimed_job(first.id, _token(first), JobStatus.QUEUED)
    second = _present(area, store.claim_next_inhub_job([target], worker), "claim")
    _check(second.id == first.id, area, "a job given back must be claimable again.")
    _check(
        second.claim_token not in (None, first.claim_token),
        area,
        "each claim must get a fresh claim_token.",
    )


@_case("claims", "bad claim arguments raise and claim nothing")
def _claim_bad_arguments(kit: _Kit, store: StateStore) -> None:
    area, target = "claims", kit.name("target")
    (job,) = _queue(kit, store, target)
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
        _raises(area, InvalidJobState, call, f"a claim with {what}")
    _check(
        _present(area, store.get_job(job.id), "get_job").status == JobStatus.QUEUED,
        area,
        "a refused claim must not move any job.",
    )


# --- threads -------------------------------------------------------------------------


@_case("threads", "a thread with running work holds its next job until that work finishes")
def _thread_running_blocks(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "threads", kit.name("target"), kit.name("worker")
    thread = kit.thread()
    first, second = _queue(kit, store, target, 2, thread_id=thread)
    (free,) = _queue(kit, store, target)
    claimed = _present(area, store.claim_next_inhub_job([target], worker), "claim")
    _check(claimed.id == first.id, area, "the head of the thread must be claimed first.")
    other = store.claim_next_inhub_job([target], worker)
    _check(
        other is not None and other.id == free.id,
        area,
        "while a thread runs, its next job must be passed over for other work.",
    )
    _check(
        store.claim_next_inhub_job([target], worker) is None,
        area,
        "a thread's next job must not be claimed while the thread has running work.",
    )
    store.complete_claimed_job(first.id, _token(claimed), JobStatus.DONE)
    follow = store.claim_next_inhub_job([target], worker)
    _check(
        follow is not None and follow.id == second.id,
        area,
        "once the running job finished the thread's next job must be claimable.",
    )


@_case("threads", "a thread's jobs are claimed strictly from the head of its queue")
def _thread_fifo(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "threads", kit.name("target"), kit.name("worker")
    thread = kit.thread()
    jobs = _queue(kit, store, target, 3, thread_id=thread)
    seen = []
    for _ in jobs:
        claimed = _present(area, store.claim_next_inhub_job([target], worker), "claim")
        seen.append(claimed.id)
        _check(
            store.claim_next_inhub_job([target], worker) is None,
            area,
            "a second claim in a thread with running work must return None.",
        )
        store.complete_claimed_job(claimed.id, _token(claimed), JobStatus.DONE)
    _check(seen == [job.id for job in jobs], area, "a thread's jobs must run in queue order.")


@_case("threads", "dispatched work blocks its thread for in-hub workers too")
def _thread_dispatched_blocks(kit: _Kit, store: StateStore) -> None:
    area, target = "threads", kit.name("target")
    thread = kit.thread()
    _queue(kit, store, target, 2, thread_id=thread)
    _present(area, store.claim_next_job([target], kit.name("exec")), "claim_next_job")
    _check(
        store.claim_next_inhub_job([target], kit.name("worker")) is None,
        area,
        "a thread with dispatched work must not start another job.",
    )


@_case("threads", "a delayed job does not hold up the ready jobs behind it")
def _thread_delay(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "threads", kit.name("target"), kit.name("worker")
    thread = kit.thread()
    (delayed,) = _queue(kit, store, target, thread_id=thread, run_after=_now() + _HOUR)
    (ready,) = _queue(kit, store, target, thread_id=thread)
    claimed = _present(area, store.claim_next_inhub_job([target], worker), "claim")
    _check(claimed.id == ready.id, area, "a delayed head must not block a ready job behind it.")
    store.update_job(delayed.id, run_after=_now() - timedelta(seconds=1))
    _check(
        store.claim_next_inhub_job([target], worker) is None,
        area,
        "a job that became due must still wait for its thread's running work.",
    )


@_case("threads", "count_inflight_by_thread counts queued, running and dispatched jobs only")
def _thread_count(kit: _Kit, store: StateStore) -> None:
    area, target = "threads", kit.name("target")
    thread, other = kit.thread(), kit.thread()
    for status in JobStatus:
        _job_in(kit, store, target, status, thread_id=thread)
    _job_in(kit, store, target, JobStatus.QUEUED, thread_id=other)
    count = store.count_inflight_by_thread(thread)
    _check(count == 3, area, f"expected 3 in-flight jobs, counted {count}.")
    _check(store.count_inflight_by_thread(kit.thread()) == 0, area, "an empty thread counts 0.")


# --- completion ----------------------------------------------------------------------


@_case("completion", "the claim holder's report lands and clears the claim fields")
def _complete(kit: _Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    _queue(kit, store, target)
    claimed = _present(area, store.claim_next_job([target], kit.name("exec")), "claim")
    result = store.complete_claimed_job(
        claimed.id,
        str(claimed.claim_token),
        JobStatus.DONE,
        result={"answer": 42},
        usage={"duration_ms": 12},
    )
    _check(result.outcome is CompletionOutcome.COMPLETED, area, f"got {result.outcome}.")
    job = _present(area, result.job, "the completed job")
    _check(
        job.status == JobStatus.DONE and job.result == {"answer": 42},
        area,
        "a current claim's report must write its status and patch.",
    )
    _check(
        all(value is None for value in _claim_fields(job).values()),
        area,
        f"a terminal report must clear the claim fields; left {_claim_fields(job)}.",
    )


@_case("completion", "a report with a stale claim token changes nothing")
def _complete_stale_token(kit: _Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    _queue(kit, store, target)
    claimed = _present(area, store.claim_next_inhub_job([target], kit.name("w")), "claim")
    result = store.complete_claimed_job(claimed.id, uuid.uuid4(), JobStatus.DONE, result={})
    _check(result.outcome is CompletionOutcome.STALE_CLAIM, area, f"got {result.outcome}.")
    stored = _present(area, store.get_job(claimed.id), "get_job")
    _check(
        stored.status == JobStatus.RUNNING
        and stored.claim_token == claimed.claim_token
        and stored.result is None,
        area,
        "a report with a wrong token must not change the job.",
    )


@_case("completion", "a report that arrives after the job was requeued changes nothing")
def _complete_after_requeue(kit: _Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    _queue(kit, store, target)
    old = _present(area, store.claim_next_job([target], kit.name("exec")), "claim")
    store.update_job(old.id, lease_until=_now() - _HOUR)
    moved = store.requeue_stale_dispatched(_HOUR, 10 * _HOUR, targets=[target])
    _check(moved == 1, area, f"the expired dispatch must be requeued, moved {moved}.")
    late = store.complete_claimed_job(old.id, _token(old), JobStatus.DONE)
    _check(late.outcome is CompletionOutcome.STALE_CLAIM, area, f"got {late.outcome}.")
    _check(
        late.job is not None and late.job.status == JobStatus.QUEUED,
        area,
        "a late report must leave the requeued job queued.",
    )
    fresh = _present(area, store.claim_next_job([target], kit.name("exec")), "reclaim")
    late_again = store.complete_claimed_job(old.id, _token(old), JobStatus.ERROR)
    _check(
        late_again.outcome is CompletionOutcome.STALE_CLAIM,
        area,
        "the first claim's token must stay stale after another executor claimed the job.",
    )
    current = store.complete_claimed_job(fresh.id, _token(fresh), JobStatus.DONE)
    _check(current.outcome is CompletionOutcome.COMPLETED, area, "the new claim must report.")


@_case("completion", "a second report of the same claim is refused")
def _complete_twice(kit: _Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    _queue(kit, store, target)
    claimed = _present(area, store.claim_next_inhub_job([target], kit.name("w")), "claim")
    store.complete_claimed_job(claimed.id, _token(claimed), JobStatus.DONE, result={"n": 1})
    second = store.complete_claimed_job(claimed.id, _token(claimed), JobStatus.ERROR, error="late")
    _check(second.outcome is CompletionOutcome.STALE_CLAIM, area, f"got {second.outcome}.")
    stored = _present(area, store.get_job(claimed.id), "get_job")
    _check(
        stored.status == JobStatus.DONE and stored.error is None and stored.result == {"n": 1},
        area,
        "a second report must not overwrite the first.",
    )


@_case("completion", "giving a claimed job back requeues it for a retry")
def _complete_requeue(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "completion", kit.name("target"), kit.name("w")
    _queue(kit, store, target)
    claimed = _present(area, store.claim_next_inhub_job([target], worker), "claim")
    result = store.complete_claimed_job(
        claimed.id,
        _token(claimed),
        JobStatus.QUEUED,
        attempts=1,
        run_after=_now() + _HOUR,
        error="transient",
    )
    job = _present(area, result.job, "the requeued job")
    _check(
        result.completed and job.status == JobStatus.QUEUED and job.attempts == 1,
        area,
        "a claim holder must be able to give the job back with a retry patch.",
    )
    _check(
        all(value is None for value in _claim_fields(job).values()),
        area,
        "giving a job back must clear the claim fields.",
    )
    _check(
        store.claim_next_inhub_job([target], worker) is None,
        area,
        "the retry's run_after must keep it from being claimed at once.",
    )


@_case("completion", "unknown jobs answer NOT_FOUND and bad reports raise")
def _complete_errors(kit: _Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    missing = store.complete_claimed_job(uuid.uuid4(), uuid.uuid4(), JobStatus.DONE)
    _check(
        missing.outcome is CompletionOutcome.NOT_FOUND and missing.job is None,
        area,
        "a report on an unknown job must answer NOT_FOUND.",
    )
    _queue(kit, store, target)
    claimed = _present(area, store.claim_next_inhub_job([target], kit.name("w")), "claim")
    token = _token(claimed)
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
        _raises(area, error, call, f"complete_claimed_job with {what}")
    stored = _present(area, store.get_job(claimed.id), "get_job")
    _check(stored.status == JobStatus.RUNNING, area, "a refused report must write nothing.")


@_case("completion", "extend_claim_lease renews only under the current token")
def _extend_claim_lease(kit: _Kit, store: StateStore) -> None:
    area, target = "completion", kit.name("target")
    _queue(kit, store, target)
    claimed = _present(
        area, store.claim_next_inhub_job([target], kit.name("w"), timedelta(minutes=1)), "claim"
    )
    _check(
        store.extend_claim_lease(claimed.id, _token(claimed), _HOUR),
        area,
        "the claim holder must be able to extend its lease.",
    )
    renewed = _present(area, store.get_job(claimed.id), "get_job")
    assert renewed.lease_until is not None and claimed.lease_until is not None
    _check(
        renewed.lease_until > claimed.lease_until + timedelta(minutes=30),
        area,
        "extend_claim_lease must move lease_until to the store's clock plus the lease.",
    )
    _check(
        not store.extend_claim_lease(claimed.id, uuid.uuid4(), _HOUR),
        area,
        "a stale token must not extend the lease.",
    )
    store.complete_claimed_job(claimed.id, _token(claimed), JobStatus.DONE)
    _check(
        not store.extend_claim_lease(claimed.id, _token(claimed)),
        area,
        "a finished job's lease must not be extended.",
    )


# --- leases --------------------------------------------------------------------------


@_case("leases", "extend_executor_leases renews the dispatched jobs of that executor only")
def _extend_executor(kit: _Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    mine, theirs = kit.name("exec"), kit.name("exec")
    _queue(kit, store, target, 4)
    own = [_present(area, store.claim_next_job([target], mine), "claim") for _ in range(2)]
    other = _present(area, store.claim_next_job([target], theirs), "claim")
    running = _present(area, store.claim_next_inhub_job([target], mine), "in-hub claim")
    soon = _now() + timedelta(minutes=1)
    for job in [*own, other, running]:
        store.update_job(job.id, lease_until=soon)
    renewed = store.extend_executor_leases(mine, _HOUR)
    _check(renewed == 2, area, f"expected 2 dispatched leases renewed, renewed {renewed}.")
    for job in own:
        lease_until = _present(area, store.get_job(job.id), "get_job").lease_until
        _check(
            lease_until is not None and lease_until > soon + timedelta(minutes=30),
            area,
            "the executor's dispatched leases must move to clock + lease.",
        )
    for job in (other, running):
        _check(
            _present(area, store.get_job(job.id), "get_job").lease_until == soon,
            area,
            "other executors' jobs and running jobs must keep their leases.",
        )
    _check(store.extend_executor_leases(kit.name("idle")) == 0, area, "no jobs, no renewals.")


@_case("leases", "requeue_stale_dispatched hands back jobs whose lease expired")
def _requeue_expired(kit: _Kit, store: StateStore) -> None:
    area, target, executor = "leases", kit.name("target"), kit.name("e")
    _queue(kit, store, target, 2)
    expired = _present(area, store.claim_next_job([target], executor), "claim")
    fresh = _present(area, store.claim_next_job([target], executor), "claim")
    store.update_job(expired.id, lease_until=_now() - _HOUR)
    moved = store.requeue_stale_dispatched(_HOUR, 10 * _HOUR, targets=[target])
    _check(moved == 1, area, f"exactly the expired job must be requeued; moved {moved}.")
    back = _present(area, store.get_job(expired.id), "get_job")
    _check(back.status == JobStatus.QUEUED, area, "an expired dispatch must be queued again.")
    _check(
        all(value is None for value in _claim_fields(back).values()),
        area,
        "a requeued job must have its claim fields cleared.",
    )
    _check(
        _present(area, store.get_job(fresh.id), "get_job").status == JobStatus.DISPATCHED,
        area,
        "a dispatch with a live lease must stay dispatched.",
    )
    _check(
        store.requeue_stale_dispatched(_HOUR, 10 * _HOUR, targets=[target]) == 0,
        area,
        "a second sweep must find nothing left to move.",
    )


@_case("leases", "requeue_stale_dispatched applies the hard cap even to a renewed lease")
def _requeue_hard_cap(kit: _Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    _queue(kit, store, target)
    job = _present(area, store.claim_next_job([target], kit.name("e"), _HOUR), "claim")
    store.update_job(job.id, dispatched_at=_now() - 3 * _HOUR)
    moved = store.requeue_stale_dispatched(_HOUR, 2 * _HOUR, targets=[target])
    _check(moved == 1, area, "a dispatch older than the hard cap must be requeued.")


@_case("leases", "a dispatched job without a lease is handed back once silent for dead_after")
def _requeue_no_lease(kit: _Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    _queue(kit, store, target, 2)
    silent = _present(area, store.claim_next_job([target], kit.name("e")), "claim")
    store.update_job(silent.id, lease_until=None)
    time.sleep(_SETTLE)
    recent = _present(area, store.claim_next_job([target], kit.name("e")), "claim")
    store.update_job(recent.id, lease_until=None)
    moved = store.requeue_stale_dispatched(_AGE, 10 * _HOUR, targets=[target])
    _check(moved == 1, area, f"only the silent lease-less dispatch must move; moved {moved}.")
    _check(
        _present(area, store.get_job(recent.id), "get_job").status == JobStatus.DISPATCHED,
        area,
        "a lease-less dispatch written recently must stay.",
    )


@_case("leases", "list_expired_leases returns expired leases and lease-less jobs past the fallback")
def _list_expired(kit: _Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    now = _now()
    expired = _job_in(kit, store, target, JobStatus.RUNNING, lease_until=now - _HOUR)
    _job_in(kit, store, target, JobStatus.RUNNING, lease_until=now + _HOUR)
    old_no_lease = _job_in(kit, store, target, JobStatus.RUNNING)
    _job_in(kit, store, target, JobStatus.DISPATCHED, lease_until=now - _HOUR)
    time.sleep(_SETTLE)
    _job_in(kit, store, target, JobStatus.RUNNING)
    listed = store.list_expired_leases([JobStatus.RUNNING], _AGE, targets=[target])
    _check(
        [job.id for job in listed] == [expired.id, old_no_lease.id],
        area,
        "list_expired_leases must return the expired lease and the old lease-less job, "
        f"oldest first; got {[job.request_id for job in listed]}.",
    )


@_case("leases", "expire_stale_queued fails old queued jobs and leaves the rest")
def _expire_queued(kit: _Kit, store: StateStore) -> None:
    area, target = "leases", kit.name("target")
    old_queued, old_running = _queue(kit, store, target, 2)
    store.update_job(old_running.id, status=JobStatus.RUNNING)
    time.sleep(_SETTLE)
    (fresh,) = _queue(kit, store, target)
    moved = store.expire_stale_queued(_AGE, targets=[target])
    _check(moved == 1, area, f"exactly the old queued job must expire; moved {moved}.")
    expired = _present(area, store.get_job(old_queued.id), "get_job")
    _check(
        expired.status == JobStatus.ERROR and expired.error == EXPIRED_QUEUED_ERROR,
        area,
        "an expired job must be in error with the queue-timeout message.",
    )
    for job, status in ((old_running, JobStatus.RUNNING), (fresh, JobStatus.QUEUED)):
        _check(
            _present(area, store.get_job(job.id), "get_job").status == status,
            area,
            "running jobs and young queued jobs must not expire.",
        )


# --- audit ---------------------------------------------------------------------------


@_case("audit", "append_audit fills stage, severity, title and summary from the event")
def _audit_fill(kit: _Kit, store: StateStore) -> None:
    area = "audit"
    (job,) = _queue(kit, store, kit.name("target"))
    entry = store.append_audit(
        job=job, event="retry_scheduled", detail={"attempt": 2, "delay_ms": 500}
    )
    _check(
        (entry.stage, entry.severity, entry.title) == ("recovery", "warning", "Retry scheduled"),
        area,
        f"retry_scheduled must be filled as recovery/warning; got {entry.stage}/"
        f"{entry.severity} {entry.title!r}.",
    )
    _check(
        "attempt: 2" in entry.summary and "delay_ms: 500" in entry.summary,
        area,
        f"the default summary must list the detail; got {entry.summary!r}.",
    )
    _check(
        entry.job_id == job.id and entry.request_id == job.request_id and entry.ts is not None,
        area,
        "an entry must carry the job, its request_id and a timestamp.",
    )
    failed = store.append_audit(job=job.id, event="finished", detail={"status": "error"})
    _check(
        (failed.stage, failed.severity) == ("summary", "error"),
        area,
        "a finished entry with status error must have severity error.",
    )
    listed = store.list_audit(job=job)
    _check(
        [item.id for item in listed] == [entry.id, failed.id],
        area,
        "list_audit must return the job's entries oldest first.",
    )


@_case("audit", "given values win and unknown events get system defaults")
def _audit_given(kit: _Kit, store: StateStore) -> None:
    area = "audit"
    request_id = kit.name("req")
    given = store.append_audit(
        request_id=request_id,
        event="started",
        stage="tool",
        severity="error",
        title="Custom",
        summary="said so",
        detail={"k": "v"},
    )
    _check(
        (given.stage, given.severity, given.title, given.summary, given.detail)
        == ("tool", "error", "Custom", "said so", {"k": "v"}),
        area,
        "explicit stage, severity, title, summary and detail must be kept.",
    )
    unknown = store.append_audit(request_id=request_id, event="custom_event")
    _check(
        (unknown.stage, unknown.severity, unknown.title, unknown.job_id)
        == ("system", "info", "custom_event", None),
        area,
        "an unknown event must default to stage system, severity info and its own name.",
    )
    _check(len(store.list_audit(request_id=request_id)) == 2, area, "both entries are listed.")


@_case("audit", "bad entries raise and write nothing")
def _audit_bad(kit: _Kit, store: StateStore) -> None:
    area = "audit"
    request_id = kit.name("req")
    bad: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"event": ""}, InvalidJobState),
        ({"event": "x", "stage": "launchpad"}, InvalidJobState),
        ({"event": "x", "severity": "fatal"}, InvalidJobState),
        ({"event": "x", "detail": {"v": float("nan")}}, InvalidPayload),
        ({"event": "x", "detail": ["not", "a", "dict"]}, InvalidJobState),
        ({"event": "x", "at": datetime(2020, 1, 1)}, InvalidJobState),
        ({"event": "x", "job": "not-a-uuid"}, InvalidJobState),
    ]
    for fields, error in bad:
        _raises(
            area,
            error,
            lambda fields=fields: store.append_audit(request_id=request_id, **fields),  # type: ignore[misc]
            f"append_audit({fields!r})",
        )
    _check(store.list_audit(request_id=request_id) == [], area, "nothing may be written.")


@_case("audit", "prune deletes the entries older than the cutoff, batch by batch")
def _audit_prune(kit: _Kit, store: StateStore) -> None:
    area = "audit"
    request_id = kit.name("req")
    for day in (1, 2, 3):
        store.append_audit(
            request_id=request_id, event="received", at=datetime(1999, 1, day, tzinfo=UTC)
        )
    kept = store.append_audit(request_id=request_id, event="finished")
    pruned = store.prune_audit_older_than(datetime(2000, 1, 1, tzinfo=UTC), batch_size=2)
    _check(pruned >= 3, area, f"3 old entries must be pruned over two batches; pruned {pruned}.")
    left = store.list_audit(request_id=request_id)
    _check(
        [entry.id for entry in left] == [kept.id],
        area,
        "prune must delete every entry before the cutoff and nothing after it.",
    )
    _raises(
        area,
        InvalidJobState,
        lambda: store.prune_audit_older_than(datetime(2000, 1, 1)),
        "prune with a naive cutoff",
    )


# --- locks ---------------------------------------------------------------------------


@_case("locks", "the owner renews, another owner is refused, a non-owner's release does nothing")
def _lock_owner(kit: _Kit, store: StateStore) -> None:
    area, key = "locks", kit.name("lock")
    _check(store.acquire_runtime_lock(key, "a", _HOUR), area, "a free lock must be acquired.")
    _check(store.acquire_runtime_lock(key, "a", _HOUR), area, "the owner must be able to renew.")
    _check(not store.acquire_runtime_lock(key, "b", _HOUR), area, "another owner is refused.")
    store.release_runtime_lock(key, "b")
    _check(
        not store.acquire_runtime_lock(key, "b", _HOUR),
        area,
        "a release by a non-owner must not free the lock.",
    )


@_case("locks", "an expired lock can be taken by another owner")
def _lock_expiry(kit: _Kit, store: StateStore) -> None:
    area, key = "locks", kit.name("lock")
    _check(store.acquire_runtime_lock(key, "a", _AGE), area, "a free lock must be acquired.")
    time.sleep(_SETTLE)
    _check(store.acquire_runtime_lock(key, "b", _HOUR), area, "an expired lock must be takeable.")
    _check(
        not store.acquire_runtime_lock(key, "a", _HOUR),
        area,
        "the previous owner must not take back a lock it lost.",
    )


@_case("locks", "a released lock is free for the next owner")
def _lock_release(kit: _Kit, store: StateStore) -> None:
    area, key = "locks", kit.name("lock")
    store.acquire_runtime_lock(key, "a", _HOUR)
    store.release_runtime_lock(key, "a")
    _check(store.acquire_runtime_lock(key, "b", _HOUR), area, "a released lock must be free.")
    _raises(
        area,
        InvalidJobState,
        lambda: store.acquire_runtime_lock(key, "b", timedelta(0)),
        "acquire_runtime_lock with a zero ttl",
    )


@_case("locks", "runtime_lock holds the key for the block and raises LockHeld when taken")
def _lock_context(kit: _Kit, store: StateStore) -> None:
    area, key = "locks", kit.name("lock")
    with runtime_lock(store, key, "a", _HOUR):
        _check(
            not store.acquire_runtime_lock(key, "b", _HOUR),
            area,
            "the key must be held inside the block.",
        )
        _raises(
            area,
            LockHeld,
            lambda: runtime_lock(store, key, "b", _HOUR).__enter__(),
            "runtime_lock on a held key",
        )
    _check(store.acquire_runtime_lock(key, "b", _HOUR), area, "the block must release the key.")
    store.release_runtime_lock(key, "b")
    try:
        with runtime_lock(store, key, "a", _HOUR):
            raise KeyError("boom")
    except KeyError:
        pass
    _check(
        store.acquire_runtime_lock(key, "c", _HOUR),
        area,
        "the key must be released when the block raises.",
    )


# --- batches -------------------------------------------------------------------------


@_case("batches", "a batch claim takes up to limit ready jobs, each with its own claim")
def _batch_claim(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    jobs = _queue(kit, store, target, 5)
    (delayed,) = _queue(kit, store, target, run_after=_now() + _HOUR)
    first = store.claim_next_inhub_jobs([target], worker, timedelta(minutes=5), limit=3)
    _check(
        [job.id for job in first] == [job.id for job in jobs[:3]],
        area,
        "a batch claim must take the oldest ready jobs, oldest first, up to limit.",
    )
    _check(
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
    tokens = {_token(job) for job in first}
    _check(len(tokens) == 3, area, "every job of a batch must get its own claim_token.")
    rest = store.claim_next_inhub_jobs([target], worker, limit=10)
    _check(
        [job.id for job in rest] == [job.id for job in jobs[3:]],
        area,
        "a second batch must take the remaining ready jobs and skip the delayed one.",
    )
    _check(
        store.claim_next_inhub_jobs([target], worker, limit=10) == [],
        area,
        "with only a delayed job left a batch claim must return an empty list.",
    )
    stored = _present(area, store.get_job(delayed.id), "get_job")
    _check(stored.status == JobStatus.QUEUED, area, "the delayed job must stay queued.")


@_case("batches", "a batch claim takes at most one job of a thread, the thread's oldest")
def _batch_claim_threads(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    thread = kit.thread()
    threaded = _queue(kit, store, target, 3, thread_id=thread)
    loose = _queue(kit, store, target, 2)
    claimed = store.claim_next_inhub_jobs([target], worker, limit=10)
    ids = {job.id for job in claimed}
    _check(
        ids == {threaded[0].id, *(job.id for job in loose)},
        area,
        "a batch must take the thread's oldest job and every thread-less job, and leave the "
        f"thread's later jobs queued; took {len(ids)} jobs.",
    )
    for job in threaded[1:]:
        stored = _present(area, store.get_job(job.id), "get_job")
        _check(stored.status == JobStatus.QUEUED, area, "a thread's later jobs must wait.")
    store.complete_claimed_job(
        threaded[0].id, _token(_claimed_job(claimed, threaded[0].id)), "done"
    )
    following = store.claim_next_inhub_jobs([target], worker, limit=10)
    _check(
        [job.id for job in following] == [threaded[1].id],
        area,
        "once the thread's job is done the next batch must take exactly its next job.",
    )


@_case("batches", "bad batch claim arguments raise and claim nothing")
def _batch_claim_bad_arguments(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    (job,) = _queue(kit, store, target)
    limits: tuple[Any, ...] = (0, -1, True, "5", None)
    for limit in limits:
        _raises(
            area,
            InvalidJobState,
            functools.partial(store.claim_next_inhub_jobs, [target], worker, limit=limit),
            f"claim_next_inhub_jobs(limit={limit!r})",
        )
    _raises(
        area,
        InvalidJobState,
        lambda: store.claim_next_inhub_jobs([target], "", limit=1),
        "claim_next_inhub_jobs with an empty worker_id",
    )
    _check(
        store.claim_next_inhub_jobs([], worker, limit=5) == [],
        area,
        "empty targets must answer an empty list.",
    )
    stored = _present(area, store.get_job(job.id), "get_job")
    _check(stored.status == JobStatus.QUEUED, area, "a refused batch claim must claim nothing.")


@_case("batches", "a batch of reports answers per report, in order, each fenced by its token")
def _batch_complete(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    _queue(kit, store, target, 3)
    first, second, third = store.claim_next_inhub_jobs([target], worker, limit=3)
    missing = uuid.uuid4()
    results = store.complete_claimed_jobs(
        [
            ClaimReport(first.id, _token(first), JobStatus.DONE, {"result": {"n": 1}}),
            ClaimReport(missing, uuid.uuid4(), JobStatus.DONE),
            ClaimReport(second.id, uuid.uuid4(), JobStatus.DONE, {"result": {"n": 2}}),
            ClaimReport(str(third.id), str(third.claim_token), JobStatus.ERROR, {"error": "x"}),
        ]
    )
    outcomes = [result.outcome for result in results]
    _check(
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
    done = _present(area, results[0].job, "the completed job")
    _check(
        done.status == JobStatus.DONE
        and done.result == {"n": 1}
        and all(value is None for value in _claim_fields(done).values()),
        area,
        "a current report in a batch must write its status and patch and clear the claim.",
    )
    failed = _present(area, results[3].job, "the failed job")
    _check(
        failed.status == JobStatus.ERROR and failed.error == "x",
        area,
        "each report in a batch must write its own status and patch.",
    )
    stale = _present(area, store.get_job(second.id), "get_job")
    _check(
        stale.status == JobStatus.RUNNING
        and stale.result is None
        and stale.claim_token == second.claim_token,
        area,
        "a report with a wrong token must leave its job untouched.",
    )
    _check(store.complete_claimed_jobs([]) == [], area, "an empty batch must answer [].")


@_case("batches", "a batch with one bad report raises and writes nothing")
def _batch_complete_bad(kit: _Kit, store: StateStore) -> None:
    area, target, worker = "batches", kit.name("target"), kit.name("worker")
    _queue(kit, store, target, 2)
    first, second = store.claim_next_inhub_jobs([target], worker, limit=2)
    good = ClaimReport(first.id, _token(first), JobStatus.DONE)
    bad_batches: list[tuple[Any, type[BaseException], str]] = [
        ([good, ClaimReport(second.id, _token(second), "running")], InvalidJobState, "running"),
        (
            [good, ClaimReport(second.id, _token(second), "done", {"id": uuid.uuid4()})],
            ImmutableField,
            "a patch of the id",
        ),
        ([good, ClaimReport(second.id, "not-a-uuid", "done")], InvalidJobState, "a bad token"),
        ([good, ClaimReport(first.id, _token(first), "error")], InvalidJobState, "a job twice"),
        ([good, (second.id, _token(second), "done")], InvalidJobState, "a tuple"),
    ]
    for batch, error, what in bad_batches:
        _raises(
            area,
            error,
            functools.partial(store.complete_claimed_jobs, batch),
            f"complete_claimed_jobs with {what}",
        )
    for job in (first, second):
        stored = _present(area, store.get_job(job.id), "get_job")
        _check(
            stored.status == JobStatus.RUNNING and stored.claim_token == job.claim_token,
            area,
            "a refused batch must write nothing, not even its good reports.",
        )


def _claimed_job(jobs: Iterable[Any], job_id: uuid.UUID) -> Any:
    for job in jobs:
        if job.id == job_id:
            return job
    raise _fail("batches", f"job {job_id} is not in the batch.")


# --- concurrency ---------------------------------------------------------------------


def _burst(kit: _Kit, call: Callable[[int], _T]) -> list[_T]:
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


@_case("concurrency", "a burst of {n} concurrent claims on {n} jobs claims each job once")
def _burst_claims(kit: _Kit, store: StateStore) -> None:
    area, target = "concurrency", kit.name("target")
    jobs = _queue(kit, store, target, kit.concurrency)
    claimed = _burst(kit, lambda i: store.claim_next_job([target], f"{kit.ns}.exec-{i}"))
    ids = [job.id for job in claimed if job is not None]
    _check(
        sorted(ids) == sorted(job.id for job in jobs),
        area,
        f"{len(ids)} claims ({len(set(ids))} distinct) for {len(jobs)} jobs: every job must "
        "be claimed exactly once. Claim with one atomic conditional write.",
    )


@_case("concurrency", "a burst of {n} concurrent batch claims claims each job once")
def _burst_batch_claims(kit: _Kit, store: StateStore) -> None:
    area, target = "concurrency", kit.name("target")
    jobs = _queue(kit, store, target, 3 * kit.concurrency)
    batches = _burst(
        kit, lambda i: store.claim_next_inhub_jobs([target], f"{kit.ns}.w-{i}", limit=5)
    )
    ids = [job.id for batch in batches for job in batch]
    ids += [job.id for job in store.claim_next_inhub_jobs([target], kit.name("w"), limit=1000)]
    _check(
        sorted(ids) == sorted(job.id for job in jobs),
        area,
        f"{len(ids)} claims ({len(set(ids))} distinct) for {len(jobs)} jobs: concurrent "
        "batches must claim every job exactly once.",
    )


@_case("concurrency", "a burst of {n} acquisitions of one free lock has exactly one winner")
def _burst_locks(kit: _Kit, store: StateStore) -> None:
    area, key = "concurrency", kit.name("lock")
    won = _burst(kit, lambda i: store.acquire_runtime_lock(key, f"owner-{i}", _HOUR))
    _check(
        sum(1 for result in won if result) == 1,
        area,
        f"{sum(1 for result in won if result)} owners acquired one lock; expected exactly 1.",
    )


@_case("concurrency", "a burst of {n} enqueues of one request creates one job")
def _burst_enqueue(kit: _Kit, store: StateStore) -> None:
    area = "concurrency"
    request_id, target = kit.name("req"), kit.name("target")
    outcomes = _burst(
        kit, lambda i: store.enqueue(request_id=request_id, target=target, input={"n": 1})
    )
    ids = {job.id for job, _ in outcomes}
    created = sum(1 for _, was_created in outcomes if was_created)
    _check(
        len(ids) == 1 and created == 1,
        area,
        f"{created} of {kit.concurrency} concurrent enqueues created a job ({len(ids)} "
        "distinct ids); exactly one may create it, the rest must get it back.",
    )
