"""Bulk operations over a filter of the jobs list: requeue, reject (cancel) or delete
every matching job, in bounded batches that survive restarts.

An operation is a :class:`~jobstate.models.BulkOperation` row holding the filter (the
list's filter parameters and search), the operator, a cutoff (jobs created after the
confirmation are not included), counts and a keyset cursor. :func:`advance_bulk_operation`
runs batches for about a second and a half and returns; whoever drives it (the console's
progress page, ``manage.py run_bulk_operation``) calls it again until the operation is
done. Each batch is one transaction that

1. locks the operation's row, so two drivers never take the same batch;
2. reads the next :data:`BATCH_SIZE` matching jobs after the cursor, newest first (the
   list's order), that the action applies to at that moment;
3. hands them to the store's batch transition (``requeue_jobs``,
   ``reject_queued_jobs``, ``delete_finished_jobs``: the single-job transitions over a
   batch), which re-checks each job's condition under its row lock: a job claimed or
   changed meanwhile is left alone and counted as skipped;
4. moves the cursor and the counts.

A crash rolls back the batch in flight (its transitions, audit entries and cursor move
together), so a resumed operation neither repeats nor loses a job. Every job changed
gets the audit entry of its transition naming the operator (``via`` ``bulk:<id>``); the
operation adds one summary entry when it starts and one when it ends.

Which jobs are included: those matching the filter when a batch reaches them, created
at or before the cutoff. A job that enters the filter after the confirmation (e.g.
fails meanwhile) is included if the cursor has not passed it yet; one that leaves it is
not touched.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from django.db import transaction
from django.db.models import Q, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from jobstate.console.job_search import db_instant, filter_jobs, parse_search, recent_window_start
from jobstate.exceptions import JobStateError
from jobstate.models import BulkAction, BulkOperation, BulkState, Job, JobQuerySet
from jobstate.stores import get_state_store
from jobstate.stores.contracts.state_store import StateStore

__all__ = [
    "BATCH_SIZE",
    "STEP_SECONDS",
    "BulkOperationFinished",
    "advance_bulk_operation",
    "applicable_jobs",
    "cancel_bulk_operation",
    "latest_operation_id",
    "matching_jobs",
    "running_twin",
    "start_bulk_operation",
    "twin_since",
]

#: Jobs per batch (one transaction).
BATCH_SIZE = 200

#: How long one call of :func:`advance_bulk_operation` runs batches.
STEP_SECONDS = 1.5


class BulkOperationFinished(JobStateError):
    """The operation is no longer running (done or cancelled)."""


def applicable_jobs(rows: QuerySet[Job], action: str) -> JobQuerySet:
    """The jobs of ``rows`` (a queryset of ``Job.objects``) that ``action`` applies to:
    requeue takes the requeueable ones (:meth:`~jobstate.models.JobQuerySet.requeueable`),
    reject the queued ones, delete the finished ones."""
    if not isinstance(rows, JobQuerySet):
        raise TypeError(f"rows must be a queryset of Job.objects, got {type(rows).__name__}.")
    if action == BulkAction.REQUEUE:
        return rows.requeueable()
    if action == BulkAction.REJECT:
        return rows.queued()
    if action == BulkAction.DELETE:
        return rows.terminal()
    raise ValueError(f"unknown bulk action {action!r}")


def matching_jobs(operation: BulkOperation, using: str = "default") -> QuerySet[Job]:
    """The jobs of ``operation``'s filter, created by its cutoff, that its action applies
    to now."""
    rows = filter_jobs(
        Job.objects.using(using),
        operation.filters,
        operation.search,
        window_start=operation.search_window_start,
    )
    cutoff = db_instant(using, operation.cutoff)
    return applicable_jobs(rows.filter(created_at__lte=cutoff), operation.action)


def running_twin(
    *,
    action: str,
    filters: Mapping[str, str],
    search: str,
    operator: str,
    reason: str = "",
    using: str = "default",
) -> BulkOperation | None:
    """The operation of ``operator`` still running with this action, filter, search and
    reason, or ``None``: a confirmation sent twice (a double click, a reload) opens it
    rather than starting a second one over the same jobs."""
    candidates = BulkOperation.objects.using(using).filter(
        state=BulkState.RUNNING,
        action=action,
        operator=operator,
        search=search.strip(),
        reason=reason,
    )
    wanted = dict(filters)
    return next((operation for operation in candidates if operation.filters == wanted), None)


def latest_operation_id(using: str = "default") -> int:
    """The id of the newest operation, 0 when there is none: what a confirmation page
    carries, so that the same confirmation sent again once its operation has run (the
    back button, then the submit) is told from a new one (:func:`twin_since`)."""
    newest = BulkOperation.objects.using(using).order_by("-pk").values_list("pk", flat=True)
    return newest.first() or 0


def twin_since(
    *,
    action: str,
    filters: Mapping[str, str],
    search: str,
    operator: str,
    after: int,
    using: str = "default",
) -> BulkOperation | None:
    """The newest operation of ``operator`` with this action, filter and search
    recorded after the operation ``after`` (running or not), or ``None``: the one a
    confirmation page opened when ``after`` was the newest has already started."""
    candidates = BulkOperation.objects.using(using).filter(
        pk__gt=after, action=action, operator=operator, search=search.strip()
    )
    wanted = dict(filters)
    return next(
        (operation for operation in candidates.order_by("-pk") if operation.filters == wanted),
        None,
    )


def start_bulk_operation(
    *,
    action: str,
    filters: Mapping[str, str],
    search: str,
    operator: str,
    reason: str = "",
    using: str = "default",
) -> BulkOperation:
    """Record an operation over the jobs matching ``filters`` and ``search`` now, with
    the count of those its action applies to. A malformed filter raises
    :class:`~jobstate.console.job_search.SearchError` and records nothing."""
    if action not in BulkAction.values:
        raise ValueError(f"unknown bulk action {action!r}")
    filters = dict(filters)
    window_start = None
    if search.strip() and parse_search(search).needs_window(using):
        window_start = recent_window_start(using)
    # Validates the filter before anything is written.
    filter_jobs(Job.objects.using(using), filters, search, window_start=window_start)
    store = get_state_store(using)
    with transaction.atomic(using=using):
        # The cutoff is the database's clock, which stamps the jobs' created_at.
        operation = BulkOperation.objects.using(using).create(
            action=action,
            operator=operator,
            filters=filters,
            search=search.strip(),
            search_window_start=window_start,
            reason=reason,
            cutoff=Now(),
        )
        operation.refresh_from_db(using=using)
        operation.total = matching_jobs(operation, using).count()
        operation.save(using=using, update_fields=["total"])
        _summary(store, operation, "bulk_started")
    return operation


def advance_bulk_operation(
    operation_id: int,
    *,
    seconds: float = STEP_SECONDS,
    batch_size: int = BATCH_SIZE,
    using: str = "default",
) -> BulkOperation:
    """Run batches of the operation for about ``seconds`` (at least one batch) and
    return it as it then stands; a finished or cancelled one is returned unchanged."""
    deadline = time.monotonic() + seconds
    store = get_state_store(using)
    while True:
        operation = _run_batch(store, operation_id, batch_size, using)
        if operation.state != BulkState.RUNNING or time.monotonic() >= deadline:
            return operation


def cancel_bulk_operation(operation_id: int, *, by: str, using: str = "default") -> BulkOperation:
    """Stop a running operation after the batch in flight; what it did stays done."""
    store = get_state_store(using)
    with transaction.atomic(using=using):
        operation = BulkOperation.objects.using(using).select_for_update().get(pk=operation_id)
        if operation.state != BulkState.RUNNING:
            raise BulkOperationFinished(f"Bulk operation {operation_id} is {operation.state}.")
        operation.state = BulkState.CANCELLED
        operation.finished_at = operation.updated_at = timezone.now()
        operation.save(using=using)
        _summary(store, operation, "bulk_cancelled", by=by)
    return operation


def _run_batch(store: StateStore, operation_id: int, batch_size: int, using: str) -> BulkOperation:
    with transaction.atomic(using=using):
        operation = BulkOperation.objects.using(using).select_for_update().get(pk=operation_id)
        if operation.state != BulkState.RUNNING:
            return operation
        rows = matching_jobs(operation, using)
        if operation.cursor_created_at is not None:
            at, last = db_instant(using, operation.cursor_created_at), operation.cursor_id
            # The plain bound lets the index range start at the cursor; the pair is the
            # exact keyset condition.
            rows = rows.filter(created_at__lte=at).filter(
                Q(created_at__lt=at) | Q(created_at=at, id__lt=last)
            )
        batch = list(
            rows.order_by("-created_at", "-id").values_list("id", "created_at", "status")[
                :batch_size
            ]
        )
        if not batch:
            operation.state = BulkState.DONE
            operation.finished_at = operation.updated_at = timezone.now()
            operation.save(using=using)
            _summary(store, operation, "bulk_finished")
            return operation
        changed = _apply(store, operation, [(job_id, status) for job_id, _at, status in batch])
        operation.done += changed
        operation.skipped += len(batch) - changed
        operation.cursor_id, operation.cursor_created_at = batch[-1][0], batch[-1][1]
        operation.updated_at = timezone.now()
        operation.save(using=using)
        return operation


def _apply(store: StateStore, operation: BulkOperation, jobs: list[tuple[uuid.UUID, str]]) -> int:
    """Hand one batch to the store's batch transition; how many jobs it changed."""
    by, via = operation.operator, f"bulk:{operation.pk}"
    if operation.action == BulkAction.REQUEUE:
        # The status each job was read in: one that moved since is not requeued.
        return len(store.requeue_jobs(jobs, by=by, via=via))
    ids = [job_id for job_id, _status in jobs]
    if operation.action == BulkAction.REJECT:
        reason = operation.reason or f"rejected by {by} (bulk operation {operation.pk})"
        return len(store.reject_queued_jobs(ids, by=by, reason=reason, via=via))
    return len(store.delete_finished_jobs(ids, by=by, via=via))


def _summary(store: StateStore, operation: BulkOperation, event: str, by: str = "") -> None:
    store.append_audit(
        event=event,
        title=f"Bulk {operation.get_action_display()} #{operation.pk}",
        detail={
            "by": by or operation.operator,
            "operation": operation.pk,
            "action": operation.action,
            "filters": operation.filters,
            "search": operation.search,
            "total": operation.total,
            "done": operation.done,
            "skipped": operation.skipped,
        },
    )
