"""The transactional notification outbox on the Django ORM.

:func:`complete_with_notifications` is the database state store's fenced terminal
transition that writes notification rows in the same transaction.
``DatabaseNotificationOutbox`` is the repository relays use to claim, settle and
dead-letter those rows. The one-time replay of a dead letter lives with the other
continuations (:mod:`jobstate.stores.database.continuations`).

Nothing here sends anything: delivery happens in :mod:`jobstate.outbox.relay`, after commit and
outside any transaction.
"""

from __future__ import annotations

import functools
import json
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Now

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import JobId, NotificationRequest, NotificationState
from jobstate.exceptions import DuplicateNotification, InvalidJobState
from jobstate.models import NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY, DeliveryAttempt, Job, Notification
from jobstate.stores.contracts.audit import complete_audit_fields
from jobstate.stores.contracts.state_store import NotificationOutbox, StateStore

# Defined with the state store's argument checks; importable from here too.
from jobstate.stores.contracts.validation import (
    CLEARED_CLAIM,
    default_idempotency_key,
    parse_limit,
    parse_uuid,
    require_text,
    validate_duration,
    validate_instant,
    validate_notification_requests,
)
from jobstate.stores.database.audit_locks import record_audit
from jobstate.stores.database.backends import database_ops
from jobstate.stores.database.backends.portable import FinishedEntry
from jobstate.stores.database.tables import job_rows
from jobstate.stores.errors import translate_store_errors
from jobstate.stores.integrity import violates

__all__ = [
    "LEASE_EXPIRED_ERROR",
    "DatabaseNotificationOutbox",
    "OutboxLeaseRecovery",
    "backoff_delay",
    "complete_with_notifications",
    "default_idempotency_key",
    "validate_notification_requests",
]

#: Error recorded for an attempt whose relay never settled it before its lease ended.
LEASE_EXPIRED_ERROR = "the relay holding this attempt stopped before settling it (lease expired)"

#: What recording a lost attempt needs of its row.
_LOST_ATTEMPT_FIELDS = ("id", "attempts", "relay_id", "updated_at", "lease_until", "job_id")

_RELAY_ID_LIMIT = 200
# 2**32 times any sensible base is far past any cap; bounding the exponent keeps the
# multiplication from overflowing timedelta after very many attempts.
_BACKOFF_EXPONENT_LIMIT = 32


def backoff_delay(
    attempts: int,
    *,
    base: timedelta | None = None,
    cap: timedelta | None = None,
    rng: random.Random | None = None,
) -> timedelta:
    """The wait before the next try after ``attempts`` failed attempts.

    Exponential with "equal jitter": the ceiling is ``min(cap, base * 2**(attempts-1))``
    (defaults ``OUTBOX_BACKOFF_BASE`` and ``OUTBOX_BACKOFF_MAX``); the delay is half the
    ceiling plus a uniform random share of the other half. The fixed half keeps retries
    from hammering a receiver that just failed; the random half spreads out rows that
    failed together, so they do not all come back at the same instant.
    """
    if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 1:
        raise InvalidJobState(f"attempts must be a positive int, got {attempts!r}.")
    base = validate_duration(
        jobstate_settings.OUTBOX_BACKOFF_BASE if base is None else base,
        field="base",
        allow_zero=False,
    )
    cap = validate_duration(
        jobstate_settings.OUTBOX_BACKOFF_MAX if cap is None else cap,
        field="cap",
        allow_zero=False,
    )
    ceiling = min(cap, base * 2 ** min(attempts - 1, _BACKOFF_EXPONENT_LIMIT))
    half = ceiling / 2
    return half + half * (rng or random).random()


def _lease_ended() -> Q:
    """Delivering rows whose relay's lease ended on the database clock (it died or
    stalled before settling them)."""
    return Q(state=NotificationState.DELIVERING, lease_until__lt=Now())


