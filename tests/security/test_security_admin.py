"""Who may change what through the admin.

Every state-changing action is found on the registered admin classes, not listed by
hand: a new action (or a custom URL, or an editable form) without a case here fails
``test_every_action_and_custom_view_has_a_case``. For each action:

- a staff user with the view permission but without the action's permission sees it
  neither in the action menu nor as a button on the row's page, and a POST of it
  (with a valid CSRF token: the test client skips the check) is refused with a
  message, changes nothing and writes no audit entry;
- a user with the permission runs it, and the audit entry names the user;
- a POST without a CSRF token is refused with 403, while the token the pages carry
  works;
- anonymous and non-staff users are sent to the login page.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.apps import apps
from django.contrib import admin
from django.contrib.admin.utils import quote
from django.db.models import Model
from django.test import Client, RequestFactory

from jobstate.models import (
    AuditEntry,
    Job,
    JobRun,
    Notification,
    QueuePause,
    RuntimeLock,
    Schedule,
    ScheduleOccurrence,
)
from jobstate.schedules.definitions import parse_declaration
from jobstate.stores.base import JobRunStatus, JobStatus, NotificationState
from jobstate.stores.database import DatabaseJobRunStore, DatabaseStateStore
from tests.support.admin_kit import (
    act,
    dead_letter,
    logged_in,
    run,
    running_job,
    seen_fields,
    task_job,
)
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

OVERVIEW = "/admin/jobstate/job/overview/"


def change_url(model: type[Model], pk: str) -> str:
    return f"{changelist_url(model)}{quote(pk)}/change/"


# --- the actions and what each one changes -----------------------------------------------


def _stale_run() -> str:
    return run(DatabaseJobRunStore(), "stale-key", stale=True)


def _held_lock() -> str:
    DatabaseStateStore().acquire_runtime_lock("serial:1", "worker-1", timedelta(minutes=5))
    return "serial:1"


def _dead_letter() -> str:
    return str(dead_letter().id)


def _schedule(*, paused: bool = False) -> str:
    definition = parse_declaration(
        "nightly",
        {"task": "tests.support.task_functions.add", "cron": "30 2 * * *", "args": [1, 1]},
    )
    row = Schedule.objects.create(
        key=definition.key,
        kind=definition.kind,
        target=definition.target,
        cron=definition.cron,
        timezone=definition.timezone,
        catch_up=definition.catch_up,
        definition=definition.as_json(),
        effective_from=definition.slots().next_after(datetime.now(UTC)),
        paused=paused,
    )
    return str(row.pk)


@dataclass(frozen=True)
class ActionCase:
    model: type[Model]
    action: str
    codename: str
    make: Callable[[], str]
    """Creates a row the action applies to; returns its primary key."""
    changed: Callable[[str], bool]
    """Whether the action has been applied to that row."""
    event: str
    """The audit entry the action writes..."""
    names_user: str
    """...and the detail member that names the operator."""
    button: bool = False
    """The row's own page offers the action as a button."""


CASES = [
    ActionCase(
        Job,
        "requeue_jobs",
        "requeue_job",
        _failed_job,
        lambda pk: _job_status(pk) == JobStatus.QUEUED,
        "rerun",
        "by",
        button=True,
    ),
    ActionCase(
        Job,
        "reject_jobs",
        "reject_job",
        _queued_job,
        lambda pk: _job_status(pk) == JobStatus.REJECTED,
        "rejected",
        "by",
        button=True,
    ),
    ActionCase(
        Job,
        "cancel_jobs",
        "cancel_job",
        lambda: str(running_job(DatabaseStateStore(), "running", expired=False).pk),
        lambda pk: _job_status(pk) == JobStatus.REJECTED,
        "cancelled",
        "by",
        button=True,
    ),
    ActionCase(
        Job,
        "retry_now_jobs",
        "retry_job_now",
        lambda: str(task_job(DatabaseStateStore(), failed_once=True).pk),
        lambda pk: Job.objects.get(pk=pk).run_after is None,
        "retry_now",
        "by",
        button=True,
    ),
    ActionCase(
        Job,
        "discard_jobs",
        "discard_job",
        lambda: str(task_job(DatabaseStateStore(), failed_once=False).pk),
        lambda pk: _job_status(pk) == JobStatus.ERROR,
        "discarded",
        "by",
        button=True,
    ),
    ActionCase(
        Job,
        "approve_and_requeue_jobs",
        "approve_job",
        _failed_job,
        lambda pk: _job_status(pk) == JobStatus.QUEUED,
        "approved",
        "approver",
        button=True,
    ),
    ActionCase(
        JobRun,
        "reap_stale_runs",
        "reap_runs",
        _stale_run,
        lambda pk: JobRun.objects.get(pk=pk).status == JobRunStatus.TIMED_OUT,
        "run_reaped",
        "by",
    ),
    ActionCase(
        RuntimeLock,
        "force_release_locks",
        "force_release_lock",
        _held_lock,
        lambda pk: not RuntimeLock.objects.filter(pk=pk).exists(),
        "lock_force_released",
        "by",
    ),
    ActionCase(
        Notification,
        "replay_dead_letters",
        "replay_notification",
        _dead_letter,
        lambda pk: Notification.objects.get(pk=pk).state == NotificationState.PENDING,
        "dlq_resend_ok",
        "requested_by",
    ),
    ActionCase(
        Schedule,
        "run_schedules_now",
        "run_schedule",
        _schedule,
        lambda pk: ScheduleOccurrence.objects.filter(schedule_id=pk, trigger="manual").exists(),
        "schedule_run_now",
        "by",
        button=True,
    ),
    ActionCase(
        Schedule,
        "pause_schedules",
        "pause_schedule",
        _schedule,
        lambda pk: Schedule.objects.get(pk=pk).paused,
        "schedule_paused",
        "by",
        button=True,
    ),
    ActionCase(
        Schedule,
        "resume_schedules",
        "pause_schedule",
        lambda: _schedule(paused=True),
        lambda pk: not Schedule.objects.get(pk=pk).paused,
        "schedule_resumed",
        "by",
        button=True,
    ),
]
CASE_IDS = [case.action for case in CASES]

