"""The operations object of each backend: chosen once per alias, reading Django's
features, and the per-thread gate as one call that does the right thing on each backend
(an advisory lock on PostgreSQL, the thread's gate row on MariaDB and MySQL, nothing on
SQLite, whose transactions already serialise writers)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from django.db import connection, connections, transaction

from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.backends.mysql import THREAD_GATE_TABLE, MySQLOperations
from jobstate.stores.database.backends.postgresql import PostgreSQLOperations
from jobstate.stores.database.backends.sqlite import SQLiteOperations

pytestmark = pytest.mark.mysql

CLASSES = {"postgresql": PostgreSQLOperations, "mysql": MySQLOperations, "sqlite": SQLiteOperations}


@pytest.mark.backend
def test_one_object_per_alias_of_its_backends_class() -> None:
    ops = database_ops("default")
    assert type(ops) is CLASSES[connection.vendor]
    assert database_ops("default") is ops
    assert ops.using == "default"


@pytest.mark.backend
def test_features_come_from_django() -> None:
    ops = database_ops("default")
    features = connection.features
    assert ops.locks_rows == features.has_select_for_update
    assert ops.hot_statements == (connection.vendor == "postgresql")


@pytest.mark.django_db
def test_the_thread_gate_is_one_call_that_holds_on_each_backend() -> None:
    ops = database_ops("default")
    with transaction.atomic():
        ops.lock_thread(7_001)
        # The holder itself passes its own gate.
        assert ops.try_lock_thread(7_001)
        assert ops.try_lock_thread(7_002)
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT thread_id FROM {THREAD_GATE_TABLE} WHERE thread_id = 7001")
            assert cursor.fetchone() is not None


@pytest.mark.concurrent
@pytest.mark.django_db(transaction=True)
def test_a_held_thread_gate_turns_another_transaction_away() -> None:
    ops = database_ops("default")
    answers: dict[str, bool] = {}

    def other() -> None:
        try:
            with transaction.atomic():
                answers["held"] = ops.try_lock_thread(7_101)
                answers["free"] = ops.try_lock_thread(7_102)
        finally:
            connections.close_all()

    # A thread gated before (on MariaDB and MySQL its gate row committed): the usual
    # case of a claim meeting an enqueue or another claim of the same thread.
    with transaction.atomic():
        ops.lock_thread(7_101)
    with transaction.atomic():
        ops.lock_thread(7_101)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert answers == {"held": False, "free": True}


@pytest.mark.django_db
def test_instant_filters_match_the_row_the_instant_was_read_from() -> None:
    from jobstate.models import Job

    job = Job.objects.create(request_id="ops-instant", target="t")
    at = Job.objects.values_list("created_at", flat=True).get(id=job.id)
    ops = database_ops("default")
    rows = Job.objects.filter(id=job.id)
    assert rows.filter(ops.instant_filter("created_at", "exact", at)).exists()
    assert rows.filter(ops.instant_filter("created_at", "gte", at)).exists()
    assert not rows.filter(ops.instant_filter("created_at", "gt", at)).exists()
    assert rows.filter(created_at__gte=ops.clock_instant(at)).exists()
    assert not rows.filter(created_at__gt=ops.clock_instant(at)).exists()
    with pytest.raises(ValueError, match="lookup must be one of"):
        ops.instant_filter("created_at", "range", datetime.now(UTC))


@pytest.mark.concurrent
@pytest.mark.django_db(transaction=True)
def test_several_thread_gates_at_once_hand_over_only_the_free_ones() -> None:
    ops = database_ops("default")
    answers: list[set[int]] = []

    def other() -> None:
        try:
            with transaction.atomic():
                # 7_201 is held by the test's transaction, 7_202 was gated before and is
                # free, 7_203 was never gated.
                answers.append(ops.try_lock_threads([7_201, 7_202, 7_203]))
        finally:
            connections.close_all()

    with transaction.atomic():
        ops.lock_thread(7_201)
        ops.lock_thread(7_202)
    with transaction.atomic():
        ops.lock_thread(7_201)
        thread = threading.Thread(target=other)
        thread.start()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert answers == [{7_202, 7_203}]
