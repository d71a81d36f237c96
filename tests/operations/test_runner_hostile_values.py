"""What a careless or hostile operations job hands the runner and the run store: an
exception whose message no database can hold, a timeout past any date, an error text of
megabytes. Each is either refused before a run row is written or recorded as a settled
run; never a run left RUNNING that holds its overlap key until a sweep reaps it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobstate.exceptions import InvalidOperationsJob
from jobstate.models import JobRun
from jobstate.runner import JobRunner, Registry, RunContext, operations_job
from jobstate.stores.base import JobRunStatus, Trigger
from jobstate.stores.database import DatabaseJobRunStore

db = pytest.mark.django_db(transaction=True)

FAST = {
    "heartbeat_interval": timedelta(milliseconds=50),
    "stale_run_after": timedelta(milliseconds=500),
}

#: A file name as ``os.fsdecode`` gives it for bytes that are not UTF-8: a lone surrogate.
UNDECODABLE = b"report-\xff.csv".decode("utf-8", "surrogateescape")


@pytest.fixture
def reg() -> Registry:
    return Registry()


@db
def test_an_error_whose_message_holds_a_lone_surrogate_is_recorded_failed(
    reg: Registry,
) -> None:
    @operations_job("billing.read-report", registry=reg)
    def body(ctx: RunContext, input: None) -> None:
        raise ValueError(f"cannot read {UNDECODABLE}")

    runner = JobRunner(registry=reg, **FAST)
    first = runner.execute("billing.read-report")
    assert first.status == JobRunStatus.FAILED
    stored = JobRun.objects.get(id=first.run_id)
    assert stored.status == JobRunStatus.FAILED
    assert stored.error is not None and stored.error.startswith("ValueError: cannot read report-")
    # The overlap key was let go: the next start runs instead of being skipped.
    assert runner.execute("billing.read-report").status == JobRunStatus.FAILED


@pytest.mark.parametrize("timeout", [timedelta.max, timedelta(days=365 * 1000 + 1)])
def test_a_timeout_past_the_longest_duration_is_refused_at_registration(
    reg: Registry, timeout: timedelta
) -> None:
    with pytest.raises(InvalidOperationsJob, match="timeout must be at most 365000 days"):
        operations_job("billing.close-day", registry=reg, timeout=timeout)(lambda c, i: None)
    assert "billing.close-day" not in reg


@db
def test_the_run_store_keeps_an_error_text_cut_to_the_limit(settings: Any) -> None:
    settings.JOBSTATE = {"ERROR_TEXT_LIMIT": 100}
    store = DatabaseJobRunStore()
    run_id = store.claim(
        job_key="billing.close-day",
        overlap_key="billing.close-day",
        trigger=Trigger("CLI"),
        input=None,
        started_at=datetime.now(UTC),
    )
    assert store.complete(
        run_id=run_id,
        status="FAILED",
        finished_at=datetime.now(UTC),
        duration_ms=5,
        error="e" * 1_000_000,
    )
    assert JobRun.objects.get(id=run_id).error == "e" * 100


@db
def test_a_heartbeat_interval_longer_than_a_thread_can_wait_still_settles_the_run(
    reg: Registry,
) -> None:
    # 150,000 days is within the longest duration, but past the longest wait a thread
    # can be given (threading.TIMEOUT_MAX, about 292 years).
    @operations_job("billing.slow-beat", registry=reg)
    def body(ctx: RunContext, input: None) -> str:
        return "done"

    runner = JobRunner(
        registry=reg,
        heartbeat_interval=timedelta(days=150_000),
        stale_run_after=timedelta(days=300_000),
    )
    result = runner.execute("billing.slow-beat")
    assert result.status == JobRunStatus.SUCCEEDED
    assert JobRun.objects.get(id=result.run_id).status == JobRunStatus.SUCCEEDED
