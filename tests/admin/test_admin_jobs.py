"""The jobs admin: the changelist at scale, the job page, and the requeue, reject and
approve actions with their confirmation pages, permissions and audit entries. Also the
two store methods the actions use, on the database and the in-memory store."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib import admin
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from jobstate.admin.paginator import CountKind, EstimatedCountPaginator
from jobstate.exceptions import InvalidJobState
from jobstate.models import ApprovalDecision, AuditEntry, DeliveryAttempt, Job
from jobstate.stores.base import JobStatus, StateStore
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.factories import NotificationFactory
from tests.support.admin_kit import (
    JOBS,
    PAST,
    act,
    confirm_page,
    failed_job,
    logged_in,
    operator,
    running_job,
    shown_messages,
)
from tests.support.threads import in_parallel


def audit_events(job: Job) -> list[tuple[str, dict[str, Any]]]:
    return [
        (entry.event, entry.detail)
        for entry in AuditEntry.objects.filter(job_id=job.id).order_by("ts", "id")
    ]


# --- the changelist --------------------------------------------------------------------


def test_changelist_shows_status_badges_lease_and_age(admin_client: Client, store) -> None:
    running_job(store, "live", expired=False)
    running_job(store, "lost", expired=True)
    failed_job(store, "broken")
    page = admin_client.get(JOBS).content.decode()
    assert "jobstate-badge" in page and ">Running<" in page and ">Error<" in page
    # The lost worker's lease ended in 2020; the live one has its 20 minutes.
    assert re.search(r'<span class="jobstate-alert-text">lease expired \d+ d ago</span>', page)
    assert re.search(r"lease ends in (19|20) min", page)
    assert re.search(
        r'<td class="field-age"><time class="jobstate-age"[^>]*>\d+ s ago</time>', page
    )
    for request_id in ("live", "lost", "broken"):
        # The request id links to the job, on one line with the whole id as tooltip.
        assert f'title="{request_id}">{request_id}</span></a>' in page


def test_changelist_lists_newest_first(admin_client: Client, store) -> None:
    for n in range(3):
        store.create_job(request_id=f"job-{n}", target="mail")
    page = admin_client.get(JOBS).content.decode()
    assert page.index(">job-2<") < page.index(">job-1<") < page.index(">job-0<")


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("status__exact=error", {"broken"}),
        ("lease=expired", {"lost"}),
        ("lease=held", {"live"}),
        ("delayed=yes", {"later"}),
        ("target=mail", {"broken", "waiting"}),
        ("source=api", {"waiting"}),
    ],
)
def test_changelist_filters(admin_client: Client, store, query: str, expected: set[str]) -> None:
    running_job(store, "live", expired=False)
    running_job(store, "lost", expired=True)
    failed_job(store, "broken")
    store.create_job(request_id="waiting", target="mail", source="api")
    store.create_job(
        request_id="later", target="sms", run_after=datetime.now(UTC) + timedelta(hours=1)
    )
    response = admin_client.get(f"{JOBS}?{query}")
    assert response.status_code == 200
    listed = {job.request_id for job in response.context["cl"].result_list}
    assert listed == expected


def test_target_filter_offers_recent_targets(admin_client: Client, store) -> None:
    store.create_job(request_id="a", target="mail")
    store.create_job(request_id="b", target="sms")
    page = admin_client.get(JOBS).content.decode()
    assert "?target=mail" in page and "?target=sms" in page


def test_search_matches_job_id_request_id_and_thread_exactly(admin_client: Client, store) -> None:
    first = store.create_job(request_id="order-1", target="mail", thread_id=77)
    store.create_job(request_id="order-10", target="mail", thread_id=78)

    def found(term: str) -> set[str]:
        response = admin_client.get(JOBS, {"q": term})
        return {job.request_id for job in response.context["cl"].result_list}

    assert found(str(first.id)) == {"order-1"}
    assert found("order-1") == {"order-1"}  # exact, so not order-10
    assert found("77") == {"order-1"}
    assert found("nothing-like-it") == set()


def test_changelist_queries_do_not_grow_with_rows(admin_client: Client, store) -> None:
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert admin_client.get(JOBS).status_code == 200
        return len(captured)

    for n in range(5):
        store.create_job(request_id=f"few-{n}", target="mail")
    few = queries()
    for n in range(60):
        store.create_job(request_id=f"many-{n}", target=f"t{n % 7}", source="api")
    assert queries() == few


def test_changelist_and_filtered_changelist_use_few_queries(
    admin_client: Client, store, django_assert_max_num_queries: Any
) -> None:
    for n in range(8):
        failed_job(store, f"failed-{n}", target="reports")
    for n in range(80):
        store.create_job(request_id=f"job-{n}", target="mail")
    # Session, user, count, rows, filter choices.
    with django_assert_max_num_queries(6):
        assert admin_client.get(JOBS).status_code == 200
    with django_assert_max_num_queries(6):
        assert admin_client.get(f"{JOBS}?status__exact=error&lease=expired").status_code == 200


def test_a_view_only_user_sees_no_actions(django_user_model: Any, store) -> None:
    job = failed_job(store, "broken")
    viewer = logged_in(operator(django_user_model, "vera", "view_job"))
    listing = viewer.get(JOBS)
    assert listing.status_code == 200
    assert 'name="action"' not in listing.content.decode()
    page = viewer.get(f"{JOBS}{job.id}/change/").content.decode()
    assert "Requeue…" not in page and 'name="jobstate_action"' not in page
    assert 'name="_save"' not in page  # read-only


def test_a_user_sees_only_the_actions_they_may_run(django_user_model: Any, store) -> None:
    failed_job(store, "broken")
    client = logged_in(operator(django_user_model, "rita", "view_job", "requeue_job"))
    page = client.get(JOBS).content.decode()
    assert 'value="requeue_jobs"' in page
    assert 'value="reject_jobs"' not in page and 'value="approve_and_requeue_jobs"' not in page


@pytest.mark.parametrize(
    ("action", "permission_held"),
    [
        ("requeue_jobs", "reject_job"),
        ("reject_jobs", "requeue_job"),
        ("approve_and_requeue_jobs", "requeue_job"),
    ],
)
def test_posting_an_action_without_its_permission_changes_nothing(
    django_user_model: Any, store, action: str, permission_held: str
) -> None:
    broken = failed_job(store, "broken")
    waiting = store.create_job(request_id="waiting", target="mail")
    client = logged_in(operator(django_user_model, "mallory", "view_job", permission_held))
    before = AuditEntry.objects.count()
    response = act(client, JOBS, action, [broken.id, waiting.id], confirm=True, reason="x")
    assert response.status_code == 200
    assert Job.objects.get(id=broken.id).status == JobStatus.ERROR
    assert Job.objects.get(id=waiting.id).status == JobStatus.QUEUED
    assert AuditEntry.objects.count() == before
    assert not ApprovalDecision.objects.exists()


def test_history_rows_cannot_be_added_or_edited(admin_client: Client, store) -> None:
    job = store.create_job(request_id="r1", target="mail")
    assert admin_client.get(f"{JOBS}add/").status_code == 403
    response = admin_client.post(f"{JOBS}{job.id}/change/", {"status": "done"})
    assert response.status_code == 403
    assert Job.objects.get(id=job.id).status == JobStatus.QUEUED
    assert admin_client.post(f"{JOBS}{job.id}/delete/", {"post": "yes"}).status_code == 403


# --- requeue -------------------------------------------------------------------------


def test_requeue_confirmation_lists_eligible_and_skipped_jobs(
    django_user_model: Any, store
) -> None:
    broken = failed_job(store, "broken")
    lost = running_job(store, "lost", expired=True)
    live = running_job(store, "live", expired=False)
    waiting = store.create_job(request_id="waiting", target="mail")
    client = logged_in(operator(django_user_model, "rita", "view_job", "requeue_job"))
    response = act(client, JOBS, "requeue_jobs", [broken.id, lost.id, live.id, waiting.id])
    page = response.content.decode()
    assert response.status_code == 200
    assert "2 jobs will change" in page and "2 jobs will be skipped" in page
    eligible = page[page.index('id="jobstate-eligible"') : page.index('id="jobstate-skipped"')]
    assert ">broken<" in eligible and ">lost<" in eligible
    skipped = page[page.index('id="jobstate-skipped"') :]
    assert "already queued" in skipped and "lease has not expired" in skipped
    assert 'value="Yes, requeue"' in page and 'name="post" value="yes"' in page
    assert "csrfmiddlewaretoken" in page
    # Nothing changed yet.
    assert Job.objects.get(id=broken.id).status == JobStatus.ERROR
    assert Job.objects.get(id=lost.id).status == JobStatus.RUNNING


def test_requeue_moves_finished_and_expired_jobs_and_audits_the_operator(
    django_user_model: Any, store
) -> None:
    broken = failed_job(store, "broken")
    lost = running_job(store, "lost", expired=True)
    live = running_job(store, "live", expired=False)
    client = logged_in(operator(django_user_model, "rita", "view_job", "requeue_job"))
    response = act(client, JOBS, "requeue_jobs", [broken.id, lost.id, live.id], confirm=True)
    messages = shown_messages(response)
    assert "Requeued 2 jobs." in messages
    assert any("Skipped 1 job: live (Running and its lease has not expired)" in m for m in messages)
    for job in (broken, lost):
        refired = Job.objects.get(id=job.id)
        assert refired.status == JobStatus.QUEUED
        assert refired.claim_token is None and refired.error is None and refired.attempts == 0
        event, detail = audit_events(job)[-1]
        assert event == "rerun"
        assert detail["by"] == "rita" and detail["via"] == "admin"
    assert audit_events(lost)[-1][1]["prev_status"] == "running"
    kept = Job.objects.get(id=live.id)
    assert kept.status == JobStatus.RUNNING and kept.claim_token == live.claim_token


def test_a_job_that_changed_before_confirming_is_skipped_and_named(
    django_user_model: Any, store
) -> None:
    broken = failed_job(store, "broken")
    client = logged_in(operator(django_user_model, "rita", "view_job", "requeue_job"))
    assert "1 job will change" in act(client, JOBS, "requeue_jobs", [broken.id]).content.decode()
    # Someone else requeues it and a worker claims it before the operator confirms.
    store.requeue_job(broken.id, from_statuses=["error"], by="someone", via="api")
    store.claim_next_inhub_job(["mail"], "worker-2")
    response = act(client, JOBS, "requeue_jobs", [broken.id], confirm=True)
    assert any("broken (already" in m or "broken (Running" in m for m in shown_messages(response))
    assert Job.objects.get(id=broken.id).status == JobStatus.RUNNING
    assert [event for event, _ in audit_events(broken)].count("rerun") == 1


def test_a_selection_past_the_limit_is_refused_whole(
    admin_client: Client, store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("jobstate.admin.common.ACTION_ROW_LIMIT", 3)
    jobs = [failed_job(store, f"broken-{n}") for n in range(4)]
    response = act(admin_client, JOBS, "requeue_jobs", [job.id for job in jobs], confirm=True)
    assert any("Select at most 3 jobs" in m for m in shown_messages(response))
    assert Job.objects.filter(status=JobStatus.ERROR).count() == 4


def test_select_across_applies_to_every_row_of_the_filtered_list(
    admin_client: Client, store
) -> None:
    first = failed_job(store, "broken-1")
    failed_job(store, "broken-2")
    store.create_job(request_id="waiting", target="mail")
    page = admin_client.post(
        f"{JOBS}?status__exact=error",
        # The changelist posts the checked box of the page along with "select all".
        {
            "action": "requeue_jobs",
            "select_across": "1",
            "index": "0",
            "_selected_action": [str(first.id)],
        },
    ).content.decode()
    assert "2 jobs will change" in page and "waiting" not in page


def test_the_job_page_button_confirms_and_comes_back_to_the_job(
    django_user_model: Any, store
) -> None:
    broken = failed_job(store, "broken")
    client = logged_in(operator(django_user_model, "rita", "view_job", "requeue_job"))
    job_url = f"{JOBS}{broken.id}/change/"
    page = client.get(job_url).content.decode()
    assert "Requeue…" in page and "Reject…" not in page
    confirmation = confirm_page(client, JOBS, "requeue_jobs", [broken.id], _return_to=job_url)
    assert f'name="_return_to" value="{job_url}"' in confirmation.content.decode()
    done = act(client, JOBS, "requeue_jobs", [broken.id], confirm=True, _return_to=job_url)
    assert done.redirect_chain[-1][0] == job_url
    assert "Requeued 1 job." in shown_messages(done)
    assert "Rerun requested" in done.content.decode()  # the new audit entry, on the page


def test_return_to_elsewhere_is_ignored(admin_client: Client, store) -> None:
    broken = failed_job(store, "broken")
    done = act(
        admin_client,
        JOBS,
        "requeue_jobs",
        [broken.id],
        confirm=True,
        _return_to="https://evil.example/",
    )
    assert done.redirect_chain[-1][0] == JOBS


# --- reject ----------------------------------------------------------------------------


def test_reject_cancels_queued_jobs_with_the_reason_and_audits_the_operator(
    django_user_model: Any, store
) -> None:
    waiting = store.create_job(request_id="waiting", target="mail")
    broken = failed_job(store, "broken", target="reports")
    client = logged_in(operator(django_user_model, "rex", "view_job", "reject_job"))
    confirmation = act(client, JOBS, "reject_jobs", [waiting.id, broken.id]).content.decode()
    assert 'name="reason"' in confirmation and 'value="Yes, reject"' in confirmation
    response = act(
        client, JOBS, "reject_jobs", [waiting.id, broken.id], confirm=True, reason="duplicate order"
    )
    messages = shown_messages(response)
    assert "Rejected 1 job." in messages
    assert any("broken (not queued)" in m for m in messages)
    rejected = Job.objects.get(id=waiting.id)
    assert rejected.status == JobStatus.REJECTED and rejected.error == "duplicate order"
    event, detail = audit_events(waiting)[-1]
    assert event == "rejected"
    assert detail == {"by": "rex", "reason": "duplicate order", "prev_status": "queued"}
    assert Job.objects.get(id=broken.id).status == JobStatus.ERROR


def test_an_overlong_reason_is_refused_on_the_confirmation_page(
    admin_client: Client, store
) -> None:
    waiting = store.create_job(request_id="waiting", target="mail")
    response = act(admin_client, JOBS, "reject_jobs", [waiting.id], confirm=True, reason="x" * 2001)
    assert response.status_code == 200
    assert "errorlist" in response.content.decode()
    assert Job.objects.get(id=waiting.id).status == JobStatus.QUEUED


# --- approve ---------------------------------------------------------------------------


def test_approve_requeues_once_with_a_decision_naming_the_approver(
    django_user_model: Any, store
) -> None:
    broken = failed_job(store, "broken")
    client = logged_in(operator(django_user_model, "ada", "view_job", "approve_job"))
    response = act(
        client, JOBS, "approve_and_requeue_jobs", [broken.id], confirm=True, comment="checked"
    )
    assert "Approved and requeued 1 job." in shown_messages(response)
    assert Job.objects.get(id=broken.id).status == JobStatus.QUEUED
    decision = ApprovalDecision.objects.get(job_id=broken.id)
    assert decision.decision_id == f"admin:{broken.id}:1"
    assert (decision.approver, decision.comment) == ("ada", "checked")
    events = audit_events(broken)
    assert [event for event, _ in events[-2:]] == ["approved", "rerun"]
    assert events[-2][1]["approver"] == "ada" and events[-1][1]["by"] == "ada"
    # Confirming the same form again: the job is queued now, so nothing more happens.
    again = act(client, JOBS, "approve_and_requeue_jobs", [broken.id], confirm=True)
    assert any("broken (in flight" in m for m in shown_messages(again))
    assert ApprovalDecision.objects.filter(job_id=broken.id).count() == 1


def test_a_job_that_fails_again_can_be_approved_again(admin_client: Client, store) -> None:
    broken = failed_job(store, "broken")
    act(admin_client, JOBS, "approve_and_requeue_jobs", [broken.id], confirm=True)
    claimed = store.claim_next_inhub_job(["mail"], "worker-3")
    assert claimed is not None
    store.complete_claimed_job(claimed.id, claimed.claim_token, "error", error="again")
    act(admin_client, JOBS, "approve_and_requeue_jobs", [broken.id], confirm=True)
    ids = sorted(ApprovalDecision.objects.values_list("decision_id", flat=True))
    assert ids == [f"admin:{broken.id}:1", f"admin:{broken.id}:2"]
    assert Job.objects.get(id=broken.id).status == JobStatus.QUEUED


# --- the job page ----------------------------------------------------------------------


def test_the_job_page_shows_its_fields_with_json_pretty_redacted_and_folded(
    admin_client: Client, store, settings: Any
) -> None:
    settings.JOBSTATE = {"WEBHOOK_SECRET": "whsec-never-shown"}
    job = store.create_job(
        request_id="r1",
        target="mail",
        input={
            "to": "ops@example.com",
            "Password": "hunter2",
            "nested": [{"api_key": "k-123", "kept": "visible"}],
        },
        metadata={"route": "ops"},
    )
    job = store.update_job(
        job.id,
        result={"lines": [f"line {n}" for n in range(60)]},
        error="Traceback (most recent call last):\n  boom",
    )
    assert job is not None
    page = admin_client.get(f"{JOBS}{job.id}/change/").content.decode()
    assert '<pre class="jobstate-json">' in page
    assert "&quot;to&quot;: &quot;ops@example.com&quot;" in page  # indented JSON
    assert "hunter2" not in page and "k-123" not in page
    assert "&quot;Password&quot;: &quot;••••&quot;" in page and "visible" in page
    assert '<details class="jobstate-fold">' in page and "64 lines" in page  # folded result
    assert "<code>{&quot;lines&quot;: [&quot;line 0&quot;" in page  # its one-line preview
    assert "Traceback" in page
    assert "whsec-never-shown" not in page
    assert "<h1>r1</h1>" in page  # a job's page is titled by its request id
    for label in ("Metadata", "Input preview" if job.input_preview else "Input"):
        assert f"{label}:</label>" in page or f">{label}<" in page, label
    # A queued job was never claimed and reported nothing: those fields are left out.
    for label in ("Claim token", "Lease until", "Usage", "Report", "Callback URL", "Session"):
        assert f"{label}:</label>" not in page, label


def test_redacted_keys_come_from_the_setting(admin_client: Client, store, settings: Any) -> None:
    settings.JOBSTATE = {"ADMIN_REDACTED_KEYS": ["customer"]}
    job = store.create_job(
        request_id="r1", target="mail", input={"customer": "Jane", "password": "p"}
    )
    page = admin_client.get(f"{JOBS}{job.id}/change/").content.decode()
    assert "Jane" not in page and "&quot;password&quot;: &quot;p&quot;" in page


def test_a_malformed_redaction_setting_fails_loudly(
    admin_client: Client, store, settings: Any
) -> None:
    settings.JOBSTATE = {"ADMIN_REDACTED_KEYS": "password"}
    job = store.create_job(request_id="r1", target="mail", input={"password": "p"})
    with pytest.raises(ImproperlyConfigured, match="ADMIN_REDACTED_KEYS"):
        admin_client.get(f"{JOBS}{job.id}/change/")


def test_the_job_page_shows_the_audit_trail_and_notifications_with_attempts(
    admin_client: Client, store
) -> None:
    broken = failed_job(store, "broken")
    store.append_audit(job=broken, event="tool_result", summary="looked up the order")
    notification = NotificationFactory(
        dead=True,
        job=broken,
        channel="webhook",
        destination="https://hooks.example/x",
        payload={"status": "error", "token": "t-secret"},
        idempotency_key="k1",
        attempts=2,
        last_error="HTTP 503",
    )
    now = datetime.now(UTC)
    for number in (1, 2):
        DeliveryAttempt.objects.create(
            notification=notification,
            number=number,
            relay_id="relay-1",
            started_at=now,
            succeeded=False,
            error=f"HTTP 503 #{number}",
        )
    page = admin_client.get(f"{JOBS}{broken.id}/change/").content.decode()
    trail = page[
        page.index('id="jobstate-audit-trail"') : page.index('id="jobstate-notifications"')
    ]
    assert "looked up the order" in trail and "tool_result" in trail
    notifications = page[page.index('id="jobstate-notifications"') :]
    assert "https://hooks.example/x" in notifications and "Dead letter" in notifications
    assert "Attempt 1" in notifications and "HTTP 503 #2" in notifications
    assert "t-secret" not in page


def test_a_missing_job_page_redirects_with_a_message(admin_client: Client, db: None) -> None:
    response = admin_client.get(f"{JOBS}{uuid.uuid4()}/change/", follow=True)
    assert response.status_code == 200
    assert any("Perhaps it was deleted?" in m for m in shown_messages(response))


# --- counts at scale ---------------------------------------------------------------------


def test_a_short_list_is_counted_exactly(admin_client: Client, store) -> None:
    for n in range(3):
        store.create_job(request_id=f"r{n}", target="mail")
    response = admin_client.get(JOBS)
    assert response.context["cl"].paginator.count_kind is CountKind.EXACT
    assert "3 jobs" in response.content.decode()


@pytest.mark.postgres
def test_postgresql_estimates_unfiltered_and_caps_filtered_counts(
    admin_client: Client, store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(EstimatedCountPaginator, "count_cap", 5)
    for n in range(20):
        store.create_job(request_id=f"r{n}", target="mail", status="done" if n < 8 else "queued")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")

    with CaptureQueriesContext(connection) as unfiltered_queries:
        unfiltered = admin_client.get(JOBS)
    assert unfiltered.context["cl"].paginator.count_kind is CountKind.ESTIMATE
    assert "about 20 jobs" in unfiltered.content.decode()
    sql = [query["sql"] for query in unfiltered_queries.captured_queries]
    assert any("reltuples" in s for s in sql)
    assert not any("COUNT(" in s and "jobstate_job" in s for s in sql)

    with CaptureQueriesContext(connection) as filtered_queries:
        filtered = admin_client.get(f"{JOBS}?status__exact=done")
    assert filtered.context["cl"].paginator.count_kind is CountKind.AT_LEAST
    assert "more than 5 jobs" in filtered.content.decode()
    counts = [q["sql"] for q in filtered_queries.captured_queries if "COUNT(" in q["sql"]]
    assert counts and all("LIMIT 6" in s for s in counts)

    small = admin_client.get(f"{JOBS}?status__exact=done&target=nowhere")
    assert small.context["cl"].paginator.count_kind is CountKind.EXACT


@pytest.mark.postgres
def test_a_page_past_the_end_of_an_estimated_list_is_named_not_shown_empty(
    admin_client: Client, store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planner's estimate promised four pages of five jobs after fifteen of twenty
    were deleted; page 2 showed an empty list saying "No jobs. A job appears here when
    the application enqueues one"."""
    monkeypatch.setattr(EstimatedCountPaginator, "count_cap", 5)
    monkeypatch.setattr(admin.site._registry[Job], "list_per_page", 5)
    for n in range(20):
        store.create_job(request_id=f"r{n}", target="mail")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE jobstate_job")
    Job.objects.filter(request_id__in=[f"r{n}" for n in range(5, 20)]).delete()
    first = admin_client.get(JOBS)
    assert first.context["cl"].paginator.count_kind is CountKind.ESTIMATE
    assert len(first.context["cl"].result_list) == 5

    past = admin_client.get(f"{JOBS}?p=2", follow=True)
    [message] = shown_messages(past)
    assert "p=2. That page contains no results." in message, message
    assert past.request["QUERY_STRING"] == "e=1"
    assert len(past.context["cl"].result_list) == 5
    assert "No jobs." not in past.content.decode()


