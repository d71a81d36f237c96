"""Who may run the bulk actions over a filter of the jobs list (the views listed as
``BULK_VIEWS`` in the security inventory): a staff user with view permissions only, or
with every permission but the action's own, can neither start, step nor stop one; a
user with it runs it and the audit entries name them; CSRF is enforced; outsiders are
sent to log in."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from jobstate.console.bulk import start_bulk_operation
from jobstate.models import AuditEntry, BulkOperation, Job
from jobstate.stores.base import JobStatus
from tests.support.admin_kit import logged_in
from tests.support.security_kit import (
    OPERATOR,
    _failed_job,
    _job_status,
    _queued_job,
    changelist_url,
    csrf_client,
    jobstate_permissions,
    snapshot,
    staff,
    view_permission,
)

pytestmark = pytest.mark.django_db


BULK = "/admin/jobstate/job/bulk/"

#: Each bulk action, the permission it needs and a job it applies to.
BULK_CASES = [
    ("requeue", "requeue_job", _failed_job, lambda pk: _job_status(pk) == JobStatus.QUEUED),
    ("reject", "reject_job", _queued_job, lambda pk: _job_status(pk) == JobStatus.REJECTED),
    (
        "delete",
        "delete_finished_job",
        _failed_job,
        lambda pk: not Job.objects.filter(pk=pk).exists(),
    ),
]


def _bulk_progress(pk: int) -> str:
    return f"/admin/jobstate/job/bulk-operation/{pk}/"


@pytest.mark.parametrize("holds", ["view only", "every other permission"])
@pytest.mark.parametrize(("action", "codename", "make", "changed"), BULK_CASES)
def test_without_its_permission_a_bulk_action_is_neither_offered_nor_run(
    django_user_model: Any, holds: str, action: str, codename: str, make: Any, changed: Any
) -> None:
    pk = make()
    if holds == "view only":
        granted = [view_permission(Job), view_permission(BulkOperation)]
    else:
        granted = list(jobstate_permissions().exclude(codename=codename))
    client = logged_in(staff(django_user_model, "mallory", granted))
    assert f'href="{BULK}{action}/' not in client.get(changelist_url(Job)).content.decode()
    before = snapshot()
    assert client.get(f"{BULK}{action}/").status_code == 403
    assert client.post(f"{BULK}{action}/", {"_filter": ""}).status_code == 403
    assert not BulkOperation.objects.exists()
    # An operation started by someone who may: this user can watch it, not run or stop it.
    operation = start_bulk_operation(action=action, filters={}, search="", operator="boss")
    before = snapshot()
    progress = client.get(_bulk_progress(operation.pk))
    assert progress.status_code == 200
    assert 'name="step"' not in progress.content.decode()
    for data in ({"step": "1"}, {"stop": "1"}):
        assert client.post(_bulk_progress(operation.pk), data).status_code == 403
    operation.refresh_from_db()
    assert operation.state == "running" and operation.processed == 0
    assert not changed(pk)
    assert snapshot() == before


@pytest.mark.parametrize(("action", "codename", "make", "changed"), BULK_CASES)
def test_with_its_permission_a_bulk_action_runs_and_is_audited_with_the_user(
    django_user_model: Any, action: str, codename: str, make: Any, changed: Any
) -> None:
    pk = make()
    granted = [view_permission(Job), jobstate_permissions().get(codename=codename)]
    client = logged_in(staff(django_user_model, OPERATOR, granted))
    assert f'href="{BULK}{action}/' in client.get(changelist_url(Job)).content.decode()
    assert client.post(f"{BULK}{action}/", {"_filter": ""}).status_code == 302
    operation = BulkOperation.objects.get()
    assert client.post(_bulk_progress(operation.pk), {"step": "1"}).status_code == 302
    assert changed(pk)
    event = {"requeue": "rerun", "reject": "rejected", "delete": "deleted"}[action]
    assert [entry.detail["by"] for entry in AuditEntry.objects.filter(event=event)] == [OPERATOR]


def test_a_bulk_action_posted_without_a_csrf_token_is_refused(django_user_model: Any) -> None:
    pk = _failed_job()
    user = staff(django_user_model, OPERATOR, list(jobstate_permissions()))
    client = csrf_client(user)
    assert client.post(f"{BULK}requeue/", {"_filter": ""}).status_code == 403
    operation = start_bulk_operation(action="requeue", filters={}, search="", operator="boss")
    assert client.post(_bulk_progress(operation.pk), {"step": "1"}).status_code == 403
    assert _job_status(pk) == JobStatus.ERROR
    assert BulkOperation.objects.get().processed == 0


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
def test_outsiders_are_sent_to_log_in_from_the_bulk_views(
    outsiders: dict[str, Client], who: str
) -> None:
    pk = _failed_job()
    operation = start_bulk_operation(action="requeue", filters={}, search="", operator="boss")
    client = outsiders[who]
    for response in (
        client.get(f"{BULK}requeue/"),
        client.post(f"{BULK}requeue/", {"_filter": ""}),
        client.post(_bulk_progress(operation.pk), {"step": "1"}),
    ):
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")
    assert _job_status(pk) == JobStatus.ERROR
    assert BulkOperation.objects.get().processed == 0


@pytest.mark.parametrize(("action", "codename", "make", "changed"), BULK_CASES)
def test_the_action_permission_without_the_view_permission_runs_no_bulk_action(
    django_user_model: Any, action: str, codename: str, make: Any, changed: Any
) -> None:
    # The confirmation counts the jobs matching any search (an oracle over the jobs'
    # inputs) and its operation then acts on them: both need the jobs' view permission too.
    pk = make()
    client = logged_in(
        staff(django_user_model, "mallory", [jobstate_permissions().get(codename=codename)])
    )
    before = snapshot()
    assert client.get(f"{BULK}{action}/", {"q": "input:customer=42"}).status_code == 403
    assert client.post(f"{BULK}{action}/", {"_filter": ""}).status_code == 403
    assert not BulkOperation.objects.exists()
    operation = start_bulk_operation(action=action, filters={}, search="", operator="boss")
    before = snapshot()
    assert client.get(_bulk_progress(operation.pk)).status_code == 403
    for data in ({"step": "1"}, {"stop": "1"}):
        response = client.post(
            _bulk_progress(operation.pk), data, headers={"Accept": "application/json"}
        )
        assert response.status_code == 403
    operation.refresh_from_db()
    assert operation.state == "running" and operation.processed == 0
    assert not changed(pk)
    assert snapshot() == before
