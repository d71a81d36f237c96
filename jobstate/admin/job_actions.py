"""The operator actions on jobs (requeue, reject, approve and requeue): which rows
each applies to and how it changes them, through the state store, audited with the
operator's user name. :class:`jobstate.admin.jobs.JobAdmin` offers them on the list and
as buttons on the job page."""

from __future__ import annotations

from typing import Any

from django import forms
from django.http import HttpRequest
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext_lazy

from jobstate.admin.common import ActionRow, ActionSpec, RejectForm, counted, relative_time
from jobstate.admin.job_page import job_name
from jobstate.admin.page_bases import database_now
from jobstate.models import ApprovalDecision, Job
from jobstate.stores import get_state_store
from jobstate.stores.base import (
    CLAIMED_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    ApprovalRequeueOutcome,
    JobStatus,
)
from jobstate.stores.contracts.validation import APPROVAL_COMMENT_LIMIT

__all__ = ["ADMIN_VIA", "ApproveForm", "approve_spec", "lease_text", "reject_spec", "requeue_spec"]

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
    """Why a store call found nothing to do: the job's status as it is now."""
    status = Job.objects.filter(pk=job.pk).values_list("status", flat=True).first()
    if status is None:
        return _("no longer exists")
    return _("now %(status)s") % {"status": JobStatus(status).label}


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
    parts = [str(JobStatus(job.status).label), job.target or "—"]
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
            why = _("%(status)s and its lease has not expired") % {
                "status": JobStatus(job.status).label
            }
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
        why = (
            None
            if job.status in TERMINAL_JOB_STATUSES
            else _("in flight; it will use the approval itself")
        )
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
            "Records your approval of each finished job (a permanent decision marker "
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
