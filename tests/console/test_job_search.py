"""The jobs list's search (jobstate.console.job_search): parsing, results on SQLite and
PostgreSQL, the recent-rows bound of the searches no index serves, the GIN index behind
``input:`` on PostgreSQL, and clear messages (never a 500) for malformed searches."""

from __future__ import annotations

import time

import pytest
from django.db import connection, transaction
from django.test import Client

from jobstate.console import job_search as job_queries
from jobstate.console.job_search import SearchError, filter_jobs, parse_search
from jobstate.models import Job
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import shown_messages
from tests.support.plans import plans_without_table_scans

#: The console's pages and their queries run on MariaDB/MySQL too (scripts/test's MariaDB step).
pytestmark = pytest.mark.mysql

JOBS = "/admin/jobstate/job/"


# --- parsing -----------------------------------------------------------------------------


def test_terms_are_read_with_their_fields_and_values() -> None:
    search = parse_search(
        'task:app.tasks.send queue:emails error:"timed out" input:order.id=7 '
        'input:code="42" input:name=ann worker:w-1 req-9'
    )
    assert search.exact == "req-9"
    assert search.conditions == [
        ("task", "app.tasks.send"),
        ("queue", "emails"),
        ("error", "timed out"),
        ("input", {"order": {"id": 7}}),
        ("input", {"code": "42"}),
        ("input", {"name": "ann"}),
        ("worker", "w-1"),
    ]


@pytest.mark.parametrize(
    ("term", "message"),
    [
        ("colour:red", "Unknown search field 'colour'"),
        ('error:"never closed', "A quote is not closed"),
        ("one two", "Only one bare term"),
        ("input:customer", "input: takes key=value"),
        ("input:=3", "input: takes key=value"),
        ("input:a..b=1", "has an empty part"),
        ("task:", "task: needs a value"),
        ("x" * 501, "at most 500 characters"),
    ],
)
def test_a_malformed_search_says_what_is_wrong(term: str, message: str) -> None:
    with pytest.raises(SearchError, match=message.replace("(", r"\(").replace(".", r"\.")):
        parse_search(term)


# --- results -----------------------------------------------------------------------------


def make_jobs() -> dict[str, Job]:
    rows = {
        "send": dict(task_path="app.tasks.send", queue_name="emails", input={"customer": 42}),
        "send-str": dict(task_path="app.tasks.send", queue_name="emails", input={"customer": "42"}),
        "bill": dict(
            task_path="app.billing.charge",
            queue_name="default",
            input={"order": {"id": 7, "lines": 3}},
            error="TimeoutError: the gateway timed out",
            attempt_log=[{"worker_id": "w-1", "outcome": "failed"}],
        ),
        "exec": dict(target="gpu", executor_id="w-1", status="dispatched"),
        "other": dict(target="gpu", input={"customer": 43}, error="ValueError: bad"),
    }
    return {name: Job.objects.create(request_id=name, **fields) for name, fields in rows.items()}


def found(term: str) -> set[str]:
    rows = parse_search(term).apply(Job.objects.all())
    return set(rows.values_list("request_id", flat=True))


@pytest.mark.django_db
def test_each_search_field_finds_its_jobs() -> None:
    jobs = make_jobs()
    assert found("task:app.tasks.send") == {"send", "send-str"}
    assert found("task:app.*") == {"send", "send-str", "bill"}
    assert found("queue:emails") == {"send", "send-str"}
    assert found("error:TimeoutError") == {"bill"}
    assert found('error:"gateway timed"') == {"bill"}
    assert found("input:customer=42") == {"send"}
    assert found('input:customer="42"') == {"send-str"}
    assert found("input:order.id=7") == {"bill"}
    assert found("worker:w-1") == {"bill", "exec"}
    assert found("task:app.tasks.send input:customer=42") == {"send"}
    assert found(str(jobs["bill"].pk)) == {"bill"}
    assert found("exec") == {"exec"}
    assert found("worker:w-2") == set()


@pytest.mark.django_db
def test_the_list_searches_and_a_malformed_search_shows_a_message(admin_client: Client) -> None:
    make_jobs()
    page = admin_client.get(JOBS, {"q": "input:customer=42"})
    assert page.status_code == 200
    assert [job.request_id for job in page.context["cl"].result_list] == ["send"]
    assert "input:customer=42" in page.content.decode()  # the help text shows the syntax
    bad = admin_client.get(JOBS, {"q": "colour:red"})
    assert bad.status_code == 200
    assert list(bad.context["cl"].result_list) == []
    [message] = shown_messages(bad)
    assert "Unknown search field 'colour'" in message and "worker:" in message


@pytest.mark.django_db
def test_a_bad_filter_value_is_refused_without_a_500(admin_client: Client) -> None:
    make_jobs()
    response = admin_client.get(JOBS, {"lease": "sideways"})
    # Django's list answers an unreadable filter by dropping it (?e=1), not with a 500.
    assert response.status_code == 302 and "e=1" in response["Location"]
    with pytest.raises(SearchError, match="Unknown lease filter"):
        filter_jobs(Job.objects.all(), {"lease": "sideways"})


@pytest.mark.django_db(transaction=True)
def test_searches_no_index_serves_look_only_at_the_newest_jobs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(job_queries, "RECENT_SEARCH_WINDOW", 3)
    store = DatabaseStateStore()
    for n in range(5):
        # One transaction per job, a few milliseconds apart: created_at is the database's
        # clock, which stands still within a transaction on PostgreSQL.
        with transaction.atomic():
            job = store.create_job(request_id=f"j{n}", input={"customer": 1}, error="boom")
        Job.objects.filter(pk=job.pk).update(queue_name="emails")
        time.sleep(0.005)
    assert found("queue:emails") == {"j2", "j3", "j4"}
    assert found("error:boom") == {"j2", "j3", "j4"}
    # The identity terms are indexed everywhere; input: is indexed on PostgreSQL.
    assert found("j0") == {"j0"}
    everyone = {f"j{n}" for n in range(5)}
    expected = everyone if connection.vendor == "postgresql" else {"j2", "j3", "j4"}
    assert found("input:customer=1") == expected


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_input_search_is_served_by_the_gin_index() -> None:
    make_jobs()
    rows = parse_search("input:customer=42").apply(Job.objects.all())
    sql, params = rows.order_by("-created_at")[:50].query.sql_with_params()
    with connection.cursor() as cursor:
        statement = cursor.mogrify(sql, params)
    statement = statement.decode() if isinstance(statement, bytes) else statement
    assert "@>" in statement
    [plan] = plans_without_table_scans(connection, [statement], bitmap=True)
    assert "jobstate_job_input_gin_idx" in plan, plan


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_gin_index_exists_only_with_jsonb_path_ops() -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexdef FROM pg_indexes WHERE indexname = 'jobstate_job_input_gin_idx'"
        )
        [(definition,)] = cursor.fetchall()
    assert "USING gin (input jsonb_path_ops)" in definition


def test_search_help_names_every_field() -> None:
    from jobstate.admin.jobs import JobAdmin

    text = str(JobAdmin.search_help_text)
    for name in job_queries.SEARCH_FIELDS:
        assert f"{name}:" in text
