"""The operations-job runner: registry, input checks, outcomes, overlap, heartbeats,
deadlines and how each run is recorded. Real database stores throughout; the small store
subclasses below only force the answers (False, an exception) a test needs."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import OperationalError, connections, transaction
from django.db.models.functions import Now

from jobstate.exceptions import (
    DuplicateJobKey,
    InvalidJobKey,
    InvalidOperationsJob,
    InvalidPayload,
    InvalidRunnerConfiguration,
    OperationsJobInputError,
    StoreError,
    TransactionNotAllowed,
    UnknownOperationsJob,
)
from jobstate.models import JobRun
from jobstate.runner import (
    JobExecutionResult,
    JobRunner,
    Registry,
    RunContext,
    RunReason,
    operations_job,
    registry,
)
from jobstate.stores.base import REAPED_RUN_ERROR, JobRunStatus, Trigger
from jobstate.stores.database import DatabaseJobRunStore

db = pytest.mark.django_db(transaction=True)

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)
FAST = {
    "heartbeat_interval": timedelta(milliseconds=50),
    "stale_run_after": timedelta(milliseconds=500),
}


class ManualClock:
    """A runner clock that only moves when told: recorded instants become exact."""

    def __init__(self, start: datetime = T0) -> None:
        self.instant = start

    def now(self) -> datetime:
        return self.instant


class RecordingStore(DatabaseJobRunStore):
    """The database store, recording each call. ``heartbeat`` may override the answer of
    the n-th heartbeat (return a bool or raise; ``None`` means ask the database)."""

    def __init__(
        self,
        *,
        heartbeat: Callable[[int], bool | None] | None = None,
        fail: frozenset[str] = frozenset(),
    ) -> None:
        super().__init__()
        self.heartbeat_answer = heartbeat
        self.fail = fail
        self.heartbeat_calls: list[float] = []
        self.reap_calls: list[dict[str, Any]] = []
        self.complete_calls: list[dict[str, Any]] = []

    def _maybe_fail(self, method: str) -> None:
        if method in self.fail:
            raise OperationalError(f"{method}: connection lost")

    def claim(self, **kwargs: Any) -> str | None:
        self._maybe_fail("claim")
        return super().claim(**kwargs)

    def record_skipped(self, **kwargs: Any) -> str:
        self._maybe_fail("record_skipped")
        return super().record_skipped(**kwargs)

    def heartbeat(self, *, run_id: str, progress: dict[str, Any] | None = None) -> bool:
        self.heartbeat_calls.append(time.monotonic())
        if self.heartbeat_answer is not None:
            answer = self.heartbeat_answer(len(self.heartbeat_calls))
            if answer is not None:
                return answer
        return super().heartbeat(run_id=run_id, progress=progress)

    def complete(self, **kwargs: Any) -> bool:
        self.complete_calls.append(kwargs)
        self._maybe_fail("complete")
        return super().complete(**kwargs)

    def reap_stale(self, **kwargs: Any) -> int:
        self.reap_calls.append(kwargs)
        self._maybe_fail("reap_stale")
        return super().reap_stale(**kwargs)


@pytest.fixture
def reg() -> Registry:
    return Registry()


def runner(reg: Registry, **options: Any) -> JobRunner:
    return JobRunner(registry=reg, **{**FAST, **options})


def row(result: JobExecutionResult) -> JobRun:
    return JobRun.objects.get(id=result.run_id)


def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# Registry and job definitions ---------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    ["nodot", "Bad_Key.x", "a.b.c", "a..b", "-a.b", "a.b-", "a.B", "a b.c", "", "x." + "y" * 99],
)
def test_malformed_job_keys_are_rejected_at_registration(reg: Registry, key: str) -> None:
    with pytest.raises(InvalidJobKey, match=r"domain\.action"):
        operations_job(key, registry=reg)(lambda ctx, input: None)
    assert len(reg) == 0


def test_well_formed_keys_up_to_100_characters_register(reg: Registry) -> None:
    longest = "a" * 60 + "." + "b" * 39
    for key in ["a.b", "billing.close-day", "v2.sync-2-stores", longest]:
        operations_job(key, registry=reg)(lambda ctx, input: None)
    assert len(longest) == 100
    assert reg.keys() == sorted(["a.b", "billing.close-day", "v2.sync-2-stores", longest])


def test_a_second_job_under_the_same_key_is_rejected(reg: Registry) -> None:
    def first(ctx: RunContext, input: None) -> None: ...

    def second(ctx: RunContext, input: None) -> None: ...

    operations_job("billing.close-day", registry=reg)(first)
    with pytest.raises(DuplicateJobKey, match=r"billing\.close-day.*first.*second"):
        operations_job("billing.close-day", registry=reg)(second)
    # The same definition again (a module imported twice) is harmless.
    operations_job("billing.close-day", registry=reg)(first)
    assert reg.get("billing.close-day").func is first


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"overlap": "sometimes"}, "overlap"),
        ({"timeout": timedelta(0)}, "timeout"),
        ({"timeout": 30}, "timeout"),
        ({"input_schema": 42}, "input_schema"),
    ],
)
def test_malformed_job_options_are_rejected(
    reg: Registry, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidOperationsJob, match=message):
        operations_job("a.b", registry=reg, **options)(lambda ctx, input: None)


def test_decorator_returns_the_function_and_takes_its_docstring(reg: Registry) -> None:
    def close_day(ctx: RunContext, input: None) -> dict[str, int]:
        """Close the business day.

        More words."""
        return {"closed": 1}

    assert operations_job("billing.close-day", registry=reg)(close_day) is close_day
    job = reg.get("billing.close-day")
    assert job.description == "Close the business day."
    assert (job.overlap, job.timeout, job.input_schema) == ("forbid", None, None)


def test_autodiscover_finds_the_operations_modules_of_installed_apps() -> None:
    assert {"demo.nightly-close", "demo.report-build", "demo.always-fails"} <= set(registry.keys())
    assert registry.get("demo.report-build").overlap == "allow"


# Runner options -----------------------------------------------------------------------


def test_liveness_budget_must_cover_two_heartbeats(reg: Registry) -> None:
    with pytest.raises(InvalidRunnerConfiguration, match="at least twice"):
        JobRunner(
            registry=reg,
            heartbeat_interval=timedelta(seconds=30),
            stale_run_after=timedelta(seconds=59),
        )
    exact = JobRunner(
        registry=reg,
        heartbeat_interval=timedelta(seconds=30),
        stale_run_after=timedelta(seconds=60),
    )
    assert exact.stale_run_after == timedelta(seconds=60)


@pytest.mark.parametrize(
    "options",
    [
        {"reap_scope": "everything"},
        {"reap_limit": 0},
        {"error_text_limit": 0},
        {"default_timeout": timedelta(seconds=-1)},
        {"heartbeat_interval": 5},
        {"clock": object()},
        {"clock": type("Naive", (), {"now": lambda self: datetime(2024, 1, 1)})()},
    ],
)
def test_invalid_runner_options_are_rejected(reg: Registry, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidRunnerConfiguration):
        JobRunner(registry=reg, **options)


def test_options_default_to_the_jobstate_settings(reg: Registry, settings: Any) -> None:
    settings.JOBSTATE = {
        **settings.JOBSTATE,
        "HEARTBEAT_INTERVAL": timedelta(seconds=7),
        "STALE_RUN_AFTER": timedelta(seconds=21),
        "REAP_SCOPE": "all",
        "REAP_LIMIT": None,
        "SERVICE_REVISION": "rev-42",
    }
    made = JobRunner(registry=reg)
    assert made.heartbeat_interval == timedelta(seconds=7)
    assert made.stale_run_after == timedelta(seconds=21)
    assert (made.reap_scope, made.reap_limit, made.service_revision) == ("all", None, "rev-42")


# Rejections that write nothing --------------------------------------------------------


@pytest.mark.django_db
def test_unknown_job_raises_and_writes_nothing(reg: Registry) -> None:
    store = RecordingStore()
    with pytest.raises(UnknownOperationsJob, match=r"no\.such-job"):
        runner(reg, store=store).execute("no.such-job")
    assert store.reap_calls == []
    assert not JobRun.objects.exists()


class Seconds:
    @staticmethod
    def parse(value: Any) -> float:
        seconds = value.get("seconds", 0)
        if not isinstance(seconds, int | float):
            raise ValueError("seconds must be a number")
        return float(seconds)


@pytest.mark.django_db  # rejected before the transaction check: nothing runs in a thread
@pytest.mark.parametrize(
    ("key", "bad_input", "message"),
    [
        ("a.schema", {"seconds": "soon"}, "seconds must be a number"),
        ("a.schema", {"seconds": float("nan")}, "not strict JSON"),
        ("a.no-input", {"x": 1}, "takes no input"),
        ("a.no-input", [1], "takes no input"),
    ],
)
def test_rejected_input_raises_and_writes_nothing(
    reg: Registry, key: str, bad_input: Any, message: str
) -> None:
    ran = threading.Event()
    operations_job("a.schema", input_schema=Seconds, registry=reg)(lambda c, i: ran.set())
    operations_job("a.no-input", registry=reg)(lambda c, i: ran.set())
    store = RecordingStore()
    with pytest.raises(OperationsJobInputError, match=message):
        runner(reg, store=store).execute(key, bad_input)
    assert not ran.is_set()
    assert store.reap_calls == []
    assert not JobRun.objects.exists()


@db
def test_empty_input_reaches_the_schema_as_an_empty_object(reg: Registry) -> None:
    seen: list[Any] = []
    operations_job("a.schema", input_schema=Seconds, registry=reg)(lambda c, i: seen.append(i))
    operations_job("a.callable", input_schema=lambda v: sorted(v), registry=reg)(
        lambda c, i: seen.append(i)
    )
    operations_job("a.no-input", registry=reg)(lambda c, i: seen.append(i))
    run = runner(reg)
    for key, value in [("a.schema", None), ("a.schema", {}), ("a.callable", {"b": 1, "a": 2})]:
        assert run.execute(key, value).status == JobRunStatus.SUCCEEDED
    assert run.execute("a.no-input", {}).status == JobRunStatus.SUCCEEDED
    assert seen == [0.0, 0.0, ["a", "b"], None]


@db
def test_execute_inside_a_transaction_is_refused_before_writing(reg: Registry) -> None:
    operations_job("a.b", registry=reg)(lambda c, i: None)
    with transaction.atomic(), pytest.raises(TransactionNotAllowed, match="autocommit"):
        runner(reg).execute("a.b")
    assert not JobRun.objects.exists()


# Outcomes -----------------------------------------------------------------------------


@db
def test_succeeded_run_stores_summary_input_trigger_and_runner_instants(reg: Registry) -> None:
    clock = ManualClock()

    @operations_job("billing.close-day", input_schema=Seconds, registry=reg)
    def body(ctx: RunContext, seconds: float) -> dict[str, Any]:
        clock.instant = T0 + timedelta(milliseconds=1234)
        return {"ok": True, "closed": 3, "seconds": seconds}

    result = runner(reg, clock=clock, service_revision="abc123").execute(
        "billing.close-day", {"seconds": 2}, Trigger("SCHEDULER", "cron@host")
    )
    assert result.status == JobRunStatus.SUCCEEDED
    assert (result.recorded, result.duration_ms, result.error) == ("settled", 1234, None)
    assert result.summary == {"ok": True, "closed": 3, "seconds": 2.0}
    stored = row(result)
    assert stored.status == JobRunStatus.SUCCEEDED
    assert stored.summary == {"ok": True, "closed": 3, "seconds": 2.0}
    assert stored.input == {"seconds": 2}
    assert (stored.trigger_source, stored.triggered_by) == ("SCHEDULER", "cron@host")
    assert (stored.started_at, stored.finished_at) == (T0, T0 + timedelta(milliseconds=1234))
    assert (stored.duration_ms, stored.service_revision) == (1234, "abc123")
    assert stored.overlap_key == "billing.close-day"


@db
def test_a_body_that_raises_is_failed_with_its_error_text(reg: Registry) -> None:
    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        raise ValueError("ledger does not balance")

    result = runner(reg).execute("billing.close-day")
    assert (result.status, result.reason) == (JobRunStatus.FAILED, RunReason.ERROR)
    stored = row(result)
    assert stored.status == JobRunStatus.FAILED
    assert stored.error is not None
    assert stored.error.startswith("ValueError: ledger does not balance\n")
    assert "Traceback" in stored.error and "in body" in stored.error


@db
def test_a_body_reporting_ok_false_is_failed_and_keeps_its_summary(reg: Registry) -> None:
    operations_job("billing.close-day", registry=reg)(lambda c, i: {"ok": False, "left": 4})
    result = runner(reg).execute("billing.close-day")
    assert (result.status, result.reason) == (JobRunStatus.FAILED, RunReason.REPORTED_NOT_OK)
    stored = row(result)
    assert (stored.status, stored.summary) == (JobRunStatus.FAILED, {"ok": False, "left": 4})
    assert stored.error == "job reported ok: False"


@db
def test_other_return_values_succeed(reg: Registry) -> None:
    run = runner(reg)
    for n, returned in enumerate([None, [1, 2], "done", 7, {"ok": "no"}, {"ok": 0}]):
        operations_job(f"a.returns-{n}", registry=reg)(lambda c, i, value=returned: value)
        result = run.execute(f"a.returns-{n}")
        assert result.status == JobRunStatus.SUCCEEDED, returned
        assert row(result).summary == (returned if isinstance(returned, dict) else None)


@db
def test_an_unstorable_summary_fails_the_run_instead_of_leaving_it_running(
    reg: Registry,
) -> None:
    operations_job("billing.close-day", registry=reg)(lambda c, i: {"at": datetime.now(UTC)})
    result = runner(reg).execute("billing.close-day")
    assert (result.status, result.reason) == (JobRunStatus.FAILED, RunReason.INVALID_SUMMARY)
    stored = row(result)
    assert stored.status == JobRunStatus.FAILED
    assert stored.error is not None and "cannot be stored" in stored.error


@db
def test_error_text_is_truncated_to_the_limit(reg: Registry) -> None:
    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        raise RuntimeError("x" * 5000 + "\x00")

    result = runner(reg, error_text_limit=120).execute("billing.close-day")
    stored = row(result)
    assert stored.error == result.error
    assert stored.error is not None and len(stored.error) == 120
    assert stored.error.startswith("RuntimeError: xxxx")
    assert stored.error.endswith("(truncated)")


# Overlap ------------------------------------------------------------------------------


@db
def test_a_held_key_records_a_skipped_run_and_never_runs_the_body(
    reg: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    ran = threading.Event()
    operations_job("billing.close-day", registry=reg)(lambda c, i: ran.set())
    holder = DatabaseJobRunStore().claim(
        job_key="billing.close-day",
        overlap_key="billing.close-day",
        trigger=Trigger("ADMIN"),
        input=None,
        started_at=T0,
    )
    assert holder is not None
    with caplog.at_level(logging.WARNING, logger="jobstate.runner"):
        result = runner(reg, clock=ManualClock()).execute(
            "billing.close-day", trigger=Trigger("SCHEDULER", "cron")
        )
    assert not ran.is_set()
    assert (result.status, result.reason, result.recorded) == (
        JobRunStatus.SKIPPED,
        RunReason.OVERLAP,
        "settled",
    )
    assert result.ok and result.duration_ms == 0
    skipped = row(result)
    assert skipped.status == JobRunStatus.SKIPPED
    assert (skipped.overlap_key, skipped.summary) == (None, {"reason": "overlap"})
    assert (skipped.started_at, skipped.finished_at) == (T0, T0)
    assert (skipped.trigger_source, skipped.triggered_by) == ("SCHEDULER", "cron")
    assert JobRun.objects.get(id=holder).status == JobRunStatus.RUNNING
    assert "job skipped: billing.close-day (overlap key already held)" in caplog.text


@db
def test_forbid_runs_exclude_each_other_and_the_key_is_free_once_settled(
    reg: Registry,
) -> None:
    entered, release = threading.Event(), threading.Event()

    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> dict[str, bool]:
        entered.set()
        return {"released": release.wait(5)}

    results: list[JobExecutionResult] = []

    def first() -> None:
        results.append(runner(reg).execute("billing.close-day"))
        connections.close_all()

    thread = threading.Thread(target=first)
    thread.start()
    assert entered.wait(5)
    second = runner(reg).execute("billing.close-day")
    release.set()
    thread.join(5)
    assert second.status == JobRunStatus.SKIPPED
    assert results[0].status == JobRunStatus.SUCCEEDED
    assert results[0].summary == {"released": True}
    third = runner(reg).execute("billing.close-day")
    assert third.status == JobRunStatus.SUCCEEDED


@db
def test_allow_runs_overlap_with_distinct_keys(reg: Registry) -> None:
    both_inside = threading.Barrier(2, timeout=5)

    @operations_job("reports.build", overlap="allow", registry=reg)
    def body(ctx: RunContext, input: None) -> dict[str, int]:
        # Passing the barrier proves both bodies were executing at the same time.
        return {"arrival": both_inside.wait()}

    results: list[JobExecutionResult] = []

    def run_one() -> None:
        results.append(runner(reg).execute("reports.build"))
        connections.close_all()

    threads = [threading.Thread(target=run_one) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert [r.status for r in results] == [JobRunStatus.SUCCEEDED] * 2
    keys = set(JobRun.objects.values_list("overlap_key", flat=True))
    assert len(keys) == 2
    assert all(key.startswith("reports.build#") for key in keys)


@db
@pytest.mark.concurrent
@pytest.mark.mysql
def test_eight_runners_on_one_forbid_key_run_the_body_once() -> None:
    reg = Registry()
    bodies: list[str] = []

    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        bodies.append(ctx.run_id)
        time.sleep(0.3)

    start = threading.Barrier(8, timeout=10)
    results: list[JobExecutionResult] = []
    lock = threading.Lock()

    def contender() -> None:
        try:
            start.wait()
            result = runner(reg).execute("billing.close-day")
            with lock:
                results.append(result)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contender) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    statuses = sorted(r.status for r in results)
    assert statuses == [JobRunStatus.SKIPPED] * 7 + [JobRunStatus.SUCCEEDED]
    assert len(bodies) == 1
    assert not JobRun.objects.running().exists()
    assert JobRun.objects.filter(status=JobRunStatus.SKIPPED).count() == 7


# Reaping before the claim -------------------------------------------------------------


@db
def test_reap_before_claim_is_scoped_by_policy(reg: Registry) -> None:
    operations_job("billing.close-day", registry=reg)(lambda c, i: None)
    operations_job("reports.build", overlap="allow", registry=reg)(lambda c, i: None)
    budget = {"stale_after": FAST["stale_run_after"], "limit": 25}
    cases = [
        ("billing.close-day", "overlap-key", [{**budget, "overlap_key": "billing.close-day"}]),
        # An allow-run's key is new, so its job's dead runs are found by job key.
        ("reports.build", "overlap-key", [{**budget, "job_key": "reports.build"}]),
        ("billing.close-day", "all", [budget]),
        ("reports.build", "all", [budget]),
        ("billing.close-day", "off", []),
        ("reports.build", "off", []),
    ]
    for key, scope, expected in cases:
        store = RecordingStore()
        runner(reg, store=store, reap_scope=scope, reap_limit=25).execute(key)
        assert store.reap_calls == expected, (key, scope)


def backdate(run_id: str, by: timedelta) -> None:
    JobRun.objects.filter(id=run_id).update(heartbeat_at=Now() - by)


@db
def test_a_dead_run_of_the_same_key_is_reaped_so_the_new_run_executes(reg: Registry) -> None:
    operations_job("billing.close-day", registry=reg)(lambda c, i: {"ran": True})
    store = DatabaseJobRunStore()
    dead = store.claim(
        job_key="billing.close-day",
        overlap_key="billing.close-day",
        trigger=Trigger("CLI"),
        input=None,
        started_at=T0,
    )
    assert dead is not None
    backdate(dead, timedelta(hours=1))
    result = runner(reg).execute("billing.close-day")
    assert result.status == JobRunStatus.SUCCEEDED
    reaped = JobRun.objects.get(id=dead)
    assert (reaped.status, reaped.error) == (JobRunStatus.TIMED_OUT, REAPED_RUN_ERROR)


@db
def test_a_failing_reap_is_logged_and_the_run_goes_on(
    reg: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    operations_job("billing.close-day", registry=reg)(lambda c, i: None)
    store = RecordingStore(fail=frozenset({"reap_stale"}))
    with caplog.at_level(logging.WARNING, logger="jobstate.runner"):
        result = runner(reg, store=store).execute("billing.close-day")
    assert result.status == JobRunStatus.SUCCEEDED
    assert "stale job run reap failed" in caplog.text


@db
def test_reap_stale_runs_sweeps_every_job_and_key(reg: Registry) -> None:
    store = DatabaseJobRunStore()
    ids = [
        store.claim(job_key=key, overlap_key=key, trigger=Trigger("CLI"), input=None, started_at=T0)
        for key in ["a.one", "b.two", "c.three"]
    ]
    for run_id in ids[:2]:
        assert run_id is not None
        backdate(run_id, timedelta(hours=1))
    assert runner(reg).reap_stale_runs() == 2
    assert runner(reg).reap_stale_runs() == 0
    assert JobRun.objects.get(id=ids[2]).status == JobRunStatus.RUNNING


# Store failures -----------------------------------------------------------------------


@db
@pytest.mark.parametrize("method", ["claim", "record_skipped"])
def test_a_store_failure_raises_store_error_with_its_cause(reg: Registry, method: str) -> None:
    ran = threading.Event()
    operations_job("billing.close-day", registry=reg)(lambda c, i: ran.set())
    if method == "record_skipped":
        DatabaseJobRunStore().claim(
            job_key="billing.close-day",
            overlap_key="billing.close-day",
            trigger=Trigger("CLI"),
            input=None,
            started_at=T0,
        )
    store = RecordingStore(fail=frozenset({method}))
    with pytest.raises(StoreError, match=r"billing\.close-day") as raised:
        runner(reg, store=store).execute("billing.close-day")
    assert isinstance(raised.value.__cause__, OperationalError)
    assert not ran.is_set()
    assert not JobRun.objects.exclude(status=JobRunStatus.RUNNING).exists()


@db
def test_a_run_settled_by_a_reaper_first_is_reported_superseded(
    reg: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> dict[str, bool]:
        # Another machine's reaper decides this run is dead while it is still working.
        DatabaseJobRunStore().reap_stale(stale_after=timedelta(0), overlap_key="billing.close-day")
        return {"closed": True}

    quiet = {"heartbeat_interval": timedelta(seconds=5), "stale_run_after": timedelta(seconds=10)}
    with caplog.at_level(logging.WARNING, logger="jobstate.runner"):
        result = runner(reg, **quiet).execute("billing.close-day")
    assert (result.status, result.recorded) == (JobRunStatus.SUCCEEDED, "superseded")
    stored = row(result)
    assert (stored.status, stored.error) == (JobRunStatus.TIMED_OUT, REAPED_RUN_ERROR)
    assert "already settled by a reaper" in caplog.text


@db
def test_a_failed_final_write_is_reported_unrecorded(
    reg: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    operations_job("billing.close-day", registry=reg)(lambda c, i: {"closed": True})
    store = RecordingStore(fail=frozenset({"complete"}))
    with caplog.at_level(logging.ERROR, logger="jobstate.runner"):
        result = runner(reg, store=store).execute("billing.close-day")
    assert (result.status, result.recorded) == (JobRunStatus.SUCCEEDED, "unrecorded")
    assert len(store.complete_calls) == 1
    assert row(result).status == JobRunStatus.RUNNING
    assert "the row stays RUNNING until the next reap" in caplog.text


# Heartbeats ---------------------------------------------------------------------------


@db
def test_heartbeats_advance_the_watermark_during_a_long_body(reg: Registry) -> None:
    watermarks: list[datetime] = []

    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        watermarks.append(JobRun.objects.get(id=ctx.run_id).heartbeat_at)
        # A long body: it runs until the heartbeat thread has beaten a few times (at a
        # 0.05 s interval), however slow the machine, rather than for a guessed time.
        deadline = time.monotonic() + 30
        while len(store.heartbeat_calls) < 4 and time.monotonic() < deadline:
            time.sleep(0.02)
        watermarks.append(JobRun.objects.get(id=ctx.run_id).heartbeat_at)

    store = RecordingStore()
    result = runner(reg, store=store).execute("billing.close-day")
    assert result.status == JobRunStatus.SUCCEEDED
    beats = len(store.heartbeat_calls)
    assert beats >= 4, "the heartbeat thread did not beat during the body"
    assert watermarks[1] > watermarks[0]
    time.sleep(0.2)
    assert len(store.heartbeat_calls) == beats, "heartbeats continued after the run settled"


@db
def test_progress_from_the_body_is_stored_as_the_summary(reg: Registry) -> None:
    answers: list[bool] = []

    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        answers.append(ctx.heartbeat({"processed": 10}))
        with pytest.raises(InvalidPayload):
            ctx.heartbeat({"bad": float("inf")})

    result = runner(reg).execute("billing.close-day")
    assert result.status == JobRunStatus.SUCCEEDED
    assert answers == [True]
    assert row(result).summary == {"processed": 10}


@db
def test_a_rejected_heartbeat_aborts_the_run_as_failed(
    reg: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    cancelled: list[bool] = []

    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        cancelled.append(ctx.cancelled.wait(5))

    store = RecordingStore(heartbeat=lambda n: False)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="jobstate.runner"):
        result = runner(reg, store=store).execute("billing.close-day")
    assert time.monotonic() - started < 2
    assert (result.status, result.reason) == (JobRunStatus.FAILED, RunReason.CLAIM_LOST)
    assert row(result).status == JobRunStatus.FAILED
    assert "lost its claim" in (row(result).error or "")
    assert "claim lost" in caplog.text
    assert wait_until(lambda: cancelled == [True])


@db
def test_heartbeat_errors_abort_only_after_the_whole_liveness_budget(reg: Registry) -> None:
    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        ctx.cancelled.wait(5)

    def broken(n: int) -> bool:
        raise OperationalError("database went away")

    started = time.monotonic()
    result = runner(
        reg,
        store=RecordingStore(heartbeat=broken),
        heartbeat_interval=timedelta(milliseconds=50),
        stale_run_after=timedelta(milliseconds=300),
    ).execute("billing.close-day")
    elapsed = time.monotonic() - started
    assert result.reason == RunReason.HEARTBEAT_UNVERIFIABLE
    assert row(result).status == JobRunStatus.FAILED
    assert 0.3 <= elapsed < 2


@db
def test_a_single_heartbeat_error_is_tolerated(reg: Registry) -> None:
    # A budget of five beats: one failed beat is tolerated, however late a loaded machine
    # runs the next one (two beats' worth of budget failed it there).
    operations_job("billing.close-day", registry=reg)(lambda c, i: time.sleep(1.0))

    def flaky(n: int) -> bool | None:
        if n == 1:
            raise OperationalError("one dropped packet")
        return None

    store = RecordingStore(heartbeat=flaky)
    result = runner(
        reg,
        store=store,
        heartbeat_interval=timedelta(milliseconds=100),
        stale_run_after=timedelta(milliseconds=500),
    ).execute("billing.close-day")
    assert result.status == JobRunStatus.SUCCEEDED
    assert len(store.heartbeat_calls) >= 4


# Deadlines ----------------------------------------------------------------------------


@db
def test_a_body_past_its_timeout_is_recorded_timed_out(reg: Registry) -> None:
    @operations_job("billing.close-day", timeout=timedelta(milliseconds=200), registry=reg)
    def body(ctx: RunContext, input: None) -> dict[str, bool]:
        # A cooperative body stops when cancelled; returning does not turn it into success.
        return {"ok": True, "cancelled": ctx.cancelled.wait(5)}

    started = time.monotonic()
    result = runner(reg).execute("billing.close-day")
    assert 0.2 <= time.monotonic() - started < 1.5
    assert (result.status, result.reason) == (JobRunStatus.TIMED_OUT, RunReason.TIMEOUT)
    assert not result.ok
    stored = row(result)
    assert stored.status == JobRunStatus.TIMED_OUT
    assert "timed out" in (stored.error or "")
    assert stored.duration_ms is not None and stored.duration_ms >= 200


@db
def test_a_body_returning_when_cancelled_stays_timed_out_on_a_coarse_clock(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Some platforms' monotonic clock ticks every few milliseconds: the deadline and the
    # body's return, microseconds apart, read the same instant. A second's tick makes
    # that certain here.
    fine = time.monotonic
    monkeypatch.setattr(time, "monotonic", lambda: float(int(fine())))

    @operations_job("billing.close-day", timeout=timedelta(milliseconds=100), registry=reg)
    def body(ctx: RunContext, input: None) -> dict[str, bool]:
        ctx.cancelled.wait(5)
        return {"ok": True}

    result = runner(reg).execute("billing.close-day")
    assert (result.status, result.reason) == (JobRunStatus.TIMED_OUT, RunReason.TIMEOUT)
    assert row(result).status == JobRunStatus.TIMED_OUT


@db
def test_the_default_timeout_applies_to_jobs_without_one(reg: Registry) -> None:
    operations_job("billing.close-day", registry=reg)(lambda c, i: c.cancelled.wait(5))
    result = runner(reg, default_timeout=timedelta(milliseconds=150)).execute("billing.close-day")
    assert result.status == JobRunStatus.TIMED_OUT


@db
def test_a_body_finishing_after_the_record_is_never_written(
    reg: Registry, caplog: pytest.LogCaptureFixture
) -> None:
    finished = threading.Event()

    @operations_job("billing.close-day", timeout=timedelta(milliseconds=100), registry=reg)
    def body(ctx: RunContext, input: None) -> dict[str, bool]:
        time.sleep(0.4)  # ignores ctx.cancelled
        finished.set()
        return {"late": True}

    store = RecordingStore()
    with caplog.at_level(logging.WARNING, logger="jobstate.runner"):
        result = runner(reg, store=store).execute("billing.close-day")
        assert result.status == JobRunStatus.TIMED_OUT
        assert finished.wait(5)
        assert wait_until(lambda: "settled after the run was recorded" in caplog.text)
    assert len(store.complete_calls) == 1
    stored = row(result)
    assert stored.status == JobRunStatus.TIMED_OUT
    assert stored.summary != {"late": True}


@db
def test_an_interrupted_run_is_recorded_failed_so_its_key_is_free(reg: Registry) -> None:
    interrupts = [signal.SIGINT]

    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        if interrupts:
            time.sleep(0.1)  # let the caller reach its wait
            signal.pthread_kill(threading.main_thread().ident or 0, interrupts.pop())
            ctx.cancelled.wait(5)

    # Ctrl-C as a terminal delivers it. A process started in the background by a
    # non-interactive shell (as CI starts its test legs) inherits SIGINT ignored, and
    # Python then leaves it ignored: the test sets the default handler itself.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            runner(reg).execute("billing.close-day")
    finally:
        signal.signal(signal.SIGINT, previous)
    interrupted = JobRun.objects.get()
    assert interrupted.status == JobRunStatus.FAILED
    assert "interrupted" in (interrupted.error or "")
    assert runner(reg).execute("billing.close-day").status == JobRunStatus.SUCCEEDED


@db
def test_an_interrupt_while_the_run_s_threads_start_is_recorded_too(
    reg: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop signal that came while the runner started its heartbeat thread (a wait of
    its own, long on a loaded machine) escaped before the runner's guard: the run stayed
    RUNNING and held its key until reaped."""
    ran: list[bool] = []

    @operations_job("billing.close-day", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        ran.append(True)

    start = threading.Thread.start

    def interrupted_start(thread: threading.Thread) -> None:
        if thread.name.startswith("jobstate-heartbeat-"):
            raise KeyboardInterrupt
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", interrupted_start)
    with pytest.raises(KeyboardInterrupt):
        runner(reg).execute("billing.close-day")
    monkeypatch.undo()

    interrupted = JobRun.objects.get()
    assert interrupted.status == JobRunStatus.FAILED
    assert interrupted.error == "job run was interrupted (Ctrl-C or a stop signal)"
    assert ran == []
    assert runner(reg).execute("billing.close-day").status == JobRunStatus.SUCCEEDED
