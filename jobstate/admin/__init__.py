"""The operators' console on the Django admin.

Jobs, runs, schedules, the audit ledger, runtime locks and the notification outbox are browsable
at any size (estimated or capped counts, index-backed ordering and filters, exact
search). History tables are read-only. Every change an operator makes is an admin
action with a confirmation page and its own permission; it goes through the stores,
re-checks each row in the database, and leaves an audit entry naming the user. The
Overview page (``admin:jobstate_dashboard``) shows the metrics snapshot and charts;
the Workers page lists the registered worker processes and the Queues page
(``admin:jobstate_queuepause_changelist``) every queue, with pause and resume. The
three pages refresh themselves in place.
"""

from __future__ import annotations

from jobstate.admin.bulk_actions import BulkOperationAdmin
from jobstate.admin.common import ReadOnlyAdmin, status_badge
from jobstate.admin.dashboard_entry import OverviewAdmin
from jobstate.admin.history import ApprovalDecisionAdmin, AuditEntryAdmin, DeliveryReplayAdmin
from jobstate.admin.jobs import JobAdmin
from jobstate.admin.locks import RuntimeLockAdmin
from jobstate.admin.outbox import NotificationAdmin
from jobstate.admin.paginator import EstimatedCountPaginator
from jobstate.admin.queues import QueuePauseAdmin
from jobstate.admin.runs import JobRunAdmin
from jobstate.admin.schedules import ScheduleAdmin
from jobstate.admin.workers import WorkerAdmin

__all__ = [
    "ApprovalDecisionAdmin",
    "AuditEntryAdmin",
    "BulkOperationAdmin",
    "DeliveryReplayAdmin",
    "EstimatedCountPaginator",
    "JobAdmin",
    "JobRunAdmin",
    "NotificationAdmin",
    "OverviewAdmin",
    "QueuePauseAdmin",
    "ReadOnlyAdmin",
    "RuntimeLockAdmin",
    "ScheduleAdmin",
    "WorkerAdmin",
    "status_badge",
]
