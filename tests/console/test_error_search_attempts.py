"""``error:`` finds a job by the error of any of its attempts, not only the last one
its ``error`` column keeps, on every backend, within the search's recent window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobstate.console.job_search import parse_search
from jobstate.core.attempt_log import AttemptOutcome, TaskAttempt
from jobstate.models import Job

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def attempt(worker: str, minute: int, cls: str, message: str) -> dict[str, object]:
    return TaskAttempt(
        worker_id=worker,
        started_at=T0 + timedelta(minutes=minute),
        finished_at=T0 + timedelta(minutes=minute, seconds=5),
        outcome=AttemptOutcome.FAILED,
        exception_class_path=cls,
        message=message,
        traceback=f'Traceback (most recent call last):\n  File "app/sync.py"\n{cls}: {message}\n',
    ).as_json()


def found(term: str) -> set[str]:
    return set(parse_search(term).apply(Job.objects.all()).values_list("request_id", flat=True))


def test_error_matches_an_earlier_attempts_error_as_well_as_the_last() -> None:
    log = [
        attempt("w-1", 0, "builtins.ConnectionResetError", "peer reset by “gateway”"),
        attempt("w-2", 1, "builtins.TimeoutError", "Zeitüberschreitung nach 30 s"),
    ]
    Job.objects.create(
        request_id="retried",
        task_path="app.sync",
        status="error",
        attempt_log=log,
        error="builtins.TimeoutError: Zeitüberschreitung nach 30 s",
    )
    Job.objects.create(request_id="clean", task_path="app.sync", status="done", attempt_log=[])
    Job.objects.create(request_id="legacy", target="gpu", status="error", error="ValueError: bad")

    assert found("error:ConnectionResetError") == {"retried"}
    assert found('error:"reset by “gateway”"') == {"retried"}
    assert found("error:Zeitüberschreitung") == {"retried"}
    assert found("error:ValueError") == {"legacy"}
    assert found("error:KeyError") == set()
    # With another term, every term must hold.
    assert found("error:ConnectionResetError worker:w-3") == set()
    assert found("error:ConnectionResetError worker:w-1") == {"retried"}


def test_error_looks_only_at_the_newest_jobs_of_the_window() -> None:
    log = [attempt("w-1", 0, "builtins.ConnectionResetError", "old failure")]
    old = Job.objects.create(request_id="old", status="error", attempt_log=log, error="x")
    new = Job.objects.create(request_id="new", status="error", attempt_log=log, error="x")
    Job.objects.filter(pk=old.pk).update(created_at=T0 - timedelta(days=30))
    search = parse_search("error:ConnectionResetError")
    rows = search.apply(Job.objects.all(), window_start=T0)
    assert set(rows.values_list("request_id", flat=True)) == {new.request_id}
