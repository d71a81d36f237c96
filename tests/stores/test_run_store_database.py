"""DatabaseJobRunStore behaviour a user relies on beyond the contract cases: bad input is
refused before anything is written, only the overlap constraint becomes "key held",
liveness instants come from the database clock, and reaping counts what it moved."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.db.models.functions import Now
from django.utils import timezone

from jobstate.exceptions import InvalidJobState, InvalidPayload, StoreError
from jobstate.models import JobRun
from jobstate.stores.base import REAPED_RUN_ERROR, JobRunStatus, Trigger
from jobstate.stores.database import DatabaseJobRunStore

T0 = datetime.fromtimestamp(1_700_000_000, UTC)
CLI = Trigger("CLI", "ops@example.com")
# SQLite's clock has millisecond precision; allow for it when comparing with Python's.
CLOCK_SLACK = timedelta(seconds=1)


@pytest.fixture
def store(runs: DatabaseJobRunStore) -> DatabaseJobRunStore:
    """The store under test here is the run store."""
    return runs


def claim(store: DatabaseJobRunStore, key: str = "billing.close-day", **kwargs: Any) -> str:
    arguments: dict[str, Any] = {
        "job_key": key,
        "overlap_key": key,
        "trigger": CLI,
        "input": None,
        "started_at": T0,
    }
    arguments.update(kwargs)
    run_id = store.claim(**arguments)
    assert run_id is not None
    return run_id


def table() -> list[dict[str, Any]]:
    return list(JobRun.objects.order_by("id").values())


def run(run_id: str) -> JobRun:
    return JobRun.objects.get(id=run_id)


# S7: values that cannot be stored are refused and nothing is written -------------------


def _cyclic() -> Any:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


UNSTORABLE: dict[str, Callable[[], Any]] = {
    "nan": lambda: {"ratio": math.nan},
    "infinity": lambda: {"ratio": math.inf},
    "cycle": _cyclic,
    "object": lambda: {"when": object()},
    "tuple": lambda: {"pair": (1, 2)},
    "int-keys": lambda: {1: "one"},
    "nul": lambda: {"name": "a\x00b"},
    "too-large": lambda: {"blob": "x" * 100},
}


@pytest.fixture
def small_payload_limit(settings: Any) -> None:
    settings.JOBSTATE = {"MAX_PAYLOAD_BYTES": 64}


@pytest.mark.django_db
@pytest.mark.usefixtures("small_payload_limit")
@pytest.mark.parametrize("make_value", UNSTORABLE.values(), ids=UNSTORABLE.keys())
class TestUnstorableValues:
    def test_claim_refuses_input(
        self, store: DatabaseJobRunStore, make_value: Callable[[], Any]
    ) -> None:
        with pytest.raises(InvalidPayload, match="input"):
            store.claim(
                job_key="a.b", overlap_key="a.b", trigger=CLI, input=make_value(), started_at=T0
            )
        assert table() == []

    def test_record_skipped_refuses_input(
        self, store: DatabaseJobRunStore, make_value: Callable[[], Any]
    ) -> None:
        with pytest.raises(InvalidPayload, match="input"):
            store.record_skipped(job_key="a.b", trigger=CLI, input=make_value(), at=T0)
        assert table() == []

    def test_heartbeat_refuses_progress(
        self, store: DatabaseJobRunStore, make_value: Callable[[], Any]
    ) -> None:
        run_id = claim(store)
        before = table()
        with pytest.raises(InvalidPayload, match="progress"):
            store.heartbeat(run_id=run_id, progress=make_value())
        assert table() == before

    def test_complete_refuses_summary(
        self, store: DatabaseJobRunStore, make_value: Callable[[], Any]
    ) -> None:
        run_id = claim(store)
        before = table()
        with pytest.raises(InvalidPayload, match="summary"):
            store.complete(
                run_id=run_id,
                status="SUCCEEDED",
                finished_at=T0,
                duration_ms=1,
                summary=make_value(),
            )
        assert table() == before
        assert run(run_id).status == JobRunStatus.RUNNING


@pytest.mark.django_db
def test_a_value_at_the_size_limit_is_stored(store: DatabaseJobRunStore, settings: Any) -> None:
    settings.JOBSTATE = {"MAX_PAYLOAD_BYTES": 64}
    value = {"blob": "x" * 52}  # {"blob": "..."} is exactly 64 bytes
    run_id = claim(store, input=value)
    assert run(run_id).input == value


# Other bad arguments -------------------------------------------------------------------


@pytest.mark.django_db
class TestBadArguments:
    def test_naive_started_at(self, store: DatabaseJobRunStore) -> None:
        with pytest.raises(InvalidJobState, match="started_at must be an aware datetime"):
            store.claim(
                job_key="a.b",
                overlap_key="a.b",
                trigger=CLI,
                input=None,
                started_at=datetime(2023, 11, 14, 22, 13, 20),
            )
        assert table() == []

    def test_naive_skip_instant(self, store: DatabaseJobRunStore) -> None:
        with pytest.raises(InvalidJobState, match="at must be an aware datetime"):
            store.record_skipped(
                job_key="a.b", trigger=CLI, input=None, at=datetime(2023, 11, 14, 22, 13, 20)
            )
        assert table() == []

    @pytest.mark.parametrize("status", ["RUNNING", "DONE", "succeeded", ""])
    def test_complete_needs_a_terminal_status(
        self, store: DatabaseJobRunStore, status: str
    ) -> None:
        run_id = claim(store)
        before = table()
        with pytest.raises(InvalidJobState):
            store.complete(run_id=run_id, status=status, finished_at=T0, duration_ms=1)
        assert table() == before

    def test_complete_refuses_naive_finish_and_bad_duration(
        self, store: DatabaseJobRunStore
    ) -> None:
        run_id = claim(store)
        before = table()
        with pytest.raises(InvalidJobState, match="finished_at"):
            store.complete(
                run_id=run_id, status="SUCCEEDED", finished_at=datetime(2024, 1, 1), duration_ms=1
            )
        for duration in (-1, 1.5, True, None):
            with pytest.raises(InvalidJobState, match="duration_ms"):
                store.complete(
                    run_id=run_id, status="SUCCEEDED", finished_at=T0, duration_ms=duration
                )
        with pytest.raises(InvalidJobState, match="NUL"):
            store.complete(
                run_id=run_id, status="FAILED", finished_at=T0, duration_ms=1, error="a\x00b"
            )
        assert table() == before

    @pytest.mark.parametrize("run_id", ["not-a-uuid", "", "1234", 42])
    def test_malformed_run_id(self, store: DatabaseJobRunStore, run_id: Any) -> None:
        claim(store)
        before = table()
        with pytest.raises(InvalidJobState):
            store.heartbeat(run_id=run_id)
        with pytest.raises(InvalidJobState):
            store.complete(run_id=run_id, status="SUCCEEDED", finished_at=T0, duration_ms=1)
        assert table() == before

    def test_unknown_run_id_answers_false(self, store: DatabaseJobRunStore) -> None:
        unknown = "00000000-0000-4000-8000-000000000000"
        assert store.heartbeat(run_id=unknown) is False
        assert (
            store.complete(run_id=unknown, status="SUCCEEDED", finished_at=T0, duration_ms=1)
            is False
        )

    def test_run_ids_in_any_uuid_spelling(self, store: DatabaseJobRunStore) -> None:
        run_id = claim(store)
        assert store.heartbeat(run_id=run_id.upper().replace("-", ""))

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"job_key": "j" * 201},
            {"overlap_key": "o" * 301},
            {"trigger": Trigger("S" * 101)},
            {"trigger": Trigger("CLI", "u" * 201)},
            {"service_revision": "r" * 101},
            {"job_key": ""},
            {"overlap_key": "  "},
            {"trigger": "CLI"},
        ],
        ids=[
            "long-job-key",
            "long-overlap-key",
            "long-source",
            "long-triggered-by",
            "long-revision",
            "empty-job-key",
            "blank-overlap-key",
            "trigger-not-a-trigger",
        ],
    )
    def test_claim_refuses_keys_the_table_cannot_hold(
        self, store: DatabaseJobRunStore, kwargs: dict[str, Any]
    ) -> None:
        arguments: dict[str, Any] = {
            "job_key": "a.b",
            "overlap_key": "a.b",
            "trigger": CLI,
            "input": None,
            "started_at": T0,
        }
        arguments.update(kwargs)
        with pytest.raises(InvalidJobState):
            store.claim(**arguments)
        assert table() == []

    @pytest.mark.parametrize("reason", ["", None, 7, "over\x00lap"])
    def test_record_skipped_needs_a_reason(self, store: DatabaseJobRunStore, reason: Any) -> None:
        with pytest.raises(InvalidJobState, match="reason"):
            store.record_skipped(job_key="a.b", trigger=CLI, input=None, at=T0, reason=reason)
        assert table() == []

    @pytest.mark.parametrize("limit", [0, -1, 2.5, True])
    def test_reap_refuses_a_bad_limit(self, store: DatabaseJobRunStore, limit: Any) -> None:
        claim(store)
        before = table()
        with pytest.raises(InvalidJobState, match="limit"):
            store.reap_stale(stale_after=timedelta(0), limit=limit)
        with pytest.raises(InvalidJobState, match="stale_after"):
            store.reap_stale(stale_after=timedelta(seconds=-1))
        assert table() == before


# S1: only the overlap constraint becomes "key held" -------------------------------------


@pytest.mark.django_db
def test_another_unique_violation_propagates_instead_of_reading_as_key_held(
    store: DatabaseJobRunStore,
) -> None:
    # A host may add its own constraints to the table; their violations are errors, and
    # turning them into None would report a run that never happened as SKIPPED.
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"CREATE UNIQUE INDEX {quote('host_one_start_per_job')} "
            f"ON {quote(JobRun._meta.db_table)} ({quote('job_key')}, {quote('started_at')})"
        )
    claim(store, "reports.build", overlap_key="reports.build#1")
    with pytest.raises(StoreError) as raised:
        store.claim(
            job_key="reports.build",
            overlap_key="reports.build#2",
            trigger=CLI,
            input=None,
            started_at=T0,
        )
    assert isinstance(raised.value.__cause__, IntegrityError)
    assert JobRun.objects.count() == 1


@pytest.mark.django_db
def test_a_lost_claim_leaves_the_callers_transaction_usable(store: DatabaseJobRunStore) -> None:
    claim(store)
    with transaction.atomic():
        assert (
            store.claim(
                job_key="billing.close-day",
                overlap_key="billing.close-day",
                trigger=CLI,
                input=None,
                started_at=T0,
            )
            is None
        )
        skipped = store.record_skipped(job_key="billing.close-day", trigger=CLI, input=None, at=T0)
    assert run(skipped).status == JobRunStatus.SKIPPED


@pytest.mark.django_db
def test_skipped_rows_hold_no_key_and_record_the_instant_verbatim(
    store: DatabaseJobRunStore,
) -> None:
    at = T0 + timedelta(milliseconds=1)
    skipped = store.record_skipped(
        job_key="billing.close-day", trigger=CLI, input={"day": 1}, at=at, service_revision="abc"
    )
    row = run(skipped)
    assert (row.status, row.overlap_key, row.summary) == (
        JobRunStatus.SKIPPED,
        None,
        {"reason": "overlap"},
    )
    assert row.started_at == row.finished_at == at
    assert row.duration_ms == 0
    assert (row.trigger_source, row.triggered_by, row.service_revision) == (
        "CLI",
        CLI.triggered_by,
        "abc",
    )
    claim(store)


# S2 / S6: liveness instants come from the database clock --------------------------------


@pytest.mark.django_db
def test_claim_starts_the_watermark_at_the_database_clock_not_the_runner_clock(
    store: DatabaseJobRunStore,
) -> None:
    before = timezone.now()
    run_id = claim(store, started_at=T0)
    after = timezone.now()
    row = run(run_id)
    assert row.started_at == T0
    assert before - CLOCK_SLACK <= row.heartbeat_at <= after + CLOCK_SLACK


@pytest.mark.django_db
def test_a_heartbeat_moves_an_old_watermark_up_to_the_database_clock(
    store: DatabaseJobRunStore,
) -> None:
    run_id = claim(store)
    JobRun.objects.filter(id=run_id).update(heartbeat_at=Now() - timedelta(hours=1))
    old = run(run_id).heartbeat_at
    before = timezone.now()
    assert store.heartbeat(run_id=run_id, progress={"processed": 5})
    row = run(run_id)
    assert row.heartbeat_at > old
    assert row.heartbeat_at >= before - CLOCK_SLACK
    assert row.summary == {"processed": 5}
    assert store.reap_stale(stale_after=timedelta(minutes=30), overlap_key=row.overlap_key) == 0


@pytest.mark.django_db
def test_a_heartbeat_never_moves_a_watermark_back(store: DatabaseJobRunStore) -> None:
    run_id = claim(store)
    JobRun.objects.filter(id=run_id).update(heartbeat_at=Now() + timedelta(hours=1))
    ahead = run(run_id).heartbeat_at
    assert store.heartbeat(run_id=run_id)
    assert run(run_id).heartbeat_at == ahead


@pytest.mark.django_db
def test_a_heartbeat_without_progress_keeps_the_summary(store: DatabaseJobRunStore) -> None:
    run_id = claim(store)
    assert store.heartbeat(run_id=run_id, progress={"processed": 1})
    assert store.heartbeat(run_id=run_id)
    assert run(run_id).summary == {"processed": 1}


@pytest.mark.django_db
def test_settled_runs_refuse_heartbeats_and_completions(store: DatabaseJobRunStore) -> None:
    run_id = claim(store)
    assert store.complete(
        run_id=run_id,
        status="FAILED",
        finished_at=T0 + timedelta(seconds=3),
        duration_ms=3000,
        summary={"ok": False},
        error="boom",
    )
    settled = table()
    assert store.heartbeat(run_id=run_id, progress={"late": True}) is False
    assert store.complete(run_id=run_id, status="SUCCEEDED", finished_at=T0, duration_ms=0) is False
    assert table() == settled
    row = run(run_id)
    assert (row.status, row.error, row.summary, row.duration_ms) == (
        JobRunStatus.FAILED,
        "boom",
        {"ok": False},
        3000,
    )


# S4: reaping -----------------------------------------------------------------------------


def _age(run_id: str, age: timedelta) -> None:
    JobRun.objects.filter(id=run_id).update(heartbeat_at=Now() - age)


@pytest.mark.django_db
def test_reap_times_out_stale_runs_with_the_database_clock_and_frees_the_key(
    store: DatabaseJobRunStore,
) -> None:
    stale = claim(store, "a.stale")
    fresh = claim(store, "a.fresh")
    _age(stale, timedelta(minutes=10))
    _age(fresh, timedelta(minutes=2))
    before = timezone.now()
    assert store.reap_stale(stale_after=timedelta(minutes=5)) == 1
    row = run(stale)
    assert row.status == JobRunStatus.TIMED_OUT
    assert row.error == REAPED_RUN_ERROR
    assert row.finished_at is not None
    assert row.finished_at >= before - CLOCK_SLACK
    assert row.started_at == T0
    assert run(fresh).status == JobRunStatus.RUNNING
    claim(store, "a.stale")


@pytest.mark.django_db
def test_reap_moves_the_oldest_watermarks_first_up_to_the_limit(
    store: DatabaseJobRunStore,
) -> None:
    runs = {hours: claim(store, "a.b", overlap_key=f"a.b#{hours}") for hours in (1, 3, 2)}
    for hours, run_id in runs.items():
        _age(run_id, timedelta(hours=hours))
    assert store.reap_stale(stale_after=timedelta(0), job_key="a.b", limit=2) == 2
    statuses = {hours: run(run_id).status for hours, run_id in runs.items()}
    assert statuses == {1: "RUNNING", 2: "TIMED_OUT", 3: "TIMED_OUT"}


@pytest.mark.django_db
def test_reap_never_touches_settled_or_skipped_runs(store: DatabaseJobRunStore) -> None:
    done = claim(store, "a.done")
    store.complete(run_id=done, status="SUCCEEDED", finished_at=T0, duration_ms=1)
    store.record_skipped(job_key="a.done", trigger=CLI, input=None, at=T0)
    JobRun.objects.update(heartbeat_at=Now() - timedelta(days=1))
    before = table()
    assert store.reap_stale(stale_after=timedelta(0)) == 0
    assert table() == before


def _reap_concurrently(reap: Callable[[], int], reapers: int = 2) -> list[int]:
    barrier = threading.Barrier(reapers)
    counts: list[int] = [0] * reapers
    errors: list[BaseException] = []

    def worker(index: int) -> None:
        try:
            barrier.wait(10)
            counts[index] = reap()
        except Exception as exc:
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(reapers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors, errors
    return counts


def _fifty_stale_runs(store: DatabaseJobRunStore) -> None:
    for index in range(50):
        claim(store, "sweep.all", overlap_key=f"sweep.all#{index}")
    JobRun.objects.update(heartbeat_at=Now() - timedelta(hours=1))


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_reapers_count_fifty_stale_runs_once(store: DatabaseJobRunStore) -> None:
    _fifty_stale_runs(store)
    counts = _reap_concurrently(lambda: store.reap_stale(stale_after=timedelta(minutes=5)))
    assert sum(counts) == 50
    assert JobRun.objects.filter(status=JobRunStatus.TIMED_OUT).count() == 50


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_concurrent_reapers_with_a_limit_share_the_rows(
    store: DatabaseJobRunStore,
) -> None:
    _fifty_stale_runs(store)

    def drain() -> int:
        moved = 0
        while batch := store.reap_stale(stale_after=timedelta(minutes=5), limit=7):
            assert batch <= 7
            moved += batch
        return moved

    counts = _reap_concurrently(drain, reapers=3)
    assert sum(counts) == 50
    assert JobRun.objects.filter(status=JobRunStatus.TIMED_OUT).count() == 50


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_the_portable_locking_reap_also_counts_each_row_once(
    store: DatabaseJobRunStore,
) -> None:
    # The path MySQL and MariaDB take (lock with SKIP LOCKED, then update); PostgreSQL is
    # the backend here that can show it under real contention.
    _fifty_stale_runs(store)
    candidates = JobRun.objects.stale(timedelta(minutes=5)).order_by("heartbeat_at")

    def drain() -> int:
        moved = 0
        while batch := store._reap_locking(candidates, 9):
            assert batch <= 9
            moved += batch
        return moved

    counts = _reap_concurrently(drain)
    assert sum(counts) == 50
    assert JobRun.objects.filter(status=JobRunStatus.TIMED_OUT).count() == 50
