"""Database faults against real connections: each one surfaces as a documented error
(never as ``None`` or ``False``), leaves the row as it was, and the next call on the same
thread works again.

- a lost connection (another connection runs ``pg_terminate_backend`` on the store's
  backend, in the middle of its transaction or while it waits for a lock; or the socket
  is cut without a word) -> ``StoreUnavailable``;
- a statement or lock timeout while another connection holds the row or the table ->
  ``StoreTimeout`` (on SQLite too: the busy timeout behind another writer);
- a deadlock between two threads -> exactly one ``StoreConflict``;
- a serialization failure between two SERIALIZABLE transactions -> ``StoreConflict``;
- the runner's heartbeat thread, its final write and the relay loop reconnect by
  themselves.

Rows are compared as a whole (``row_to_json``), read through a connection of their own.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import IntegrityError, connection, connections, transaction

from jobstate.exceptions import (
    DuplicateRequestId,
    StoreConflict,
    StoreError,
    StoreTimeout,
    StoreUnavailable,
)
from jobstate.models import DeliveryAttempt, Job, JobRun, Notification
from jobstate.outbox.channels import notification_handler
from jobstate.outbox.relay import deliver_notifications
from jobstate.runner import JobRunner, Registry, RunContext, operations_job
from jobstate.stores.base import (
    CompletionOutcome,
    JobRunStatus,
    JobStatus,
    NotificationRequest,
    NotificationState,
    Trigger,
)
from jobstate.stores.database import DatabaseJobRunStore, DatabaseStateStore

pytestmark = pytest.mark.django_db(transaction=True, available_apps=["jobstate"])
#: Every test but the last needs PostgreSQL's real connections, locks and timeouts.
postgres = pytest.mark.postgres

T0 = datetime(2026, 11, 28, 12, 0, tzinfo=UTC)
CLI = Trigger("CLI", "ops@example.com")
HANDLER = "tests.stores.test_store_faults.record_delivery"
#: Generous: the machine may be loaded; no assertion depends on how fast anything is.
WAIT_SECONDS = 30

deliveries: Counter[str] = Counter()


@notification_handler
def record_delivery(notification: Notification) -> None:
    deliveries[notification.idempotency_key] += 1


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    deliveries.clear()
    yield
    connections.close_all()


# --- helpers: connections of their own ------------------------------------------------------


@contextmanager
def raw(*, autocommit: bool = True) -> Iterator[psycopg.Connection[Any]]:
    """A psycopg connection to the test database that Django knows nothing about."""
    db = connection.settings_dict
    with psycopg.connect(
        dbname=db["NAME"],
        user=db["USER"] or None,
        password=db["PASSWORD"] or None,
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        autocommit=autocommit,
    ) as conn:
        yield conn


def row(model: Any, pk: Any) -> dict[str, Any] | None:
    """The whole row as the database has it, read through a fresh connection."""
    with raw() as conn:
        found = conn.execute(
            f"SELECT row_to_json(t) FROM {model._meta.db_table} AS t WHERE id = %s", [pk]
        ).fetchone()
    return None if found is None else dict(found[0])


def backend_pid() -> int:
    """This thread's Django connection's server process."""
    connection.ensure_connection()
    return int(connection.connection.info.backend_pid)


def terminate(pid: int) -> None:
    """Kill backend ``pid`` from another connection and wait until it is gone."""
    with raw() as conn:
        assert conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
        deadline = time.monotonic() + WAIT_SECONDS
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline, f"backend {pid} outlived pg_terminate_backend"
            time.sleep(0.01)


@contextmanager
def killed_before(statement: Callable[[str], bool]) -> Iterator[list[str]]:
    """Kill this thread's backend right before the first statement ``statement``
    accepts, so the statement runs on a dead connection, in the middle of whatever
    transaction the store has open. Yields the statements seen before the kill."""
    seen: list[str] = []
    fired = threading.Event()

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if not fired.is_set() and statement(sql):
            fired.set()
            terminate(backend_pid())
        elif not fired.is_set():
            seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        yield seen
    assert fired.is_set(), "the statement to kill before never ran"


def starts_with(word: str) -> Callable[[str], bool]:
    return lambda sql: sql.lstrip().upper().startswith(word)


def locks_rows(sql: str) -> bool:
    """A plain ``SELECT ... FOR UPDATE``: a transaction that goes on after it."""
    return starts_with("SELECT")(sql) and "FOR UPDATE" in sql


@contextmanager
def held(*statements: tuple[str, list[Any]]) -> Iterator[None]:
    """Another connection holds the locks ``statements`` take, in an open transaction,
    until the block ends (then it rolls back)."""
    with raw(autocommit=False) as conn:
        for sql, params in statements:
            conn.execute(sql, params)
        try:
            yield
        finally:
            conn.rollback()


def lock_table(model: Any, mode: str = "ACCESS EXCLUSIVE") -> tuple[str, list[Any]]:
    return f"LOCK TABLE {model._meta.db_table} IN {mode} MODE", []


def lock_row(model: Any, pk: Any) -> tuple[str, list[Any]]:
    return f"SELECT 1 FROM {model._meta.db_table} WHERE id = %s FOR UPDATE", [pk]


@contextmanager
def killed_while_waiting() -> Iterator[None]:
    """Kill this thread's backend once it waits for a lock (another thread watches)."""
    pid = backend_pid()
    outcome: list[BaseException | None] = []

    def watch() -> None:
        try:
            with raw() as conn:
                deadline = time.monotonic() + WAIT_SECONDS
                sql = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
                while not conn.execute(sql, [pid]).fetchone():
                    assert time.monotonic() < deadline, "the store call never waited for the lock"
                    time.sleep(0.01)
            terminate(pid)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        yield
    finally:
        watcher.join(WAIT_SECONDS)
    assert outcome == [None], outcome


