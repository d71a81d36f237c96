"""Property tests over the public state-store API (``get_state_store()``), on the database
store and on the in-memory reference store.

Two properties, for every method:

- **Valid input round-trips**: what goes in (arbitrary strict JSON, any storable text,
  aware instants at any UTC offset Python allows) comes out equal; JSON is compared as
  canonical text, so ``1``, ``1.0`` and ``true`` stay apart.
- **Malformed input is refused before anything is written**: the call raises an error
  of the package (``JobStateError``) or a plain ``ValueError`` / ``TypeError`` (never a
  raw database error, never a bare ``UnicodeError``, never a quiet ``None`` or
  ``False``), and a snapshot of every jobstate table is the same afterwards.

Each example runs in a savepoint that is rolled back (the memory store: a fresh store),
so examples never see each other's rows. The suite runs on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from jobstate.models import Job, Notification
from jobstate.stores import get_state_store
from jobstate.stores.base import (
    TERMINAL_JOB_STATUSES,
    ClaimReport,
    JobStatus,
    NotificationRequest,
    StateStore,
)
from jobstate.stores.contracts.audit import AuditSeverity, AuditStage
from jobstate.stores.contracts.validation import (
    ENQUEUE_FIELDS,
    JOB_CLAIM_FIELDS,
    JOB_IDENTITY_FIELDS,
    JOB_PATCH_FIELDS,
)
from jobstate.testing.memory_state import MemoryStateStore
from tests.support.strategies import (
    PAYLOAD_LIMIT,
    Call,
    assert_refused,
    aware_datetimes,
    bad_counts,
    bad_durations,
    bad_ids,
    bad_instants,
    bad_json_objects,
    bad_json_values,
    bad_names,
    database_snapshot,
    json_objects,
    json_values,
    names,
    positive_durations,
    storable_text,
    unknown_choices,
    unstorable_text,
)

pytestmark = pytest.mark.django_db

PROPERTIES = hypothesis_settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

CREATE_FIELDS = JOB_PATCH_FIELDS | {"request_id"}
ENQUEUE_ALLOWED = ENQUEUE_FIELDS | {"request_id"}
REPORT_FIELDS = JOB_PATCH_FIELDS - {"status", *JOB_CLAIM_FIELDS}
JSON_FIELDS = {"input", "result", "report", "usage", "metadata", "attempt_log"}
STATUSES = set(JobStatus.values)


# --- harnesses: one per store kind ---------------------------------------------------------


@dataclass
class World:
    """What every example starts from: a queued job, a job an in-process worker holds,
    a finished job, an audit entry and a held runtime lock."""

    queued: Job
    running: Job
    done: Job


def seed(store: StateStore) -> World:
    queued = store.create_job(request_id="seed-queued", target="seed")
    store.create_job(request_id="seed-running", target="seed-worker")
    running = store.claim_next_inhub_job(["seed-worker"], "seed-worker-1")
    assert running is not None
    done = store.create_job(request_id="seed-done", target="seed", status=JobStatus.DONE)
    store.append_audit(job=queued, event="received")
    assert store.acquire_runtime_lock("seed-lock", "seed-owner", timedelta(minutes=5))
    return World(queued=queued, running=running, done=done)


class DatabaseHarness:
    def __init__(self) -> None:
        self.store: StateStore = get_state_store()

    @contextmanager
    def example(self) -> Iterator[StateStore]:
        # A savepoint per example, always rolled back: the next example starts clean.
        with transaction.atomic():
            yield self.store
            transaction.set_rollback(True)

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        return database_snapshot()


class MemoryHarness:
    def __init__(self) -> None:
        self.store: StateStore = MemoryStateStore()

    @contextmanager
    def example(self) -> Iterator[StateStore]:
        self.store = MemoryStateStore()
        yield self.store

    def snapshot(self) -> dict[str, Any]:
        """Everything the memory store holds (its lock and clock are not state)."""
        state = {k: v for k, v in vars(self.store).items() if k not in {"_mutex", "_clock"}}
        return copy.deepcopy(state)


Harness = DatabaseHarness | MemoryHarness


@pytest.fixture(params=[DatabaseHarness, MemoryHarness], ids=["database", "memory"])
def harness(request: pytest.FixtureRequest) -> Harness:
    made: Harness = request.param()
    return made


@pytest.fixture
def database() -> DatabaseHarness:
    return DatabaseHarness()


@pytest.fixture(autouse=True)
def small_payload_limit(settings: Any) -> None:
    settings.JOBSTATE = {**settings.JOBSTATE, "MAX_PAYLOAD_BYTES": PAYLOAD_LIMIT}


def rejects(harness: Harness, world: World, call: Call) -> None:
    assert_refused(call, (harness.store, world), harness.snapshot)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def assert_job_has(job: Job | None, fields: dict[str, Any]) -> None:
    assert job is not None
    for name, value in fields.items():
        stored = getattr(job, name)
        if name in JSON_FIELDS:
            assert canonical(stored) == canonical(value), name
        else:
            assert stored == value, name


# --- valid job fields ----------------------------------------------------------------------

_instants = st.one_of(st.none(), aware_datetimes)

VALID_JOB_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "status": st.sampled_from(sorted(STATUSES)),
    "target": st.one_of(st.none(), names()),
    "source": storable_text(),
    "thread_id": st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    "session_id": st.one_of(st.none(), storable_text()),
    "input": json_values,
    "input_preview": storable_text(max_size=60),
    "result": json_values,
    "report": json_values,
    "usage": json_values,
    "error": st.one_of(st.none(), storable_text(max_size=60)),
    "metadata": json_objects,
    "callback_url": st.one_of(st.none(), storable_text()),
    "attempts": st.integers(0, 2**31 - 1),
    "run_after": _instants,
    "claimed_at": _instants,
    "lease_until": _instants,
    "executor_id": st.one_of(st.none(), storable_text()),
    "dispatched_at": _instants,
    "claim_token": st.one_of(st.none(), st.uuids()),
    "task_path": st.one_of(st.none(), names()),
    "queue_name": st.one_of(st.none(), names(max_size=100)),
    "priority": st.integers(-(2**31), 2**31 - 1),
    "max_attempts": st.one_of(st.none(), st.integers(0, 2**31 - 1)),
    "attempt_log": st.one_of(st.none(), st.lists(json_objects, max_size=3)),
}


def job_fields(allowed: set[str] | frozenset[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={name: VALID_JOB_VALUES[name] for name in sorted(allowed & set(VALID_JOB_VALUES))},
    )


# --- malformed job fields -------------------------------------------------------------------

_TEXT_LIMITS = {
    "request_id": 200,
    "target": 200,
    "source": 100,
    "session_id": 200,
    "executor_id": 200,
    "callback_url": 2000,
    "input_preview": None,
    "error": None,
    "task_path": 300,
    "queue_name": 100,
}
_REQUIRED = {"request_id", "status", "source", "input_preview", "attempts", "metadata", "priority"}
_INSTANTS = {"run_after", "claimed_at", "lease_until", "dispatched_at"}
_not_text = st.one_of(st.integers(), st.booleans(), st.binary(max_size=4), st.lists(st.integers()))


def bad_job_values(name: str) -> st.SearchStrategy[Any]:
    """What field ``name`` of a job may not be given."""
    options: list[st.SearchStrategy[Any]] = []
    if name in _REQUIRED:
        options.append(st.none())
    if name == "status":
        options.append(unknown_choices(STATUSES))
    elif name in _TEXT_LIMITS:
        options += [unstorable_text, _not_text]
        limit = _TEXT_LIMITS[name]
        if limit is not None:
            options.append(st.integers(1, 30).map(lambda extra: "u" * (limit + extra)))
        if name == "request_id":
            options.append(st.sampled_from(["", "   "]))
    elif name == "metadata":
        options.append(bad_json_objects)
    elif name == "attempt_log":
        options += [bad_json_values, json_objects, st.lists(st.integers(), min_size=1)]
    elif name in JSON_FIELDS:
        options.append(bad_json_values)
    elif name in _INSTANTS:
        options.append(bad_instants())
    elif name == "thread_id":
        options += [
            st.integers(min_value=2**63),
            st.integers(max_value=-(2**63) - 1),
            st.booleans(),
            st.floats(),
            storable_text(),
        ]
    elif name in ("attempts", "max_attempts"):
        options += [
            st.integers(max_value=-1),
            st.integers(min_value=2**31),
            st.booleans(),
            st.floats(),
            storable_text(),
        ]
    elif name == "priority":
        options += [
            st.integers(max_value=-(2**31) - 1),
            st.integers(min_value=2**31),
            st.booleans(),
            st.floats(),
            storable_text(),
        ]
    elif name == "claim_token":
        options.append(bad_ids.filter(lambda value: value is not None))
    return st.one_of(options)


def bad_job_field(allowed: set[str] | frozenset[str]) -> st.SearchStrategy[tuple[str, Any]]:
    return st.sampled_from(sorted(allowed)).flatmap(
        lambda name: st.tuples(st.just(name), bad_job_values(name))
    )


#: Field names no job has.
unknown_fields = names(max_size=20).filter(
    lambda name: name not in JOB_PATCH_FIELDS | JOB_IDENTITY_FIELDS and name.isidentifier()
)


def intake_call(method: str, name: str, value: Any) -> Call:
    def make(store: StateStore, world: World) -> Any:
        return getattr(store, method)(**{"request_id": "new-job", name: value})

    return Call(f"{method}(request_id='new-job', {name}={value!r})", make)


def update_call(name: str, value: Any, *, conditional: bool = False) -> Call:
    def make(store: StateStore, world: World) -> Any:
        if conditional:
            return store.update_job_if_status(world.queued.id, ["queued"], **{name: value})
        return store.update_job(world.queued.id, **{name: value})

    method = "update_job_if_status(queued, ['queued']" if conditional else "update_job(queued"
    return Call(f"{method}, {name}={value!r})", make)


def intake_calls(method: str, allowed: frozenset[str]) -> st.SearchStrategy[Call]:
    """``create_job`` / ``enqueue`` with one malformed, unknown or refused field."""
    refused = sorted((CREATE_FIELDS | JOB_IDENTITY_FIELDS) - allowed)
    return st.one_of(
        bad_job_field(allowed).map(lambda pair: intake_call(method, *pair)),
        st.sampled_from(refused).map(lambda name: intake_call(method, name, "x")),
        st.tuples(unknown_fields, json_values).map(lambda pair: intake_call(method, *pair)),
        st.just(Call(f"{method}() without a request_id", lambda s, w: getattr(s, method)())),
    )


#: A list of statuses that is not one: a bare string, an unknown status, not a list.
bad_status_lists = st.one_of(
    st.sampled_from(sorted(STATUSES)),
    st.lists(unknown_choices(STATUSES), min_size=1, max_size=2).map(lambda xs: ["queued", *xs]),
    st.integers(),
    st.none(),
)

#: Targets a sweep or a listing may not be narrowed to (``None`` means every target).
bad_scopes = st.one_of(
    names(),
    st.lists(
        st.one_of(unstorable_text, st.just(""), st.integers(), st.none()), min_size=1, max_size=2
    ).map(lambda xs: ["seed", *xs]),
    st.integers(),
)

#: Targets a claim may not take: those, and ``None``.
bad_targets = st.one_of(bad_scopes, st.none())

update_calls = st.one_of(
    bad_job_field(JOB_PATCH_FIELDS).map(lambda pair: update_call(*pair)),
    bad_job_field(JOB_PATCH_FIELDS).map(lambda pair: update_call(*pair, conditional=True)),
    st.sampled_from(sorted(JOB_IDENTITY_FIELDS)).map(lambda name: update_call(name, "x")),
    st.tuples(unknown_fields, json_values).map(lambda pair: update_call(*pair)),
    bad_ids.map(
        lambda job_id: Call(
            f"update_job({job_id!r}, error='x')", lambda s, w: s.update_job(job_id, error="x")
        )
    ),
    bad_status_lists.map(
        lambda statuses: Call(
            f"update_job_if_status(queued, {statuses!r}, error='x')",
            lambda s, w: s.update_job_if_status(w.queued.id, statuses, error="x"),
        )
    ),
)


# --- valid input round-trips ---------------------------------------------------------------


@PROPERTIES
@given(request_id=names(max_size=200), fields=job_fields(JOB_PATCH_FIELDS))
@example(request_id="big-float", fields={"input": {"x": 1.5}, "metadata": {"n": -(2**70)}})
@example(request_id="escape", fields={"input": "C:\\u0000", "metadata": {"k\\u0000": 1}})
@example(
    request_id="offsets",
    fields={
        "run_after": datetime(2020, 1, 1, tzinfo=timezone(timedelta(hours=16))),
        "claimed_at": datetime(
            2020, 1, 1, tzinfo=timezone(timedelta(hours=1, seconds=7, microseconds=5))
        ),
    },
)
def test_create_job_keeps_what_it_was_given(
    harness: Harness, request_id: str, fields: dict[str, Any]
) -> None:
    with harness.example() as store:
        job = store.create_job(request_id=request_id, **fields)
        assert_job_has(job, {"request_id": request_id, **fields})
        assert_job_has(store.get_job(job.id), {"request_id": request_id, **fields})
        assert store.find_by_request_id(request_id) == job


@PROPERTIES
@given(request_id=names(max_size=200), fields=job_fields(ENQUEUE_FIELDS))
@example(request_id="float-1e16", fields={"input": {"x": 123456789.125}})
def test_enqueue_replays_the_same_request(
    harness: Harness, request_id: str, fields: dict[str, Any]
) -> None:
    with harness.example() as store:
        job, created = store.enqueue(request_id=request_id, **fields)
        assert created
        assert_job_has(job, {"request_id": request_id, "status": "queued", **fields})
        again, created_again = store.enqueue(request_id=request_id, **fields)
        assert (again.id, created_again) == (job.id, False)
        assert_job_has(again, fields)


@PROPERTIES
@given(patch=job_fields(JOB_PATCH_FIELDS))
def test_update_job_writes_exactly_the_patch(harness: Harness, patch: dict[str, Any]) -> None:
    with harness.example() as store:
        world = seed(store)
        updated = store.update_job(world.queued.id, **patch)
        assert_job_has(updated, {"request_id": "seed-queued", **patch})
        assert_job_has(store.get_job(world.queued.id), patch)
        again = store.update_job_if_status(world.done.id, ["done"], **patch)
        assert_job_has(again, {"request_id": "seed-done", **patch})


@PROPERTIES
@given(
    status=st.sampled_from(["done", "error", "rejected", "queued"]),
    patch=job_fields(REPORT_FIELDS),
    batch=st.booleans(),
)
def test_fenced_report_writes_the_patch_and_clears_the_claim(
    harness: Harness, status: str, patch: dict[str, Any], batch: bool
) -> None:
    with harness.example() as store:
        world = seed(store)
        token = world.running.claim_token
        assert token is not None
        if batch:
            (result,) = store.complete_claimed_jobs(
                [ClaimReport(world.running.id, token, status, patch)]
            )
        else:
            result = store.complete_claimed_job(world.running.id, token, status, **patch)
        assert result.completed
        cleared = dict.fromkeys(JOB_CLAIM_FIELDS)
        assert_job_has(result.job, {**patch, **cleared, "status": status})
        assert_job_has(store.get_job(world.running.id), {**patch, **cleared, "status": status})


@PROPERTIES
@given(
    event=names(max_size=100),
    stage=st.one_of(st.none(), st.sampled_from(AuditStage.values)),
    severity=st.one_of(st.none(), st.sampled_from(AuditSeverity.values)),
    title=storable_text(),
    summary=storable_text(max_size=100),
    detail=st.one_of(st.none(), json_objects),
    at=st.one_of(st.none(), aware_datetimes),
)
def test_audit_entries_keep_what_they_were_given(
    harness: Harness,
    event: str,
    stage: str | None,
    severity: str | None,
    title: str,
    summary: str,
    detail: dict[str, Any] | None,
    at: datetime | None,
) -> None:
    with harness.example() as store:
        world = seed(store)
        entry = store.append_audit(
            job=world.done,
            event=event,
            stage=stage,
            severity=severity,
            title=title,
            summary=summary,
            detail=detail,
            at=at,
        )
        (listed,) = [e for e in store.list_audit(job=world.done) if e.id == entry.id]
        for stored in (entry, listed):
            assert stored.event == event
            assert (stored.job_id, stored.request_id) == (world.done.id, "seed-done")
            assert canonical(stored.detail) == canonical(detail or {})
            assert stage is None or stored.stage == stage
            assert severity is None or stored.severity == severity
            assert not title or stored.title == title
            assert not summary or stored.summary == summary
            assert at is None or stored.ts == at


@PROPERTIES
@given(lock_key=names(max_size=200), owner=names(max_size=200), ttl=positive_durations)
def test_runtime_locks_take_any_storable_key(
    harness: Harness, lock_key: str, owner: str, ttl: timedelta
) -> None:
    with harness.example() as store:
        assert store.acquire_runtime_lock(lock_key, owner, ttl)
        assert store.acquire_runtime_lock(lock_key, owner, ttl)
        store.release_runtime_lock(lock_key, owner)
        assert store.acquire_runtime_lock(lock_key, f"{owner}-other", ttl)


_requests = st.lists(
    st.builds(
        NotificationRequest,
        channel=st.sampled_from(["webhook", "email", "callable"]),
        destination=names(max_size=60),
        payload=json_objects,
        idempotency_key=names(max_size=200),
    ),
    max_size=3,
    unique_by=lambda request: request.idempotency_key,
)


@PROPERTIES
@given(
    status=st.sampled_from(sorted(TERMINAL_JOB_STATUSES)),
    result=json_values,
    requests=_requests,
)
def test_completion_with_notifications_keeps_every_payload(
    database: DatabaseHarness, status: str, result: Any, requests: list[NotificationRequest]
) -> None:
    with database.example() as store:
        world = seed(store)
        job = store.complete_job_with_notifications(
            world.running, {"status": status, "result": result}, requests
        )
        assert_job_has(job, {"status": status, "result": result})
        stored = {n.idempotency_key: n for n in Notification.objects.filter(job_id=job.id)}
        assert sorted(stored) == sorted(str(r.idempotency_key) for r in requests)
        for request in requests:
            notification = stored[str(request.idempotency_key)]
            assert (notification.channel, notification.destination) == (
                request.channel,
                request.destination,
            )
            assert canonical(notification.payload) == canonical(request.payload)


# --- malformed input is refused and writes nothing -------------------------------------------

# Bugs these properties found, kept as regression examples (each raised a raw database
# error on PostgreSQL, stored something SQLite kept and PostgreSQL refuses, or escaped
# as an OverflowError / UnicodeEncodeError / IntegrityError from the driver).
NUL_TARGET = Call(
    "claim_next_job(['a\\x00'], 'executor')", lambda s, w: s.claim_next_job(["a\x00"], "executor")
)
NUL_AUDIT_TITLE = Call(
    "append_audit(event='e', title='a\\x00')", lambda s, w: s.append_audit(event="e", title="a\x00")
)
HUGE_LEASE = Call(
    "claim_next_inhub_job(['seed-worker'], 'w', lease=timedelta.max)",
    lambda s, w: s.claim_next_inhub_job(["seed"], "w", lease=timedelta.max),
)
HUGE_LOCK_TTL = Call(
    "acquire_runtime_lock('k', 'o', timedelta.max)",
    lambda s, w: s.acquire_runtime_lock("k", "o", timedelta.max),
)
HUGE_LIMIT = Call(
    "list_jobs_by_status(['queued'], limit=2**70)",
    lambda s, w: s.list_jobs_by_status(["queued"], limit=2**70),
)
YEAR_ZERO = Call(
    "create_job(run_after=0001-01-01T00:00+05:00)",
    lambda s, w: s.create_job(
        request_id="new-job", run_after=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5)))
    ),
)
SURROGATE_REQUEST_ID = Call(
    "create_job(request_id='a\\ud800')", lambda s, w: s.create_job(request_id="a\ud800")
)
FLOAT_1E16 = Call(
    "create_job(input={'x': 1e16})",
    lambda s, w: s.create_job(request_id="new-job", input={"x": 1e16}),
)
NEGATIVE_ZERO = Call(
    "enqueue(input=-0.0)", lambda s, w: s.enqueue(request_id="new-job", input=-0.0)
)
NONE_TARGETS = Call(
    "claim_next_inhub_job(None, 'w')", lambda s, w: s.claim_next_inhub_job(None, "w")
)


@PROPERTIES
@given(
    call=st.one_of(
        intake_calls("create_job", CREATE_FIELDS), intake_calls("enqueue", ENQUEUE_ALLOWED)
    )
)
@example(call=YEAR_ZERO)
@example(call=SURROGATE_REQUEST_ID)
@example(call=FLOAT_1E16)
@example(call=NEGATIVE_ZERO)
def test_intake_refuses_malformed_jobs(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


@PROPERTIES
@given(call=update_calls)
def test_updates_refuse_malformed_patches(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


def _claim_calls() -> st.SearchStrategy[Call]:
    def claim(method: str, targets: Any, owner: Any, lease: Any) -> Call:
        return Call(
            f"{method}({targets!r}, {owner!r}, lease={lease!r})",
            lambda s, w: getattr(s, method)(targets, owner, lease),
        )

    def batch(targets: Any, owner: Any, lease: Any, limit: Any) -> Call:
        return Call(
            f"claim_next_inhub_jobs({targets!r}, {owner!r}, lease={lease!r}, limit={limit!r})",
            lambda s, w: s.claim_next_inhub_jobs(targets, owner, lease, limit=limit),
        )

    methods = st.sampled_from(["claim_next_job", "claim_next_inhub_job"])
    lease = bad_durations(allow_zero=False, allow_none=True)
    return st.one_of(
        st.builds(claim, methods, bad_targets, st.just("worker"), st.none()),
        st.builds(claim, methods, st.just(["seed"]), bad_names(), st.none()),
        st.builds(claim, methods, st.just(["seed"]), st.just("worker"), lease),
        st.builds(batch, bad_targets, st.just("worker"), st.none(), st.just(2)),
        st.builds(batch, st.just(["seed"]), bad_names(), st.none(), st.just(2)),
        st.builds(batch, st.just(["seed"]), st.just("worker"), lease, st.just(2)),
        st.builds(batch, st.just(["seed"]), st.just("worker"), st.none(), bad_counts),
    )


@PROPERTIES
@given(call=_claim_calls())
@example(call=NUL_TARGET)
@example(call=HUGE_LEASE)
@example(call=NONE_TARGETS)
def test_claims_refuse_malformed_arguments(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


def _report_calls() -> st.SearchStrategy[Call]:
    def report(job_id: Any, token: Any, status: Any, patch: dict[str, Any]) -> Call:
        def make(s: StateStore, w: World) -> Any:
            pk = w.running.id if job_id is None else job_id
            claim_token = w.running.claim_token if token is None else token
            return s.complete_claimed_job(pk, claim_token, status, **patch)

        return Call(f"complete_claimed_job({job_id!r}, {token!r}, {status!r}, **{patch!r})", make)

    def batch(reports: Callable[[World], Any], label: str) -> Call:
        return Call(
            f"complete_claimed_jobs({label})", lambda s, w: s.complete_claimed_jobs(reports(w))
        )

    def good(w: World) -> ClaimReport:
        assert w.running.claim_token is not None
        return ClaimReport(w.running.id, w.running.claim_token, "done")

    def with_bad(name: str, value: Any) -> Call:
        return batch(
            lambda w: [good(w), ClaimReport(w.queued.id, uuid.uuid4(), "done", {name: value})],
            f"[good, report with {name}={value!r}]",
        )

    def extend(job_id: Any, token: Any, lease: Any) -> Call:
        def make(s: StateStore, w: World) -> Any:
            pk = w.running.id if job_id is None else job_id
            claim_token = w.running.claim_token if token is None else token
            return s.extend_claim_lease(pk, claim_token, lease)

        return Call(f"extend_claim_lease({job_id!r}, {token!r}, {lease!r})", make)

    not_ids = bad_ids.filter(lambda value: value is not None)
    release_statuses = st.one_of(
        unknown_choices(STATUSES), st.sampled_from(["running", "dispatched"])
    )
    refused = sorted({"status", *JOB_CLAIM_FIELDS, *JOB_IDENTITY_FIELDS})
    return st.one_of(
        st.builds(report, not_ids, st.none(), st.just("done"), st.just({})),
        st.builds(report, st.none(), not_ids, st.just("done"), st.just({})),
        st.builds(report, st.none(), st.none(), release_statuses, st.just({})),
        bad_job_field(REPORT_FIELDS).map(
            lambda pair: report(None, None, "done", {pair[0]: pair[1]})
        ),
        st.sampled_from(refused).map(lambda name: report(None, None, "done", {name: None})),
        bad_job_field(REPORT_FIELDS).map(lambda pair: with_bad(*pair)),
        st.sampled_from(["done", b"x", 5, None, {"job_id": 1}]).map(
            lambda reports: batch(lambda w: reports, repr(reports))
        ),
        st.just(batch(lambda w: [good(w), object()], "[good, object()]")),
        st.just(batch(lambda w: [good(w), good(w)], "[good, the same job again]")),
        st.builds(extend, not_ids, st.none(), st.none()),
        st.builds(extend, st.none(), not_ids, st.none()),
        st.builds(extend, st.none(), st.none(), bad_durations(allow_zero=False, allow_none=True)),
    )


@PROPERTIES
@given(call=_report_calls())
def test_fenced_reports_refuse_malformed_arguments(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


def _maintenance_calls() -> st.SearchStrategy[Call]:
    def method(name: str, *args: Any, **kwargs: Any) -> Call:
        shown = ", ".join([*map(repr, args), *(f"{k}={v!r}" for k, v in kwargs.items())])
        return Call(f"{name}({shown})", lambda s, w: getattr(s, name)(*args, **kwargs))

    hour = timedelta(hours=1)
    duration = bad_durations(allow_none=True)
    return st.one_of(
        duration.map(lambda d: method("requeue_stale_dispatched", d)),
        duration.map(lambda d: method("requeue_stale_dispatched", hour, d)),
        bad_scopes.map(lambda t: method("requeue_stale_dispatched", targets=t)),
        duration.map(lambda d: method("expire_stale_queued", d)),
        bad_scopes.map(lambda t: method("expire_stale_queued", targets=t)),
        bad_status_lists.map(lambda x: method("list_jobs_by_status", x)),
        duration.map(lambda d: method("list_jobs_by_status", ["queued"], d)),
        bad_scopes.map(lambda t: method("list_jobs_by_status", ["queued"], targets=t)),
        bad_counts.map(lambda n: method("list_jobs_by_status", ["queued"], limit=n)),
        bad_status_lists.map(lambda x: method("list_expired_leases", x, hour)),
        bad_durations().map(lambda d: method("list_expired_leases", ["running"], d)),
        bad_scopes.map(lambda t: method("list_expired_leases", ["running"], hour, targets=t)),
        bad_counts.map(lambda n: method("list_expired_leases", ["running"], hour, limit=n)),
        st.one_of(st.integers(min_value=2**63), st.booleans(), storable_text(), st.none()).map(
            lambda t: method("count_inflight_by_thread", t)
        ),
        bad_names().map(lambda e: method("extend_executor_leases", e)),
        bad_durations(allow_zero=False, allow_none=True).map(
            lambda d: method("extend_executor_leases", "executor", d)
        ),
        bad_instants().map(lambda c: method("prune_audit_older_than", c)),
        bad_counts.map(
            lambda n: method(
                "prune_audit_older_than", datetime(2000, 1, 1, tzinfo=UTC), batch_size=n
            )
        ),
    )


@PROPERTIES
@given(call=_maintenance_calls())
@example(call=HUGE_LIMIT)
def test_sweeps_and_listings_refuse_malformed_arguments(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


def _audit_calls() -> st.SearchStrategy[Call]:
    def append(**fields: Any) -> Call:
        arguments = {"event": "checked", **fields}
        shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())

        def make(s: StateStore, w: World) -> Any:
            return s.append_audit(job=w.queued, **arguments)

        return Call(f"append_audit(job=queued, {shown})", make)

    def listing(**kwargs: Any) -> Call:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return Call(f"list_audit({shown})", lambda s, w: s.list_audit(**kwargs))

    return st.one_of(
        bad_names(max_length=100).map(lambda v: append(event=v)),
        unknown_choices(set(AuditStage.values))
        .filter(lambda v: v is not None)
        .map(lambda v: append(stage=v)),
        unknown_choices(set(AuditSeverity.values))
        .filter(lambda v: v is not None)
        .map(lambda v: append(severity=v)),
        st.one_of(unstorable_text, st.integers(), st.none()).map(lambda v: append(title=v)),
        st.one_of(unstorable_text, st.integers(), st.none()).map(lambda v: append(summary=v)),
        bad_json_objects.map(lambda v: append(detail=v)),
        bad_instants().map(lambda v: append(at=v)),
        st.one_of(unstorable_text, st.integers(), st.just("r" * 201)).map(
            lambda v: append(request_id=v)
        ),
        bad_ids.filter(lambda v: v is not None).map(
            lambda v: Call(
                f"append_audit(job={v!r}, event='e')", lambda s, w: s.append_audit(job=v, event="e")
            )
        ),
        st.just(listing()),
        bad_ids.filter(lambda v: v is not None).map(lambda v: listing(job=v)),
        bad_names().filter(lambda v: v is not None).map(lambda v: listing(request_id=v)),
        bad_counts.map(lambda n: listing(request_id="seed-queued", limit=n)),
    )


@PROPERTIES
@given(call=_audit_calls())
@example(call=NUL_AUDIT_TITLE)
def test_audit_refuses_malformed_entries(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


def _lock_calls() -> st.SearchStrategy[Call]:
    def acquire(key: Any, owner: Any, ttl: Any) -> Call:
        return Call(
            f"acquire_runtime_lock({key!r}, {owner!r}, {ttl!r})",
            lambda s, w: s.acquire_runtime_lock(key, owner, ttl),
        )

    def release(key: Any, owner: Any) -> Call:
        return Call(
            f"release_runtime_lock({key!r}, {owner!r})",
            lambda s, w: s.release_runtime_lock(key, owner),
        )

    minute = timedelta(minutes=1)
    return st.one_of(
        st.builds(acquire, bad_names(), st.just("owner"), st.just(minute)),
        st.builds(acquire, st.just("seed-lock"), bad_names(), st.just(minute)),
        st.builds(
            acquire, st.just("seed-lock"), st.just("seed-owner"), bad_durations(allow_zero=False)
        ),
        st.builds(release, bad_names(), st.just("seed-owner")),
        st.builds(release, st.just("seed-lock"), bad_names()),
    )


@PROPERTIES
@given(call=_lock_calls())
@example(call=HUGE_LOCK_TTL)
def test_runtime_locks_refuse_malformed_arguments(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


def _continuation_calls() -> st.SearchStrategy[Call]:
    def requeue(
        statuses: Any = ("done",), by: Any = "op", via: Any = "admin", event: Any = "rerun"
    ) -> Call:
        return Call(
            f"requeue_job(done, from_statuses={statuses!r}, by={by!r}, via={via!r}, "
            f"event={event!r})",
            lambda s, w: s.requeue_job(
                w.done.id, from_statuses=statuses, by=by, via=via, event=event
            ),
        )

    def reject(by: Any = "op", reason: Any = "") -> Call:
        return Call(
            f"reject_queued_job(queued, by={by!r}, reason={reason!r})",
            lambda s, w: s.reject_queued_job(w.queued.id, by=by, reason=reason),
        )

    def approve(decision: Any = "d-1", approver: Any = "op", comment: Any = "") -> Call:
        return Call(
            f"requeue_approved_job_once(done, {decision!r}, {approver!r}, {comment!r})",
            lambda s, w: s.requeue_approved_job_once(
                job_id=w.done.id, decision_id=decision, approver=approver, comment=comment
            ),
        )

    def expired(job_id: Any = None, by: Any = "op", via: Any = "admin") -> Call:
        def make(s: StateStore, w: World) -> Any:
            pk = w.running.id if job_id is None else job_id
            return s.requeue_expired_lease_job(pk, by=by, via=via)

        return Call(f"requeue_expired_lease_job({job_id!r}, by={by!r}, via={via!r})", make)

    not_ids = bad_ids.filter(lambda value: value is not None)
    long_text = st.integers(1, 10).map(lambda extra: "c" * (2000 + extra))
    return st.one_of(
        bad_status_lists.map(lambda v: requeue(statuses=v)),
        bad_names().map(lambda v: requeue(by=v)),
        bad_names(max_length=250).map(lambda v: requeue(via=v)),
        bad_names(max_length=100).map(lambda v: requeue(event=v)),
        not_ids.map(
            lambda v: Call(
                f"requeue_job({v!r}, ...)",
                lambda s, w: s.requeue_job(v, from_statuses=["done"], by="op", via="admin"),
            )
        ),
        bad_names().map(lambda v: reject(by=v)),
        st.one_of(unstorable_text, long_text, st.integers(), st.none()).map(
            lambda v: reject(reason=v)
        ),
        bad_names().map(lambda v: approve(decision=v)),
        bad_names().map(lambda v: approve(approver=v)),
        st.one_of(unstorable_text, long_text, st.integers(), st.none()).map(
            lambda v: approve(comment=v)
        ),
        not_ids.map(lambda v: expired(job_id=v)),
        bad_names().map(lambda v: expired(by=v)),
        bad_names(max_length=250).map(lambda v: expired(via=v)),
    )


@PROPERTIES
@given(call=_continuation_calls())
def test_continuations_refuse_malformed_arguments(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


def _outbox_calls() -> st.SearchStrategy[Call]:
    def complete(patch: Any, requests: Any, label: str) -> Call:
        def make(s: StateStore, w: World) -> Any:
            return s.complete_job_with_notifications(w.running, patch, requests)

        return Call(f"complete_job_with_notifications(running, {patch!r}, {label})", make)

    def complete_not_a_job(original: Any) -> Call:
        return Call(
            f"complete_job_with_notifications({original!r}, {{'status': 'done'}}, [])",
            lambda s, w: s.complete_job_with_notifications(original, {"status": "done"}, []),
        )

    def with_request(**fields: Any) -> Call:
        request = {"channel": "webhook", "destination": "https://example.com/hook", "payload": {}}
        request.update(fields)
        made = NotificationRequest(**request)
        return complete({"status": "done"}, [made], repr([made]))

    def outbox(name: str, **kwargs: Any) -> Call:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return Call(
            f"notification_outbox.{name}({shown})",
            lambda s, w: getattr(s.notification_outbox, name)(**kwargs),
        )

    good = NotificationRequest("webhook", "https://example.com/hook", {"ok": True}, "key-1")
    refused_patch = sorted({*JOB_CLAIM_FIELDS, *JOB_IDENTITY_FIELDS})
    some_id = "6b1c3d9e-0000-4000-8000-000000000001"
    return st.one_of(
        st.sampled_from([{}, {"status": "queued"}, {"status": "running"}, {"error": "x"}]).map(
            lambda patch: complete(patch, [], "[]")
        ),
        st.sampled_from(refused_patch).map(
            lambda name: complete({"status": "done", name: None}, [], "[]")
        ),
        bad_job_field(REPORT_FIELDS).map(
            lambda pair: complete({"status": "done", pair[0]: pair[1]}, [], "[]")
        ),
        st.sampled_from(["done", None, 5, [("status", "done")]]).map(
            lambda patch: complete(patch, [], "[]")
        ),
        st.sampled_from([None, "webhook", 5, good, {"channel": "webhook"}, [object()]]).map(
            lambda requests: complete({"status": "done"}, requests, repr(requests))
        ),
        st.just(complete({"status": "done"}, [good, good], "[the same key twice]")),
        st.sampled_from([None, "seed-running", 5, {"id": 1}]).map(complete_not_a_job),
        unknown_choices({"webhook", "email", "callable"}).map(lambda v: with_request(channel=v)),
        bad_names(max_length=2000).map(lambda v: with_request(destination=v)),
        bad_json_objects.map(lambda v: with_request(payload=v)),
        bad_names().filter(lambda v: v is not None).map(lambda v: with_request(idempotency_key=v)),
        bad_ids.filter(lambda v: v is not None).map(
            lambda v: Call(
                f"requeue_delivery_job_once({v!r}, ...)",
                lambda s, w: s.requeue_delivery_job_once(
                    notification_id=v, dlq_key="k", requested_by="op"
                ),
            )
        ),
        bad_names().map(
            lambda v: Call(
                f"requeue_delivery_job_once(dlq_key={v!r})",
                lambda s, w: s.requeue_delivery_job_once(
                    notification_id=some_id, dlq_key=v, requested_by="op"
                ),
            )
        ),
        bad_names().map(lambda v: outbox("claim_due", relay_id=v)),
        bad_counts.map(lambda n: outbox("claim_due", relay_id="relay", limit=n)),
        bad_durations(allow_zero=False, allow_none=True).map(
            lambda d: outbox("claim_due", relay_id="relay", lease=d)
        ),
        bad_ids.filter(lambda v: v is not None).map(
            lambda v: outbox("mark_delivered", notification_id=v, relay_id="relay")
        ),
        bad_names().map(lambda v: outbox("mark_delivered", notification_id=some_id, relay_id=v)),
        bad_instants().map(
            lambda v: outbox(
                "mark_failed", notification_id=some_id, relay_id="relay", error="e", started_at=v
            )
        ),
        st.one_of(st.integers(), st.none(), st.binary()).map(
            lambda v: outbox("mark_failed", notification_id=some_id, relay_id="relay", error=v)
        ),
        bad_counts.map(lambda n: outbox("dead_letters", limit=n)),
    )


@PROPERTIES
@given(call=_outbox_calls())
def test_outbox_refuses_malformed_arguments(database: DatabaseHarness, call: Call) -> None:
    with database.example() as store:
        rejects(database, seed(store), call)