#: Custom admin URLs (besides the standard list, add, change, delete and history) and
#: why they need no action permission: they change nothing.
READ_ONLY_VIEWS = {"jobstate_dashboard": OVERVIEW}

#: Custom admin URLs that change state: the queue pause and resume pages (a
#: confirmation page on GET, the change on its POST), each behind ``pause_queue``.
PAUSE = "/admin/jobstate/queuepause/pause/"
RESUME = "/admin/jobstate/queuepause/resume/"
ACTION_VIEWS = {"jobstate_queue_pause": PAUSE, "jobstate_queue_resume": RESUME}

#: The console's pages without an action of their own to guard, which a read-only user
#: must see.
CONSOLE_PAGES = {
    "overview": OVERVIEW,
    "workers": "/admin/jobstate/worker/",
    "queues": "/admin/jobstate/queuepause/",
}
#: Custom admin URLs that find a worker by id or a schedule by key and redirect to its
#: page (what the console's links point at): read-only, behind the view permission.
FIND_VIEWS = {
    "jobstate_worker_find": "/admin/jobstate/worker/find/?id=w-1",
    "jobstate_schedule_find": "/admin/jobstate/schedule/find/?key=nightly",
}
#: Custom admin URLs that run the bulk actions over a filter; each checks the action's
#: own permission (tests/security/test_security_bulk.py).
BULK_VIEWS = {"jobstate_job_bulk", "jobstate_job_bulk_progress"}


def jobstate_admins() -> list[tuple[type[Model], admin.ModelAdmin[Any]]]:
    models = apps.get_app_config("jobstate").get_models()
    return [
        (model, admin.site.get_model_admin(model))
        for model in models
        if admin.site.is_registered(model)
    ]


def superuser_request(django_user_model: Any) -> Any:
    request = RequestFactory().get("/admin/")
    request.user = django_user_model.objects.create_superuser("root", "root@example.com", None)
    return request


def offered(page: str, action: str) -> bool:
    """Whether a page offers ``action``: in the action menu or as a button."""
    return f'value="{action}"' in page


# --- the inventory -----------------------------------------------------------------------


def test_every_action_and_custom_view_has_a_case(django_user_model: Any) -> None:
    request = superuser_request(django_user_model)
    found_actions = set()
    found_views = set()
    standard = {"changelist", "add", "change", "delete", "history"}
    for model, model_admin in jobstate_admins():
        for name, action in model_admin.get_actions(request).items():
            found_actions.add((model, name))
            # An Action object from Django 6.1 on, a (func, name, label) tuple before.
            func = action.func if hasattr(action, "func") else action[0]
            # Each action declares its own permission; none is left to the view right.
            assert getattr(func, "allowed_permissions", ()), f"{name} declares no permission"
        for pattern in model_admin.get_urls():
            url_name = getattr(pattern, "name", None)
            prefix = f"jobstate_{model._meta.model_name}_"
            if url_name and not (
                url_name.startswith(prefix) and url_name.removeprefix(prefix) in standard
            ):
                found_views.add(url_name)
    assert found_actions == {(case.model, case.action) for case in CASES}
    assert found_views == set(READ_ONLY_VIEWS) | set(ACTION_VIEWS) | BULK_VIEWS | set(FIND_VIEWS)


