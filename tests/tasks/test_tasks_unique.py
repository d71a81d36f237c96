"""Unique tasks (``policy(unique=...)``) on the database: an enqueue whose key a job holds
returns that job's result (same id) and writes nothing, whoever enqueues at once.

Runs on SQLite, PostgreSQL and MariaDB: the unique index is partial on the first two and
a generated column's index on MariaDB (migration ``0017_task_policy``)."""

from __future__ import annotations

import hashlib
import importlib
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobstate.console.job_search import parse_search
from jobstate.core.states import JobStatus
from jobstate.exceptions import InvalidPayload, UniqueTaskHeld
from jobstate.models import UNIQUE_HOLD_SQL, AuditEntry, Job, unique_hold
from jobstate.stores import get_state_store
from jobstate.tasks import unique_key
from jobstate.tasks.compat import task_enqueued
from jobstate.testing.memory_queue import holds_unique_key
from tests.support.admin_kit import JOBS, act, logged_in, operator, shown_messages
from tests.support.policy_tasks import (
    add_with_a_policy,
    import_customer,
    key_raises,
    keyed_by,
    unique_by_arguments,
    unique_per_hour,
    unique_until_it_succeeds,
)
from tests.support.task_functions import add
from tests.support.tasks_kit import use_options
from tests.support.threads import in_parallel

migration_0017 = importlib.import_module("jobstate.migrations.0017_task_policy")

pytestmark = pytest.mark.mysql


@pytest.fixture
def enqueued() -> Iterator[list[str]]:
    """The ids ``task_enqueued`` was sent for during the test."""
    sent: list[str] = []

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        sent.append(task_result.id)

    task_enqueued.connect(receiver, weak=False)
    yield sent
    task_enqueued.disconnect(receiver)


def finish(result_id: str, status: str = JobStatus.DONE) -> None:
    Job.objects.filter(id=result_id).update(status=status)


@pytest.mark.django_db
def test_a_duplicate_returns_the_holder_and_writes_nothing(
    settings: Any, enqueued: list[str]
) -> None:
    use_options(settings)
    first = unique_by_arguments.enqueue(1, flag=True)
    again = unique_by_arguments.enqueue(1, flag=True)
    other = unique_by_arguments.enqueue(2, flag=True)

    assert again.id == first.id != other.id
    assert Job.objects.count() == 2
    assert enqueued == [first.id, other.id]
    job = Job.objects.get(id=first.id)
    assert job.policy == {"unique_key": '[[1],{"flag":true}]'}


@pytest.mark.django_db
def test_a_running_holder_blocks_and_a_finished_one_does_not(settings: Any) -> None:
    use_options(settings)
    first = import_customer.enqueue(7)
    Job.objects.filter(id=first.id).update(status=JobStatus.RUNNING)
    assert import_customer.enqueue(7, full=True).id == first.id

    finish(first.id)
    second = import_customer.enqueue(7)
    assert second.id != first.id
    finish(second.id, JobStatus.ERROR)
    assert import_customer.enqueue(7).id not in (first.id, second.id)


@pytest.mark.django_db
def test_a_key_function_returning_none_is_not_unique(settings: Any) -> None:
    use_options(settings)
    assert import_customer.enqueue(-1).id != import_customer.enqueue(-1).id


@pytest.mark.django_db
def test_a_key_given_at_enqueue_replaces_the_computed_one(settings: Any) -> None:
    use_options(settings)
    with unique_key("nightly"):
        first = unique_by_arguments.enqueue(1)
        assert unique_by_arguments.enqueue(2).id == first.id
    assert unique_by_arguments.enqueue(2).id != first.id
    assert Job.objects.get(id=first.id).policy == {"unique_key": "nightly"}
    # Tasks that are not unique stay so inside the block, with a policy or without.
    with unique_key("nightly"):
        assert add_with_a_policy.enqueue(1, 2).id != add_with_a_policy.enqueue(1, 2).id
        assert add.enqueue(1, 2).id != add.enqueue(1, 2).id


@pytest.mark.django_db
def test_unique_states_say_which_states_hold_the_key(settings: Any) -> None:
    use_options(settings)
    first = unique_until_it_succeeds.enqueue("a")
    finish(first.id, JobStatus.ERROR)
    second = unique_until_it_succeeds.enqueue("a")
    assert second.id != first.id
    finish(second.id)
    assert unique_until_it_succeeds.enqueue("a").id == second.id


@pytest.mark.django_db
def test_a_finished_task_whose_key_a_newer_job_holds_is_not_requeued(settings: Any) -> None:
    use_options(settings)
    first = unique_by_arguments.enqueue("r")
    finish(first.id)
    newer = unique_by_arguments.enqueue("r")
    store = get_state_store()

    assert store.requeue_jobs([(first.id, JobStatus.DONE)], by="ops", via="test") == []
    with pytest.raises(UniqueTaskHeld, match="finish or cancel that job first"):
        store.requeue_job(first.id, from_statuses=[JobStatus.DONE], by="ops", via="test")
    assert Job.objects.get(id=first.id).status == JobStatus.DONE
    assert not AuditEntry.objects.filter(job_id=first.id, event="rerun").exists()

    finish(newer.id)
    assert store.requeue_jobs([(first.id, JobStatus.DONE)], by="ops", via="test") == [
        Job.objects.get(id=first.id).id
    ]
    assert unique_by_arguments.enqueue("r").id == first.id