# --- the store methods behind reject and expired-lease requeue ------------------------


def test_reject_queued_job_moves_only_a_queued_job(any_store: StateStore) -> None:
    waiting = any_store.create_job(request_id="waiting", target="mail")
    rejected = any_store.reject_queued_job(waiting.id, by="rex", reason="spam")
    assert rejected is not None and rejected.status == JobStatus.REJECTED
    assert rejected.error == "spam"
    assert any_store.reject_queued_job(waiting.id, by="rex") is None  # already rejected
    entries = any_store.list_audit(job=waiting)
    assert [(e.event, e.detail["by"]) for e in entries] == [("rejected", "rex")]
    claimed = any_store.create_job(request_id="claimed", target="llm")
    any_store.claim_next_inhub_job(["llm"], "w")
    assert any_store.reject_queued_job(claimed.id, by="rex") is None
    assert any_store.get_job(claimed.id).status == JobStatus.RUNNING  # type: ignore[union-attr]


def test_reject_without_reason_names_the_operator(any_store: StateStore) -> None:
    waiting = any_store.create_job(request_id="waiting", target="mail")
    rejected = any_store.reject_queued_job(waiting.id, by="rex")
    assert rejected is not None and rejected.error == "rejected by rex"


@pytest.mark.parametrize(
    ("by", "reason"), [("", "x"), ("rex", "x" * 2001), ("rex", "nul\x00"), ("rex", 3)]
)
def test_bad_reject_arguments_raise_and_write_nothing(
    any_store: StateStore, by: str, reason: Any
) -> None:
    waiting = any_store.create_job(request_id="waiting", target="mail")
    with pytest.raises(InvalidJobState):
        any_store.reject_queued_job(waiting.id, by=by, reason=reason)
    assert any_store.get_job(waiting.id).status == JobStatus.QUEUED  # type: ignore[union-attr]
    assert any_store.list_audit(job=waiting) == []


