"""The outbox relay: delivers notifications after their transition committed.

One call of :func:`deliver_notifications` is one pass: claim a batch of due rows (one
short transaction), send each through its channel with no transaction open, then settle
each row (one short transaction per row, which also records the attempt). Run passes from
a loop, a cron job or a Celery beat task; any number of relays may run at once.

Guarantees:

- **Nothing is lost.** Rows are written with the transition that caused them; a relay
  that crashes after claiming leaves its rows ``delivering`` until the lease ends, then
  they are due again.
- **At least once, never twice at once.** A row is held by one relay at a time (the
  claim's lease); a send that succeeded but whose settle was lost (a crash, a lease
  taken over) is sent again, with the same idempotency key for the receiver to drop.
- **No transaction spans a send.** The relay refuses to run inside one
  (:class:`~jobstate.exceptions.TransactionNotAllowed`).
- **Database failures are documented errors.** A failed claim or settle raises
  :class:`~jobstate.exceptions.StoreError` (``StoreUnavailable``, ``StoreConflict`` or
  ``StoreTimeout`` when the cause is known, each ``retryable``), whatever outbox the
  store hands out; a lost connection is dropped, so the next pass reconnects. The rows
  the failed pass holds are due again when their lease ends.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from jobstate.core.attempt_log import exception_message, exception_traceback
from jobstate.core.conf import jobstate_settings
from jobstate.core.imports import NotImportable, import_path
from jobstate.core.left_open import roll_back_left_open
from jobstate.core.stop_signals import StopAtOnce
from jobstate.exceptions import DeliveryFailed, TransactionNotAllowed
from jobstate.outbox.channels import Channel
from jobstate.stores import get_state_store
from jobstate.stores.base import NotificationOutbox, NotificationState, StateStore
from jobstate.stores.contracts.validation import parse_limit, require_text, validate_duration
from jobstate.stores.errors import translated_database_errors

if TYPE_CHECKING:
    from jobstate.models import Notification

__all__ = ["DeliveryReport", "default_relay_id", "deliver_notifications", "load_channel"]

logger = logging.getLogger("jobstate.relay")

_REDACTED = "[redacted]"


@dataclass(frozen=True)
class DeliveryReport:
    """What one relay pass did.

    ``claimed`` rows end up in exactly one of the other counters: ``delivered``;
    ``retrying`` (failed, due again after a backoff); ``dead`` (failed on the last
    attempt); ``superseded`` (the relay lost the row before settling it: its lease ended
    and another relay took over, so the outcome of this send is not recorded); or
    ``unsent`` (the pass stopped before sending because less than half of the lease was
    left; those rows are due again when the lease ends).
    """

    relay_id: str
    claimed: int = 0
    delivered: int = 0
    retrying: int = 0
    dead: int = 0
    superseded: int = 0
    unsent: int = 0


def default_relay_id() -> str:
    """``<host>:<pid>:<random>``: new at each call, so passes that may run at the same
    time (threads of one process too) settle only their own claims, and readable in the
    admin and the attempt history. A ``--loop`` relay, whose passes run one after
    another, draws one for all of them."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"[:200]


def load_channel(name: str) -> Channel:
    """An instance of the channel class ``JOBSTATE['CHANNELS'][name]``. An unknown name
    or a path that does not import raises :class:`~jobstate.exceptions.DeliveryFailed`,
    so the notification fails (and can be replayed once the setting is fixed)."""
    path = jobstate_settings.CHANNELS.get(name)
    if path is None:
        raise DeliveryFailed(f"no channel named {name!r} in JOBSTATE['CHANNELS'].")
    # A module that raises anything at import fails the channel's sends (replayable
    # once fixed) instead of stopping the relay.
    try:
        cls = import_path(path)
    except NotImportable as exc:
        raise DeliveryFailed(f"cannot import channel {name!r} ({path}): {exc.reason}") from exc
    channel: Channel = cls()
    return channel