@contextmanager
def host_transaction(*settings: str) -> Iterator[None]:
    """The host's own ``atomic()`` block, with ``SET LOCAL`` settings."""
    with transaction.atomic(), connection.cursor() as cursor:
        for setting in settings:
            cursor.execute(f"SET LOCAL {setting}")
        yield


def assert_documented(error: StoreError, kind: type[StoreError], sqlstate: str | None) -> None:
    assert type(error) is kind
    assert error.retryable
    if sqlstate is not None:
        assert error.sqlstate == sqlstate
    # The driver's error is chained; the message names the failure, never a value.
    assert error.__cause__ is not None
    assert "SECRET" not in str(error)


# --- fixtures: one row of each kind -------------------------------------------------------


def queued(store: DatabaseStateStore, name: str, **fields: Any) -> Job:
    return store.create_job(request_id=name, target="faults", input={"token": "SECRET"}, **fields)


def claimed(store: DatabaseStateStore, name: str) -> Job:
    queued(store, name)
    job = store.claim_next_inhub_job(["faults"], "worker-1")
    assert job is not None
    return job


def running_run(runs: DatabaseJobRunStore, key: str = "reports.build") -> str:
    run_id = runs.claim(
        job_key=key, overlap_key=key, trigger=CLI, input={"token": "SECRET"}, started_at=T0
    )
    assert run_id is not None
    return run_id


def notified(store: DatabaseStateStore, name: str) -> Notification:
    job = claimed(store, name)
    done = store.complete_job_with_notifications(
        job, {"status": JobStatus.DONE}, [NotificationRequest("callable", HANDLER, {"n": name})]
    )
    assert done is not None
    return Notification.objects.get(job_id=job.id)


# --- (a) a lost connection -> StoreUnavailable ----------------------------------------------


@postgres
def test_a_claim_killed_inside_its_transaction_claims_nothing(store: DatabaseStateStore) -> None:
    # A job of a thread is claimed by the gated path: lock the candidate, take the
    # thread's lock, then update. The connection dies between the lock and the update.
    job = queued(store, "threaded", thread_id=7)
    before = row(Job, job.id)
    # The claimer's first claim writes its Workers page row (an UPDATE of its own); made
    # here, the first UPDATE below is the claim's.
    assert store.claim_next_inhub_job(["elsewhere"], "worker-1") is None
    with killed_before(starts_with("UPDATE")) as seen, pytest.raises(StoreError) as raised:
        store.claim_next_inhub_job(["faults"], "worker-1")
    assert any(locks_rows(sql) for sql in seen), "the update was not inside the claim"
    assert_documented(raised.value, StoreUnavailable, None)
    assert row(Job, job.id) == before
    again = store.claim_next_inhub_job(["faults"], "worker-1")
    assert again is not None and again.id == job.id and again.status == JobStatus.RUNNING