def test_no_admin_adds_edits_or_deletes(django_user_model: Any) -> None:
    """State moves only through the actions: even a superuser gets no editable form."""
    request = superuser_request(django_user_model)
    for _model, model_admin in jobstate_admins():
        assert not model_admin.has_add_permission(request)
        assert not model_admin.has_change_permission(request)
        assert not model_admin.has_delete_permission(request)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_forms_posted_to_add_change_and_delete_are_refused(admin_client: Client, case) -> None:
    pk = case.make()
    before = (snapshot(), case.changed(pk), case.model._default_manager.count())
    assert admin_client.post(f"{changelist_url(case.model)}add/", {}).status_code == 403
    assert admin_client.post(change_url(case.model, pk), {}).status_code == 403
    delete = f"{changelist_url(case.model)}{pk}/delete/"
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert (snapshot(), case.changed(pk), case.model._default_manager.count()) == before


# --- without the permission ---------------------------------------------------------------


@pytest.mark.parametrize("holds", ["view only", "every other permission"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_without_its_permission_an_action_is_neither_offered_nor_run(
    django_user_model: Any, case: ActionCase, holds: str
) -> None:
    pk = case.make()
    if holds == "view only":
        granted = [view_permission(case.model)]
    else:
        # Including the model's add/change/delete rights: none of them grants an action.
        granted = list(jobstate_permissions().exclude(codename=case.codename))
    client = logged_in(staff(django_user_model, "mallory", granted))
    url = changelist_url(case.model)

    listing = client.get(url)
    assert listing.status_code == 200
    assert not offered(listing.content.decode(), case.action)
    page = client.get(change_url(case.model, pk))
    assert page.status_code == 200
    assert not offered(page.content.decode(), case.action)

    before = snapshot()
    # Both steps, posted directly: the confirmation page and the confirmed action.
    for confirm in (False, True):
        response = act(client, url, case.action, [pk], confirm=confirm, reason="x", comment="y")
        assert response.status_code == 200
        messages = [str(message) for message in response.context["messages"]]
        assert messages == [f"You may not run the action “{case.action}”; nothing was changed."]
        assert response.redirect_chain[-1][0] == url
    assert not case.changed(pk)
    assert snapshot() == before


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_refused_post_is_logged_with_the_user(
    django_user_model: Any, case: ActionCase, caplog: pytest.LogCaptureFixture
) -> None:
    pk = case.make()
    client = logged_in(staff(django_user_model, "mallory", [view_permission(case.model)]))
    with caplog.at_level("WARNING", logger="jobstate.admin"):
        act(client, changelist_url(case.model), case.action, [pk], confirm=True)
    assert f"mallory posted the action '{case.action}'" in caplog.text


def test_an_action_of_another_model_or_an_unknown_one_is_refused(
    django_user_model: Any,
) -> None:
    pk = _failed_job()
    everything = list(jobstate_permissions())
    client = logged_in(staff(django_user_model, "mallory", everything))
    before = snapshot()
    for action in ("replay_dead_letters", "delete_selected", "no_such_action"):
        response = act(client, changelist_url(Job), action, [pk], confirm=True)
        messages = [str(message) for message in response.context["messages"]]
        assert messages == [f"You may not run the action “{action}”; nothing was changed."]
    assert Job.objects.filter(pk=pk).exists() and _job_status(pk) == JobStatus.ERROR
    assert snapshot() == before


def test_a_refused_action_posted_to_a_list_with_a_huge_query_returns_to_the_bare_list(
    django_user_model: Any,
) -> None:
    # The refusal sends the user back to the list as it was filtered; a query longer
    # than any redirect Django allows is dropped rather than answered with an error.
    pk = _failed_job()
    client = logged_in(staff(django_user_model, "mallory", list(jobstate_permissions())))
    url = changelist_url(Job)
    response = act(client, f"{url}?q={'A' * 20_000}", "no_such_action", [pk], confirm=True)
    assert response.status_code == 200
    assert response.redirect_chain[-1][0] == url
    messages = [str(message) for message in response.context["messages"]]
    assert messages == ["You may not run the action “no_such_action”; nothing was changed."]
    assert _job_status(pk) == JobStatus.ERROR


# --- with the permission ------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_with_its_permission_an_action_runs_and_is_audited_with_the_user(
    django_user_model: Any, case: ActionCase
) -> None:
    pk = case.make()
    granted = [view_permission(case.model), jobstate_permissions().get(codename=case.codename)]
    client = logged_in(staff(django_user_model, OPERATOR, granted))
    url = changelist_url(case.model)
    assert offered(client.get(url).content.decode(), case.action)
    page = client.get(change_url(case.model, pk)).content.decode()
    assert offered(page, case.action) is case.button

    confirmation = act(client, url, case.action, [pk])
    assert confirmation.status_code == 200 and 'name="post" value="yes"' in (
        confirmation.content.decode()
    )
    assert not case.changed(pk)
    shown = seen_fields(confirmation.content.decode())
    done = act(client, url, case.action, [pk], confirm=True, **shown)
    assert done.status_code == 200
    assert case.changed(pk)
    entries = AuditEntry.objects.filter(event=case.event)
    assert [entry.detail[case.names_user] for entry in entries] == [OPERATOR]


# --- CSRF ---------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_an_action_posted_without_a_csrf_token_is_refused(
    admin_user: Any, case: ActionCase
) -> None:
    pk = case.make()
    client = csrf_client(admin_user)
    url = changelist_url(case.model)
    token = page_token(client, url)  # the session now has its CSRF cookie
    before = snapshot()
    for confirm in (False, True):
        response = act(client, url, case.action, [pk], confirm=confirm)
        assert response.status_code == 403
        assert b"CSRF" in response.content
    forged = "x" * len(token)
    response = act(client, url, case.action, [pk], confirm=True, csrfmiddlewaretoken=forged)
    assert response.status_code == 403
    assert not case.changed(pk)
    assert snapshot() == before


