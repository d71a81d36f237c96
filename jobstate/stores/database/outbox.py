"""The transactional notification outbox on the Django ORM.

``DatabaseOutboxMixin`` gives the database state store its outbox transitions: the fenced
terminal transition that writes notification rows in the same transaction
(``complete_job_with_notifications``) and the one-time replay of a dead letter
(``requeue_delivery_job_once``). ``DatabaseNotificationOutbox`` is the repository relays
use to claim, settle and dead-letter those rows.

Nothing here sends anything: delivery happens in :mod:`jobstate.relay`, after commit and
outside any transaction.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Q, QuerySet
from django.db.models.functions import Now

from jobstate.conf import jobstate_settings
from jobstate.exceptions import (
    DuplicateNotification,
    InvalidJobState,
    InvalidNotification,
    InvalidPayload,
)
from jobstate.jsonvalues import ensure_json
from jobstate.models import (
    NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY,
    DeliveryAttempt,
    DeliveryReplay,
    Job,
    Notification,
)
from jobstate.stores.base import (
    TERMINAL_JOB_STATUSES,
    DeliveryRequeueOutcome,
    JobId,
    NotificationOutbox,
    NotificationRequest,
    NotificationState,
    StateStore,
)
from jobstate.stores.errors import translate_store_errors
from jobstate.stores.integrity import violates
from jobstate.stores.validation import (
    JOB_CLAIM_FIELDS,
    JOB_PATCH_FIELDS,
    clean_job_fields,
    parse_limit,
    parse_uuid,
    require_text,
    text_problem,
    validate_duration,
    validate_instant,
)

__all__ = [
    "DELIVERY_REPLAY_PKEY",
    "LEASE_EXPIRED_ERROR",
    "DatabaseNotificationOutbox",
    "DatabaseOutboxMixin",
    "OutboxLeaseRecovery",
    "backoff_delay",
    "default_idempotency_key",
    "validate_notification_requests",
]

#: Name PostgreSQL gives the primary key of the replay markers; the only
#: ``IntegrityError`` a replay turns into a domain answer.
DELIVERY_REPLAY_PKEY = "jobstate_deliveryreplay_pkey"

#: Error recorded for an attempt whose relay never settled it before its lease ended.
LEASE_EXPIRED_ERROR = "the relay holding this attempt stopped before settling it (lease expired)"

#: What recording a lost attempt needs of its row.
_LOST_ATTEMPT_FIELDS = ("id", "attempts", "relay_id", "updated_at", "lease_until", "job_id")

_COMPLETION_FIELDS = JOB_PATCH_FIELDS - set(JOB_CLAIM_FIELDS)
_CLEARED_CLAIM = dict.fromkeys(JOB_CLAIM_FIELDS)
_CHANNEL_LIMIT = 100
_DESTINATION_LIMIT = 2000
_KEY_LIMIT = 200
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


def default_idempotency_key(job: Job, channel: str, destination: str) -> str:
    """``<job id>:<channel>:<destination>``, with the destination replaced by its SHA-256
    when the key would exceed 200 characters. Stable across retries and reruns, so one
    job notifies one destination once per channel unless the caller picks its own keys."""
    key = f"{job.id}:{channel}:{destination}"
    if len(key) <= _KEY_LIMIT:
        return key
    digest = hashlib.sha256(destination.encode("utf-8")).hexdigest()
    return f"{job.id}:{channel}:sha256:{digest}"


def validate_notification_requests(
    job: Job, notifications: Iterable[NotificationRequest]
) -> list[NotificationRequest]:
    """Check every request (channel registered in ``JOBSTATE['CHANNELS']``, destination
    and key sizes, payload a strict JSON object) and return them with their idempotency
    keys filled in. Raises :class:`InvalidNotification` or :class:`InvalidPayload`, and
    :class:`DuplicateNotification` for a key repeated within the list."""
    if isinstance(notifications, NotificationRequest | str | bytes | dict) or not isinstance(
        notifications, Iterable
    ):
        raise InvalidNotification(
            f"notifications must be a list of NotificationRequest, got {notifications!r}."
        )
    channels = jobstate_settings.CHANNELS
    cleaned: list[NotificationRequest] = []
    seen: set[str] = set()
    for request in notifications:
        if not isinstance(request, NotificationRequest):
            raise InvalidNotification(
                f"every notification must be a NotificationRequest, got {type(request).__name__}."
            )
        channel, destination, key = request.channel, request.destination, request.idempotency_key
        if not isinstance(channel, str) or channel not in channels:
            known = ", ".join(sorted(channels)) or "none"
            raise InvalidNotification(
                f"channel {channel!r} is not in JOBSTATE['CHANNELS'] (known: {known})."
            )
        _check_text(destination, field="destination", limit=_DESTINATION_LIMIT)
        if not isinstance(request.payload, dict):
            raise InvalidPayload(
                f"notification payload must be a dict, got {type(request.payload).__name__}."
            )
        ensure_json(request.payload, field="notification payload")
        if key is None:
            key = default_idempotency_key(job, channel, destination)
        _check_text(key, field="idempotency_key", limit=_KEY_LIMIT)
        if key in seen:
            raise DuplicateNotification(
                f"idempotency_key {key!r} appears twice in one completion.", idempotency_key=key
            )
        seen.add(key)
        cleaned.append(
            NotificationRequest(
                channel=channel,
                destination=destination,
                payload=request.payload,
                idempotency_key=key,
            )
        )
    return cleaned


def _check_text(value: Any, *, field: str, limit: int) -> None:
    if not isinstance(value, str) or not value.strip():
        raise InvalidNotification(f"{field} must be a non-empty string, got {value!r}.")
    if len(value) > limit or text_problem(value):
        raise InvalidNotification(
            f"{field} must be at most {limit} characters of valid Unicode, without NUL."
        )


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
            if self._is_postgresql():
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
            locked = held.select_for_update() if self._is_postgresql() else held
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
        over (``SKIP LOCKED`` on PostgreSQL; SQLite's ``IMMEDIATE`` transactions
        serialise), so concurrent callers move and count each row once.
        """
        count = parse_limit(limit, default=jobstate_settings.OUTBOX_BATCH_SIZE)
        rows = self._rows()
        with transaction.atomic(using=self.using):
            candidates = self.expired_leases().order_by("lease_until", "id")
            if self._is_postgresql():
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

    def _is_postgresql(self) -> bool:
        return connections[self.using].vendor == "postgresql"

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
        self._audit_store().append_audit(
            job=job_id,
            event="delivery_error",
            detail={
                "notification_id": str(pk),
                "channel": notification.channel,
                "idempotency_key": notification.idempotency_key,
                "attempts": attempts,
                "error": error if error is not None else notification.last_error or "",
            },
        )

    def _audit_store(self) -> StateStore:
        if self._store is None:
            # Imported here: the state store module mixes in this module's mixin.
            from jobstate.stores.database import DatabaseStateStore

            self._store = DatabaseStateStore(using=self.using)
        return self._store