@postgres
def test_a_claim_killed_while_it_waits_for_the_table_claims_nothing(
    store: DatabaseStateStore,
) -> None:
    job = queued(store, "plain")
    before = row(Job, job.id)
    with held(lock_table(Job)), killed_while_waiting(), pytest.raises(StoreError) as raised:
        store.claim_next_inhub_job(["faults"], "worker-1")
    assert_documented(raised.value, StoreUnavailable, None)
    assert row(Job, job.id) == before
    again = store.claim_next_inhub_job(["faults"], "worker-1")
    assert again is not None and again.id == job.id


@postgres
def test_a_completion_killed_while_it_waits_for_the_row_writes_nothing(
    store: DatabaseStateStore,
) -> None:
    job = claimed(store, "running")
    token = job.claim_token
    assert token is not None
    before = row(Job, job.id)
    with held(lock_row(Job, job.id)), killed_while_waiting(), pytest.raises(StoreError) as raised:
        store.complete_claimed_job(job.id, token, "done", result={"ok": True})
    assert_documented(raised.value, StoreUnavailable, None)
    assert row(Job, job.id) == before
    result = store.complete_claimed_job(job.id, token, "done", result={"ok": True})
    assert result.outcome == CompletionOutcome.COMPLETED


@postgres
def test_an_update_killed_after_its_write_but_before_commit_is_rolled_back(
    store: DatabaseStateStore,
) -> None:
    # update_job writes, then re-reads the row in the same transaction; the connection
    # dies in between, so the written row was never committed.
    job = queued(store, "patched")
    before = row(Job, job.id)
    with killed_before(starts_with("SELECT")) as seen, pytest.raises(StoreError) as raised:
        store.update_job(job.id, metadata={"step": 2})
    assert any(sql.lstrip().startswith("UPDATE") for sql in seen)
    assert_documented(raised.value, StoreUnavailable, None)
    assert row(Job, job.id) == before
    updated = store.update_job(job.id, metadata={"step": 2})
    assert updated is not None and updated.metadata == {"step": 2}


@postgres
def test_a_lost_connection_inside_the_hosts_transaction_rolls_the_whole_block_back(
    store: DatabaseStateStore,
) -> None:
    first, second = queued(store, "first"), queued(store, "second")
    before = (row(Job, first.id), row(Job, second.id))
    with pytest.raises(StoreError) as raised, transaction.atomic():
        assert store.update_job(first.id, metadata={"host": True}) is not None
        with killed_before(starts_with("UPDATE")):
            store.update_job(second.id, metadata={"host": True})
    assert_documented(raised.value, StoreUnavailable, None)
    # The host's block rolled back: its earlier write is gone too.
    assert (row(Job, first.id), row(Job, second.id)) == before
    # Django dropped the dead connection when the block ended; the next call reconnects.
    assert store.update_job(second.id, metadata={"host": True}) is not None