def form_token(page: str) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert found is not None, "the page carries no CSRF token"
    return found.group(1)


def page_token(client: Client, url: str) -> str:
    return form_token(client.get(url).content.decode())


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_the_token_the_pages_carry_lets_the_action_through(
    admin_user: Any, case: ActionCase
) -> None:
    pk = case.make()
    client = csrf_client(admin_user)
    url = changelist_url(case.model)
    token = page_token(client, url)
    confirmation = act(client, url, case.action, [pk], csrfmiddlewaretoken=token)
    assert confirmation.status_code == 200
    page = confirmation.content.decode()
    token = form_token(page)
    act(
        client, url, case.action, [pk], confirm=True, csrfmiddlewaretoken=token, **seen_fields(page)
    )
    assert case.changed(pk)


# --- who may open the console at all ------------------------------------------------------


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_outsiders_are_sent_to_log_in_and_change_nothing(
    outsiders: dict[str, Client], who: str, case: ActionCase
) -> None:
    pk = case.make()
    client = outsiders[who]
    before = snapshot()
    url = changelist_url(case.model)
    for response in (
        client.get(url),
        client.get(change_url(case.model, pk)),
        client.post(url, {"action": case.action, "_selected_action": [pk], "post": "yes"}),
    ):
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")
    assert not case.changed(pk)
    assert snapshot() == before


@pytest.mark.parametrize("who", ["anonymous", "not staff"])
def test_outsiders_are_sent_to_log_in_from_the_custom_views(
    outsiders: dict[str, Client], who: str
) -> None:
    for url in [
        *READ_ONLY_VIEWS.values(),
        *ACTION_VIEWS.values(),
        *CONSOLE_PAGES.values(),
        *FIND_VIEWS.values(),
    ]:
        response = outsiders[who].get(url, {"target": "billing"})
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/?next=")
    for url in ACTION_VIEWS.values():
        response = outsiders[who].post(url, {"target": "billing", "post": "yes"})
        assert response.status_code == 302
    assert not QueuePause.objects.exists()
    assert not AuditEntry.objects.exists()


# --- the custom views -----------------------------------------------------------------


def test_the_overview_page_takes_no_post(admin_client: Client) -> None:
    pk = _failed_job()
    before = snapshot()
    for url in READ_ONLY_VIEWS.values():
        assert admin_client.get(url).status_code == 200
        response = admin_client.post(url, {"action": "requeue_jobs", "_selected_action": [pk]})
        assert response.status_code == 405
    assert _job_status(pk) == JobStatus.ERROR
    assert snapshot() == before


def test_the_find_pages_redirect_on_get_take_no_post_and_need_the_view_permission(
    admin_client: Client, django_user_model: Any
) -> None:
    before = snapshot()
    for url in FIND_VIEWS.values():
        assert admin_client.get(url).status_code == 302
        assert admin_client.post(url, {"id": "w-1", "key": "nightly"}).status_code == 405
    assert snapshot() == before
    bare = Client()
    bare.force_login(staff(django_user_model, "bare", []))
    for url in FIND_VIEWS.values():
        assert bare.get(url).status_code == 403


