"""The JobRunStore contract kit: its cases pass on correct stores, fail on broken ones
with the obligation named, and stay inside their own namespace on a shared table."""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import FrozenInstanceError, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db.models.functions import Now

from jobstate.exceptions import InvalidJobState, InvalidPayload, StoreError
from jobstate.models import JobRun
from jobstate.stores.base import REAPED_RUN_ERROR, JobRunStatus, Trigger
from jobstate.stores.database import DatabaseJobRunStore
from jobstate.testing import (
    Clock,
    ContractViolation,
    FakeClock,
    JobRunStoreContractCase,
    MemoryJobRunStore,
    SystemClock,
    contract_case_id,
    database_run_inspector,
    job_run_store_contract_cases,
)
from jobstate.testing.fake_clock import T0

pytestmark = pytest.mark.mysql

EXPECTED_NAMES = [
    "S1: a burst of 8 concurrent claims on one overlap key yields exactly one winner",
    "S1: the overlap key is free again once the run is settled",
    "S1: distinct overlap keys do not block one another",
    "S2: a heartbeat on a settled run writes nothing and answers false",
    "S2: an accepted heartbeat advances the liveness watermark and never rewinds it",
    "S3: completing twice writes once and answers false the second time",
    "S3: a run the reaper already settled refuses a late completion",
    "S4: two concurrent reaps of three stale rows report three moves in total",
    "S4: a fresh RUNNING row survives a generous liveness budget",
    "S4: reap narrowed to one overlap key leaves other keys alone",
    "S4: limit caps how many rows one reap may move",
    "S5: every claimed and skipped run gets a distinct id",
    "S6: claim initialises the liveness watermark from the store clock",
    "S6: recording instants are stored verbatim from the runner clock",
    "S7: input and summary survive a JSON round trip",
    "S7: a value that cannot be stored raises instead of being dropped",
]
INSPECT_ONLY = {EXPECTED_NAMES[13], EXPECTED_NAMES[14], EXPECTED_NAMES[15]}
FOREIGN = Trigger("CLI", "ops@example.com")


def memory_store() -> MemoryJobRunStore:
    return MemoryJobRunStore(clock=FakeClock())


def case_named(cases: list[JobRunStoreContractCase], prefix: str) -> JobRunStoreContractCase:
    (found,) = [case for case in cases if case.name.startswith(prefix)]
    return found


# The memory store ------------------------------------------------------------------------


def _memory_cases() -> list[JobRunStoreContractCase]:
    store = memory_store()
    return job_run_store_contract_cases(store, inspect=store.run_of)


@pytest.mark.parametrize("case", _memory_cases(), ids=contract_case_id)
def test_memory_store_passes_every_case(case: JobRunStoreContractCase) -> None:
    case.run()


def test_the_sixteen_cases_in_order_with_inspect() -> None:
    cases = _memory_cases()
    assert [case.name for case in cases] == EXPECTED_NAMES
    assert [case.obligation for case in cases] == [name[:2] for name in EXPECTED_NAMES]


def test_without_inspect_thirteen_cases_and_no_s7() -> None:
    cases = job_run_store_contract_cases(memory_store())
    assert [case.name for case in cases] == [n for n in EXPECTED_NAMES if n not in INSPECT_ONLY]
    assert {case.obligation for case in cases} == {"S1", "S2", "S3", "S4", "S5", "S6"}


def test_skip_drops_every_case_of_those_obligations() -> None:
    store = memory_store()
    cases = job_run_store_contract_cases(store, inspect=store.run_of, skip=("S4", "S7"))
    assert len(cases) == 10
    assert {case.obligation for case in cases} == {"S1", "S2", "S3", "S5", "S6"}


def test_burst_size_follows_concurrency() -> None:
    cases = job_run_store_contract_cases(memory_store(), concurrency=3)
    assert cases[0].name.startswith("S1: a burst of 3 concurrent claims")
    cases[0].run()


