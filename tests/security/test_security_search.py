"""The jobs list's search reveals nothing the console hides. A user who may only view
could otherwise read a redacted value a character at a time: ``error:"api key sk-9"``,
then ``...sk-9f``, listing the job only while the guess was right (found by an outside
pass: a four-character key in about 60 requests), and confirm a whole guess with
``input:api_key="sk-9f3Q"``. The bulk operations narrow jobs the same way."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobstate.console import hidden_matches
from jobstate.console.job_search import SearchError, parse_search
from jobstate.models import Job
from jobstate.stores.base import NotificationRequest
from jobstate.stores.database import DatabaseStateStore
from tests.support.admin_kit import logged_in, operator

pytestmark = [pytest.mark.django_db, pytest.mark.mysql]

JOBS = "/admin/jobstate/job/"
SECRET_ERROR = "gateway refused api key sk-9f3Q for customer 7"


@pytest.fixture
def jobs() -> None:
    store = DatabaseStateStore()
    store.create_job(
        request_id="holds-a-key",
        input={"customer": 7, "auth": {"API_Key": "sk-9f3Q"}},
        error=SECRET_ERROR,
    )
    store.create_job(request_id="plain", input={"customer": 8}, error="gateway refused customer 8")


@pytest.fixture
def viewer(django_user_model: Any) -> Client:
    return logged_in(operator(django_user_model, "viewer", "view_job"))


def listed(client: Client, search: str) -> list[str]:
    response = client.get(JOBS, {"q": search})
    assert response.status_code == 200
    return sorted(job.request_id for job in response.context["cl"].result_list)


@pytest.mark.usefixtures("jobs")
def test_an_error_search_does_not_match_inside_a_hidden_value(viewer: Client) -> None:
    for guess in ('"api key sk-9"', '"api key sk-9f3"', "sk-9f3Q", '"key sk-9f3Q for"'):
        assert listed(viewer, f"error:{guess}") == [], guess
    # What the page shows is still found, around the hidden value too.
    assert listed(viewer, 'error:"gateway refused"') == ["holds-a-key", "plain"]
    assert listed(viewer, 'error:"for customer 7"') == ["holds-a-key"]
    assert listed(viewer, 'error:"api key ••••"') == []  # the mask is not in the text


@pytest.mark.usefixtures("jobs")
def test_an_error_search_in_the_attempt_log_does_not_match_inside_a_hidden_value() -> None:
    Job.objects.filter(request_id="holds-a-key").update(
        error=None, attempt_log=[{"error": {"message": SECRET_ERROR}}]
    )
    assert not parse_search('error:"api key sk-9"').apply(Job.objects.all()).exists()
    assert parse_search('error:"customer 7"').apply(Job.objects.all()).count() == 1


def test_values_hidden_through_the_job_s_notifications_and_audit_entries_are_not_matched(
    viewer: Client,
) -> None:
    """The job's page also hides the values under a redacted key of its notifications'
    payloads and its audit entries' details; the search's check looked only at the
    job's own fields, and a view-only user read a token from a webhook's payload in
    304 requests (found by an outside pass)."""
    store = DatabaseStateStore()
    store.create_job(request_id="notified", target="hooks", input={"customer": 8})
    job = store.claim_next_inhub_job(["hooks"], "worker-1")
    assert job is not None
    hook = NotificationRequest("webhook", "https://example.com/", {"token": "tk-77aZq9"})
    done = store.complete_job_with_notifications(
        job, {"status": "error", "error": "hook refused token tk-77aZq9 for customer 8"}, [hook]
    )
    assert done is not None
    audited = store.create_job(
        request_id="audited", error="login failed with pw-hunter-2 for customer 9"
    )
    store.append_audit(job=audited, event="note", detail={"password": "pw-hunter-2"})

    assert listed(viewer, 'error:"token tk-77"') == []
    assert listed(viewer, 'error:"with pw-hun"') == []
    assert listed(viewer, 'error:"for customer 8"') == ["notified"]
    assert listed(viewer, 'error:"for customer 9"') == ["audited"]


@pytest.mark.usefixtures("jobs")
def test_the_configured_secrets_are_not_matched_either(settings: Any) -> None:
    settings.JOBSTATE = {"WEBHOOK_SECRET": "whsec-abcdef"}
    Job.objects.filter(request_id="plain").update(error="signing with whsec-abcdef failed")
    assert not parse_search("error:whsec-abc").apply(Job.objects.all()).exists()
    assert parse_search('error:"signing with"').apply(Job.objects.all()).count() == 1


@pytest.mark.usefixtures("jobs")
@pytest.mark.parametrize("key", ["auth.API_Key", "auth.api_key", "password", "a.Token.b"])
def test_an_input_search_under_a_redacted_key_is_refused(viewer: Client, key: str) -> None:
    with pytest.raises(SearchError, match="the console hides the values"):
        parse_search(f'input:{key}="sk-9f3Q"')
    response = viewer.get(JOBS, {"q": f'input:{key}="sk-9f3Q"'})
    assert [job.request_id for job in response.context["cl"].result_list] == []
    said = " ".join(str(message) for message in response.context["messages"])
    assert "ADMIN_REDACTED_KEYS" in said
    # Other keys are searched as ever.
    assert listed(viewer, "input:customer=7") == ["holds-a-key"]


@pytest.mark.usefixtures("jobs")
def test_too_many_jobs_holding_hidden_values_refuse_the_search(
    viewer: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hidden_matches, "CHECK_LIMIT", 0)
    response = viewer.get(JOBS, {"q": 'error:"gateway refused"'})
    said = " ".join(str(message) for message in response.context["messages"])
    assert "matched more than 0 jobs that hold hidden values" in said
    # A search no job holding a hidden value matches reads nothing back.
    assert listed(viewer, 'error:"customer 8"') == ["plain"]


@pytest.mark.usefixtures("jobs")
def test_a_bulk_operation_over_the_search_takes_what_the_list_shows(django_user_model: Any) -> None:
    Job.objects.update(status="error")
    client = logged_in(operator(django_user_model, "ops", "view_job", "requeue_job"))

    def counted(search: str) -> str:
        response = client.get("/admin/jobstate/job/bulk/requeue/", {"q": search})
        assert response.status_code == 200
        return response.content.decode()

    assert "2 matching jobs now" in counted('error:"gateway refused"')
    assert "1 matching job now" in counted('error:"customer 7"')
    assert "1 matching job" not in counted('error:"api key sk-9"')