@postgres
def test_a_connection_cut_without_a_word_is_unavailable_after_django_reconnected(
    store: DatabaseStateStore,
) -> None:
    # A server that crashes says nothing: the client only sees its socket close. When the
    # store's own transaction ends, Django reconnects at once (the server is still up
    # here), so only the error itself can say the connection was lost.
    job = queued(store, "cut")
    before = row(Job, job.id)

    def cut(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        if sql.lstrip().startswith("UPDATE"):
            fd = connection.connection.pgconn.socket
            with socket.socket(fileno=os.dup(fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(cut), pytest.raises(StoreError) as raised:
        store.update_job(job.id, metadata={"cut": True})
    assert_documented(raised.value, StoreUnavailable, None)
    assert raised.value.sqlstate is None
    assert row(Job, job.id) == before
    assert store.update_job(job.id, metadata={"cut": True}) is not None


@postgres
def test_an_enqueue_killed_while_it_waits_writes_no_job(store: DatabaseStateStore) -> None:
    with (
        held(lock_table(Job, "SHARE")),
        killed_while_waiting(),
        pytest.raises(StoreError) as raised,
    ):
        store.enqueue(request_id="new", target="faults", input={"token": "SECRET"})
    assert_documented(raised.value, StoreUnavailable, None)
    assert not Job.objects.filter(request_id="new").exists()
    job, created = store.enqueue(request_id="new", target="faults", input={"token": "SECRET"})
    assert created and job.request_id == "new"


@postgres
def test_a_run_claim_killed_while_it_waits_records_no_run(runs: DatabaseJobRunStore) -> None:
    with held(lock_table(JobRun)), killed_while_waiting(), pytest.raises(StoreError) as raised:
        running_run(runs)
    assert_documented(raised.value, StoreUnavailable, None)
    assert not JobRun.objects.exists()
    assert JobRun.objects.get(id=running_run(runs)).status == JobRunStatus.RUNNING


@postgres
def test_a_run_completion_killed_while_it_waits_leaves_the_run_running(
    runs: DatabaseJobRunStore,
) -> None:
    run_id = running_run(runs)
    before = row(JobRun, run_id)
    finish: dict[str, Any] = {
        "run_id": run_id,
        "status": "SUCCEEDED",
        "finished_at": T0,
        "duration_ms": 5,
    }
    with (
        held(lock_row(JobRun, run_id)),
        killed_while_waiting(),
        pytest.raises(StoreError) as raised,
    ):
        runs.complete(**finish)
    assert_documented(raised.value, StoreUnavailable, None)
    assert row(JobRun, run_id) == before
    assert runs.complete(**finish) is True


@postgres
def test_a_relay_claim_killed_inside_its_transaction_leaves_the_notification_due(
    store: DatabaseStateStore,
) -> None:
    note = notified(store, "claim-killed")
    before = row(Notification, note.id)
    # claim_due locks the due rows, then moves them: the connection dies in between.
    with killed_before(starts_with("UPDATE")) as seen, pytest.raises(StoreError) as raised:
        deliver_notifications(relay_id="relay-1")
    assert any(locks_rows(sql) for sql in seen)
    assert_documented(raised.value, StoreUnavailable, None)
    assert row(Notification, note.id) == before
    assert not deliveries
    assert deliver_notifications(relay_id="relay-2").delivered == 1
    assert deliveries == {note.idempotency_key: 1}


@pytest.mark.slow
@postgres
def test_a_relay_settle_killed_inside_its_transaction_sends_again_after_the_lease(
    store: DatabaseStateStore,
) -> None:
    note = notified(store, "settle-killed")
    lease = timedelta(seconds=1)
    # mark_delivered moves the row, then records the attempt: the connection dies between.
    inserting_attempt = starts_with(f"INSERT INTO {DeliveryAttempt._meta.db_table}".upper())
    with (
        killed_before(lambda sql: inserting_attempt(sql.replace('"', ""))),
        pytest.raises(StoreError) as raised,
    ):
        deliver_notifications(relay_id="relay-1", lease=lease)
    assert_documented(raised.value, StoreUnavailable, None)
    after = row(Notification, note.id)
    assert after is not None
    assert (after["state"], after["relay_id"], after["attempts"]) == (
        NotificationState.DELIVERING,
        "relay-1",
        1,
    )
    assert not DeliveryAttempt.objects.exists()
    assert deliveries == {note.idempotency_key: 1}
    # The send whose settle was lost is sent again once the lease ends: at least once.
    time.sleep(lease.total_seconds() + 0.2)
    assert deliver_notifications(relay_id="relay-2", lease=lease).delivered == 1
    assert deliveries == {note.idempotency_key: 2}
    assert Notification.objects.get(id=note.id).state == NotificationState.DELIVERED


# --- (b) statement and lock timeouts -> StoreTimeout ----------------------------------------


@postgres
def test_an_update_past_the_statement_timeout_raises_and_writes_nothing(
    store: DatabaseStateStore,
) -> None:
    job = queued(store, "slow")
    before = row(Job, job.id)
    with (
        held(lock_row(Job, job.id)),
        pytest.raises(StoreError) as raised,
        host_transaction("statement_timeout = '200ms'"),
    ):
        store.update_job(job.id, metadata={"late": True})
    assert_documented(raised.value, StoreTimeout, "57014")
    assert row(Job, job.id) == before
    assert store.update_job(job.id, metadata={"late": True}) is not None


@postgres
def test_a_completion_past_the_lock_timeout_raises_and_writes_nothing(
    store: DatabaseStateStore,
) -> None:
    job = claimed(store, "locked")
    token = job.claim_token
    assert token is not None
    before = row(Job, job.id)
    with (
        held(lock_row(Job, job.id)),
        pytest.raises(StoreError) as raised,
        host_transaction("lock_timeout = '200ms'"),
    ):
        store.complete_claimed_job(job.id, token, "done")
    assert_documented(raised.value, StoreTimeout, "55P03")
    assert row(Job, job.id) == before
    result = store.complete_claimed_job(job.id, token, "done")
    assert result.outcome == CompletionOutcome.COMPLETED


@postgres
def test_a_claim_past_the_statement_timeout_raises_instead_of_finding_nothing(
    store: DatabaseStateStore,
) -> None:
    job = queued(store, "table-locked")
    before = row(Job, job.id)
    with (
        held(lock_table(Job)),
        pytest.raises(StoreError) as raised,
        host_transaction("statement_timeout = '200ms'"),
    ):
        store.claim_next_inhub_job(["faults"], "worker-1")
    assert_documented(raised.value, StoreTimeout, "57014")
    assert row(Job, job.id) == before
    again = store.claim_next_inhub_job(["faults"], "worker-1")
    assert again is not None and again.id == job.id


@postgres
def test_an_enqueue_past_the_lock_timeout_raises_and_writes_no_job(
    store: DatabaseStateStore,
) -> None:
    with (
        held(lock_table(Job, "SHARE")),
        pytest.raises(StoreError) as raised,
        host_transaction("lock_timeout = '200ms'"),
    ):
        store.enqueue(request_id="late", target="faults")
    assert_documented(raised.value, StoreTimeout, "55P03")
    assert not Job.objects.filter(request_id="late").exists()
    assert store.enqueue(request_id="late", target="faults")[1] is True


@postgres
def test_run_store_calls_past_the_timeouts_raise_and_write_nothing(
    runs: DatabaseJobRunStore,
) -> None:
    run_id = running_run(runs, "reports.first")
    before = row(JobRun, run_id)
    with (
        held(lock_row(JobRun, run_id)),
        pytest.raises(StoreError) as raised,
        host_transaction("statement_timeout = '200ms'"),
    ):
        runs.complete(run_id=run_id, status="FAILED", finished_at=T0, duration_ms=1)
    assert_documented(raised.value, StoreTimeout, "57014")
    assert row(JobRun, run_id) == before
    with (
        held(lock_table(JobRun)),
        pytest.raises(StoreError) as raised,
        host_transaction("lock_timeout = '200ms'"),
    ):
        running_run(runs, "reports.second")
    assert_documented(raised.value, StoreTimeout, "55P03")
    assert list(JobRun.objects.values_list("id", flat=True)) == [uuid.UUID(run_id)]
    assert runs.heartbeat(run_id=run_id) is True


@postgres
def test_a_relay_pass_past_the_statement_timeout_raises_and_claims_nothing(
    store: DatabaseStateStore,
) -> None:
    note = notified(store, "relay-slow")
    before = row(Notification, note.id)
    # The relay refuses to run inside a transaction, so the timeout is the session's.
    with connection.cursor() as cursor:
        cursor.execute("SET statement_timeout = '200ms'")
    try:
        with held(lock_table(Notification)), pytest.raises(StoreError) as raised:
            deliver_notifications(relay_id="relay-1")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET statement_timeout")
    assert_documented(raised.value, StoreTimeout, "57014")
    assert row(Notification, note.id) == before
    assert deliver_notifications(relay_id="relay-2").delivered == 1


# --- (c) a deadlock -> exactly one StoreConflict --------------------------------------------


def in_two_threads(work: Callable[[int, threading.Barrier], Any]) -> list[Any]:
    """Run ``work(0, barrier)`` and ``work(1, barrier)`` on two threads, each with its
    own connection; returns what each returned or raised."""
    barrier = threading.Barrier(2, timeout=WAIT_SECONDS)
    outcomes: list[Any] = [None, None]

    def body(index: int) -> None:
        try:
            outcomes[index] = work(index, barrier)
        except BaseException as exc:
            outcomes[index] = exc
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(index,)) for index in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_SECONDS * 2)
    assert not any(thread.is_alive() for thread in threads), "a thread hung"
    return outcomes


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.parametrize("kind", ["jobs", "runs"])
def test_a_deadlock_aborts_exactly_one_side_and_a_retry_of_it_succeeds(
    store: DatabaseStateStore, runs: DatabaseJobRunStore, kind: str
) -> None:
    if kind == "jobs":
        rows: list[Any] = [queued(store, "left").id, queued(store, "right").id]

        def write(pk: Any, author: int) -> None:
            assert store.update_job(pk, metadata={"by": author}) is not None

        def author_of(pk: Any) -> Any:
            job = store.get_job(pk)
            assert job is not None
            return job.metadata["by"]

    else:
        rows = [running_run(runs, "reports.left"), running_run(runs, "reports.right")]

        def write(pk: Any, author: int) -> None:
            assert runs.heartbeat(run_id=pk, progress={"by": author}) is True

        def author_of(pk: Any) -> Any:
            summary = JobRun.objects.get(id=pk).summary
            assert summary is not None
            return summary["by"]

    def lock_both(index: int, barrier: threading.Barrier) -> str:
        # The two sides take the two rows in opposite orders.
        first, second = rows if index == 0 else rows[::-1]
        try:
            with transaction.atomic():
                write(first, index)
                barrier.wait()
                write(second, index)
        except StoreConflict as conflict:
            # PostgreSQL's own deadlock code; MariaDB/MySQL error 1213, SQLSTATE 40001.
            deadlock = "40P01" if connection.vendor == "postgresql" else "40001"
            assert_documented(conflict, StoreConflict, deadlock)
            barrier.wait()  # let the winner commit, then retry the whole transaction
            with transaction.atomic():
                write(first, index)
                write(second, index)
            return "retried"
        barrier.wait()
        return "won"

    outcomes = in_two_threads(lock_both)
    assert sorted(outcomes) == ["retried", "won"], outcomes
    loser = outcomes.index("retried")
    # Each transaction wrote both rows or neither: the retried one came last.
    assert [author_of(pk) for pk in rows] == [loser, loser]


# --- (d) a serialization failure -> StoreConflict -------------------------------------------


@postgres
@pytest.mark.parametrize("kind", ["jobs", "runs"])
def test_a_serialization_failure_raises_conflict_and_keeps_the_first_write(
    store: DatabaseStateStore, runs: DatabaseJobRunStore, kind: str
) -> None:
    if kind == "jobs":
        pk: Any = claimed(store, "contended").id

        def read() -> Any:
            return store.get_job(pk)

        def write(author: int) -> Any:
            return store.update_job(pk, metadata={"by": author})

        def written() -> Any:
            return Job.objects.get(id=pk).metadata

    else:
        pk = running_run(runs)

        def read() -> Any:
            return JobRun.objects.get(id=pk)

        def write(author: int) -> Any:
            return runs.complete(
                run_id=pk, status="SUCCEEDED", finished_at=T0, duration_ms=1, summary={"by": author}
            )

        def written() -> Any:
            return JobRun.objects.get(id=pk).summary

    first_committed = threading.Event()

    def serializable(index: int, barrier: threading.Barrier) -> Any:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            assert read() is not None  # both snapshots are taken before either writes
            barrier.wait()
            if index == 1:
                assert first_committed.wait(WAIT_SECONDS)
                return write(index)
            outcome = write(index)
        first_committed.set()
        return outcome

    first, second = in_two_threads(serializable)
    assert first is not None and first is not False, first
    assert isinstance(second, StoreConflict), second
    assert_documented(second, StoreConflict, "40001")
    assert written() == {"by": 0}


@postgres
def test_the_thread_that_hit_a_conflict_can_use_the_store_at_once(
    store: DatabaseStateStore,
) -> None:
    job = queued(store, "after-conflict")

    def conflicting(index: int, barrier: threading.Barrier) -> Any:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                store.get_job(job.id)
                barrier.wait()
                if index == 1:
                    barrier.wait()  # the other side has committed
                store.update_job(job.id, metadata={"by": index})
        except StoreConflict:
            updated = store.update_job(job.id, metadata={"by": index, "retried": True})
            assert updated is not None
            return "retried"
        if index == 0:
            barrier.wait()
        return "first"

    assert in_two_threads(conflicting) == ["first", "retried"]
    assert Job.objects.get(id=job.id).metadata == {"by": 1, "retried": True}


# --- what is not translated, and what else is ----------------------------------------------


@postgres
def test_documented_answers_pass_through_untouched(store: DatabaseStateStore) -> None:
    queued(store, "taken")
    with transaction.atomic():
        with pytest.raises(DuplicateRequestId) as raised:
            store.create_job(request_id="taken")
        # Still the store's savepoint: the host's transaction goes on.
        store.create_job(request_id="after")
    assert isinstance(raised.value.__cause__, IntegrityError)
    assert Job.objects.filter(request_id="after").exists()


@contextmanager
def host_index(definition: str) -> Iterator[None]:
    """A unique index of the host's own on a jobstate table, for the block only (these
    tests commit, so the index would outlive the test)."""
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE UNIQUE INDEX host_unique {definition}")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX host_unique")


