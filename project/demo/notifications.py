"""Demo receivers for the ``callable`` notification channel.

The demo has no webhook receiver to call, so its jobs notify these functions instead
(destination ``project.demo.notifications.<name>``). Each stands for a receiver with a
different temper, so the admin shows every fate of an outbox row: delivered at once,
delivered after a retry, and dead-lettered.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from jobstate.exceptions import DeliveryFailed
from jobstate.outbox.channels import notification_handler

if TYPE_CHECKING:
    from jobstate.models import Notification

__all__ = ["ACCEPTS", "ALWAYS_FAILS", "BUSY_ONCE", "accepts", "always_fails", "busy_once"]

logger = logging.getLogger("project.demo.notifications")

ACCEPTS = f"{__name__}.accepts"
BUSY_ONCE = f"{__name__}.busy_once"
ALWAYS_FAILS = f"{__name__}.always_fails"


@notification_handler
def accepts(notification: Notification) -> None:
    """A healthy receiver: takes every notification."""
    logger.info(
        "demo receiver got %s (attempt %d)", notification.idempotency_key, notification.attempts
    )


@notification_handler
def busy_once(notification: Notification) -> None:
    """A receiver that answers "busy" to the first attempt and takes the retry."""
    if notification.attempts < 2:
        raise DeliveryFailed(
            "the demo receiver answers busy to a first attempt on purpose; the retry gets through"
        )


@notification_handler
def always_fails(notification: Notification) -> None:
    """A receiver that is never reachable: its notifications end as dead letters."""
    raise DeliveryFailed(
        "the demo pager is offline on purpose: this notification ends as a dead letter"
    )