# --- the fleet pages: workers, queues, pause and resume ---------------------------------


def read_only_staff(django_user_model: Any) -> Client:
    """A staff user with every jobstate view permission and nothing else."""
    user = staff(
        django_user_model,
        "vera.viewer",
        list(jobstate_permissions().filter(codename__startswith="view_")),
    )
    return logged_in(user)


def test_a_read_only_user_sees_every_console_page_and_runs_no_queue_action(
    django_user_model: Any,
) -> None:
    store = DatabaseStateStore()
    store.create_job(request_id="waiting", target="billing")
    store.pause_queue(target="reports", by="olga")
    client = read_only_staff(django_user_model)
    for name, url in CONSOLE_PAGES.items():
        response = client.get(url)
        assert response.status_code == 200, name
    queues = client.get(CONSOLE_PAGES["queues"]).content.decode()
    assert "billing" in queues and "reports" in queues
    assert "Pause…" not in queues and "Resume…" not in queues
    before = (snapshot(), list(QueuePause.objects.values_list("target", flat=True)))
    for url, target in ((PAUSE, "billing"), (RESUME, "reports")):
        assert client.get(url, {"target": target}).status_code == 403
        response = client.post(url, {"target": target, "queue": "", "post": "yes"})
        assert response.status_code == 403
    assert (snapshot(), list(QueuePause.objects.values_list("target", flat=True))) == before


def test_a_refused_queue_action_is_logged_with_the_user(
    django_user_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    client = read_only_staff(django_user_model)
    with caplog.at_level("WARNING", logger="jobstate.admin"):
        client.post(PAUSE, {"target": "billing", "post": "yes"})
    assert "vera.viewer asked to pause a queue without the pause_queue permission" in caplog.text


def test_with_the_pause_permission_a_queue_is_paused_and_audited_with_the_user(
    django_user_model: Any,
) -> None:
    user = staff(
        django_user_model,
        OPERATOR,
        [view_permission(QueuePause), jobstate_permissions().get(codename="pause_queue")],
    )
    client = logged_in(user)
    client.post(PAUSE, {"target": "billing", "queue": "", "post": "yes"})
    assert QueuePause.objects.get().target == "billing"
    client.post(RESUME, {"target": "billing", "queue": "", "post": "yes"})
    assert not QueuePause.objects.exists()
    entries = AuditEntry.objects.filter(event__in=["queue_paused", "queue_resumed"])
    assert [(entry.event, entry.detail["by"]) for entry in entries.order_by("id")] == [
        ("queue_paused", OPERATOR),
        ("queue_resumed", OPERATOR),
    ]


@pytest.mark.parametrize("url", [PAUSE, RESUME])
def test_a_queue_action_posted_without_a_csrf_token_is_refused(admin_user: Any, url: str) -> None:
    DatabaseStateStore().pause_queue(target="reports", by="olga")
    client = csrf_client(admin_user)
    target = "billing" if url == PAUSE else "reports"
    confirmation = client.get(url, {"target": target, "queue": ""})
    token = form_token(confirmation.content.decode())
    before = (snapshot(), QueuePause.objects.count())
    for data in ({}, {"csrfmiddlewaretoken": "x" * len(token)}):
        response = client.post(url, {"target": target, "queue": "", "post": "yes", **data})
        assert response.status_code == 403
    assert (snapshot(), QueuePause.objects.count()) == before
    response = client.post(
        url, {"target": target, "queue": "", "post": "yes", "csrfmiddlewaretoken": token}
    )
    assert response.status_code == 302
    assert QueuePause.objects.filter(target="billing").exists() == (url == PAUSE)
    assert QueuePause.objects.filter(target="reports").exists() == (url == PAUSE)


def test_the_pause_permission_without_the_view_permission_pauses_nothing(
    django_user_model: Any, caplog: pytest.LogCaptureFixture
) -> None:
    DatabaseStateStore().pause_queue(target="reports", by="olga")
    user = staff(django_user_model, "mallory", [jobstate_permissions().get(codename="pause_queue")])
    client = logged_in(user)
    before = (snapshot(), list(QueuePause.objects.values_list("target", flat=True)))
    with caplog.at_level("WARNING", logger="jobstate.admin"):
        for url, target in ((PAUSE, "billing"), (RESUME, "reports")):
            assert client.get(url, {"target": target}).status_code == 403
            response = client.post(url, {"target": target, "queue": "", "post": "yes"})
            assert response.status_code == 403
    assert (snapshot(), list(QueuePause.objects.values_list("target", flat=True))) == before
    assert "mallory asked to pause a queue without the view permission" in caplog.text
