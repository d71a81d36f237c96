"""The state store's audit ledger and runtime locks: every store has them, and the other
parts write their audit entries through :meth:`LedgerPart.append_audit`."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import JobId
from jobstate.exceptions import InvalidJobState
from jobstate.stores.contracts.audit import complete_audit_fields
from jobstate.stores.contracts.primitives import AuditSubject, StateStorePrimitives
from jobstate.stores.contracts.validation import (
    column_limit,
    parse_limit,
    parse_uuid,
    require_text,
    text_problem,
    validate_duration,
    validate_instant,
)

if TYPE_CHECKING:
    from jobstate.models import AuditEntry, Job

__all__ = ["LedgerPart"]


class LedgerPart(StateStorePrimitives):
    """The audit ledger and runtime locks; see
    :class:`~jobstate.stores.contracts.state_store.StateStore` for the guarantees."""

    # --- audit ledger ----------------------------------------------------------------

    def append_audit(
        self,
        *,
        job: Job | JobId | None = None,
        request_id: str = "",
        event: str,
        stage: str | None = None,
        severity: str | None = None,
        title: str = "",
        summary: str = "",
        detail: dict[str, Any] | None = None,
        at: datetime | None = None,
    ) -> AuditEntry:
        """Append one entry and return it. Stage, severity, title and summary left out are
        filled from the event (:func:`complete_audit_fields`); ``request_id`` defaults to
        the job's. ``at`` is stored verbatim; without it the store's clock stamps the
        entry."""
        fields = complete_audit_fields(
            event=event, stage=stage, severity=severity, title=title, summary=summary, detail=detail
        )
        subject = _audit_subject(job, request_id)
        instant = None if at is None else validate_instant(at, field="at")
        return self._append_audit_entry(subject, event, fields, instant)

    def list_audit(
        self,
        *,
        job: Job | JobId | None = None,
        request_id: str | None = None,
        limit: int | None = None,
    ) -> list[AuditEntry]:
        """Entries of one job and/or request id, oldest first, at most ``limit``
        (default ``JOBSTATE['LIST_LIMIT']``)."""
        count = parse_limit(limit, default=jobstate_settings.LIST_LIMIT)
        if job is None and request_id is None:
            raise InvalidJobState("list_audit needs a job or a request_id to narrow to.")
        job_id = None if job is None else _job_id(job)
        if request_id is not None:
            require_text(request_id, field="request_id")
        return self._list_audit(job_id, request_id, count)

    def prune_audit_older_than(self, cutoff: datetime, *, batch_size: int | None = None) -> int:
        """Delete entries stamped before ``cutoff`` in batches of ``batch_size`` (default
        ``JOBSTATE['AUDIT_PRUNE_BATCH_SIZE']``), each its own short transaction, and
        return how many were deleted."""
        instant = validate_instant(cutoff, field="cutoff")
        batch = parse_limit(batch_size, default=jobstate_settings.AUDIT_PRUNE_BATCH_SIZE)
        return self._prune_audit(instant, batch)

    # --- runtime locks ---------------------------------------------------------------

    def acquire_runtime_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
        """Take or renew ``lock_key`` for ``owner`` until clock + ``ttl``. ``True`` when
        the lock was free, expired or already ``owner``'s; ``False`` while another owner
        holds it. Atomic: of concurrent callers for a free key exactly one wins."""
        require_text(lock_key, field="lock_key")
        require_text(owner, field="owner")
        validate_duration(ttl, field="ttl", allow_zero=False)
        return self._acquire_lock(lock_key, owner, ttl)

    def release_runtime_lock(self, lock_key: str, owner: str) -> None:
        """Release ``lock_key`` if ``owner`` holds it; otherwise do nothing."""
        require_text(lock_key, field="lock_key")
        require_text(owner, field="owner")
        self._release_lock(lock_key, owner)


def _audit_subject(job: Job | JobId | None, request_id: str) -> AuditSubject:
    """The job id and request id an audit entry names: a ``Job`` gives both (an explicit
    ``request_id`` wins), an id gives the job only."""
    limit = column_limit("AuditEntry", "request_id") or 0
    if not isinstance(request_id, str) or len(request_id) > limit:
        raise InvalidJobState(f"request_id must be a string of at most {limit} characters.")
    if problem := text_problem(request_id):
        raise InvalidJobState(f"request_id {problem}.")
    if job is None:
        return None, request_id
    job_id = _job_id(job)
    # Past _job_id, job is a Job or an id, and only a Job carries a request id.
    return job_id, request_id or getattr(job, "request_id", "")


def _job_id(job: Job | JobId) -> uuid.UUID:
    # Imported here: the store contracts load before the app registry is ready.
    from jobstate.models import Job

    return job.id if isinstance(job, Job) else parse_uuid(job, field="job")
