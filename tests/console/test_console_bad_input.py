"""What a user types or a URL carries never makes the console answer 500: a search or
filter value it cannot read (a NUL, a lone surrogate, a bad escape, NaN, a number out of
range) is a message on the list, shown empty (a search) or unfiltered (a filter), and
the bulk pages over such a filter go back to the list with the message. Also the one
meaning of ``input:`` (containment) on SQLite, PostgreSQL and MariaDB."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobstate.console.bulk import start_bulk_operation
from jobstate.console.job_search import SearchError, parse_search
from jobstate.models import AuditEntry, BulkOperation, Job
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import shown_messages

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

JOBS = "/admin/jobstate/job/"
AUDIT = "/admin/jobstate/auditentry/"
BULK = "/admin/jobstate/job/bulk/"


def get(client: Client, url: str, query: str) -> Any:
    """``url`` with ``query`` as the raw query string (percent-encoded as a browser
    sends it), following redirects: the page the user ends up on."""
    response = client.get(f"{url}?{query}", follow=True)
    assert response.status_code == 200, (url, query, response.status_code)
    return response


def listed(response: Any) -> list[str]:
    return [job.request_id for job in response.context["cl"].result_list]


@pytest.fixture
def jobs() -> None:
    store = DatabaseStateStore()
    store.create_job(request_id="first", target="billing", input={"a": 1})
    store.create_job(request_id="second", target="reports", input={"a": 2})


#: Searches from the issue and the fuzzing, each with what its message says.
BAD_SEARCHES = [
    ("error%3A%22%5Cx%22", "escape"),  # error:"\x"
    ("input%3Aa%3DNaN", "NaN"),
    ("input%3Aa%3DInfinity", "Infinity"),
    ("input%3Aa%3D-Infinity", "Infinity"),
    ("input%3Aa%3D1e400", "1e400"),
    ("input%3Aa%3D99999999999999999999", "99999999999999999999"),
    ("error%3A%22%5Cud800%22", "surrogate"),  # error:"\ud800"
    ("input%3Aa%3D%22%5Cud800%22", "surrogate"),
    ("input%3A%22%5Cud800%22%3D1", "surrogate"),
    ("input%3Aa%3D%22%5Cu0000%22", "NUL"),  # input:a="\u0000"
    ("input%3Aa%3D%5B1%5D", "single value"),  # input:a=[1]
    ("input%3Aa%3D%7B%22b%22%3A1%7D", "single value"),  # input:a={"b":1}
    ("input%3A%22a%5C%22b%22%3D1", "double quote"),  # input:"a\"b"=1
]
#: Searches holding a NUL as typed (the jobs list refuses them before reading them).
NUL_SEARCHES = [("a%00b", "NUL"), ("error%3A%00", "NUL"), ("input%3Aa%3D%00", "NUL")]


@pytest.mark.parametrize(("query", "says"), BAD_SEARCHES)
def test_a_search_the_list_cannot_read_shows_a_message_and_lists_nothing(
    admin_client: Client, jobs: None, query: str, says: str
) -> None:
    response = get(admin_client, JOBS, f"q={query}")
    [message] = shown_messages(response)
    assert says in message, message
    assert listed(response) == []


@pytest.mark.parametrize(
    ("url", "query", "says"),
    [
        (JOBS, "q=a%00b", "search"),
        (JOBS, "q=input%3Aa%3D%00", "search"),
        (JOBS, "target=%00", "target"),
        (JOBS, "status__exact=%00", "status__exact"),
        (JOBS, "status=%00", "status"),
        (JOBS, "queue=a%00b", "queue"),
        (JOBS, "lease=sideways", "lease"),
        (JOBS, "created_at__gte=2020-13-45", "created_at__gte"),
        (AUDIT, "event=%00", "event"),
        (AUDIT, "stage__exact=%00", "stage__exact"),
        (AUDIT, "ts__gte=yesterday", "ts__gte"),
        (AUDIT, "job_id=not-a-uuid", "job_id"),
    ],
)
def test_a_filter_value_the_list_cannot_read_shows_the_list_unfiltered_with_a_message(
    admin_client: Client, jobs: None, url: str, query: str, says: str
) -> None:
    AuditEntry.objects.create(event="rerun", request_id="first")
    response = get(admin_client, url, query)
    [message] = shown_messages(response)
    assert says in message, message
    assert response.request["QUERY_STRING"] == "e=1"
    assert len(response.context["cl"].result_list) >= 1


@pytest.mark.parametrize(
    ("query", "says"),
    [
        *((f"q={query}", says) for query, says in [*BAD_SEARCHES, *NUL_SEARCHES]),
        ("target=%00", "target"),
    ],
)
def test_the_bulk_confirmation_over_an_unreadable_filter_goes_back_with_a_message(
    admin_client: Client, jobs: None, query: str, says: str
) -> None:
    for action in ("requeue", "reject", "delete"):
        response = get(admin_client, f"{BULK}{action}/", query)
        assert response.request["PATH_INFO"] == JOBS
        assert any(says in message for message in shown_messages(response)), action
        # Posted (the confirmation form carries the filter): nothing is recorded.
        posted = admin_client.post(f"{BULK}{action}/", {"_filter": query}, follow=True)
        assert posted.status_code == 200
        assert any(says in message for message in shown_messages(posted)), action
    assert not BulkOperation.objects.exists()


def test_a_bulk_operation_started_before_the_search_rules_tightened_is_not_a_500(
    admin_client: Client, jobs: None
) -> None:
    operation = start_bulk_operation(action="requeue", filters={}, search="", operator="o")
    BulkOperation.objects.filter(pk=operation.pk).update(search="input:a=NaN")
    url = f"/admin/jobstate/job/bulk-operation/{operation.pk}/"
    assert admin_client.get(url).status_code == 200
    step = admin_client.post(url, {"step": "1"}, follow=True)
    assert step.status_code == 200
    [message] = shown_messages(step)
    assert "filter cannot be read" in message and "NaN" in message
    scripted = admin_client.post(url, {"step": "1"}, headers={"Accept": "application/json"})
    assert scripted.status_code == 400 and "NaN" in scripted.json()["error"]
    assert admin_client.post(url, {"stop": "1"}).status_code == 302
    assert BulkOperation.objects.get().state == "cancelled"


# --- every list page and parameter ---------------------------------------------------------

#: Each console list and the parameters its URL takes (its filters, search, ordering and
#: page, and a lookup Django's admin accepts on any field of the model).
LIST_PARAMETERS = {
    "job": ["q", "status__exact", "target", "task", "queue", "source", "lease", "delayed"],
    "jobrun": ["q", "status__exact", "trigger", "heartbeat", "job_key"],
    "auditentry": ["q", "stage__exact", "severity__exact", "event", "request_id", "bulk"],
    "notification": ["q", "state__exact", "channel", "destination"],
    "runtimelock": ["q", "state", "owner"],
    "worker": ["q", "state", "kind__exact", "host"],
    "schedule": ["q", "state", "kind__exact", "target"],
    "approvaldecision": ["q", "approver"],
    "deliveryreplay": ["q", "requested_by"],
    "bulkoperation": ["q", "action__exact", "state__exact", "operator"],
}
EVERY_PAGE = [("o", "99"), ("o", "-1.x"), ("p", "-1"), ("p", "99999999999999999999")]
#: "²" is a digit to str.isdigit() and not to int(); int() refuses more than 4,300
#: digits. Both gave the Workers search and the audit list's bulk filter a 500.
UNREADABLE = ["%00", "a%00b", "%ED%A0%80", "%FF", "NaN", "1e400", "x" * 3000, "%C2%B2", "9" * 4301]


@pytest.mark.parametrize("model", sorted(LIST_PARAMETERS))
def test_no_list_answers_500_to_any_parameter(admin_client: Client, model: str) -> None:
    DatabaseStateStore().create_job(request_id="first", input={"a": 1})
    url = f"/admin/jobstate/{model}/"
    queries = [f"{name}={value}" for name in LIST_PARAMETERS[model] for value in UNREADABLE]
    queries += [f"{name}={value}" for name, value in EVERY_PAGE]
    for query in queries:
        response = admin_client.get(f"{url}?{query}", follow=True)
        assert response.status_code in (200, 400), (query, response.status_code)
    for pk in ("%00", "a%00b"):
        response = admin_client.get(f"{url}{pk}/change/", follow=True)
        assert response.status_code == 200, (pk, response.status_code)


# --- input: means containment on every backend ---------------------------------------------


def found(term: str) -> set[str]:
    rows = parse_search(term).apply(Job.objects.all())
    return set(rows.values_list("request_id", flat=True))


def test_input_search_is_containment_on_every_backend() -> None:
    rows: dict[str, Any] = {
        "int": {"customer": 42, "kind": "invoice"},
        "float": {"customer": 42.0},
        "text": {"customer": "42"},
        "upper": {"customer": "ANN"},
        "true": {"customer": True, "contains": 1},
        "one": {"customer": 1, "contains": {"exact": 2}},
        "null": {"customer": None},
        "listed": {"customer": [42, 1]},
        "nested": {"order": {"id": 7, "lines": [{"sku": "a"}]}, "0": "zero"},
        "nested-list": {"order": [{"id": 7}]},
        "empty": {},
        "list-input": [{"customer": 42}],
    }
    for name, value in rows.items():
        Job.objects.create(request_id=name, input=value)
    # A key with that value (numbers as numbers, 42 == 42.0; text is not a number).
    assert found("input:customer=42") == {"int", "float"}
    assert found("input:customer=42.0") == {"int", "float"}
    assert found('input:customer="42"') == {"text"}
    assert found("input:customer=ANN") == {"upper"}
    assert found("input:customer=ann") == set()
    # true is not 1, null is a key present with null (not a missing key).
    assert found("input:customer=true") == {"true"}
    assert found("input:customer=1") == {"one"}
    assert found("input:customer=null") == {"null"}
    # Nested keys by a dotted path; keys that are Django lookup names or digits are keys.
    assert found("input:order.id=7") == {"nested"}
    assert found("input:contains=1") == {"true"}
    assert found("input:contains.exact=2") == {"one"}
    assert found("input:0=zero") == {"nested"}
    # A value inside a list is not the key's value; a path does not go through a list.
    assert found("input:customer=1") == {"one"}
    assert found("input:order.lines.sku=a") == set()
    # Every term must hold.
    assert found("input:customer=42 input:kind=invoice") == {"int"}


def test_input_takes_one_value_and_keys_without_quotes_or_backslashes() -> None:
    for term, message in [
        ("input:a=[1]", "single value"),
        ('input:a={"b":1}', "single value"),
        ("input:a=NaN", "NaN"),
        ("input:a=1e400", "1e400"),
        ('input:"a\\\\b"=1', "backslash"),
    ]:
        with pytest.raises(SearchError, match=message.replace("[", r"\[")):
            parse_search(term)


#: The table of docs/console.md ("What input: means"): each input and the terms that find it.
DOCUMENTED = [
    ({"customer": 42}, {"input:customer=42"}),
    ({"customer": 42.0, "contains": True}, {"input:customer=42", "input:contains=true"}),
    ({"customer": "42"}, {'input:customer="42"'}),
    ({"customer": [42, 1]}, set()),
    ({"order": {"id": 7, "lines": 3}}, {"input:order.id=7"}),
    ({"order": [{"id": 7}]}, set()),
]


def test_the_documented_examples_of_input_hold() -> None:
    for n, (value, _terms) in enumerate(DOCUMENTED):
        Job.objects.create(request_id=f"row-{n}", input=value)
    for term in (
        "input:customer=42",
        'input:customer="42"',
        "input:order.id=7",
        "input:contains=true",
    ):
        expected = {f"row-{n}" for n, (_v, terms) in enumerate(DOCUMENTED) if term in terms}
        assert found(term) == expected, term


@pytest.mark.parametrize("model", ["runtimelock", "approvaldecision", "job"])
def test_a_selection_no_row_can_match_changes_nothing_and_says_so(
    admin_client: Client, model: str
) -> None:
    data = {"action": "force_release_locks", "_selected_action": ["a\x00b"], "index": "0"}
    response = admin_client.post(f"/admin/jobstate/{model}/", data, follow=True)
    assert response.status_code == 200
    [message] = shown_messages(response)
    assert "selection cannot be used" in message and "Nothing was changed" in message


def test_the_bulk_confirmations_message_says_nothing_started_and_keeps_the_fields_name(
    admin_client: Client, jobs: None
) -> None:
    # The page capitalises a message's first letter: the bare reason read "Input: NaN …",
    # naming a search field the search box does not know, and did not say what happened.
    response = get(admin_client, f"{BULK}requeue/", "q=input%3Aa%3DNaN")
    html = response.content.decode()
    shown = " ".join(html.split('<ul class="messagelist">')[1].split("</ul>")[0].split())
    assert "Nothing was started." in shown, shown
    assert "Search not understood: input: NaN is not a JSON value" in shown, shown
    assert "Input:" not in shown


@pytest.mark.parametrize(
    ("model", "action", "selected", "says"),
    [
        ("job", "requeue_jobs", "not-a-uuid", "UUID"),
        ("notification", "replay_dead_letters", "12", "UUID"),
        ("schedule", "pause_schedules", "abc", "integer"),
        ("schedule", "run_schedules_now", "1.5", "integer"),
        ("schedule", "resume_schedules", "9" * 30, "less than or equal to"),
    ],
)
def test_a_selection_that_is_no_id_of_the_list_changes_nothing_and_says_so(
    admin_client: Client, jobs: None, model: str, action: str, selected: str, says: str
) -> None:
    # A forged or stale form: Django's admin filtered the rows by the value and answered
    # a server error ("“not-a-uuid” is not a valid UUID").
    data = {"action": action, "_selected_action": [selected], "index": "0"}
    response = admin_client.post(f"/admin/jobstate/{model}/", data, follow=True)
    assert response.status_code == 200
    [message] = shown_messages(response)
    assert "selection cannot be used" in message and "Nothing was changed" in message
    assert says in message, message
    assert not AuditEntry.objects.exists()


def test_a_huge_selected_value_is_not_repeated_whole(admin_client: Client, jobs: None) -> None:
    data = {"action": "requeue_jobs", "_selected_action": ["9" * 5000], "index": "0"}
    response = admin_client.post("/admin/jobstate/job/", data, follow=True)
    [message] = shown_messages(response)
    assert "selection cannot be used" in message and "Nothing was changed" in message
    assert len(message) < 400, len(message)
