"""The duplicate-key match by constraint name, on the messages each server writes: a
store answers "the key is held" only for its own constraint and re-raises the rest."""

from __future__ import annotations

import pytest
from django.db import IntegrityError

from jobstate.stores.integrity import violates

pytestmark = pytest.mark.mysql

RUNS = "jobstate_jobrun"
ONE_RUNNING = "jobstate_jobrun_one_running_per_overlap_key"


class DriverError(Exception):
    """What mysqlclient raises: the server's error number, then its message."""


def from_driver(*args: object) -> IntegrityError:
    error = IntegrityError(*args)
    error.__cause__ = DriverError(*args)
    return error


@pytest.mark.parametrize(
    "message",
    [
        # MariaDB
        f"Duplicate entry 'billing.close-day' for key '{ONE_RUNNING}'",
        # MySQL 8 names the key after its table
        f"Duplicate entry 'billing.close-day' for key '{RUNS}.{ONE_RUNNING}'",
        # the duplicated value may hold anything, quotes and " for key " included
        f"Duplicate entry 'a' for key 'b'' for key '{ONE_RUNNING}'",
    ],
)
def test_the_constraint_is_recognised_in_either_servers_message(message: str) -> None:
    assert violates(
        from_driver(1062, message), constraint=ONE_RUNNING, table=RUNS, columns=["overlap_key"]
    )


@pytest.mark.parametrize(
    ("number", "message"),
    [
        (1062, "Duplicate entry 'x' for key 'jobstate_job_unique_request_id'"),
        (1062, f"Duplicate entry 'x' for key '{RUNS}.PRIMARY'"),
        (1452, "Cannot add or update a child row: a foreign key constraint fails"),
        (1048, f"Column 'status' cannot be null (key '{ONE_RUNNING}')"),
    ],
)
def test_another_violation_is_not_taken_for_it(number: int, message: str) -> None:
    assert not violates(
        from_driver(number, message), constraint=ONE_RUNNING, table=RUNS, columns=["overlap_key"]
    )


@pytest.mark.parametrize("key", ["PRIMARY", "jobstate_runtimelock.PRIMARY"])
def test_a_primary_key_is_named_primary_there(key: str) -> None:
    error = from_driver(1062, f"Duplicate entry 'lock-a' for key '{key}'")

    assert violates(
        error,
        constraint="jobstate_runtimelock_pkey",
        table="jobstate_runtimelock",
        columns=["lock_key"],
    )
    assert not violates(
        error, constraint="jobstate_runtimelock_unique", table="jobstate_runtimelock", columns=[]
    )
