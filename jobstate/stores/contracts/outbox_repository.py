"""The outbox repository's contract: what a relay calls to claim, settle and inspect
notifications (the NotificationOutbox part of the state contract)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from jobstate.core.states import JobId, NotificationState

if TYPE_CHECKING:
    from jobstate.models import Notification

__all__ = ["NotificationOutbox"]


class NotificationOutbox(ABC):
    """The outbox repository a relay uses. Rows move pending -> delivering (claimed with a
    lease) -> delivered, or back to pending with a backoff, or to dead after the last
    attempt. A relay that dies leaves its rows delivering until the lease ends; then they
    are due again (at-least-once delivery)."""

    @abstractmethod
    def claim_due(self, *, relay_id: str, limit: int, lease: timedelta) -> list[Notification]:
        """Claim up to ``limit`` due pending rows (and delivering rows whose lease ended)
        under ``SKIP LOCKED``: no two relays ever hold the same row at once. Each claim
        counts one attempt, and the row is held until clock + ``lease``."""

    @abstractmethod
    def mark_delivered(
        self, *, notification_id: JobId, relay_id: str, started_at: datetime | None = None
    ) -> bool:
        """Settle a row this relay holds as delivered; ``False`` if it no longer holds it.
        ``started_at`` (when the send began, recorded verbatim in the attempt history)
        defaults to the store's clock."""

    @abstractmethod
    def mark_failed(
        self,
        *,
        notification_id: JobId,
        relay_id: str,
        error: str,
        started_at: datetime | None = None,
    ) -> NotificationState | None:
        """Record a failed attempt of a row this relay holds: back to pending with an
        exponential backoff and jitter, or dead after the last attempt. Returns the new
        state, or ``None`` if the relay no longer holds the row."""

    @abstractmethod
    def dead_letters(self, *, limit: int = 100) -> list[Notification]:
        """The newest dead rows, at most ``limit``."""
