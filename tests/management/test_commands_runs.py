"""``run_operations_job`` and ``reap_stale``: output, exit status, and what they record,
through ``call_command`` and through real ``manage.py`` processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, transaction
from django.db.models.functions import Now

from jobstate.models import JobRun
from jobstate.runner import RunContext, operations_job, registry
from jobstate.stores.base import REAPED_RUN_ERROR, JobRunStatus, Trigger
from jobstate.stores.database import DatabaseJobRunStore
from tests.support.processes import finish, manage_py

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


class UnreachableStore(DatabaseJobRunStore):
    """A run store whose database stops answering once the run is to be claimed."""

    def claim(self, **kwargs: Any) -> str | None:
        raise OperationalError("could not connect to server")


def run(*args: str, **options: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def failing(*args: str, **options: Any) -> CommandError:
    with pytest.raises(CommandError) as raised:
        run(*args, **options)
    return raised.value


def hold(key: str) -> str:
    run_id = DatabaseJobRunStore().claim(
        job_key=key, overlap_key=key, trigger=Trigger("ADMIN"), input=None, started_at=T0
    )
    assert run_id is not None
    return run_id


def stale_runs(count: int, *, age: timedelta = timedelta(hours=1)) -> list[str]:
    ids = [hold(f"stale.job-{n}") for n in range(count)]
    JobRun.objects.filter(id__in=ids).update(heartbeat_at=Now() - age)
    return ids


@pytest.fixture
def slow_job() -> Iterator[str]:
    @operations_job("tests.too-slow", timeout=timedelta(milliseconds=100))
    def too_slow(ctx: RunContext, input: None) -> None:
        ctx.cancelled.wait(5)

    yield "tests.too-slow"
    registry.unregister("tests.too-slow")


# run_operations_job through call_command ---------------------------------------------


def test_a_successful_run_is_quiet_and_recorded() -> None:
    out, err = run("run_operations_job", "demo.report-build", input='{"rows": 5}')
    assert (out, err) == ("", "")
    stored = JobRun.objects.get()
    assert (stored.job_key, stored.status) == ("demo.report-build", JobRunStatus.SUCCEEDED)
    assert stored.input == {"rows": 5}
    assert stored.summary is not None and stored.summary["rows"] == 5
    assert stored.trigger_source == "CLI"


def test_verbosity_two_prints_one_line_and_json_prints_the_result() -> None:
    out, _ = run("run_operations_job", "demo.report-build", verbosity=2)
    assert out.startswith("demo.report-build SUCCEEDED in ")
    out, _ = run("run_operations_job", "demo.report-build", "--json", triggered_by="ops@example")
    result = json.loads(out)
    assert (result["status"], result["recorded"], result["job_key"]) == (
        "SUCCEEDED",
        "settled",
        "demo.report-build",
    )
    stored = JobRun.objects.get(id=result["run_id"])
    assert stored.triggered_by == "ops@example"
    assert result["summary"] == stored.summary


def test_a_failed_run_exits_1_with_the_error_on_stderr() -> None:
    error = failing("run_operations_job", "demo.always-fails")
    assert error.returncode == 1
    assert "demo.always-fails FAILED" in str(error)
    assert "RuntimeError: demo.always-fails failed on purpose" in str(error)
    assert JobRun.objects.get().status == JobRunStatus.FAILED


def test_a_timed_out_run_exits_1(slow_job: str) -> None:
    error = failing("run_operations_job", slow_job, "--json")
    assert error.returncode == 1
    assert JobRun.objects.get().status == JobRunStatus.TIMED_OUT


def test_a_skipped_run_exits_0() -> None:
    holder = hold("demo.nightly-close")
    out, _ = run("run_operations_job", "demo.nightly-close", "--json")
    assert json.loads(out)["status"] == "SKIPPED"
    skipped = JobRun.objects.get(status=JobRunStatus.SKIPPED)
    assert skipped.job_key == "demo.nightly-close"
    assert JobRun.objects.get(id=holder).status == JobRunStatus.RUNNING


def test_an_unknown_job_exits_2_naming_the_known_ones() -> None:
    error = failing("run_operations_job", "no.such-job")
    assert error.returncode == 2
    assert "'no.such-job'" in str(error) and "demo.nightly-close" in str(error)
    assert not JobRun.objects.exists()


@pytest.mark.parametrize(
    ("key", "text", "message"),
    [
        ("demo.nightly-close", "{seconds: 2}", "--input is not valid JSON"),
        ("demo.nightly-close", '{"seconds": NaN}', "--input is not valid JSON"),
        ("demo.nightly-close", '{"seconds": -1}', "seconds must be between 0 and 3600"),
        ("demo.always-fails", '{"x": 1}', "takes no input"),
        # A RecursionError escaped as a traceback (status 1).
        # (Python 3.13 reads it, and the job's input check refuses the depth.)
        ("demo.nightly-close", "[" * 5000 + "]" * 5000, "nested more than 31 levels deep"),
    ],
)
def test_bad_input_exits_2_and_records_nothing(key: str, text: str, message: str) -> None:
    error = failing("run_operations_job", key, input=text)
    assert error.returncode == 2
    assert message in str(error)
    assert not JobRun.objects.exists()


def test_a_missing_key_exits_2() -> None:
    assert failing("run_operations_job").returncode == 2


def test_list_shows_the_registered_jobs() -> None:
    out, _ = run("run_operations_job", "--list")
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == registry.keys()
    assert any(line.split()[:2] == ["demo.report-build", "allow"] for line in lines)
    out, _ = run("run_operations_job", "--list", "--json")
    jobs = {job["key"]: job for job in json.loads(out)}
    assert jobs["demo.nightly-close"]["timeout_seconds"] == 300
    assert jobs["demo.nightly-close"]["takes_input"] is True
    assert not JobRun.objects.exists()


def test_a_store_failure_exits_1(settings: Any) -> None:
    settings.JOBSTATE = {**settings.JOBSTATE, "RUN_STORE": f"{__name__}.UnreachableStore"}
    error = failing("run_operations_job", "demo.report-build")
    assert error.returncode == 1
    assert "could not connect to server" in str(error)
    assert not JobRun.objects.exists()


# reap_stale through call_command -----------------------------------------------------


def test_reap_stale_is_silent_when_nothing_is_stale() -> None:
    hold("fresh.job")
    assert run("reap_stale") == ("", "")
    assert JobRun.objects.get().status == JobRunStatus.RUNNING


def test_reap_stale_moves_stale_runs_and_says_how_many() -> None:
    ids = stale_runs(3)
    fresh = hold("fresh.job")
    out, _ = run("reap_stale")
    assert out.strip() == "Reaped 3 stale job runs (RUNNING -> TIMED_OUT)."
    for stored in JobRun.objects.filter(id__in=ids):
        assert (stored.status, stored.error) == (JobRunStatus.TIMED_OUT, REAPED_RUN_ERROR)
    assert JobRun.objects.get(id=fresh).status == JobRunStatus.RUNNING
    assert run("reap_stale") == ("", "")


def test_reap_stale_dry_run_counts_and_writes_nothing() -> None:
    stale_runs(3)
    out, _ = run("reap_stale", "--dry-run")
    assert out.strip() == "Would reap 3 stale job runs (dry run: nothing was written)."
    out, _ = run("reap_stale", "--dry-run", "--json", "--limit", "2")
    assert json.loads(out).items() >= {"runs": 2, "dry_run": True}.items()
    assert JobRun.objects.running().count() == 3


def test_reap_stale_limit_and_budget() -> None:
    stale_runs(3, age=timedelta(minutes=10))
    out, _ = run("reap_stale", "--json", "--stale-after", "3600")
    assert json.loads(out).items() >= {"runs": 0, "dry_run": False}.items()
    out, _ = run("reap_stale", "--json", "--limit", "2")
    assert json.loads(out).items() >= {"runs": 2, "dry_run": False}.items()
    out, _ = run("reap_stale", "--json")
    assert json.loads(out).items() >= {"runs": 1, "dry_run": False}.items()


def test_reap_stale_refuses_a_budget_shorter_than_two_heartbeats() -> None:
    stale_runs(1)
    error = failing("reap_stale", "--stale-after", "45")
    assert "--stale-after: 45 s is less than twice JOBSTATE['HEARTBEAT_INTERVAL']" in str(error)
    assert JobRun.objects.running().count() == 1


# Real processes ----------------------------------------------------------------------


@pytest.mark.slow
def test_exit_status_of_real_processes() -> None:
    processes = {
        "succeeded": manage_py("run_operations_job", "demo.report-build"),
        "failed": manage_py("run_operations_job", "demo.always-fails"),
        "unknown": manage_py("run_operations_job", "no.such-job"),
        "bad json": manage_py("run_operations_job", "demo.nightly-close", "--input", "{oops"),
    }
    done = {name: finish(process) for name, process in processes.items()}
    assert done["succeeded"] == (0, "", "")
    assert done["failed"][0] == 1
    assert "demo.always-fails failed on purpose" in done["failed"][2]
    assert done["unknown"][0] == 2
    assert "no.such-job" in done["unknown"][2]
    assert done["bad json"][0] == 2
    assert "--input is not valid JSON" in done["bad json"][2]
    statuses = sorted(JobRun.objects.values_list("job_key", "status"))
    assert statuses == [
        ("demo.always-fails", JobRunStatus.FAILED),
        ("demo.report-build", JobRunStatus.SUCCEEDED),
    ]


@pytest.mark.slow
@pytest.mark.concurrent
@pytest.mark.mysql
def test_two_processes_on_one_forbid_key_run_the_body_once_and_both_exit_0() -> None:
    args = ("run_operations_job", "demo.nightly-close", "--input", '{"seconds": 2}', "--json")
    first, second = manage_py(*args), manage_py(*args)
    results = [finish(first), finish(second)]
    assert [code for code, _, _ in results] == [0, 0], results
    statuses = sorted(json.loads(out)["status"] for _, out, _ in results)
    assert statuses == ["SKIPPED", "SUCCEEDED"]
    ran = JobRun.objects.get(job_key="demo.nightly-close", status=JobRunStatus.SUCCEEDED)
    assert ran.summary is not None and ran.summary["closed"] is True
    assert ran.duration_ms is not None and ran.duration_ms >= 2000
    skipped = JobRun.objects.get(job_key="demo.nightly-close", status=JobRunStatus.SKIPPED)
    assert skipped.overlap_key is None
    assert JobRun.objects.count() == 2


@pytest.mark.slow
@pytest.mark.concurrent
@pytest.mark.mysql
def test_two_reapers_at_once_count_each_stale_run_once() -> None:
    ids = stale_runs(60)
    # This connection plays a third reaper that is midway through moving 20 of the rows:
    # the two processes must pass over them rather than wait or count them.
    with transaction.atomic():
        held = list(JobRun.objects.select_for_update().filter(id__in=ids[:20]))
        first, second = manage_py("reap_stale", "--json"), manage_py("reap_stale", "--json")
        results = [finish(first), finish(second)]
        assert [code for code, _, _ in results] == [0, 0], results
        counts = [json.loads(out)["runs"] for _, out, _ in results]
        assert sum(counts) == 40
        assert len(held) == 20
    assert JobRun.objects.filter(id__in=ids[:20], status=JobRunStatus.RUNNING).count() == 20
    out, _ = run("reap_stale", "--json")
    assert json.loads(out)["runs"] == 20
    assert JobRun.objects.filter(id__in=ids, status=JobRunStatus.TIMED_OUT).count() == 60