def _due() -> Q:
    """Rows a relay may claim on the database clock: pending ones whose time has come,
    and delivering ones whose relay's lease ended."""
    return Q(state=NotificationState.PENDING, next_attempt_at__lte=Now()) | _lease_ended()


def _clean_error(error: Any) -> str:
    if not isinstance(error, str):
        raise InvalidJobState(f"error must be a string, got {type(error).__name__}.")
    # PostgreSQL text cannot hold NUL, and no database a lone surrogate; the text is a
    # diagnostic, so it is cleaned, not refused.
    cleaned = error.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    return cleaned[: jobstate_settings.ERROR_TEXT_LIMIT]


@dataclass(frozen=True)
class OutboxLeaseRecovery:
    """What one :meth:`DatabaseNotificationOutbox.rearm_expired_leases` call did."""

    rearmed: int = 0
    """Back to ``pending`` (attempts left), due at once."""
    dead: int = 0
    """Dead-lettered: the lost attempt was the row's last."""

    @property
    def total(self) -> int:
        return self.rearmed + self.dead


@translate_store_errors
class DatabaseNotificationOutbox(NotificationOutbox):
    """:class:`~jobstate.stores.base.NotificationOutbox` on the ``Notification`` table of
    database ``using``.

    - Claims lock candidates with ``SELECT ... FOR UPDATE SKIP LOCKED`` on PostgreSQL, so
      concurrent relays split the due rows between them instead of queueing; on SQLite,
      ``IMMEDIATE`` transactions serialise the claims. Each claim counts one attempt.
    - Settling is fenced by ``relay_id`` and state ``delivering``: a relay whose row was
      taken over after its lease ended can no longer settle it.
    - Every settled attempt (and every attempt lost to an expired lease) leaves a
      ``DeliveryAttempt`` row in the same transaction as the state change.
    - A row dies after ``OUTBOX_MAX_ATTEMPTS`` attempts, with a ``delivery_error`` audit
      entry on its job; only ``requeue_delivery_job_once`` brings it back.

    ``store`` is the state store whose ``append_audit`` records a dead letter (the state
    store hands itself in); without one the entry goes straight to the audit table of
    ``using``. ``rng`` draws the backoff jitter.
    """

    def __init__(
        self,
        using: str = "default",
        *,
        store: StateStore | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.using = using
        self._store = store
        self._rng = rng

    def claim_due(
        self, *, relay_id: str, limit: int | None = None, lease: timedelta | None = None
    ) -> list[Notification]:
        """See :meth:`NotificationOutbox.claim_due`. ``limit`` and ``lease`` default to
        ``OUTBOX_BATCH_SIZE`` and ``OUTBOX_LEASE``. The claimed rows come back oldest due
        first with ``attempts`` already counting this attempt.

        A taken-over row whose lost attempt was its last is dead-lettered here instead of
        being handed out again, so a notification that kills every relay that sends it
        cannot loop forever."""
        require_text(relay_id, field="relay_id", max_length=_RELAY_ID_LIMIT)
        count = parse_limit(limit, default=jobstate_settings.OUTBOX_BATCH_SIZE)
        duration = validate_duration(
            jobstate_settings.OUTBOX_LEASE if lease is None else lease,
            field="lease",
            allow_zero=False,
        )
        rows = self._rows()
        with transaction.atomic(using=self.using):
            candidates = rows.filter(_due()).order_by("next_attempt_at", "id")
            if database_ops(self.using).locks_rows:
                candidates = candidates.select_for_update(skip_locked=True)
            picked = list(candidates.values("state", *_LOST_ATTEMPT_FIELDS)[:count])
            exhausted = self._settle_lost_attempts(
                [row for row in picked if row["state"] == NotificationState.DELIVERING]
            )
            claim_ids = [row["id"] for row in picked if row["id"] not in exhausted]
            if not claim_ids:
                return []
            rows.filter(_due(), id__in=claim_ids).update(
                state=NotificationState.DELIVERING,
                relay_id=relay_id,
                lease_until=Now() + duration,
                attempts=F("attempts") + 1,
                updated_at=Now(),
            )
            # Only what the UPDATE took: a row another claimer moved first stays theirs.
            taken = rows.filter(
                id__in=claim_ids, relay_id=relay_id, state=NotificationState.DELIVERING
            )
            return list(taken.order_by("next_attempt_at", "id"))

    def mark_delivered(
        self, *, notification_id: JobId, relay_id: str, started_at: datetime | None = None
    ) -> bool:
        pk = parse_uuid(notification_id, field="notification_id")
        require_text(relay_id, field="relay_id", max_length=_RELAY_ID_LIMIT)
        started = None if started_at is None else validate_instant(started_at, field="started_at")
        with transaction.atomic(using=self.using):
            held = self._held(pk, relay_id)
            moved = held.update(
                state=NotificationState.DELIVERED,
                delivered_at=Now(),
                lease_until=None,
                updated_at=Now(),
            )
            if not moved:
                return False
            number = self._rows().filter(id=pk).values_list("attempts", flat=True).get()
            self._record_attempt(pk, number, relay_id, started, succeeded=True, error=None)
        return True

    def mark_failed(
        self,
        *,
        notification_id: JobId,
        relay_id: str,
        error: str,
        started_at: datetime | None = None,
    ) -> NotificationState | None:
        pk = parse_uuid(notification_id, field="notification_id")
        require_text(relay_id, field="relay_id", max_length=_RELAY_ID_LIMIT)
        text = _clean_error(error)
        started = None if started_at is None else validate_instant(started_at, field="started_at")
        with transaction.atomic(using=self.using):
            held = self._held(pk, relay_id)
            # The lock keeps the attempt count read here the one the update below settles.
            locked = held.select_for_update() if database_ops(self.using).locks_rows else held
            current = locked.values("attempts", "job_id").first()
            if current is None:
                return None
            attempts: int = current["attempts"]
            changes: dict[str, Any] = {"lease_until": None, "last_error": text, "updated_at": Now()}
            if attempts >= jobstate_settings.OUTBOX_MAX_ATTEMPTS:
                state = NotificationState.DEAD
            else:
                state = NotificationState.PENDING
                changes["next_attempt_at"] = Now() + backoff_delay(attempts, rng=self._rng)
            held.update(state=state, **changes)
            self._record_attempt(pk, attempts, relay_id, started, succeeded=False, error=text)
            if state == NotificationState.DEAD:
                self._audit_dead(pk, current["job_id"], attempts, error=text)
        return state

    def dead_letters(self, *, limit: int = 100) -> list[Notification]:
        count = parse_limit(limit, default=100)
        dead = self._rows().filter(state=NotificationState.DEAD)
        return list(dead.order_by("-updated_at", "-id")[:count])

    # --- lost leases (also a maintenance sweep) ---------------------------------------

    def expired_leases(self) -> QuerySet[Notification]:
        """Delivering rows whose relay's lease ended on the database clock: the relay
        died or stalled before settling them."""
        return self._rows().filter(_lease_ended())

    def rearm_expired_leases(self, *, limit: int) -> OutboxLeaseRecovery:
        """Hand back up to ``limit`` rows whose relay's lease ended, oldest lease first,
        in one transaction.

        Each row's lost attempt is recorded exactly as :meth:`claim_due` records it when
        it takes such a row over (a ``DeliveryAttempt`` with :data:`LEASE_EXPIRED_ERROR`,
        and ``last_error``). A row whose lost attempt was its last
        (``OUTBOX_MAX_ATTEMPTS``) becomes dead, with a ``delivery_error`` audit entry;
        any other row goes back to ``pending`` keeping its attempt count and its due
        time, so the next relay pass sends it at once. Either way the relay that lost
        the row can no longer settle it. Rows another sweeper or relay holds are passed
        over (``SKIP LOCKED`` on PostgreSQL, MariaDB and MySQL; SQLite's ``IMMEDIATE`` transactions
        serialise), so concurrent callers move and count each row once.
        """
        count = parse_limit(limit, default=jobstate_settings.OUTBOX_BATCH_SIZE)
        rows = self._rows()
        with transaction.atomic(using=self.using):
            candidates = self.expired_leases().order_by("lease_until", "id")
            if database_ops(self.using).locks_rows:
                candidates = candidates.select_for_update(skip_locked=True)
            lost = list(candidates.values(*_LOST_ATTEMPT_FIELDS)[:count])
            if not lost:
                return OutboxLeaseRecovery()
            dead = self._settle_lost_attempts(lost)
            rearmed = rows.filter(
                _lease_ended(), id__in=[row["id"] for row in lost if row["id"] not in dead]
            ).update(state=NotificationState.PENDING, lease_until=None, updated_at=Now())
        return OutboxLeaseRecovery(rearmed=rearmed, dead=len(dead))

    # --- internals -------------------------------------------------------------------

    def _rows(self) -> QuerySet[Notification]:
        return Notification.objects.using(self.using)

    def _held(self, pk: uuid.UUID, relay_id: str) -> QuerySet[Notification]:
        return self._rows().filter(id=pk, relay_id=relay_id, state=NotificationState.DELIVERING)

    def _settle_lost_attempts(self, lost: list[dict[str, Any]]) -> set[uuid.UUID]:
        """Record the attempts of ``lost`` (rows picked, and locked, in the caller's
        transaction while delivering with an ended lease; values of
        :data:`_LOST_ATTEMPT_FIELDS`) as failed, and dead-letter those whose lost
        attempt was their last. Returns the ids of the rows made dead; the others stay
        delivering for the caller to claim or re-arm."""
        if not lost:
            return set()
        rows = self._rows()
        # The lost attempt began when its relay claimed the row (the claim is the row's
        # last write) and ended with the lease.
        DeliveryAttempt.objects.using(self.using).bulk_create(
            DeliveryAttempt(
                notification_id=row["id"],
                number=row["attempts"],
                relay_id=row["relay_id"] or "",
                started_at=row["updated_at"],
                finished_at=row["lease_until"] or row["updated_at"],
                succeeded=False,
                error=LEASE_EXPIRED_ERROR,
            )
            for row in lost
        )
        rows.filter(id__in=[row["id"] for row in lost]).update(last_error=LEASE_EXPIRED_ERROR)
        max_attempts = jobstate_settings.OUTBOX_MAX_ATTEMPTS
        exhausted = [row for row in lost if row["attempts"] >= max_attempts]
        if exhausted:
            rows.filter(id__in=[row["id"] for row in exhausted]).update(
                state=NotificationState.DEAD, lease_until=None, updated_at=Now()
            )
            for row in exhausted:
                self._audit_dead(row["id"], row["job_id"], row["attempts"])
        return {row["id"] for row in exhausted}

    def _record_attempt(
        self,
        pk: Any,
        number: int,
        relay_id: str,
        started_at: datetime | None,
        *,
        succeeded: bool,
        error: str | None,
    ) -> None:
        DeliveryAttempt.objects.using(self.using).create(
            notification_id=pk,
            number=number,
            relay_id=relay_id,
            started_at=Now() if started_at is None else started_at,
            succeeded=succeeded,
            error=error,
        )

    def _audit_dead(self, pk: Any, job_id: Any, attempts: int, *, error: str | None = None) -> None:
        notification = self._rows().only("channel", "idempotency_key", "last_error").get(id=pk)
        detail = {
            "notification_id": str(pk),
            "channel": notification.channel,
            "idempotency_key": notification.idempotency_key,
            "attempts": attempts,
            "error": error if error is not None else notification.last_error or "",
        }
        if self._store is None:
            record_audit(self.using, job_id=job_id, event="delivery_error", detail=detail)
        else:
            self._store.append_audit(job=job_id, event="delivery_error", detail=detail)


def complete_with_notifications(
    using: str, original: Job, cleaned: dict[str, Any], requests: list[NotificationRequest]
) -> Job | None:
    """The fenced terminal transition plus its audit entry and outbox rows, all or none.

    The transition matches the job's id, ``original.status`` and ``original.claim_token``
    (``IS NULL`` when the original had none), so a job that was requeued, claimed again
    or finished by someone else since ``original`` was read is left alone and ``None``
    comes back. A key already in the outbox raises
    :class:`~jobstate.exceptions.DuplicateNotification` and rolls back the whole
    transition. Runs in the caller's transaction when there is one, so the caller can
    add its own writes to the same commit.

    Where the backend has the one-statement forms (PostgreSQL) it is one statement
    (``finish_with_notifications`` of the backend's operations object): a worker in
    autocommit mode pays one round trip; inside a caller's transaction a savepoint around
    it keeps that transaction usable after a duplicate key. Elsewhere the ORM writes it
    in a transaction of its own (a savepoint inside the caller's).
    """
    ops = database_ops(using)
    try:
        if not ops.hot_statements:
            detail = _finished_detail(str(cleaned["status"]), str(original.status), len(requests))
            return _complete_portably(using, original, cleaned, detail, requests)
        entry = _finished_entry(str(cleaned["status"]), str(original.status), len(requests))
        if connections[using].get_autocommit():
            # The statement is its own transaction: it commits whole or fails whole.
            return ops.finish_with_notifications(original, cleaned, entry, requests)
        with transaction.atomic(using=using):
            return ops.finish_with_notifications(original, cleaned, entry, requests)
    except IntegrityError as exc:
        if not violates(
            exc,
            constraint=NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY,
            table=Notification._meta.db_table,
            columns=["idempotency_key"],
        ):
            raise
        keys = [str(request.idempotency_key) for request in requests]
        taken = Notification.objects.using(using).filter(idempotency_key__in=keys)
        key = taken.values_list("idempotency_key", flat=True).first() or keys[0]
        raise DuplicateNotification(
            f"idempotency_key {key!r} is already in the outbox; the job was not changed.",
            idempotency_key=key,
        ) from exc


def _finished_detail(status: str, previous_status: str, notifications: int) -> dict[str, Any]:
    """The ``detail`` of the ``finished`` audit entry a completion writes."""
    return {"status": status, "previous_status": previous_status, "notifications": notifications}


@functools.lru_cache(maxsize=256)
def _finished_entry(status: str, previous_status: str, notifications: int) -> FinishedEntry:
    """The ``finished`` entry's fields, completed as :func:`record_audit` completes them,
    with the detail as JSON text. Cached: a worker finishes jobs of a few shapes, and
    completing and encoding the same fields again cost a tenth of the call's Python."""
    detail = _finished_detail(status, previous_status, notifications)
    fields = complete_audit_fields(
        event="finished", stage=None, severity=None, title="", summary="", detail=detail
    )
    return (fields.stage, fields.severity, fields.title, fields.summary, json.dumps(detail))


def _complete_portably(
    using: str,
    original: Job,
    cleaned: dict[str, Any],
    detail: dict[str, Any],
    requests: list[NotificationRequest],
) -> Job | None:
    """:func:`complete_with_notifications` through the ORM, for every backend."""
    jobs = job_rows(using)
    with transaction.atomic(using=using):
        moved = jobs.filter(
            id=original.id, status=original.status, claim_token=original.claim_token
        ).update(**cleaned, **CLEARED_CLAIM, updated_at=Now())
        if not moved:
            return None
        job = jobs.get(id=original.id)
        record_audit(
            using, job_id=job.id, request_id=job.request_id, event="finished", detail=detail
        )
        Notification.objects.using(using).bulk_create(
            Notification(
                job_id=job.id,
                channel=request.channel,
                destination=request.destination,
                payload=request.payload,
                idempotency_key=str(request.idempotency_key),
            )
            for request in requests
        )
    return job