def test_one_shared_store_runs_the_whole_list_inside_one_namespace() -> None:
    store = memory_store()
    for case in job_run_store_contract_cases(store, inspect=store.run_of):
        case.run()
    prefixes = {run.job_key.split(".", 1)[0] for run in store.runs()}
    assert len(prefixes) == 1
    assert re.fullmatch(r"contract-[0-9a-f]{12}", prefixes.pop())
    for run in store.runs():
        assert run.overlap_key is None or run.overlap_key.startswith(run.job_key)


def test_two_passes_over_the_same_store_both_pass() -> None:
    store = memory_store()
    for _ in range(2):
        for case in job_run_store_contract_cases(store, inspect=store.run_of):
            case.run()
    assert len({run.job_key.split(".", 1)[0] for run in store.runs()}) == 2


def test_a_factory_is_called_once_per_case_run() -> None:
    made: list[MemoryJobRunStore] = []

    def factory() -> MemoryJobRunStore:
        made.append(memory_store())
        return made[-1]

    cases = job_run_store_contract_cases(factory)
    assert made == []
    for case in cases:
        case.run()
    assert len(made) == len(cases) == 13
    assert all(store.runs() for store in made)


def test_the_fresh_case_leaves_a_foreign_two_hour_old_run_alone() -> None:
    clock = FakeClock()
    store = MemoryJobRunStore(clock=clock)
    foreign = store.claim(
        job_key="billing.close-day",
        overlap_key="billing.close-day",
        trigger=FOREIGN,
        input=None,
        started_at=T0,
    )
    assert foreign is not None
    clock.advance(timedelta(hours=2))
    case_named(job_run_store_contract_cases(store), "S4: a fresh").run()
    row = store.run_of(foreign)
    assert row is not None
    assert row.status == JobRunStatus.RUNNING


def test_the_whole_suite_never_reaps_a_foreign_run() -> None:
    store = memory_store()
    foreign = store.claim(
        job_key="billing.close-day",
        overlap_key="billing.close-day",
        trigger=FOREIGN,
        input=None,
        started_at=T0,
    )
    assert foreign is not None
    for case in job_run_store_contract_cases(store, inspect=store.run_of):
        case.run()
    row = store.run_of(foreign)
    assert row is not None
    assert row.status == JobRunStatus.RUNNING


# Broken stores fail with the obligation named ----------------------------------------------


class ReadThenInsertStore(MemoryJobRunStore):
    """Checks for a holder, yields, then inserts: the classic non-atomic claim."""

    def claim(
        self,
        *,
        job_key: str,
        overlap_key: str,
        trigger: Trigger,
        input: Any,
        started_at: datetime,
        service_revision: str | None = None,
    ) -> str | None:
        if any(r.status == "RUNNING" and r.overlap_key == overlap_key for r in self.runs()):
            return None
        time.sleep(0.01)
        with self._lock:
            return self._insert(
                job_key=job_key,
                overlap_key=overlap_key,
                status=JobRunStatus.RUNNING,
                trigger=trigger,
                input=input,
                summary=None,
                started_at=started_at,
                finished_at=None,
                duration_ms=None,
                service_revision=service_revision,
            )


class NeverReapsStore(MemoryJobRunStore):
    def reap_stale(
        self,
        *,
        stale_after: timedelta,
        job_key: str | None = None,
        overlap_key: str | None = None,
        limit: int | None = None,
    ) -> int:
        return 0


