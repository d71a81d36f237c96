"""The operator actions on jobs (requeue, reject, cancel, retry now, discard, approve
and requeue): which rows each applies to and how it changes them, through the state
store, audited with the operator's user name. :class:`jobstate.admin.jobs.JobAdmin`
offers them on the list and as buttons on the job page (:func:`job_buttons`).

Each action's rows are those its rule takes, one ``JobQuerySet`` method and its
loaded-job twin on :class:`~jobstate.models.Job` (``requeueable``, ``cancellable``,
``retryable_now``, ``discardable``, ``approvable``), which the store checks again with
the job held. The job page offers a button only where its rule takes the job, and on a
queued job it names the cancel for what it is there: "Reject" for a job, "Discard" for
a task."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext_lazy

from jobstate.admin.common import ActionRow, ActionSpec, RejectForm, counted, relative_time
from jobstate.admin.job_page import job_name
from jobstate.admin.page_bases import database_now
from jobstate.admin.status_words import status_name, status_word
from jobstate.models import ApprovalDecision, Job, unique_hold
from jobstate.stores import get_state_store
from jobstate.stores.base import (
    CLAIMED_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    ApprovalRequeueOutcome,
    JobStatus,
)
from jobstate.stores.contracts.validation import APPROVAL_COMMENT_LIMIT

__all__ = [
    "ADMIN_VIA",
    "ApproveForm",
    "approve_spec",
    "cancel_spec",
    "discard_spec",
    "job_buttons",
    "lease_text",
    "reject_spec",
    "requeue_spec",
    "retry_now_spec",
]

#: The ``via`` of the audit entries the admin's requeues write.
ADMIN_VIA = "admin"


class ApproveForm(forms.Form):
    comment = forms.CharField(
        label=gettext_lazy("Comment"),
        required=False,
        max_length=APPROVAL_COMMENT_LIMIT,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 60}),
        help_text=gettext_lazy("Kept on the approval decision and in the audit entry."),
    )


def _job_label(job: Job) -> str:
    return job_name(job)


def _now_status(job: Job) -> str:
    """Why a store call found nothing to do: the job's status as it is now, named as
    its page names it."""
    status = Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()
    if status is None:
        return _("no longer exists")
    return _("now %(status)s") % {"status": status_word(status, task=job.task_path is not None)}


def lease_text(job: Job, now: Any) -> str:
    """The lease column: when a claimed job's lease ends (or ended), when a delayed
    job runs; empty otherwise."""
    if job.status in CLAIMED_JOB_STATUSES:
        if job.lease_until is None:
            return _("no lease")
        if job.lease_until < now:
            return _("expired %(when)s") % {"when": relative_time(job.lease_until, now)}
        return _("ends %(when)s") % {"when": relative_time(job.lease_until, now)}
    if job.status == JobStatus.QUEUED and job.run_after is not None and job.run_after > now:
        return _("runs %(when)s") % {"when": relative_time(job.run_after, now)}
    return ""


def _describe(job: Job, now: Any) -> str:
    parts = [status_name(job), job.target or "—"]
    lease = lease_text(job, now)
    if lease:
        parts.append(lease)
    return " · ".join(parts)


def requeue_spec(by: str) -> ActionSpec:

    def row(job: Job) -> ActionRow:
        now = database_now(job)
        why: str | None = None
        if job.status == JobStatus.QUEUED:
            why = _("already queued")
        elif not job.requeueable_at(now):
            why = _("%(status)s and its lease has not expired") % {"status": status_name(job)}
        elif _key_held_elsewhere(job):
            why = _("a newer job holds its unique key")
        return ActionRow(job, _job_label(job), _describe(job, now), why)

    def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
        # The requeue of the bulk operations, for one job in the status it was seen in.
        refired = get_state_store().requeue_jobs([(job.pk, job.status)], by=by, via=ADMIN_VIA)
        return None if refired else _now_status(job)

    return ActionSpec(
        title=_("Requeue jobs"),
        intro=_(
            "Finished jobs (done, error, rejected) and running or dispatched jobs whose "
            "lease has expired go back to the queue: attempts reset, delay, error and "
            "claim cleared. Each gets a “rerun” audit entry naming you. A job that "
            "changes before you confirm is left alone."
        ),
        confirm_label=_("Yes, requeue"),
        done=counted(ngettext_lazy("Requeued %(count)d job.", "Requeued %(count)d jobs.", "count")),
        row=row,
        perform=perform,
    )


def _key_held_elsewhere(job: Job) -> bool:
    """A unique task whose key another job of its backend holds: a requeue leaves it."""
    if job.unique_digest is None:
        return False
    holders = Job.objects.filter(target=job.target, unique_digest=job.unique_digest)
    return holders.exclude(id=job.id).filter(unique_hold()).exists()


def reject_spec(by: str) -> ActionSpec:

    def row(job: Job) -> ActionRow:
        now = database_now(job)
        why = None if job.status == JobStatus.QUEUED else _("not queued")
        return ActionRow(job, _job_label(job), _describe(job, now), why)

    def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
        rejected = get_state_store().reject_queued_job(
            job.pk, by=by, reason=inputs.get("reason", "")
        )
        return None if rejected is not None else _now_status(job)

    return ActionSpec(
        title=_("Reject queued jobs"),
        intro=_(
            "Queued jobs become rejected and are never claimed. Each gets a “rejected” "
            "audit entry naming you and the reason. A job claimed before you confirm "
            "is left alone."
        ),
        confirm_label=_("Yes, reject"),
        done=counted(ngettext_lazy("Rejected %(count)d job.", "Rejected %(count)d jobs.", "count")),
        row=row,
        perform=perform,
        form_class=RejectForm,
    )


def approve_spec(by: str) -> ActionSpec:
    reasons = {
        ApprovalRequeueOutcome.ALREADY_REQUEUED: _("this approval already requeued it"),
        ApprovalRequeueOutcome.DECISION_CONFLICT: _("decision id already used"),
        ApprovalRequeueOutcome.JOB_IN_FLIGHT: _("in flight now; it will use the approval"),
        ApprovalRequeueOutcome.NOT_FOUND: _("no longer exists"),
    }

    def row(job: Job) -> ActionRow:
        now = database_now(job)
        why = None
        if job.status not in TERMINAL_JOB_STATUSES:
            why = _("in flight; it will use the approval itself")
        elif not job.approvable_now():
            why = _("a task or a done job has nothing to approve")
        return ActionRow(job, _job_label(job), _describe(job, now), why)

    def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
        # One decision per approval round of the job: two operators confirming the
        # same round at once share the id, so the store requeues only once.
        rounds = ApprovalDecision.objects.filter(job_id=job.pk).count()
        outcome = get_state_store().requeue_approved_job_once(
            job_id=job.pk,
            decision_id=f"admin:{job.pk}:{rounds + 1}",
            approver=by,
            comment=inputs.get("comment", ""),
        )
        return None if outcome is ApprovalRequeueOutcome.REQUEUED else reasons[outcome]

    return ActionSpec(
        title=_("Approve and requeue jobs"),
        intro=_(
            "Records your approval of each failed or rejected job (a permanent decision marker "
            "with your name and comment) and requeues it, exactly once per approval: "
            "confirming twice, or two operators at once, requeues a job only once."
        ),
        confirm_label=_("Yes, approve and requeue"),
        done=counted(
            ngettext_lazy(
                "Approved and requeued %(count)d job.",
                "Approved and requeued %(count)d jobs.",
                "count",
            )
        ),
        row=row,
        perform=perform,
        form_class=ApproveForm,
    )


def cancel_spec(by: str) -> ActionSpec:

    def row(job: Job) -> ActionRow:
        why = None if job.cancellable_now() else _("already finished")
        return ActionRow(job, _job_label(job), _describe(job, database_now(job)), why)

    def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
        cancelled = get_state_store().cancel_job(job.pk, by=by, reason=inputs.get("reason", ""))
        return None if cancelled is not None else _now_status(job)

    return ActionSpec(
        title=_("Cancel jobs"),
        intro=_(
            "Each job that has not finished becomes rejected: a queued one is never "
            "claimed; a running or dispatched one loses its claim, so whatever its worker "
            "or executor reports afterwards is refused. A task running in a worker is "
            "interrupted (TaskCancelled is raised in it) within the worker's polling "
            "interval, and its attempt is logged as cancelled. Each gets a “cancelled” "
            "audit entry naming you and the reason. A job that finishes before you "
            "confirm is left alone."
        ),
        confirm_label=_("Yes, cancel"),
        done=counted(
            ngettext_lazy("Cancelled %(count)d job.", "Cancelled %(count)d jobs.", "count")
        ),
        row=row,
        perform=perform,
        form_class=RejectForm,
    )


def retry_now_spec(by: str) -> ActionSpec:

    def row(job: Job) -> ActionRow:
        why = None if job.waiting_for_retry() else _("not a task waiting for its retry")
        return ActionRow(job, _job_label(job), _describe(job, database_now(job)), why)

    def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
        moved = get_state_store().retry_job_now(job.pk, by=by)
        return None if moved is not None else _now_status(job)

    return ActionSpec(
        title=_("Retry tasks now"),
        intro=_(
            "Tasks waiting out the backoff after a failed attempt become due at once; a "
            "worker of their queue runs them next. Each gets a “retry now” audit entry "
            "naming you. A task claimed or finished before you confirm is left alone."
        ),
        confirm_label=_("Yes, retry now"),
        done=counted(
            ngettext_lazy(
                "Brought forward the retry of %(count)d task.",
                "Brought forward the retries of %(count)d tasks.",
                "count",
            )
        ),
        row=row,
        perform=perform,
    )


def discard_spec(by: str) -> ActionSpec:

    def row(job: Job) -> ActionRow:
        why = None
        if not job.discardable_now():
            why = _("not a task") if job.task_path is None else _("not queued")
        return ActionRow(job, _job_label(job), _describe(job, database_now(job)), why)

    def perform(request: HttpRequest, job: Job, inputs: dict[str, Any]) -> str | None:
        discarded = get_state_store().discard_job(job.pk, by=by, reason=inputs.get("reason", ""))
        return None if discarded is not None else _now_status(job)

    return ActionSpec(
        title=_("Discard tasks"),
        intro=_(
            "Queued tasks, waiting for a retry or for their first attempt, are given up: "
            "they fail for good (error, read as FAILED), whatever attempts they had "
            "left, their error naming you. Each gets a “discarded” audit entry. A task "
            "claimed before you confirm is left alone (cancel it instead)."
        ),
        confirm_label=_("Yes, discard"),
        done=counted(
            ngettext_lazy("Discarded %(count)d task.", "Discarded %(count)d tasks.", "count")
        ),
        row=row,
        perform=perform,
        form_class=RejectForm,
    )


#: The job page's buttons: (permission suffix, action name, label, whether it is offered
#: for the job). Each offer is its action's rule, narrowed on a queued job to the name
#: that fits it (see the module docstring).
_BUTTONS: list[tuple[str, str, Any, Callable[[Job, Any], bool]]] = [
    ("requeue", "requeue_jobs", gettext_lazy("Requeue…"), lambda job, now: job.requeueable_at(now)),
    (
        "retry_now",
        "retry_now_jobs",
        gettext_lazy("Retry now…"),
        lambda job, now: job.waiting_for_retry(),
    ),
    (
        "cancel",
        "cancel_jobs",
        gettext_lazy("Cancel…"),
        lambda job, now: job.cancellable_now() and job.status != JobStatus.QUEUED,
    ),
    (
        "reject",
        "reject_jobs",
        gettext_lazy("Reject…"),
        lambda job, now: job.status == JobStatus.QUEUED and job.task_path is None,
    ),
    ("discard", "discard_jobs", gettext_lazy("Discard…"), lambda job, now: job.discardable_now()),
    (
        "approve",
        "approve_and_requeue_jobs",
        gettext_lazy("Approve and requeue…"),
        lambda job, now: job.approvable_now(),
    ),
]


def job_buttons(model_admin: Any, request: HttpRequest, job: Job) -> list[dict[str, str]]:
    """The action buttons of the job page the user may press for ``job`` as it is."""
    now = database_now(job)
    return [
        {"action": action, "label": str(label), "return_to": request.path}
        for permission, action, label, offered in _BUTTONS
        if getattr(model_admin, f"has_{permission}_permission")(request) and offered(job, now)
    ]
