"""Continuations on the Django ORM: the shared refire transition and exactly-once
approval requeues (``DatabaseContinuationMixin``).

Both write the job, its audit entries and (for approvals) the permanent decision marker
in one transaction, so a crash leaves either all of it or none of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Func, JSONField, Value
from django.db.models.functions import Now
from django.db.models.sql.compiler import SQLCompiler

from jobstate.audit import AuditStage
from jobstate.exceptions import InvalidJobState
from jobstate.models import ApprovalDecision, Job, JobQuerySet
from jobstate.stores.base import (
    TERMINAL_JOB_STATUSES,
    ApprovalRequeueOutcome,
    JobId,
    JobStatus,
    StateStore,
)
from jobstate.stores.integrity import violates
from jobstate.stores.validation import (
    JOB_CLAIM_FIELDS,
    parse_statuses,
    parse_uuid,
    require_text,
    text_problem,
)

__all__ = [
    "APPROVAL_COMMENT_LIMIT",
    "APPROVAL_DECISION_PKEY",
    "NO_DELIVERY_KEY",
    "DatabaseContinuationMixin",
    "approval_audit_entry",
    "approval_via",
    "validate_approval_arguments",
    "validate_requeue_arguments",
]

#: Name PostgreSQL gives the primary key of the decision markers; the only
#: ``IntegrityError`` an approval turns into a domain answer.
APPROVAL_DECISION_PKEY = "jobstate_approvaldecision_pkey"

#: ``metadata`` key that suppresses delivery of a job's result; a refired job delivers
#: again, so the refire drops it.
NO_DELIVERY_KEY = "no_delivery"

#: Longest approval comment accepted (it is kept on the decision marker and the audit).
APPROVAL_COMMENT_LIMIT = 2000

_VIA_LIMIT = 250


def validate_requeue_arguments(
    from_statuses: Sequence[str], by: str, via: str, event: str
) -> list[JobStatus]:
    """Check the arguments of ``requeue_job`` (shared by every store) and return the
    statuses parsed."""
    statuses = parse_statuses(from_statuses)
    require_text(by, field="by")
    require_text(via, field="via", max_length=_VIA_LIMIT)
    require_text(event, field="event", max_length=100)
    return statuses


def validate_approval_arguments(decision_id: str, approver: str, comment: str) -> None:
    """Check the arguments of ``requeue_approved_job_once`` (shared by every store)."""
    require_text(decision_id, field="decision_id")
    require_text(approver, field="approver")
    if not isinstance(comment, str):
        raise InvalidJobState(f"comment must be a string, got {type(comment).__name__}.")
    if len(comment) > APPROVAL_COMMENT_LIMIT or text_problem(comment):
        raise InvalidJobState(
            f"comment must be at most {APPROVAL_COMMENT_LIMIT} characters, without NUL."
        )


def approval_via(decision_id: str) -> str:
    """The ``via`` an approval's rerun audit entry names."""
    return f"approval:{decision_id}"


def approval_audit_entry(decision_id: str, approver: str, comment: str) -> dict[str, Any]:
    """The ``append_audit`` arguments of the entry that records who approved."""
    summary = f"approved by {approver}" + (f": {comment}" if comment else "")
    return {
        "event": "approved",
        "stage": AuditStage.APPROVAL,
        "title": "Approved",
        "summary": summary,
        "detail": {"decision_id": decision_id, "approver": approver, "comment": comment},
    }


class _WithoutKey(Func):
    """A JSON object without one top-level key, computed by the database inside the
    UPDATE, so the refire stays a single conditional statement (no read-modify-write of
    ``metadata`` that a concurrent writer could interleave with)."""

    # SQLite's and MySQL's JSON_REMOVE; the path quotes the key so any name is safe.
    function = "JSON_REMOVE"
    output_field = JSONField()

    def __init__(self, expression: Any, key: str) -> None:
        self.key = key
        super().__init__(expression, Value(f'$."{key}"'))

    def as_postgresql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper, **extra_context: Any
    ) -> tuple[str, list[Any]]:
        column_sql, params = compiler.compile(self.source_expressions[0])
        return f"({column_sql} - %s::text)", [*params, self.key]


class _Superseded(Exception):
    """Rolls back an approval's savepoint: the job was requeued by someone else."""