class PlainUniqueStore(MemoryJobRunStore):
    """A unique index on the overlap key without ``WHERE status = 'RUNNING'``."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.used: set[str] = set()

    def claim(self, *, overlap_key: str, **kwargs: Any) -> str | None:
        if overlap_key in self.used:
            return None
        self.used.add(overlap_key)
        return super().claim(overlap_key=overlap_key, **kwargs)


class RaisingLoserStore(MemoryJobRunStore):
    """Lets the uniqueness violation escape instead of answering None."""

    def claim(self, *, overlap_key: str, **kwargs: Any) -> str | None:
        run_id = super().claim(overlap_key=overlap_key, **kwargs)
        if run_id is None:
            raise RuntimeError("duplicate key value violates unique constraint")
        return run_id


class RewindingHeartbeatStore(MemoryJobRunStore):
    """Trusts a caller-side instant two hours behind the store clock for the watermark."""

    def heartbeat(self, *, run_id: str, progress: dict[str, Any] | None = None) -> bool:
        with self._lock:
            row = self._rows[run_id]
            if row.status != JobRunStatus.RUNNING:
                return False
            self._rows[run_id] = replace(row, heartbeat_at=self._now() - timedelta(hours=2))
            return True


class OverwritingCompleteStore(MemoryJobRunStore):
    """Writes every completion, settled or not."""

    def complete(self, *, run_id: str, **kwargs: Any) -> bool:
        with self._lock:
            self._rows[run_id] = replace(self._rows[run_id], status=JobRunStatus.RUNNING)
        return super().complete(run_id=run_id, **kwargs)


class DoubleCountingReaper(MemoryJobRunStore):
    """Counts the candidates it saw, then updates them in a second step."""

    def reap_stale(
        self,
        *,
        stale_after: timedelta,
        job_key: str | None = None,
        overlap_key: str | None = None,
        limit: int | None = None,
    ) -> int:
        seen = [
            r
            for r in self.runs()
            if r.status == JobRunStatus.RUNNING and (job_key is None or r.job_key == job_key)
        ]
        time.sleep(0.02)
        super().reap_stale(
            stale_after=stale_after, job_key=job_key, overlap_key=overlap_key, limit=limit
        )
        return len(seen)


class SilentJsonStore(MemoryJobRunStore):
    """Drops a value it cannot store instead of raising."""

    def claim(self, *, input: Any, **kwargs: Any) -> str | None:
        try:
            return super().claim(input=input, **kwargs)
        except ValueError:
            return super().claim(input=None, **kwargs)


@pytest.mark.parametrize(
    ("store_class", "case_prefix", "message"),
    [
        (ReadThenInsertStore, "S1: a burst", r"^\[JobRunStore S1\] [2-8] of 8 concurrent claims"),
        (RaisingLoserStore, "S1: a burst", r"^\[JobRunStore S1\] 7 of 8 .* raised"),
        (PlainUniqueStore, "S1: the overlap key is free again", r"^\[JobRunStore S1\].*PARTIAL"),
        (NeverReapsStore, "S6: claim initialises", r"^\[JobRunStore S6\].*NULL"),
        (RewindingHeartbeatStore, "S2: an accepted heartbeat", r"^\[JobRunStore S2\]"),
        (OverwritingCompleteStore, "S3: completing twice", r"^\[JobRunStore S3\].*overwrote"),
        (DoubleCountingReaper, "S4: two concurrent", r"^\[JobRunStore S4\].*ONE statement"),
        (SilentJsonStore, "S7: a value that cannot", r"^\[JobRunStore S7\].*silently"),
    ],
    ids=lambda value: value.__name__ if isinstance(value, type) else None,
)
def test_a_broken_store_fails_the_case_of_its_defect(
    store_class: type[MemoryJobRunStore], case_prefix: str, message: str
) -> None:
    store = store_class(clock=FakeClock())
    case = case_named(job_run_store_contract_cases(store, inspect=store.run_of), case_prefix)
    with pytest.raises(ContractViolation, match=message) as raised:
        case.run()
    assert isinstance(raised.value, AssertionError)
    assert raised.value.obligation == case.obligation


def test_a_store_that_never_reaps_also_fails_the_narrowed_reap() -> None:
    store = NeverReapsStore(clock=FakeClock())
    case = case_named(job_run_store_contract_cases(store), "S4: reap narrowed")
    with pytest.raises(ContractViolation, match=r"^\[JobRunStore S4\] .* moved 0 rows"):
        case.run()


# Bad arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"concurrency": 1}, ValueError),
        ({"concurrency": True}, ValueError),
        ({"skip": "S4"}, TypeError),
        ({"skip": ("S9",)}, ValueError),
        ({"inspect": "rows"}, TypeError),
    ],
)
def test_bad_options_are_refused(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        job_run_store_contract_cases(memory_store(), **kwargs)


def test_something_that_is_not_a_store_is_refused() -> None:
    with pytest.raises(TypeError, match="JobRunStore"):
        job_run_store_contract_cases(42)
    cases = job_run_store_contract_cases(lambda: object())
    with pytest.raises(TypeError, match="lacks the JobRunStore methods"):
        cases[0].run()


def test_case_ids_are_the_names() -> None:
    case = job_run_store_contract_cases(memory_store())[1]
    assert contract_case_id(case) == str(case) == case.name
    with pytest.raises(TypeError):
        contract_case_id("S1")


# The database store ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "case",
    job_run_store_contract_cases(DatabaseJobRunStore, inspect=database_run_inspector()),
    ids=contract_case_id,
)
def test_database_store_passes_every_case(case: JobRunStoreContractCase) -> None:
    case.run()


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_database_store_passes_every_case_with_sixteen_claimers() -> None:
    # One test for the whole list: the cases never share keys, so they need no flush
    # between them, and the burst still opens sixteen connections at once.
    cases = job_run_store_contract_cases(
        DatabaseJobRunStore, inspect=database_run_inspector(), concurrency=16
    )
    assert len(cases) == 16
    assert cases[0].name.startswith("S1: a burst of 16 concurrent claims")
    for case in cases:
        case.run()
    burst = JobRun.objects.filter(job_key__endswith=".burst")
    assert list(burst.values_list("status", flat=True)) == [JobRunStatus.RUNNING]


@pytest.mark.django_db(transaction=True)
def test_two_full_passes_over_the_persistent_table_leave_foreign_runs_alone() -> None:
    store = DatabaseJobRunStore()
    foreign = store.claim(
        job_key="billing.close-day",
        overlap_key="billing.close-day",
        trigger=FOREIGN,
        input={"day": "2023-11-14"},
        started_at=T0,
    )
    assert foreign is not None
    JobRun.objects.filter(id=foreign).update(heartbeat_at=Now() - timedelta(hours=2))
    before = JobRun.objects.get(id=foreign)

    for _ in range(2):
        for case in job_run_store_contract_cases(store, inspect=database_run_inspector()):
            case.run()

    namespaces = {
        key.split(".", 1)[0]
        for key in JobRun.objects.exclude(id=foreign).values_list("job_key", flat=True)
    }
    assert len(namespaces) == 2
    after = JobRun.objects.get(id=foreign)
    assert after.status == JobRunStatus.RUNNING
    assert after.heartbeat_at == before.heartbeat_at


def _connections_to_this_database() -> int:
    from django.db import connection

    sql = (
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
        if connection.vendor == "postgresql"
        else "SELECT count(*) FROM information_schema.processlist WHERE db = DATABASE()"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        row = cursor.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_burst_threads_close_their_connections() -> None:
    before = _connections_to_this_database()
    case_named(job_run_store_contract_cases(DatabaseJobRunStore()), "S1: a burst").run()
    # A closed session leaves pg_stat_activity (or the process list) a moment after the
    # client hangs up.
    deadline = time.monotonic() + 5
    while _connections_to_this_database() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _connections_to_this_database() == before


# The memory store and clocks themselves --------------------------------------------------


def test_the_memory_store_can_be_configured_as_the_run_store(settings: Any) -> None:
    from jobstate.stores import get_run_store

    settings.JOBSTATE = {"RUN_STORE": "jobstate.testing.MemoryJobRunStore"}
    store = get_run_store("other")
    assert isinstance(store, MemoryJobRunStore)
    assert store.using == "other"


def test_memory_store_keeps_its_own_copies() -> None:
    store = memory_store()
    given = {"days": [1, 2]}
    run_id = store.claim(
        job_key="a.b", overlap_key="a.b", trigger=FOREIGN, input=given, started_at=T0
    )
    assert run_id is not None
    given["days"].append(3)
    returned = store.run_of(run_id)
    assert returned is not None
    returned.input["days"].append(4)
    assert store.runs()[0].input == {"days": [1, 2]}
    with pytest.raises(FrozenInstanceError):
        returned.status = JobRunStatus.FAILED


def test_memory_store_liveness_follows_its_clock_and_never_rewinds() -> None:
    clock = FakeClock()
    store = MemoryJobRunStore(clock=clock)
    run_id = store.claim(
        job_key="a.b", overlap_key="a.b", trigger=FOREIGN, input=None, started_at=T0
    )
    assert run_id is not None
    clock.advance(timedelta(minutes=10))
    assert store.heartbeat(run_id=run_id, progress={"n": 1})
    clock.advance(timedelta(minutes=-30))
    assert store.heartbeat(run_id=run_id)
    row = store.run_of(run_id)
    assert row is not None
    assert row.heartbeat_at == T0 + timedelta(minutes=10)
    assert row.summary == {"n": 1}
    clock.set(T0 + timedelta(minutes=15))
    assert store.reap_stale(stale_after=timedelta(minutes=5, seconds=1)) == 0
    assert store.reap_stale(stale_after=timedelta(minutes=5)) == 1
    reaped = store.run_of(run_id)
    assert reaped is not None
    assert (reaped.status, reaped.finished_at, reaped.error) == (
        JobRunStatus.TIMED_OUT,
        T0 + timedelta(minutes=15),
        REAPED_RUN_ERROR,
    )


def test_memory_store_records_skipped_runs_without_a_key() -> None:
    store = memory_store()
    at = T0 + timedelta(seconds=1)
    skipped = store.record_skipped(job_key="a.b", trigger=FOREIGN, input=None, at=at)
    row = store.run_of(skipped)
    assert row is not None
    assert (row.status, row.overlap_key, row.summary, row.duration_ms) == (
        JobRunStatus.SKIPPED,
        None,
        {"reason": "overlap"},
        0,
    )
    assert row.started_at == row.finished_at == at
    assert row.heartbeat_at == T0


def test_memory_store_refuses_what_the_database_store_refuses() -> None:
    store = memory_store()
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    with pytest.raises(InvalidPayload):
        store.claim(job_key="a.b", overlap_key="a.b", trigger=FOREIGN, input=cyclic, started_at=T0)
    with pytest.raises(InvalidJobState):
        store.claim(
            job_key="a.b",
            overlap_key="a.b",
            trigger=FOREIGN,
            input=None,
            started_at=datetime(2024, 1, 1),
        )
    with pytest.raises(InvalidJobState):
        store.heartbeat(run_id="not-a-uuid")
    with pytest.raises(InvalidJobState):
        store.complete(run_id=str(uuid.uuid4()), status="RUNNING", finished_at=T0, duration_ms=1)
    with pytest.raises(InvalidJobState):
        store.reap_stale(stale_after=timedelta(0), limit=0)
    assert store.runs() == []
    assert store.heartbeat(run_id=str(uuid.uuid4())) is False


def test_memory_store_refuses_a_repeated_custom_id() -> None:
    store = MemoryJobRunStore(clock=FakeClock(), new_id=lambda: "run-1")
    assert (
        store.claim(job_key="a.b", overlap_key="a.b", trigger=FOREIGN, input=None, started_at=T0)
        == "run-1"
    )
    with pytest.raises(StoreError, match="already in use"):
        store.record_skipped(job_key="a.b", trigger=FOREIGN, input=None, at=T0)
    assert [run.run_id for run in store.runs()] == ["run-1"]
    assert store.heartbeat(run_id="run-1")


def test_clocks() -> None:
    assert datetime.fromtimestamp(1_700_000_000, UTC) == T0
    clock = FakeClock()
    assert clock.now() == T0
    assert clock.advance(timedelta(milliseconds=10)) == T0 + timedelta(milliseconds=10)
    assert isinstance(clock, Clock)
    with pytest.raises(ValueError, match="aware"):
        FakeClock(datetime(2024, 1, 1))
    with pytest.raises(TypeError):
        clock.advance(10)
    now = SystemClock().now()
    assert now.tzinfo is not None
    assert abs(now - datetime.now(UTC)) < timedelta(seconds=5)
