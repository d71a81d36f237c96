"""A task worker's round: its reports and its next claim in one store call
(``complete_and_claim_tasks``), one statement on PostgreSQL.

On PostgreSQL the call is one statement for every kind of worker (any queue, one, several)
and reads the claim index; concurrent rounds on real connections never hand a task out
twice and every report stays fenced by its claim token; and a worker running one task at
a time sends one statement per task once it is under way."""

from __future__ import annotations

import random
import threading
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext

from jobstate.core.states import ClaimReport, JobStatus, NewTask
from jobstate.models import Job
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.backends import postgresql_statements
from jobstate.stores.database.backends.postgresql_statements import (
    complete_and_claim_statement,
)
from jobstate.stores.database.backends.shapes import KEPT_SHAPES
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.compat import task_backends
from jobstate.tasks.worker import TaskWorker, WorkerConfig
from tests.support.plans import plans_without_table_scans
from tests.support.policy_tasks import add_with_a_policy
from tests.support.task_functions import add
from tests.support.tasks_kit import use_options

TARGET = "tasks:default"
LEASE = timedelta(minutes=1)


def new_task(queue: str = "default") -> NewTask:
    return NewTask(
        target=TARGET,
        task_path="tests.support.task_functions.add",
        queue_name=queue,
        priority=0,
        args=[1, 2],
        kwargs={},
        max_attempts=3,
    )


def round_of(
    store: DatabaseStateStore,
    held: list[Job],
    queues: list[str] | None,
    *,
    worker_id: str = "w-1",
    limit: int = 2,
    extra: list[ClaimReport] | None = None,
) -> tuple[list[Any], list[Job]]:
    reports = [ClaimReport(job.id, job.claim_token, JobStatus.DONE, {"result": 3}) for job in held]
    return store.complete_and_claim_tasks(
        [*reports, *(extra or [])],
        target=TARGET,
        queues=queues,
        worker_id=worker_id,
        lease=LEASE,
        limit=limit,
    )


def analysed_backlog(tasks: int) -> DatabaseStateStore:
    """``tasks`` tasks waiting, alternately in two queues, with the table's statistics
    read, so the planner sees a backlog rather than an empty table."""
    store = DatabaseStateStore()
    for n in range(tasks):
        store.enqueue_task(new_task(("default", "emails")[n % 2]))
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")
    return store


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("queues", [["default"], ["default", "emails"], None])
def test_a_round_of_successes_is_one_statement(queues: list[str] | None) -> None:
    store = DatabaseStateStore()
    for n in range(6):
        store.enqueue_task(
            new_task(("default", "emails")[n % 2] if queues != ["default"] else "default")
        )
    held = store.claim_tasks(target=TARGET, queues=queues, worker_id="w-1", lease=LEASE, limit=2)
    stale = ClaimReport(uuid.uuid4(), uuid.uuid4(), JobStatus.DONE, {"result": 3})
    with CaptureQueriesContext(connection) as captured:
        results, claimed = round_of(store, held, queues)
    assert len(captured.captured_queries) == 1, captured.captured_queries
    assert [result.completed for result in results] == [True, True]
    assert len(claimed) == 2 and {job.id for job in claimed}.isdisjoint(job.id for job in held)
    assert all(job.status == JobStatus.RUNNING and job.attempts == 1 for job in claimed)
    done = Job.objects.filter(id__in=[job.id for job in held])
    assert all(job.status == JobStatus.DONE and job.claim_token is None for job in done)
    # A report that matches nothing is read back (one more query), and writes nothing.
    with CaptureQueriesContext(connection) as captured:
        results, again = round_of(store, claimed, queues, extra=[stale])
    assert len(captured.captured_queries) == 2
    assert [result.outcome.value for result in results] == ["completed", "completed", "not_found"]
    assert len(again) == 2


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_task_a_round_puts_back_is_not_claimed_by_the_same_statement() -> None:
    # Both halves of the statement read one snapshot, taken before either writes: the
    # claim sees the reported task as it was (running), so no row is written twice.
    store = DatabaseStateStore()
    store.enqueue_task(new_task())
    (held,) = store.claim_tasks(target=TARGET, queues=None, worker_id="w-1", lease=LEASE, limit=1)
    back = ClaimReport(held.id, held.claim_token, JobStatus.QUEUED, {"attempts": 0})
    results, claimed = store.complete_and_claim_tasks(
        [back], target=TARGET, queues=None, worker_id="w-1", lease=LEASE, limit=1
    )
    assert results[0].completed and claimed == []
    (again,) = store.claim_tasks(target=TARGET, queues=None, worker_id="w-1", lease=LEASE, limit=1)
    assert again.id == held.id and again.attempts == 1