class DatabaseContinuationMixin(StateStore):
    """``requeue_job`` and ``requeue_approved_job_once`` for the database state store.

    One of the bases of :class:`~jobstate.stores.database.DatabaseStateStore`; it
    relies on that class's ``using`` and ``append_audit``.
    """

    using: str

    def requeue_job(
        self,
        job_id: JobId,
        *,
        from_statuses: Sequence[str],
        by: str,
        via: str,
        event: str = "rerun",
    ) -> Job | None:
        """See :meth:`StateStore.requeue_job`.

        The job row is locked first (``SELECT ... FOR UPDATE``) so the audit entry's
        ``prev_status`` is exactly the status the refire replaced; the UPDATE itself stays
        conditional on ``from_statuses``. ``metadata['no_delivery']`` is removed. Runs in
        the caller's transaction when there is one.
        """
        pk = parse_uuid(job_id, field="job_id")
        statuses = validate_requeue_arguments(from_statuses, by, via, event)
        if not statuses:
            return None
        with transaction.atomic(using=self.using):
            jobs = self._job_rows()
            prev_status = (
                jobs.select_for_update()
                .filter(id=pk, status__in=statuses)
                .values_list("status", flat=True)
                .first()
            )
            if prev_status is None:
                return None
            moved = jobs.filter(id=pk, status__in=statuses).update(
                status=JobStatus.QUEUED,
                attempts=0,
                run_after=None,
                error=None,
                metadata=_WithoutKey("metadata", NO_DELIVERY_KEY),
                updated_at=Now(),
                **dict.fromkeys(JOB_CLAIM_FIELDS),
            )
            if moved != 1:
                return None
            job = jobs.get(id=pk)
            self.append_audit(
                job=job,
                event=event,
                detail={"by": by, "via": via, "prev_status": prev_status},
            )
            return job

    def requeue_approved_job_once(
        self, *, job_id: JobId, decision_id: str, approver: str, comment: str = ""
    ) -> ApprovalRequeueOutcome:
        """See :meth:`StateStore.requeue_approved_job_once`.

        One transaction: the job row is locked, so concurrent approvals of one job (same
        or different ``decision_id``) run one after another and each later one sees
        either its own marker (``ALREADY_REQUEUED``) or the job back in the queue
        (``JOB_IN_FLIGHT``). A ``decision_id`` raced for two jobs is settled by the
        marker's primary key: the loser answers ``DECISION_CONFLICT``. On ``REQUEUED`` the
        audit has an ``approved`` entry (stage approval: approver, decision, comment) and
        the ``rerun`` entry of the refire.
        """
        pk = parse_uuid(job_id, field="job_id")
        validate_approval_arguments(decision_id, approver, comment)
        with transaction.atomic(using=self.using):
            job = self._job_rows().select_for_update().filter(id=pk).first()
            if job is None:
                return ApprovalRequeueOutcome.NOT_FOUND
            decided = self._decision_outcome(decision_id, pk)
            if decided is not None:
                return decided
            if job.status not in TERMINAL_JOB_STATUSES:
                return ApprovalRequeueOutcome.JOB_IN_FLIGHT
            try:
                # A savepoint: a lost marker race, or a job that left its terminal status
                # regardless of the lock, undoes the marker and the audit entries and
                # leaves the outer transaction usable.
                with transaction.atomic(using=self.using):
                    ApprovalDecision.objects.using(self.using).create(
                        decision_id=decision_id, job_id=pk, approver=approver, comment=comment
                    )
                    self.append_audit(
                        job=job, **approval_audit_entry(decision_id, approver, comment)
                    )
                    refired = self.requeue_job(
                        pk,
                        from_statuses=[job.status],
                        by=approver,
                        via=approval_via(decision_id),
                    )
                    if refired is None:
                        raise _Superseded
            except IntegrityError as exc:
                if not violates(
                    exc,
                    constraint=APPROVAL_DECISION_PKEY,
                    table=ApprovalDecision._meta.db_table,
                    columns=["decision_id"],
                ):
                    raise
                # The insert waited for the winner's commit, so its marker is visible now.
                decided = self._decision_outcome(decision_id, pk)
                if decided is None:
                    raise
                return decided
            except _Superseded:
                return ApprovalRequeueOutcome.JOB_IN_FLIGHT
            return ApprovalRequeueOutcome.REQUEUED

    # --- internals -------------------------------------------------------------------

    def _job_rows(self) -> JobQuerySet:
        return Job.objects.using(self.using)

    def _decision_outcome(self, decision_id: str, pk: Any) -> ApprovalRequeueOutcome | None:
        """The answer an existing marker for ``decision_id`` gives, or ``None``."""
        decided_job = (
            ApprovalDecision.objects.using(self.using)
            .filter(decision_id=decision_id)
            .values_list("job_id", flat=True)
            .first()
        )
        if decided_job is None:
            return None
        if decided_job == pk:
            return ApprovalRequeueOutcome.ALREADY_REQUEUED
        return ApprovalRequeueOutcome.DECISION_CONFLICT