@postgres
def test_another_constraints_violation_is_a_store_error_not_a_skipped_run(
    runs: DatabaseJobRunStore,
) -> None:
    with host_index(f"ON {JobRun._meta.db_table} (job_key, started_at)"):
        running_run(runs, "reports.one")
        with pytest.raises(StoreError) as raised:
            runs.claim(
                job_key="reports.one",
                overlap_key="reports.one#2",
                trigger=CLI,
                input={"token": "SECRET"},
                started_at=T0,
            )
    error = raised.value
    assert type(error) is StoreError and not error.retryable
    assert error.sqlstate == "23505"
    assert isinstance(error.__cause__, IntegrityError)
    assert "SECRET" not in str(error) and "reports.one" not in str(error)
    assert JobRun.objects.count() == 1


@postgres
def test_a_refused_connection_is_unavailable_and_the_next_call_reconnects(
    store: DatabaseStateStore,
) -> None:
    job = queued(store, "refused")
    settings = connection.settings_dict
    connection.close()
    real_port = settings["PORT"]
    settings["PORT"] = "1"  # nothing listens there
    try:
        with pytest.raises(StoreError) as raised:
            store.get_job(job.id)
    finally:
        settings["PORT"] = real_port
    assert_documented(raised.value, StoreUnavailable, None)
    found = store.get_job(job.id)
    assert found is not None and found.id == job.id