@pytest.mark.postgres
@pytest.mark.django_db
@pytest.mark.parametrize("queues", [["default"], ["default", "emails"], None])
def test_a_round_reads_the_claim_index(queues: list[str] | None) -> None:
    analysed_backlog(200)
    shape = "any" if queues is None else "one" if len(queues) == 1 else "several"
    sql, _fields = complete_and_claim_statement(connection, ("result",), 1, shape, 2)
    with connection.cursor() as cursor:
        # The plan of the statement as the worker sends it, with its own parameters.
        cursor.execute(f"PREPARE round_plan AS {_numbered(sql)}")
    try:
        params = _plan_params(queues)
        (plan,) = plans_without_table_scans(connection, [f"EXECUTE round_plan({params})"])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DEALLOCATE round_plan")
    assert "jobstate_job_task_claim_idx" in plan, plan
    assert "Sort Key: c" not in plan, plan


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queues", [["default"], ["default", "emails"], None])
def test_a_worker_s_round_is_planned_once_not_at_every_task(queues: list[str] | None) -> None:
    # PostgreSQL plans a prepared statement again at every execution while its generic
    # plan looks dearer than the plans made for the values at hand; a LIMIT given as a
    # parameter made the generic plan expect many tasks, so each one-task round paid a
    # fresh plan of the whole statement (about as much server time as running it).
    # A new session, as a worker's: PostgreSQL weighs the generic plan against the
    # average of every custom plan the session made of the statement, and the rounds
    # an earlier test ran on an empty table made those look cheap for good.
    connection.close()
    store = analysed_backlog(300)
    held = store.claim_tasks(target=TARGET, queues=queues, worker_id="w-1", lease=LEASE, limit=1)
    before = _round_plans()
    for _ in range(40):
        _results, held = round_of(store, held, queues, limit=1)
        assert len(held) == 1
    added = {
        name: (generic - before.get(name, (0, 0))[0], custom - before.get(name, (0, 0))[1])
        for name, (generic, custom) in _round_plans().items()
        if (generic, custom) != before.get(name)
    }
    assert len(added) == 1, added
    ((generic, custom),) = added.values()
    # PostgreSQL tries five plans for the values first, then keeps the generic one.
    assert custom <= 5 and generic >= 25, (generic, custom)


@pytest.mark.postgres
def test_the_round_texts_a_busy_worker_uses_are_kept_in_bounded_memory() -> None:
    # The limit is part of each round's text, so a worker of concurrency N may use up
    # to N * N texts (report counts by free slots): they must not pile up for ever.
    for reports in range(1, 41):
        for limit in range(reports, 41):
            sql, _fields = complete_and_claim_statement(
                connection, ("result",), reports, "one", limit
            )
            assert f"LIMIT {limit}\n" in sql
    assert 0 < len(postgresql_statements._ROUNDS) <= KEPT_SHAPES


@pytest.mark.postgres
def test_the_statement_texts_callers_shape_are_kept_in_bounded_memory() -> None:
    # How many targets a claim names, reports a batch completes or notifications a
    # completion queues is the caller's to choose: each count is a text of its own.
    for count in range(1, 301):
        claim = postgresql_statements.claim_statement(connection, count, JobStatus.RUNNING)
        assert claim.count("%s") >= count
        postgresql_statements.claim_unthreaded_statement(connection, count)
        postgresql_statements.complete_statement(connection, ("result",), count)
        postgresql_statements.finish_statement(connection, ("result",), True, count)
    assert 0 < len(postgresql_statements._STATEMENTS) <= KEPT_SHAPES


