"""Continuations on the Django ORM: the permanent markers behind exactly-once approval
requeues and dead-letter replays.

A marker's primary key settles concurrent callers: of two inserts of one key exactly one
wins, and the loser reads the winner's marker to answer. Each replay writes the
notification, its marker and its audit entry in one transaction, so a crash leaves all
of it or none of it.
"""

from __future__ import annotations

import uuid

from django.db import IntegrityError, transaction
from django.db.models import QuerySet
from django.db.models.functions import Now

from jobstate.core.states import DeliveryRequeueOutcome, NotificationState
from jobstate.models import ApprovalDecision, DeliveryReplay, Notification
from jobstate.stores.database.audit_locks import record_audit
from jobstate.stores.database.backends import database_ops
from jobstate.stores.integrity import violates

__all__ = [
    "APPROVAL_DECISION_PKEY",
    "DELIVERY_REPLAY_PKEY",
    "record_decision",
    "recorded_decision",
    "requeue_delivery",
]

#: Name PostgreSQL gives the primary key of the decision markers; the only
#: ``IntegrityError`` an approval turns into a domain answer.
APPROVAL_DECISION_PKEY = "jobstate_approvaldecision_pkey"

#: Name PostgreSQL gives the primary key of the replay markers; the only
#: ``IntegrityError`` a replay turns into a domain answer.
DELIVERY_REPLAY_PKEY = "jobstate_deliveryreplay_pkey"


# --- approvals -------------------------------------------------------------------------


def recorded_decision(using: str, decision_id: str) -> uuid.UUID | None:
    """The job an existing marker for ``decision_id`` names, or ``None``."""
    decided: uuid.UUID | None = (
        ApprovalDecision.objects.using(using)
        .filter(decision_id=decision_id)
        .values_list("job_id", flat=True)
        .first()
    )
    return decided


def record_decision(
    using: str, decision_id: str, pk: uuid.UUID, approver: str, comment: str
) -> uuid.UUID | None:
    """Insert the permanent marker of ``decision_id`` for job ``pk``. ``None`` when it
    was inserted; the job the winner's marker names when a concurrent approval inserted
    the same ``decision_id`` first."""
    try:
        # A savepoint: the loser's transaction must stay usable to read the winner.
        with transaction.atomic(using=using):
            ApprovalDecision.objects.using(using).create(
                decision_id=decision_id, job_id=pk, approver=approver, comment=comment
            )
    except IntegrityError as exc:
        if not violates(
            exc,
            constraint=APPROVAL_DECISION_PKEY,
            table=ApprovalDecision._meta.db_table,
            columns=["decision_id"],
        ):
            raise
        # The insert waited for the winner's commit, so its marker is visible now.
        winner = recorded_decision(using, decision_id)
        if winner is None:
            raise
        return winner
    return None


# --- dead-letter replay ----------------------------------------------------------------


def requeue_delivery(
    using: str, pk: uuid.UUID, dlq_key: str, requested_by: str
) -> DeliveryRequeueOutcome:
    """Send dead notification ``pk`` back to pending once per ``dlq_key``.

    The notification row is locked first, so concurrent replays of one dead letter run
    one after the other; a key already used for this row answers ``ALREADY_REQUEUED``
    even after the row was delivered or dead again, and one used for another row
    ``KEY_CONFLICT``. The row keeps its id, idempotency key and ``last_error``;
    ``attempts`` restarts at 0 and it is due at once. A ``dlq_resend_ok`` audit entry
    names ``requested_by``. Markers are permanent: pruning the notification does not
    free its key.
    """
    rows = Notification.objects.using(using)
    markers = DeliveryReplay.objects.using(using)
    with transaction.atomic(using=using):
        locked = rows.filter(id=pk)
        if database_ops(using).locks_rows:
            locked = locked.select_for_update()
        row = locked.first()
        if row is None:
            return DeliveryRequeueOutcome.NOT_FOUND
        used = _replay_outcome(markers, dlq_key, pk)
        if used is not None:
            return used
        if row.state != NotificationState.DEAD:
            return DeliveryRequeueOutcome.NOT_DEAD
        try:
            # A savepoint: a concurrent replay of the same key on another row wins
            # the insert, and this transaction must stay usable to answer.
            with transaction.atomic(using=using):
                markers.create(dlq_key=dlq_key, notification_id=pk, requested_by=requested_by)
        except IntegrityError as exc:
            if not violates(
                exc,
                constraint=DELIVERY_REPLAY_PKEY,
                table=DeliveryReplay._meta.db_table,
                columns=["dlq_key"],
            ):
                raise
            # A concurrent replay took the key first; it may have been for this
            # row or for another one.
            return _replay_outcome(markers, dlq_key, pk) or (
                DeliveryRequeueOutcome.ALREADY_REQUEUED
            )
        rows.filter(id=pk, state=NotificationState.DEAD).update(
            state=NotificationState.PENDING,
            attempts=0,
            next_attempt_at=Now(),
            lease_until=None,
            delivered_at=None,
            updated_at=Now(),
        )
        record_audit(
            using,
            job_id=row.job_id,
            event="dlq_resend_ok",
            summary=f"dead letter {dlq_key} requeued by {requested_by}",
            detail={
                "notification_id": str(pk),
                "dlq_key": dlq_key,
                "requested_by": requested_by,
                "channel": row.channel,
                "attempts": row.attempts,
            },
        )
    return DeliveryRequeueOutcome.REQUEUED


def _replay_outcome(
    markers: QuerySet[DeliveryReplay], dlq_key: str, notification_id: uuid.UUID
) -> DeliveryRequeueOutcome | None:
    """What an existing marker for ``dlq_key`` answers, or ``None`` when the key is free."""
    replayed = markers.filter(dlq_key=dlq_key).values_list("notification_id", flat=True).first()
    if replayed is None:
        return None
    if replayed == notification_id:
        return DeliveryRequeueOutcome.ALREADY_REQUEUED
    return DeliveryRequeueOutcome.KEY_CONFLICT
