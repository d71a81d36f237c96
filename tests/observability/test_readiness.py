"""Schema readiness: the store's answer, the deploy system check and the
``/health/ready`` view, on a migrated database, a database with a jobstate migration
unapplied, and databases that cannot be reached."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.core.checks import Tags, run_checks
from django.core.management import call_command
from django.db import connections
from django.db.migrations.loader import MigrationLoader
from django.test import Client

from jobstate.stores.base import Readiness
from jobstate.stores.database import DatabaseStateStore

pytestmark = pytest.mark.mysql

BROKEN = "jobstate_unreachable"

# Two ways a database can be out of reach: a server that refuses connections, and a
# file in a directory that does not exist.
UNREACHABLE = {
    "refused": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "jobstate",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "PORT": "1",
        "OPTIONS": {"connect_timeout": 2},
    },
    "missing-file": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": "/nonexistent-jobstate-directory/db.sqlite3",
    },
    # An option the driver refuses before connecting raises a ValueError, not a
    # DatabaseError: /metrics answered it with a 500.
    "misconfigured": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": "jobstate",
        "USER": "postgres",
        "HOST": "127.0.0.1",
        "OPTIONS": {"isolation_level": "garbage"},
    },
}


class UnreachableStore(DatabaseStateStore):
    """The database store bound to the unreachable alias, whatever it is given."""

    def __init__(self, using: str = "default") -> None:
        super().__init__(using=BROKEN)


def store_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


#: What the driver says for each, so a test cannot pass on some other failure.
UNREACHABLE_ERRORS = {
    "refused": "refused",
    "missing-file": "unable to open database file",
    "misconfigured": "invalid transaction isolation level",
}


@pytest.fixture(params=sorted(UNREACHABLE))
def unreachable(request: pytest.FixtureRequest, django_db_blocker: Any) -> Iterator[str]:
    """Register an alias whose connection settings point nowhere, for this test only.

    The tests using it run outside a test case's database wrapper: that wrapper refuses
    connections to aliases it was not told about, which would stand in for the real
    failure this fixture is about. Database access is opened for them instead."""
    # configure_settings fills the keys Django expects of every alias.
    configured = connections.configure_settings(
        {"default": connections.settings["default"], BROKEN: dict(UNREACHABLE[request.param])}
    )
    connections.settings[BROKEN] = configured[BROKEN]
    try:
        with django_db_blocker.unblock():
            yield request.param
    finally:
        connections[BROKEN].close()
        del connections[BROKEN]
        del connections.settings[BROKEN]


# --- the store's answer ---------------------------------------------------------------


@pytest.mark.django_db
def test_a_migrated_database_is_ready() -> None:
    assert DatabaseStateStore().schema_readiness() == Readiness(
        ready=True, database="ok", migrations="ok", pending=0
    )


def test_an_unreachable_database_is_not_ready(unreachable: str) -> None:
    readiness = DatabaseStateStore(using=BROKEN).schema_readiness()

    assert readiness.ready is False
    assert (readiness.database, readiness.migrations) == ("failed", "failed")
    assert readiness.detail.startswith("database unreachable")
    assert UNREACHABLE_ERRORS[unreachable] in readiness.detail.lower()


def test_an_unknown_alias_is_not_ready_rather_than_an_error() -> None:
    readiness = DatabaseStateStore(using="no-such-alias").schema_readiness()

    assert readiness.ready is False
    assert readiness.database == "failed"
    assert "no-such-alias" in readiness.detail


@pytest.mark.django_db(transaction=True)
def test_an_unapplied_jobstate_migration_means_not_ready(client: Client) -> None:
    # Every jobstate migration after 0002 counts as pending, however many there are.
    later = [
        name
        for app, name in MigrationLoader(None, ignore_no_migrations=True).disk_migrations
        if app == "jobstate" and name[:4] > "0002"
    ]
    call_command("migrate", "jobstate", "0002", verbosity=0)
    try:
        readiness = DatabaseStateStore().schema_readiness()
        response = client.get("/health/ready")
        problems = run_checks(include_deployment_checks=True, databases=["default"])
    finally:
        call_command("migrate", "jobstate", verbosity=0)

    assert readiness.ready is False
    assert (readiness.database, readiness.migrations, readiness.pending) == (
        "ok",
        "pending",
        len(later),
    )
    assert "0003_outbox_approvals_replay" in readiness.detail
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "checks": {"database": "ok", "migrations": {"status": "pending", "pending": len(later)}},
    }
    assert [p.id for p in problems if p.id.startswith("jobstate.E")] == ["jobstate.E010"]
    # Migrated forward again: ready once more.
    assert DatabaseStateStore().schema_readiness().ready is True


@pytest.mark.django_db(transaction=True)
def test_a_missing_table_means_not_ready() -> None:
    with connections["default"].schema_editor() as editor:
        from jobstate.models import ApprovalDecision

        editor.delete_model(ApprovalDecision)
    try:
        readiness = DatabaseStateStore().schema_readiness()
    finally:
        with connections["default"].schema_editor() as editor:
            editor.create_model(ApprovalDecision)

    assert readiness.ready is False
    assert readiness.migrations == "failed"
    assert "jobstate_approvaldecision" in readiness.detail


@pytest.mark.only_on("mysql")
@pytest.mark.django_db(transaction=True)
def test_a_missing_mariadb_guard_means_not_ready_and_fails_the_deploy_check() -> None:
    """On MariaDB and MySQL the unique index standing in for the partial constraint is
    what keeps one RUNNING run per overlap key; without it the schema is not usable."""
    connection = connections["default"]
    index = "jobstate_jobrun_one_running_per_overlap_key"
    with connection.cursor() as cursor:
        cursor.execute(f"DROP INDEX `{index}` ON `jobstate_jobrun`")
    try:
        readiness = DatabaseStateStore().schema_readiness()
        problems = run_checks(
            tags=[Tags.database], include_deployment_checks=True, databases=["default"]
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                f"CREATE UNIQUE INDEX `{index}` ON `jobstate_jobrun` (`running_overlap_key`)"
            )

    assert readiness.ready is False
    assert f"jobstate_jobrun.{index}" in readiness.detail
    [problem] = [p for p in problems if p.id.startswith("jobstate.E")]
    assert problem.id == "jobstate.E044" and index in problem.msg
    assert DatabaseStateStore().schema_readiness().ready is True


# --- the deploy system check ---------------------------------------------------------------


@pytest.mark.django_db
def test_deploy_check_is_silent_on_a_migrated_database() -> None:
    problems = run_checks(include_deployment_checks=True, databases=["default"])

    assert not [p for p in problems if p.id.startswith("jobstate.E")]


@pytest.mark.backend
def test_plain_check_never_touches_the_database() -> None:
    # Without databases the check has nothing to look at (and no connection is opened).
    problems = run_checks(include_deployment_checks=True)

    assert not [p for p in problems if p.id.startswith("jobstate.E")]


def test_deploy_check_reports_an_unreachable_database(unreachable: str) -> None:
    # Only the database checks: Django's model checks would themselves fail to connect.
    problems = run_checks(tags=[Tags.database], include_deployment_checks=True, databases=[BROKEN])

    [problem] = [p for p in problems if p.id.startswith("jobstate.E")]
    assert problem.id == "jobstate.E011"
    assert UNREACHABLE_ERRORS[unreachable] in problem.msg.lower()


# --- the /health/ready view -------------------------------------------------------------


@pytest.mark.django_db
def test_ready_view_answers_200_on_a_migrated_database(client: Client) -> None:
    response = client.get("/health/ready")

    assert response.status_code == 200
    assert response.json() == {
        "ready": True,
        "checks": {"database": "ok", "migrations": {"status": "ok", "pending": 0}},
    }
    assert "no-cache" in response["Cache-Control"]


def test_ready_view_answers_503_without_revealing_the_error(
    unreachable: str, settings: Any
) -> None:
    settings.JOBSTATE = {"STATE_STORE": store_path(UnreachableStore)}

    response = Client().get("/health/ready")

    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "checks": {"database": "failed", "migrations": {"status": "failed", "pending": 0}},
    }
    for secret in ("nonexistent-jobstate-directory", "127.0.0.1", "postgres"):
        assert secret not in response.content.decode()


def test_metrics_view_answers_503_when_the_database_is_unreachable(
    unreachable: str, settings: Any
) -> None:
    settings.JOBSTATE = {"STATE_STORE": store_path(UnreachableStore)}

    response = Client().get("/metrics")

    assert response.status_code == 503
    assert b"jobstate_" not in response.content


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/health/ready", "/metrics"])
def test_endpoints_answer_only_reads(client: Client, path: str) -> None:
    assert client.post(path).status_code == 405
    assert client.head(path).status_code == 200


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/health/ready", "/metrics"])
@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 401),
        ("Bearer wrong-token", 401),
        ("Basic s3cret-token", 401),
        ("Bearer s3cret-token", 200),
        ("bearer s3cret-token", 200),
    ],
)
def test_a_configured_token_guards_the_endpoints(
    settings: Any, path: str, authorization: str | None, status: int
) -> None:
    settings.JOBSTATE = {
        "OBSERVABILITY_TOKEN": "s3cret-token",
    }
    headers = {} if authorization is None else {"Authorization": authorization}

    response = Client().get(path, headers=headers)

    assert response.status_code == status
    if status == 401:
        assert response["WWW-Authenticate"].startswith("Bearer")
        assert b"jobstate_" not in response.content and b"ready" not in response.content