def test_requeue_expired_lease_job_needs_an_expired_lease(any_store: StateStore) -> None:
    live = running_job(any_store, "live", expired=False)
    assert any_store.requeue_expired_lease_job(live.id, by="rita", via="admin") is None
    assert any_store.get_job(live.id).status == JobStatus.RUNNING  # type: ignore[union-attr]
    any_store.update_job(live.id, lease_until=PAST)
    refired = any_store.requeue_expired_lease_job(live.id, by="rita", via="admin")
    assert refired is not None and refired.status == JobStatus.QUEUED
    assert refired.claim_token is None and refired.executor_id is None
    (entry,) = any_store.list_audit(job=live)
    assert entry.event == "rerun"
    assert entry.detail == {"by": "rita", "via": "admin", "prev_status": "running"}
    # A finished job has no lease to expire.
    broken = failed_job(any_store, "broken", target="mail")
    assert any_store.requeue_expired_lease_job(broken.id, by="rita", via="admin") is None


# --- races between operators (real PostgreSQL connections) ----------------------------


@pytest.mark.concurrent
@pytest.mark.mysql
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("action", ["requeue_jobs", "approve_and_requeue_jobs"])
def test_two_operators_confirming_at_once_requeue_once(django_user_model: Any, action: str) -> None:
    store = DatabaseStateStore()
    broken = failed_job(store, "broken")
    users = [
        operator(django_user_model, f"op{n}", "view_job", "requeue_job", "approve_job")
        for n in range(2)
    ]

    def confirm(index: int) -> int:
        # The test client's captured template context is process-wide, so the outcome
        # is read from the database, not from each response's messages.
        return act(logged_in(users[index]), JOBS, action, [broken.id], confirm=True).status_code

    assert in_parallel(2, confirm) == [200, 200]
    reruns = [detail for event, detail in audit_events(broken) if event == "rerun"]
    assert len(reruns) == 1 and reruns[0]["by"] in {"op0", "op1"}
    assert ApprovalDecision.objects.count() == (1 if action != "requeue_jobs" else 0)
    assert Job.objects.get(id=broken.id).status == JobStatus.QUEUED