class DatabaseOutboxMixin(StateStore):
    """``complete_job_with_notifications``, ``notification_outbox`` and
    ``requeue_delivery_job_once`` for the database state store.

    Mixed into :class:`~jobstate.stores.database.DatabaseStateStore` (before it in
    the bases); relies on its ``using`` and ``append_audit``.
    """

    using: str

    def complete_job_with_notifications(
        self,
        original: Job,
        patch: dict[str, Any],
        notifications: Iterable[NotificationRequest] = (),
    ) -> Job | None:
        """See :meth:`StateStore.complete_job_with_notifications`.

        One conditional ``UPDATE`` matches the job's id, ``original.status`` and
        ``original.claim_token`` (``IS NULL`` when the original had none), so a job that
        was requeued, claimed again or finished by someone else since ``original`` was
        read is left alone and ``None`` comes back. An ``original`` that is already
        terminal is settled, so it also answers ``None``. ``patch`` may not name claim
        fields (they are cleared). Each notification's idempotency key defaults to
        :func:`default_idempotency_key`; a key already in the outbox raises
        :class:`~jobstate.exceptions.DuplicateNotification` and rolls back the whole
        transition. Runs in the caller's transaction when there is one, so the caller can
        add its own writes to the same commit.
        """
        if not isinstance(original, Job):
            raise InvalidJobState(f"original must be a Job, got {type(original).__name__}.")
        if not isinstance(patch, dict):
            raise InvalidJobState(f"patch must be a dict, got {type(patch).__name__}.")
        cleaned = clean_job_fields(
            patch, allowed=_COMPLETION_FIELDS, action="complete_job_with_notifications"
        )
        status = cleaned.get("status")
        if status not in TERMINAL_JOB_STATUSES:
            raise InvalidJobState(
                "complete_job_with_notifications needs a terminal status in patch "
                f"(done, error or rejected), got {status!r}."
            )
        requests = validate_notification_requests(original, notifications)
        if original.status in TERMINAL_JOB_STATUSES:
            return None
        jobs = Job.objects.using(self.using)
        try:
            with transaction.atomic(using=self.using):
                moved = jobs.filter(
                    id=original.id, status=original.status, claim_token=original.claim_token
                ).update(**cleaned, **_CLEARED_CLAIM, updated_at=Now())
                if not moved:
                    return None
                job = jobs.get(id=original.id)
                self.append_audit(
                    job=job,
                    event="finished",
                    detail={
                        "status": str(status),
                        "previous_status": original.status,
                        "notifications": len(requests),
                    },
                )
                Notification.objects.using(self.using).bulk_create(
                    Notification(
                        job_id=job.id,
                        channel=request.channel,
                        destination=request.destination,
                        payload=request.payload,
                        idempotency_key=str(request.idempotency_key),
                    )
                    for request in requests
                )
        except IntegrityError as exc:
            if not violates(
                exc,
                constraint=NOTIFICATION_UNIQUE_IDEMPOTENCY_KEY,
                table=Notification._meta.db_table,
                columns=["idempotency_key"],
            ):
                raise
            keys = [str(request.idempotency_key) for request in requests]
            taken = (
                Notification.objects.using(self.using)
                .filter(idempotency_key__in=keys)
                .values_list("idempotency_key", flat=True)
                .first()
            )
            key = taken or keys[0]
            raise DuplicateNotification(
                f"idempotency_key {key!r} is already in the outbox; the job was not changed.",
                idempotency_key=key,
            ) from exc
        return job

    @property
    def notification_outbox(self) -> DatabaseNotificationOutbox:
        return DatabaseNotificationOutbox(self.using, store=self)

    def requeue_delivery_job_once(
        self, *, notification_id: JobId, dlq_key: str, requested_by: str
    ) -> DeliveryRequeueOutcome:
        """See :meth:`StateStore.requeue_delivery_job_once`.

        The notification row is locked first, so concurrent replays of one dead letter
        run one after the other; a key already used for this row answers
        ``ALREADY_REQUEUED`` even after the row was delivered or dead again, and one used
        for another row ``KEY_CONFLICT``. The row keeps its id, idempotency key
        and ``last_error``; ``attempts`` restarts at 0 and it is due at once. A
        ``dlq_resend_ok`` audit entry names ``requested_by``. Markers are permanent:
        pruning the notification does not free its key.
        """
        pk = parse_uuid(notification_id, field="notification_id")
        require_text(dlq_key, field="dlq_key")
        require_text(requested_by, field="requested_by")
        rows = Notification.objects.using(self.using)
        markers = DeliveryReplay.objects.using(self.using)
        with transaction.atomic(using=self.using):
            locked = rows.filter(id=pk)
            if connections[self.using].vendor == "postgresql":
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
                with transaction.atomic(using=self.using):
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
            self.append_audit(
                job=row.job_id,
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