# --- the long-running components reconnect by themselves -----------------------------------


def other_backends() -> list[int]:
    """Server processes on the test database other than this thread's."""
    mine = backend_pid()
    with raw() as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND pid <> %s",
            [mine],
        ).fetchall()
    return [pid for (pid,) in rows]


def beat_of(run_id: str) -> datetime:
    return JobRun.objects.values_list("heartbeat_at", flat=True).get(id=run_id)


@postgres
def test_the_runners_heartbeat_thread_reconnects_after_its_connection_is_killed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = Registry()
    seen: dict[str, Any] = {}

    @operations_job("faults.beating", registry=reg)
    def body(ctx: RunContext, input: None) -> dict[str, bool]:
        first = beat_of(ctx.run_id)
        deadline = time.monotonic() + WAIT_SECONDS
        while beat_of(ctx.run_id) == first:  # the heartbeat thread is connected
            assert time.monotonic() < deadline, "no heartbeat"
            time.sleep(0.02)
        for pid in other_backends():  # its connection dies, idle between two beats
            terminate(pid)
        killed = beat_of(ctx.run_id)
        while beat_of(ctx.run_id) == killed:
            assert time.monotonic() < deadline, "the heartbeat never came back"
            time.sleep(0.02)
        seen["resumed"] = True
        return {"ok": True}

    result = JobRunner(
        registry=reg,
        heartbeat_interval=timedelta(milliseconds=100),
        stale_run_after=timedelta(seconds=WAIT_SECONDS),
    ).execute("faults.beating")
    assert seen == {"resumed": True}
    assert (result.status, result.recorded) == (JobRunStatus.SUCCEEDED, "settled")
    assert JobRun.objects.get(id=result.run_id).status == JobRunStatus.SUCCEEDED
    assert "job heartbeat write failed" in caplog.text