def deliver_notifications(
    *,
    relay_id: str | None = None,
    limit: int | None = None,
    lease: timedelta | None = None,
    store: StateStore | None = None,
) -> DeliveryReport:
    """Claim up to ``limit`` due notifications (default ``OUTBOX_BATCH_SIZE``) for
    ``lease`` (default ``OUTBOX_LEASE``), send each through its channel and settle it.

    ``relay_id`` names this pass in the rows and the attempt history; it must be unique
    among running relays (the default is). ``store`` defaults to
    :func:`~jobstate.stores.get_state_store`. Sends run one after another; a pass stops
    sending once less than half of the lease is left, so a slow receiver cannot keep a
    row past its lease (where a second relay could send it at the same time). Size
    ``limit`` so that a batch's sends fit in half the lease.

    A channel's failure message (with ``WEBHOOK_SECRET`` masked should it ever appear)
    becomes the attempt's error and the row's ``last_error``; an exception other than
    :class:`~jobstate.exceptions.DeliveryFailed` is a bug in the channel: it is logged
    with its traceback and fails the attempt the same way, so one broken channel does not
    strand the rest of the batch.

    A database failure ends the pass with :class:`~jobstate.exceptions.StoreError`. A
    notification whose send succeeded but whose settle failed is sent again once its
    lease ends (at least once, same idempotency key); the rows not sent yet are due again
    then too.
    """
    store = get_state_store() if store is None else store
    using = getattr(store, "using", DEFAULT_DB_ALIAS)
    if connections[using].in_atomic_block:
        raise TransactionNotAllowed(
            "deliver_notifications() must run outside a database transaction: it sends "
            "to receivers, and a transaction held open across those calls would hold "
            "the outbox rows' locks and could commit the claim after the send."
        )
    relay = default_relay_id() if relay_id is None else require_text(relay_id, field="relay_id")
    count = parse_limit(limit, default=jobstate_settings.OUTBOX_BATCH_SIZE)
    duration = validate_duration(
        jobstate_settings.OUTBOX_LEASE if lease is None else lease,
        field="lease",
        allow_zero=False,
    )
    outbox = store.notification_outbox
    claimed_at = time.monotonic()
    with _translated(outbox, "claim_due", using):
        rows = outbox.claim_due(relay_id=relay, limit=count, lease=duration)
    counts = {"delivered": 0, "retrying": 0, "dead": 0, "superseded": 0, "unsent": 0}
    channels: dict[str, Channel | str] = {}
    for index, row in enumerate(rows):
        if time.monotonic() - claimed_at > duration.total_seconds() / 2:
            counts["unsent"] = len(rows) - index
            logger.warning(
                "relay %s: half of the %ss lease passed; %d claimed notifications are left "
                "for the next pass",
                relay,
                duration.total_seconds(),
                counts["unsent"],
            )
            break
        started_at = timezone.now()
        error = _send(row, channels)
        if error is None:
            with _translated(outbox, "mark_delivered", using):
                delivered = outbox.mark_delivered(
                    notification_id=row.id, relay_id=relay, started_at=started_at
                )
            if delivered:
                counts["delivered"] += 1
            else:
                counts["superseded"] += 1
                logger.warning(
                    "relay %s: notification %s was sent but another relay took it over "
                    "first; it will be sent again",
                    relay,
                    row.id,
                )
            continue
        with _translated(outbox, "mark_failed", using):
            state = outbox.mark_failed(
                notification_id=row.id, relay_id=relay, error=error, started_at=started_at
            )
        if state is None:
            counts["superseded"] += 1
        elif state == NotificationState.DEAD:
            counts["dead"] += 1
            logger.error(
                "relay %s: notification %s (%s) is dead after %d attempts: %s",
                relay,
                row.id,
                row.channel,
                row.attempts,
                error,
            )
        else:
            counts["retrying"] += 1
            logger.warning(
                "relay %s: notification %s (%s) attempt %d failed: %s",
                relay,
                row.id,
                row.channel,
                row.attempts,
                error,
            )
    return DeliveryReport(relay_id=relay, claimed=len(rows), **counts)


def _translated(
    outbox: NotificationOutbox, method: str, using: str
) -> AbstractContextManager[None]:
    """Database errors of one outbox call as documented store errors: an outbox is
    pluggable, and the relay loop must tell a lost connection from a bug."""
    return translated_database_errors(f"{type(outbox).__name__}.{method}", using)


def _send(row: Notification, channels: dict[str, Channel | str]) -> str | None:
    """Send one row; ``None`` on success, else the error text to record."""
    channel = channels.get(row.channel)
    if channel is None:
        try:
            channel = load_channel(row.channel)
        except DeliveryFailed as exc:
            channel = str(exc)
        # Loaded once per pass: every row of a channel sees the same configuration.
        channels[row.channel] = channel
    if isinstance(channel, str):
        return _redact(channel)
    try:
        channel.send(row)
    except DeliveryFailed as exc:
        error: str | None = exception_message(exc) or type(exc).__name__
    except (StopAtOnce, KeyboardInterrupt):
        # The operator stops the relay (a second stop signal, or Ctrl-C with no handler
        # installed): what this pass claimed and did not settle is due again after its
        # lease.
        raise
    except BaseException as exc:
        # A bug in a channel, whatever it raises (sys.exit() and GeneratorExit too): the
        # row must still be settled so the batch moves on. Logged with its traceback,
        # masked like the stored error: a channel's own message may quote the signing
        # key. Its message is read safely: a channel's __str__ may raise as well.
        logger.error(
            "relay: channel %r crashed on notification %s\n%s",
            row.channel,
            row.id,
            _redact(exception_traceback(exc)),
        )
        error = f"{type(exc).__name__}: {exception_message(exc)}"
    else:
        error = None
    finally:
        # A channel that left a transaction open would otherwise have the relay's own
        # settle of this row, and every later claim, run in it, never committed.
        left_open = roll_back_left_open(f"channel {row.channel!r}")
    if left_open is not None:
        logger.error("relay: notification %s: %s", row.id, left_open)
        error = str(left_open) if error is None else f"{error}; {left_open}"
    return None if error is None else _redact(error)


def _redact(text: str) -> str:
    """Mask the webhook signing key should a channel ever put it in an error."""
    secret = jobstate_settings.WEBHOOK_SECRET
    if isinstance(secret, bytes):
        secret = secret.decode("utf-8", "replace")
    if secret:
        text = text.replace(secret, _REDACTED)
    return text
