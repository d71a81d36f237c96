"""The short transaction of a claim or a report on MariaDB and MySQL, against a real
server: ``START TRANSACTION`` travels in the text of the transaction's first statement,
so that statement must run inside the transaction (its locks and writes held until the
commit), an error of any statement must roll the whole transaction back and reach the
caller as Django's own error class, and a connection that cannot send several statements
in one text must still get a transaction."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from django.db import (
    DatabaseError,
    IntegrityError,
    OperationalError,
    ProgrammingError,
    connection,
    connections,
    transaction,
)

from jobstate.models import Job
from jobstate.stores.base import JobStatus
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.backends.mysql_transaction import several_statements
from tests.support.round_trips import round_trips
from tests.support.threads import in_parallel

pytestmark = [
    pytest.mark.mysql,
    pytest.mark.only_on("mysql"),
    pytest.mark.django_db(transaction=True),
]

TABLE = Job._meta.db_table


def _seen_elsewhere(pk: uuid.UUID) -> tuple[str, bool]:
    """Job ``pk``'s ``source`` as another connection reads it (committed data only),
    and whether that connection can lock the row right now."""
    prepared = Job._meta.pk.get_db_prep_value(pk, connection)

    def look(_index: int) -> tuple[str, bool]:
        with transaction.atomic(), connections["default"].cursor() as cursor:
            cursor.execute(f"SELECT source FROM {TABLE} WHERE id = %s", [prepared])
            source = cursor.fetchone()[0]
            try:
                cursor.execute(
                    f"SELECT id FROM {TABLE} WHERE id = %s FOR UPDATE NOWAIT", [prepared]
                )
            except DatabaseError:
                return source, False
            return source, True

    return in_parallel(1, look)[0]


@pytest.fixture
def job() -> Job:
    return Job.objects.create(request_id="short", target="short", source="before")


def test_the_first_statement_runs_inside_the_transaction(job: Job) -> None:
    ops = database_ops("default")
    with ops.short_transaction():
        Job.objects.filter(id=job.id).update(source="inside")
        # The update's lock and value are this transaction's until it commits.
        assert _seen_elsewhere(job.id) == ("before", False)
    assert _seen_elsewhere(job.id) == ("inside", True)
    assert connection.get_autocommit() and not connection.in_atomic_block


def test_a_failing_later_statement_rolls_back_the_first(job: Job) -> None:
    ops = database_ops("default")
    with pytest.raises(ProgrammingError), ops.short_transaction():
        Job.objects.filter(id=job.id).update(source="lost")
        with connection.cursor() as cursor:
            cursor.execute("SELECT * FROM jobstate_no_such_table")
    assert Job.objects.get(id=job.id).source == "before"
    assert _seen_elsewhere(job.id) == ("before", True)
    assert connection.get_autocommit() and not connection.in_atomic_block


@pytest.mark.parametrize(
    ("statement", "error"),
    [
        # The server's own syntax and integrity errors, and a NULL in a NOT NULL column
        # (1048), which Django's MySQL cursor turns into an integrity error.
        ("SELECT * FROM jobstate_no_such_table", ProgrammingError),
        (f"INSERT INTO {TABLE} (id) SELECT id FROM {TABLE}", IntegrityError),
        (f"UPDATE {TABLE} SET status = NULL", IntegrityError),
        (f"SELECT id FROM {TABLE} FOR UPDATE NOWAIT", OperationalError),
    ],
)
def test_an_error_of_the_first_statement_is_raised_as_django_raises_it(
    job: Job, statement: str, error: type[Exception]
) -> None:
    held = connections.create_connection("default")
    try:
        if error is OperationalError:
            # Another transaction holds the row, so the locking read cannot wait.
            held.set_autocommit(False)
            with held.cursor() as cursor:
                cursor.execute(f"SELECT id FROM {TABLE} FOR UPDATE")
        with (
            pytest.raises(error) as raised,
            database_ops("default").short_transaction(),
            connection.cursor() as cursor,
        ):
            cursor.execute(statement)
        # The same statement outside the short transaction fails the same way.
        with pytest.raises(error) as alone, connection.cursor() as cursor:
            cursor.execute(statement)
        assert raised.value.__cause__.args[0] == alone.value.__cause__.args[0]
    finally:
        held.close()
    # The connection answers its next statement (nothing of the failed text is left).
    assert Job.objects.get(id=job.id).target == "short"
    assert connection.get_autocommit() and not connection.in_atomic_block


def test_a_block_that_sends_nothing_costs_nothing() -> None:
    ops = database_ops("default")
    connection.ensure_connection()

    def nothing() -> None:
        with ops.short_transaction():
            pass

    assert round_trips(nothing) == (0, None)
    assert connection.execute_wrappers == []


@pytest.fixture
def one_statement_per_text() -> Iterator[None]:
    """The default connection reopened with mysqlclient's ``multi_statements`` off."""
    options = connection.settings_dict["OPTIONS"]
    connection.close()
    options["multi_statements"] = False
    try:
        connection.ensure_connection()
        yield
    finally:
        del options["multi_statements"]
        connection.close()


def test_one_statement_per_text_still_claims_and_reports_in_a_transaction(
    one_statement_per_text: None,
) -> None:
    assert not several_statements(connection)
    store = DatabaseStateStore()
    created = store.create_job(request_id="one", target="one")
    assert store.claim_next_inhub_job(["elsewhere"], "worker") is None

    def claim() -> Job | None:
        return store.claim_next_inhub_job(["one"], "worker")

    sent, claimed = round_trips(claim)
    assert claimed is not None and claimed.id == created.id
    # START TRANSACTION on its own, the locking read, the UPDATE, COMMIT.
    assert sent == 4
    sent, result = round_trips(
        lambda: store.complete_claimed_job(claimed.id, claimed.claim_token or "", JobStatus.DONE)
    )
    # START TRANSACTION, the fenced UPDATE, the row read back, COMMIT.
    assert sent == 4
    assert result.completed and result.job and result.job.status == JobStatus.DONE
    assert Job.objects.get(id=created.id).status == JobStatus.DONE

    job = Job.objects.create(request_id="held", target="held", source="before")
    with database_ops("default").short_transaction():
        Job.objects.filter(id=job.id).update(source="inside")
        assert _seen_elsewhere(job.id) == ("before", False)
    assert _seen_elsewhere(job.id) == ("inside", True)