@postgres
def test_the_runners_final_write_is_tried_again_after_a_lost_connection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reg = Registry()
    operations_job("faults.finishing", registry=reg)(lambda ctx, input: {"ok": True})
    runner = JobRunner(
        registry=reg,
        heartbeat_interval=timedelta(seconds=1),
        stale_run_after=timedelta(seconds=WAIT_SECONDS),
    )
    # The caller's thread claims (INSERT) and completes (UPDATE); kill before the UPDATE.
    with killed_before(starts_with("UPDATE")):
        result = runner.execute("faults.finishing")
    assert (result.status, result.recorded) == (JobRunStatus.SUCCEEDED, "settled")
    assert JobRun.objects.get(id=result.run_id).status == JobRunStatus.SUCCEEDED
    assert "job run finalize failed, trying again" in caplog.text


@postgres
def test_the_relay_loop_rides_out_a_lost_connection(store: DatabaseStateStore) -> None:
    first = notified(store, "before")
    errors: list[BaseException] = []
    main = backend_pid()

    def kill_then_stop() -> None:
        try:
            deadline = time.monotonic() + WAIT_SECONDS
            # Delivered and recorded as delivered: a kill between the handler's return
            # and the pass's mark would fail that pass, and its delivery would not count.
            while first.idempotency_key not in deliveries or not _delivered(first):
                assert time.monotonic() < deadline, "the relay delivered nothing"
                time.sleep(0.02)
            terminate(main)  # the loop's connection dies between two passes
            second = notified(store, "after")
            # The same for the stop: it comes after the pass's mark, however slowly a
            # loaded machine runs the relay.
            while second.idempotency_key not in deliveries or not _delivered(second):
                assert time.monotonic() < deadline, "the relay did not come back"
                time.sleep(0.02)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connections.close_all()
            os.kill(os.getpid(), signal.SIGTERM)

    out, err = StringIO(), StringIO()
    watcher = threading.Thread(target=kill_then_stop)
    watcher.start()
    try:
        call_command(
            "deliver_notifications",
            *["--loop", "--interval", "0.05", "--json"],
            stdout=out,
            stderr=err,
        )
    finally:
        watcher.join(WAIT_SECONDS)
    assert not errors, errors
    assert deliveries[first.idempotency_key] == 1 and len(deliveries) == 2
    assert "Relay pass failed; retrying in" in err.getvalue()
    assert "the database is unavailable" in err.getvalue()
    assert "Traceback" not in err.getvalue()
    totals = json.loads(out.getvalue())
    assert totals["failed_passes"] >= 1 and totals["delivered"] == 2


