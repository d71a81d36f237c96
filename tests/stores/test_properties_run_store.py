"""Property tests over the public run-store API (``get_run_store()``: claim, heartbeat,
complete, record_skipped, reap_stale), on the database store and on the in-memory
reference store.

Valid input round-trips: the stored run holds exactly what was given (JSON compared as
canonical text, instants as instants). Malformed input raises an error of the package
(or a plain ``ValueError`` / ``TypeError``), never a database error or a quiet ``None``
/ ``False``, and leaves every jobstate table as it was. Each example runs in a savepoint
that is rolled back (the memory store: a fresh store).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from jobstate.models import JobRun
from jobstate.stores import get_run_store
from jobstate.stores.base import TERMINAL_RUN_STATUSES, JobRunStatus, JobRunStore, Trigger
from jobstate.stores.contracts.validation import BIGINT_MAX
from jobstate.testing.memory_runs import MemoryJobRunStore
from tests.support.strategies import (
    PAYLOAD_LIMIT,
    Call,
    assert_refused,
    aware_datetimes,
    bad_counts,
    bad_durations,
    bad_ids,
    bad_instants,
    bad_json_values,
    bad_names,
    database_snapshot,
    durations,
    json_values,
    names,
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

T0 = datetime(2026, 1, 1, tzinfo=UTC)
TERMINAL = sorted(status.value for status in TERMINAL_RUN_STATUSES)
JSON_COLUMNS = ("input", "summary")


# --- harnesses -----------------------------------------------------------------------------


@dataclass
class World:
    """A run that holds its key and one already settled."""

    running: str
    settled: str


def seed(store: JobRunStore) -> World:
    running = store.claim(
        job_key="seed.job",
        overlap_key="seed.key",
        trigger=Trigger("CLI"),
        input=None,
        started_at=T0,
    )
    assert running is not None
    settled = store.record_skipped(job_key="seed.job", trigger=Trigger("CLI"), input=None, at=T0)
    return World(running=running, settled=settled)


class DatabaseHarness:
    def __init__(self) -> None:
        self.store: JobRunStore = get_run_store()

    @contextmanager
    def example(self) -> Iterator[JobRunStore]:
        with transaction.atomic():
            yield self.store
            transaction.set_rollback(True)

    def snapshot(self) -> Any:
        return database_snapshot()

    def row(self, run_id: str) -> dict[str, Any]:
        run = JobRun.objects.get(id=run_id)
        return {name: getattr(run, name) for name in _ROW_FIELDS}


class MemoryHarness:
    def __init__(self) -> None:
        self.store: JobRunStore = MemoryJobRunStore()
        self.memory = MemoryJobRunStore()

    @contextmanager
    def example(self) -> Iterator[JobRunStore]:
        self.memory = MemoryJobRunStore()
        self.store = self.memory
        yield self.store

    def snapshot(self) -> Any:
        return self.memory.runs()

    def row(self, run_id: str) -> dict[str, Any]:
        run = self.memory.run_of(run_id)
        assert run is not None
        stored = asdict(run)
        trigger = stored.pop("trigger")
        stored.update(trigger_source=trigger["source"], triggered_by=trigger["triggered_by"])
        return {name: stored[name] for name in _ROW_FIELDS}


_ROW_FIELDS = (
    "job_key",
    "overlap_key",
    "status",
    "trigger_source",
    "triggered_by",
    "input",
    "summary",
    "error",
    "started_at",
    "finished_at",
    "duration_ms",
    "service_revision",
)

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


def assert_row(harness: Harness, run_id: str, expected: dict[str, Any]) -> None:
    stored = harness.row(run_id)
    for name, value in expected.items():
        if name in JSON_COLUMNS:
            assert json.dumps(stored[name], sort_keys=True) == json.dumps(value, sort_keys=True)
        else:
            assert stored[name] == value, name


def rejects(harness: Harness, world: World, call: Call) -> None:
    assert_refused(call, (harness.store, world), harness.snapshot)


# --- valid input round-trips ---------------------------------------------------------------

triggers = st.builds(
    Trigger, source=names(max_size=100), triggered_by=st.one_of(st.none(), storable_text())
)
revisions = st.one_of(st.none(), storable_text(max_size=100))


@PROPERTIES
@given(
    job_key=names(max_size=200),
    overlap_key=names(max_size=300),
    trigger=triggers,
    job_input=json_values,
    started_at=aware_datetimes,
    revision=revisions,
)
@example(
    job_key="offset",
    overlap_key="k",
    trigger=Trigger("CLI"),
    job_input=None,
    started_at=datetime(2026, 1, 1, tzinfo=timezone(timedelta(hours=-20, microseconds=1))),
    revision=None,
)
def test_claim_stores_what_it_was_given_and_holds_the_key(
    harness: Harness,
    job_key: str,
    overlap_key: str,
    trigger: Trigger,
    job_input: Any,
    started_at: datetime,
    revision: str | None,
) -> None:
    claim = {
        "job_key": job_key,
        "overlap_key": overlap_key,
        "trigger": trigger,
        "input": job_input,
        "started_at": started_at,
        "service_revision": revision,
    }
    with harness.example() as store:
        run_id = store.claim(**claim)
        assert run_id is not None
        assert_row(
            harness,
            run_id,
            {
                "job_key": job_key,
                "overlap_key": overlap_key,
                "status": JobRunStatus.RUNNING,
                "trigger_source": trigger.source,
                "triggered_by": trigger.triggered_by,
                "input": job_input,
                "started_at": started_at,
                "service_revision": revision,
            },
        )
        assert store.claim(**claim) is None


@PROPERTIES
@given(
    progress=json_values,
    status=st.sampled_from(TERMINAL),
    finished_at=aware_datetimes,
    duration_ms=st.integers(0, BIGINT_MAX),
    summary=st.one_of(st.none(), json_values),
    error=st.one_of(st.none(), storable_text(max_size=100)),
)
def test_heartbeat_and_complete_store_what_they_were_given(
    harness: Harness,
    progress: Any,
    status: str,
    finished_at: datetime,
    duration_ms: int,
    summary: Any,
    error: str | None,
) -> None:
    with harness.example() as store:
        world = seed(store)
        assert store.heartbeat(run_id=world.running, progress=progress)
        if progress is not None:
            assert_row(harness, world.running, {"summary": progress})
        settled = {"finished_at": finished_at, "duration_ms": duration_ms}
        assert store.complete(
            run_id=world.running, status=status, summary=summary, error=error, **settled
        )
        assert_row(harness, world.running, {**settled, "status": status, "error": error})
        if summary is not None:
            assert_row(harness, world.running, {"summary": summary})
        assert not store.complete(run_id=world.running, status=status, **settled)


@PROPERTIES
@given(
    job_key=names(max_size=200),
    trigger=triggers,
    job_input=json_values,
    at=aware_datetimes,
    reason=names(max_size=100),
    revision=revisions,
)
def test_record_skipped_stores_what_it_was_given(
    harness: Harness,
    job_key: str,
    trigger: Trigger,
    job_input: Any,
    at: datetime,
    reason: str,
    revision: str | None,
) -> None:
    with harness.example() as store:
        run_id = store.record_skipped(
            job_key=job_key,
            trigger=trigger,
            input=job_input,
            at=at,
            reason=reason,
            service_revision=revision,
        )
        assert_row(
            harness,
            run_id,
            {
                "job_key": job_key,
                "overlap_key": None,
                "status": JobRunStatus.SKIPPED,
                "input": job_input,
                "summary": {"reason": reason},
                "started_at": at,
                "finished_at": at,
                "duration_ms": 0,
                "service_revision": revision,
            },
        )


@PROPERTIES
@given(
    stale_after=durations,
    job_key=st.one_of(st.none(), names()),
    overlap_key=st.one_of(st.none(), names()),
    limit=st.one_of(st.none(), st.integers(1, BIGINT_MAX)),
)
def test_reap_stale_accepts_any_valid_scope(
    harness: Harness,
    stale_after: timedelta,
    job_key: str | None,
    overlap_key: str | None,
    limit: int | None,
) -> None:
    with harness.example() as store:
        world = seed(store)
        # The seeded run beat a moment ago: only a zero budget (or a slow moment) can
        # reap it, and then only when the scope names it.
        reaped = store.reap_stale(
            stale_after=stale_after, job_key=job_key, overlap_key=overlap_key, limit=limit
        )
        assert reaped in (0, 1)
        if reaped:
            assert harness.row(world.running)["status"] == JobRunStatus.TIMED_OUT


# --- malformed input is refused and writes nothing -------------------------------------------


def _claim(**overrides: Any) -> Call:
    arguments = {
        "job_key": "new.job",
        "overlap_key": "new.key",
        "trigger": Trigger("CLI"),
        "input": None,
        "started_at": T0,
        **overrides,
    }
    shown = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    return Call(f"claim({shown})", lambda s, w: s.claim(**arguments))


def _skip(**overrides: Any) -> Call:
    arguments = {
        "job_key": "new.job",
        "trigger": Trigger("CLI"),
        "input": None,
        "at": T0,
        **overrides,
    }
    shown = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    return Call(f"record_skipped({shown})", lambda s, w: s.record_skipped(**arguments))


def _complete(run_id: Any = None, **overrides: Any) -> Call:
    arguments = {"status": "SUCCEEDED", "finished_at": T0, "duration_ms": 5, **overrides}
    shown = ", ".join(f"{k}={v!r}" for k, v in overrides.items())

    def make(s: JobRunStore, w: World) -> Any:
        return s.complete(run_id=w.running if run_id is None else run_id, **arguments)

    return Call(f"complete(run_id={'running' if run_id is None else run_id!r}, {shown})", make)


def _heartbeat(run_id: Any = None, **overrides: Any) -> Call:
    shown = ", ".join(f"{k}={v!r}" for k, v in overrides.items())

    def make(s: JobRunStore, w: World) -> Any:
        return s.heartbeat(run_id=w.running if run_id is None else run_id, **overrides)

    return Call(f"heartbeat(run_id={'running' if run_id is None else run_id!r}, {shown})", make)


def _reap(**overrides: Any) -> Call:
    arguments = {"stale_after": timedelta(seconds=0), **overrides}
    shown = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
    return Call(f"reap_stale(stale_after=0, {shown})", lambda s, w: s.reap_stale(**arguments))


_not_text = st.one_of(st.integers(), st.booleans(), st.binary(min_size=1, max_size=3))
_bad_triggers = st.one_of(
    st.sampled_from(["CLI", None, ("CLI", None), {"source": "CLI"}]),
    st.one_of(unstorable_text, _not_text, st.none()).map(Trigger),
    st.one_of(unstorable_text, _not_text).map(lambda who: Trigger("CLI", who)),
)
_not_ids = bad_ids.filter(lambda value: value is not None)
_bad_millis = st.one_of(
    st.integers(max_value=-1),
    st.integers(min_value=BIGINT_MAX + 1),
    st.booleans(),
    st.floats(),
    storable_text(),
    st.none(),
)

# Bugs found, kept as regression examples: each was stored by SQLite and refused by
# PostgreSQL with a raw DataError / ProgrammingError, escaped as an OverflowError, or
# was quietly accepted by one store and not the other.
NUL_JOB_KEY = _claim(job_key="a\x00b")
NUL_TRIGGER = _claim(trigger=Trigger("CLI", "ops\x00"))
NUL_REVISION = _skip(service_revision="v1\x00")
NO_OVERLAP_KEY = _claim(overlap_key=None)
YEAR_ZERO = _claim(started_at=datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=3))))
HUGE_DURATION_MS = _complete(duration_ms=2**64)
SURROGATE_REASON = _skip(reason="x\ud800")
NUL_REAP_KEY = _reap(job_key="a\x00")
INT_REAP_KEY = _reap(job_key=5)
HUGE_STALE_AFTER = _reap(stale_after=timedelta.max)
HUGE_REAP_LIMIT = _reap(limit=2**70)


@PROPERTIES
@given(
    call=st.one_of(
        bad_names(max_length=None).map(lambda v: _claim(job_key=v)),
        bad_names(max_length=None).map(lambda v: _claim(overlap_key=v)),
        _bad_triggers.map(lambda v: _claim(trigger=v)),
        bad_json_values.map(lambda v: _claim(input=v)),
        bad_instants().map(lambda v: _claim(started_at=v)),
        st.one_of(unstorable_text, _not_text).map(lambda v: _claim(service_revision=v)),
        bad_names(max_length=None).map(lambda v: _skip(job_key=v)),
        _bad_triggers.map(lambda v: _skip(trigger=v)),
        bad_json_values.map(lambda v: _skip(input=v)),
        bad_instants().map(lambda v: _skip(at=v)),
        bad_names(max_length=None).map(lambda v: _skip(reason=v)),
        st.one_of(unstorable_text, _not_text).map(lambda v: _skip(service_revision=v)),
    )
)
@example(call=NUL_JOB_KEY)
@example(call=NUL_TRIGGER)
@example(call=NUL_REVISION)
@example(call=NO_OVERLAP_KEY)
@example(call=YEAR_ZERO)
@example(call=SURROGATE_REASON)
def test_new_runs_refuse_malformed_arguments(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


@PROPERTIES
@given(
    call=st.one_of(
        _not_ids.map(lambda v: _heartbeat(run_id=v)),
        bad_json_values.map(lambda v: _heartbeat(progress=v)),
        _not_ids.map(lambda v: _complete(run_id=v)),
        st.one_of(unknown_choices(set(JobRunStatus.values)), st.just("RUNNING")).map(
            lambda v: _complete(status=v)
        ),
        bad_instants().map(lambda v: _complete(finished_at=v)),
        _bad_millis.map(lambda v: _complete(duration_ms=v)),
        bad_json_values.map(lambda v: _complete(summary=v)),
        st.one_of(unstorable_text, _not_text).map(lambda v: _complete(error=v)),
    )
)
@example(call=HUGE_DURATION_MS)
def test_settling_a_run_refuses_malformed_arguments(harness: Harness, call: Call) -> None:
    with harness.example() as store:
        rejects(harness, seed(store), call)


@PROPERTIES
@given(
    call=st.one_of(
        bad_durations().map(lambda v: _reap(stale_after=v)),
        bad_names(max_length=None).filter(lambda v: v is not None).map(lambda v: _reap(job_key=v)),
        bad_names(max_length=None)
        .filter(lambda v: v is not None)
        .map(lambda v: _reap(overlap_key=v)),
        bad_counts.map(lambda v: _reap(limit=v)),
    )
)
@example(call=NUL_REAP_KEY)
@example(call=INT_REAP_KEY)
@example(call=HUGE_STALE_AFTER)
@example(call=HUGE_REAP_LIMIT)
def test_reap_stale_refuses_malformed_arguments(harness: Harness, call: Call) -> None:
    # A zero budget would reap the seeded run if the arguments got through.
    with harness.example() as store:
        rejects(harness, seed(store), call)


@PROPERTIES
@given(
    call=st.one_of(
        st.integers(1, 40).map(lambda extra: _claim(job_key="j" * (200 + extra))),
        st.integers(1, 40).map(lambda extra: _claim(overlap_key="o" * (300 + extra))),
        st.integers(1, 40).map(lambda extra: _claim(trigger=Trigger("s" * (100 + extra)))),
        st.integers(1, 40).map(lambda extra: _skip(trigger=Trigger("CLI", "w" * (200 + extra)))),
        st.integers(1, 40).map(lambda extra: _skip(service_revision="r" * (100 + extra))),
    )
)
def test_the_database_store_refuses_values_longer_than_their_column(
    database: DatabaseHarness, call: Call
) -> None:
    with database.example() as store:
        rejects(database, seed(store), call)