@pytest.mark.django_db
def test_unique_for_covers_finished_tasks_of_the_same_period(
    settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_options(settings)
    hour = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
    monkeypatch.setattr(timezone, "now", lambda: hour + timedelta(minutes=5))
    first = unique_per_hour.enqueue("report")
    finish(first.id)
    monkeypatch.setattr(timezone, "now", lambda: hour + timedelta(minutes=55))
    assert unique_per_hour.enqueue("report").id == first.id
    finish(first.id, JobStatus.ERROR)
    assert unique_per_hour.enqueue("report").id == first.id
    monkeypatch.setattr(timezone, "now", lambda: hour + timedelta(minutes=65))
    assert unique_per_hour.enqueue("report").id != first.id


@pytest.mark.django_db
def test_inside_a_transaction_the_holder_is_what_the_transaction_sees(settings: Any) -> None:
    use_options(settings)
    with transaction.atomic():
        first = unique_by_arguments.enqueue("tx")
        assert unique_by_arguments.enqueue("tx").id == first.id
        transaction.set_rollback(True)
    # Rolled back: it never held the key.
    assert not Job.objects.filter(id=first.id).exists()
    assert unique_by_arguments.enqueue("tx").id != first.id


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("key", "error", "says"),
    [
        ("a\x00b", InvalidPayload, "NUL"),
        ("\ud800", InvalidPayload, "surrogate"),
        ("k" * 501, InvalidPayload, "limit is 500"),
        ("", InvalidPayload, "empty"),
        ({"a": 1}, TypeError, "str or an int"),
        (True, TypeError, "str or an int"),
    ],
)
def test_a_key_a_job_cannot_hold_is_refused_and_nothing_is_written(
    settings: Any, key: Any, error: type[Exception], says: str
) -> None:
    use_options(settings)
    with pytest.raises(error, match=says):
        keyed_by.enqueue(key)
    with pytest.raises(ZeroDivisionError):
        key_raises.enqueue()
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_long_arguments_are_unique_by_their_digest(settings: Any) -> None:
    use_options(settings)
    first = unique_by_arguments.enqueue("x" * 5000)
    assert unique_by_arguments.enqueue("x" * 5000).id == first.id
    assert Job.objects.get(id=first.id).policy["unique_key"].startswith("sha256:")


@pytest.mark.django_db(transaction=True)
def test_sixteen_enqueues_at_once_give_one_job_and_fifteen_existing_answers(
    settings: Any, enqueued: list[str]
) -> None:
    use_options(settings)

    def enqueue(index: int) -> str:
        if index % 2:
            # Half inside a transaction that holds the new row a moment before
            # committing: the others wait for it, then answer with it.
            with transaction.atomic():
                result = import_customer.enqueue(42)
                time.sleep(0.05)
            return result.id
        return import_customer.enqueue(42).id

    ids = in_parallel(16, enqueue)

    assert len(set(ids)) == 1
    assert list(Job.objects.values_list("id", flat=True)) == [Job.objects.get().id]
    assert str(Job.objects.get().id) == ids[0]
    assert enqueued == [ids[0]]


@pytest.mark.django_db
def test_every_backend_holds_keys_in_the_same_states() -> None:
    """The index condition (and MariaDB's generated column) against the rule itself:
    every status with every mask of states."""
    expected = set()
    for status in (s for s in JobStatus.values if s != JobStatus.DISPATCHED):
        for mask in range(1, 16):
            job = Job.objects.create(
                request_id=f"hold-{status}-{mask}",
                target="tasks:default",
                task_path="tests.support.policy_tasks.keyed_by",
                status=status,
                unique_digest=hashlib.sha256(f"{status}{mask}".encode()).hexdigest(),
                unique_states=mask,
            )
            if holds_unique_key(vars(job), job.unique_digest):
                expected.add(job.id)
    assert set(Job.objects.filter(unique_hold()).values_list("id", flat=True)) == expected
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT id FROM jobstate_job WHERE unique_hold IS NOT NULL")
            held = {row[0] for row in cursor.fetchall()}
        assert {Job._meta.pk.to_python(pk) for pk in held} == expected
        assert UNIQUE_HOLD_SQL in migration_0017._HOLD


@pytest.mark.django_db
def test_the_jobs_search_finds_a_unique_task_by_its_key(settings: Any) -> None:
    use_options(settings)
    wanted = import_customer.enqueue(7)
    import_customer.enqueue(8)
    found = parse_search("key:customer:7").apply(Job.objects.all())
    assert [str(pk) for pk in found.values_list("id", flat=True)] == [wanted.id]


@pytest.mark.postgres
@pytest.mark.django_db
def test_on_postgresql_a_unique_enqueue_is_one_statement_and_a_duplicate_two(
    settings: Any,
) -> None:
    use_options(settings)
    with CaptureQueriesContext(connection) as new:
        first = import_customer.enqueue(3)
    with CaptureQueriesContext(connection) as duplicate:
        assert import_customer.enqueue(3).id == first.id
    assert (len(new), len(duplicate)) == (1, 2)
    assert "ON CONFLICT DO NOTHING" in new.captured_queries[0]["sql"]


@pytest.mark.django_db
def test_the_console_requeue_says_why_it_skips_a_task_whose_key_is_held(
    settings: Any, django_user_model: Any
) -> None:
    use_options(settings)
    first = unique_by_arguments.enqueue("console")
    finish(first.id)
    unique_by_arguments.enqueue("console")  # a newer job holds the key
    client = logged_in(operator(django_user_model, "rita", "view_job", "requeue_job"))
    response = act(client, JOBS, "requeue_jobs", [first.id], confirm=True)
    assert any("a newer job holds its unique key" in m for m in shown_messages(response))
    assert Job.objects.get(id=first.id).status == JobStatus.DONE