def _delivered(notification: Notification) -> bool:
    return Notification.objects.filter(
        id=notification.id, state=NotificationState.DELIVERED
    ).exists()


def test_a_write_blocked_past_the_lock_timeout_raises_timeout_on_any_backend(
    store: DatabaseStateStore,
) -> None:
    """SQLite too: a writer that waits out its busy timeout behind another connection's
    write lock gets ``StoreTimeout``, not a raw "database is locked"."""
    job = queued(store, "blocked")
    before = Job.objects.values().get(id=job.id)
    with other_writer(job), pytest.raises(StoreError) as raised:
        store.update_job(job.id, metadata={"late": True})
    assert_documented(raised.value, StoreTimeout, None)
    connection.close()  # back to the configured timeouts
    assert Job.objects.values().get(id=job.id) == before
    assert store.update_job(job.id, metadata={"late": True}) is not None


@contextmanager
def other_writer(job: Job) -> Iterator[None]:
    """Another connection holds the write lock on ``job`` while this thread's connection
    gives up after 200 ms."""
    connection.ensure_connection()
    if connection.vendor == "sqlite":
        import sqlite3

        connection.connection.execute("PRAGMA busy_timeout = 200")
        other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # SQLite's one write lock
            yield
        finally:
            other.execute("ROLLBACK")
            other.close()
        return
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '200ms'")
    with held(lock_row(Job, job.id)):
        yield