def _round_plans() -> dict[str, tuple[int, int]]:
    """The generic and custom plans made so far of each round this connection prepared."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE statement LIKE %s",
            ["%claimed AS%"],
        )
        return {name: (generic, custom) for name, generic, custom in cursor.fetchall()}


def _numbered(sql: str) -> str:
    """``%s`` placeholders as ``$1``, ``$2``, ... for ``PREPARE``."""
    parts = sql.split("%s")
    return "".join(f"{part}${n}" for n, part in enumerate(parts[:-1], start=1)) + parts[-1]


def _plan_params(queues: list[str] | None) -> str:
    report = f"'{uuid.uuid4()}', '{uuid.uuid4()}', 'done', '3'"
    if queues is None:
        claim = f"'{TARGET}', '{TARGET}', '{TARGET}', '{TARGET}'"
    elif len(queues) == 1:
        claim = f"'{TARGET}', 'default', '{TARGET}', 'default'"
    else:
        claim = f"ARRAY['default', 'emails'], '{TARGET}', '{TARGET}'"
    return f"{report}, {claim}, 'running', 'w', interval '1 minute', '{uuid.uuid4()}'"


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
def test_concurrent_rounds_hand_each_task_out_once_and_every_report_is_fenced() -> None:
    store = DatabaseStateStore()
    total = 240
    for n in range(total):
        store.enqueue_task(new_task(("default", "emails")[n % 2]))
    claims: list[tuple[uuid.UUID, str]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def worker(name: str) -> None:
        held: list[Job] = []
        try:
            start.wait()
            while True:
                # Besides its own reports, a report of a task another worker holds,
                # with a made-up token: it must be refused and change nothing.
                with lock:
                    others = [pk for pk, owner in claims if owner != name]
                extra = []
                if others:
                    stolen = ClaimReport(random.choice(others), uuid.uuid4(), "done", {"result": 0})
                    extra.append(stolen)
                results, claimed = round_of(
                    store,
                    held,
                    ["default", "emails"],
                    worker_id=name,
                    limit=3,
                    extra=extra,
                )
                assert all(result.completed for result in results[: len(held)])
                assert not any(result.completed for result in results[len(held) :])
                with lock:
                    claims.extend((job.id, name) for job in claimed)
                if not claimed:
                    return
                held = claimed
        except BaseException as exc:
            errors.append(exc)
            raise
        finally:
            connections.close_all()

    threads = [threading.Thread(target=worker, args=(f"w-{n}",)) for n in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    ids = [pk for pk, _owner in claims]
    assert len(ids) == total and len(set(ids)) == total
    finished = Job.objects.filter(task_path__isnull=False)
    assert finished.filter(status=JobStatus.DONE, attempts=1, result=3).count() == total
    assert not finished.filter(result=0).exists()


# --- the worker --------------------------------------------------------------------------


def _statements_of_a_drain(tasks: int, task: Any = add) -> list[str]:
    """The statements a worker's own connection sends to drain ``tasks`` tasks one at a
    time (``--concurrency 1 --batch``), each as its first words."""
    for n in range(tasks):
        task.enqueue(n, 1)
    backend = task_backends["default"]
    assert isinstance(backend, JobStateBackend)
    config = WorkerConfig(
        concurrency=1, batch=True, interval=30, schedules=False, grace=5, worker_id=f"round-{tasks}"
    )
    worker = TaskWorker(config, backend)
    with CaptureQueriesContext(connection) as captured:
        summary = worker.run()
    assert summary.succeeded == tasks, summary
    return [" ".join((query["sql"] or "").split())[:60] for query in captured]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("task", [add, add_with_a_policy], ids=["plain", "with-a-policy"])
def test_a_worker_at_concurrency_one_sends_one_statement_per_task(settings: Any, task: Any) -> None:
    # A task's policy travels in its claimed row: applying it costs no statement.
    use_options(settings, LEASE=300.0)
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), "LISTEN_NOTIFY": False}
    few = _statements_of_a_drain(10, task)
    many = _statements_of_a_drain(50, task)
    # What a start and a stop cost is the same for both drains: the difference is what
    # 40 more tasks cost. Give or take two: on a loaded CI machine the drain of 10 once
    # sent 24 statements where it sends 23 (which one came extra was not recorded), and
    # a --batch worker that finds its queues empty while announcements are still being
    # made claims once more after them, which one drain may do and the other not. Two
    # statements per task would be 80.
    assert 38 <= len(many) - len(few) <= 42, "\n".join(
        ["drain of 10:", *few, "drain of 50:", *many]
    )
