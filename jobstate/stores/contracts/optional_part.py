"""The state store's optional capabilities beyond the job queue: the notification
outbox, dead-letter replay, metrics, schema readiness and the maintenance sweeps. Each
is offered by a store that sets its ``supports_*`` flag
(:class:`~jobstate.stores.contracts.primitives.StateStorePrimitives`)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jobstate.core.states import (
    TERMINAL_JOB_STATUSES,
    DeliveryRequeueOutcome,
    JobId,
    JobOperationalMetrics,
    NotificationRequest,
    Readiness,
)
from jobstate.exceptions import InvalidJobState
from jobstate.stores.contracts.outbox_repository import NotificationOutbox
from jobstate.stores.contracts.primitives import StateStorePrimitives
from jobstate.stores.contracts.validation import (
    JOB_COMPLETION_FIELDS,
    clean_job_fields,
    parse_uuid,
    require_text,
    validate_instant,
    validate_notification_requests,
)

if TYPE_CHECKING:
    from jobstate.models import Job
    from jobstate.stores.contracts.sweep_store import SweepStore

__all__ = ["OptionalPart"]


class OptionalPart(StateStorePrimitives):
    """The optional capabilities; see the module docstring."""

    def complete_job_with_notifications(
        self,
        original: Job,
        patch: dict[str, Any],
        notifications: Iterable[NotificationRequest] = (),
    ) -> Job | None:
        """Fenced terminal transition plus outbox rows in one transaction: applies
        ``patch`` (its ``status`` must be terminal) only while the job is still in
        ``original.status`` with ``original.claim_token``, clears the claim fields, writes
        a ``finished`` audit entry and one ``Notification`` per request. Nothing is sent
        inside the transaction. A stale ``original`` writes nothing and returns ``None``.

        An ``original`` that is already terminal is settled, so it also answers ``None``.
        ``patch`` may not name claim fields (they are cleared). Each notification's
        idempotency key defaults to
        :func:`~jobstate.stores.contracts.validation.default_idempotency_key`; a key already
        in the outbox raises :class:`~jobstate.exceptions.DuplicateNotification` and
        rolls back the whole transition. Runs in the caller's transaction when there is
        one, so the caller can add its own writes to the same commit."""
        from jobstate.models import Job

        self._require(self.supports_outbox, "supports_outbox", "complete_job_with_notifications")
        if not isinstance(original, Job):
            raise InvalidJobState(f"original must be a Job, got {type(original).__name__}.")
        if not isinstance(patch, dict):
            raise InvalidJobState(f"patch must be a dict, got {type(patch).__name__}.")
        cleaned = clean_job_fields(
            patch, allowed=JOB_COMPLETION_FIELDS, action="complete_job_with_notifications"
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
        return self._complete_with_notifications(original, cleaned, requests)

    @property
    def notification_outbox(self) -> NotificationOutbox:
        """The outbox repository relays use (claim due rows, mark delivered or failed)."""
        self._require(self.supports_outbox, "supports_outbox", "notification_outbox")
        return self._notification_outbox()

    def requeue_delivery_job_once(
        self, *, notification_id: JobId, dlq_key: str, requested_by: str
    ) -> DeliveryRequeueOutcome:
        """Send a dead notification (the original row, never a copy) back to pending
        together with a permanent :class:`~jobstate.models.DeliveryReplay` marker for
        ``dlq_key``, in one transaction; a key replays at most once. A key already used
        for this notification answers ``ALREADY_REQUEUED``, one used for another
        notification ``KEY_CONFLICT``."""
        self._require(
            self.supports_delivery_replay, "supports_delivery_replay", "requeue_delivery_job_once"
        )
        pk = parse_uuid(notification_id, field="notification_id")
        require_text(dlq_key, field="dlq_key")
        require_text(requested_by, field="requested_by")
        return self._requeue_delivery(pk, dlq_key, requested_by)

    def operational_metrics_snapshot(
        self, now: datetime | None = None, *, exact: bool = False
    ) -> JobOperationalMetrics:
        """The six operational figures at ``now`` (default: the store's clock). A store
        may estimate the counts of finished jobs on a large table (it names them in
        ``estimated_statuses``); ``exact=True`` asks for exact counts whatever they cost."""
        self._require(self.supports_metrics, "supports_metrics", "operational_metrics_snapshot")
        instant = None if now is None else validate_instant(now, field="now")
        return self._metrics_snapshot(instant, exact)

    def schema_readiness(self) -> Readiness:
        """Whether the store's schema is usable. Never raises: any error means not ready."""
        self._require(self.supports_readiness, "supports_readiness", "schema_readiness")
        return self._schema_readiness()

    def sweep_store(self) -> SweepStore:
        """A new :class:`~jobstate.stores.contracts.sweep_store.SweepStore` over this store's jobs,
        audit
        entries, locks and outbox, for one sweep of :mod:`jobstate.maintenance`."""
        self._require(self.supports_sweeps, "supports_sweeps", "sweep_store")
        return self._sweep_store()
