"""Relay channels: how a notification leaves the database.

A channel is a class named in ``JOBSTATE['CHANNELS']`` whose instances have one method,
``send(notification)``. It returns when the receiver has accepted the notification and
raises :class:`~jobstate.exceptions.DeliveryFailed` otherwise. The relay
(:mod:`jobstate.outbox.relay`) calls it outside any database transaction, records the attempt and
retries failures later, so a channel may be called more than once for one notification:
every channel hands the receiver the notification's idempotency key.

Shipped channels:

- :class:`WebhookChannel` (``"webhook"``): a signed JSON ``POST``.
- :class:`EmailChannel` (``"email"``): an e-mail through Django's mail backend.
- :class:`CallableChannel` (``"callable"``): a Python function marked with
  :func:`notification_handler`.

Receivers of webhooks check the signature with :func:`verify_webhook_signature`.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import smtplib
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from datetime import timedelta
from typing import IO, TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import urlsplit

from django.core.mail import EmailMultiAlternatives
from django.core.mail.utils import DNS_NAME
from django.views.decorators.debug import sensitive_variables

from jobstate import __version__
from jobstate.core.conf import jobstate_settings
from jobstate.core.imports import NotImportable, import_path
from jobstate.exceptions import DeliveryFailed

if TYPE_CHECKING:
    from email.message import Message

    from jobstate.models import Notification

__all__ = [
    "ATTEMPT_HEADER",
    "IDEMPOTENCY_HEADER",
    "NOTIFICATION_HEADER",
    "SIGNATURE_HEADER",
    "CallableChannel",
    "Channel",
    "EmailChannel",
    "WebhookChannel",
    "notification_handler",
    "sign_webhook",
    "verify_webhook_signature",
    "webhook_body",
]

#: ``t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<body>">``.
SIGNATURE_HEADER = "X-Jobstate-Signature"
#: The notification's idempotency key: the same on every attempt of one notification.
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: The outbox row's id.
NOTIFICATION_HEADER = "X-Jobstate-Notification"
#: Which attempt this is (1 for the first).
ATTEMPT_HEADER = "X-Jobstate-Attempt"

#: How much of a webhook response the channel reads (it only needs the status).
_RESPONSE_READ_LIMIT = 64 * 1024
_MAX_REDIRECTS = 3
_HANDLER_MARK = "__jobstate_notification_handler__"


class Channel(Protocol):
    """What the relay needs of a channel."""

    def send(self, notification: Notification) -> None:
        """Deliver ``notification`` or raise :class:`~jobstate.exceptions.DeliveryFailed`
        with a message fit for an operator (never a secret)."""
        ...


# --- webhook ---------------------------------------------------------------------------


def webhook_body(payload: Any) -> bytes:
    """The exact bytes a webhook sends for ``payload``: compact UTF-8 JSON."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


# Every function that holds the signing key marks it with @sensitive_variables: when a
# receiver's verification or a signature crashes, Django's error reports (the e-mail to
# ADMINS, and trackers that read frame variables through Django's reporter filter) show
# stars for it instead of the key.


@sensitive_variables("secret")
def _key_bytes(secret: str | bytes) -> bytes:
    if isinstance(secret, bytes):
        return secret
    if isinstance(secret, str):
        return secret.encode("utf-8")
    raise TypeError(f"a webhook secret must be str or bytes, got {type(secret).__name__}.")


@sensitive_variables("secret")
def _digest(secret: str | bytes, body: bytes, timestamp: int) -> str:
    signed = str(timestamp).encode("ascii") + b"." + body
    return hmac.new(_key_bytes(secret), signed, hashlib.sha256).hexdigest()


@sensitive_variables("secret")
def sign_webhook(secret: str | bytes, body: bytes, *, timestamp: int | None = None) -> str:
    """The ``X-Jobstate-Signature`` value for ``body``: ``t=<timestamp>,v1=<hex>``, where
    ``<hex>`` is HMAC-SHA256 keyed with ``secret`` over ``"<timestamp>." + body``.
    ``timestamp`` (Unix seconds) defaults to now."""
    if not isinstance(body, bytes):
        raise TypeError(f"body must be bytes, got {type(body).__name__}.")
    stamp = int(time.time()) if timestamp is None else timestamp
    return f"t={stamp},v1={_digest(secret, body, stamp)}"


def _unix_seconds(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= 20


@sensitive_variables("secret", "expected")
def verify_webhook_signature(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    tolerance: timedelta = timedelta(minutes=5),
    *,
    now: float | None = None,
) -> bool:
    """Whether ``header`` (the ``X-Jobstate-Signature`` value) signs ``body`` with
    ``secret`` at an instant within ``tolerance`` of ``now`` (Unix seconds, default the
    current time).

    Pass the raw request body, byte for byte, before any JSON parsing. Several ``v1=``
    entries are accepted (one matching is enough) so a sender can sign with an old and a
    new secret while keys rotate. The comparison runs in constant time. A missing or
    malformed header is simply not valid. The tolerance bounds how long a captured
    request can be replayed; deduplicate by the ``Idempotency-Key`` header within it.
    """
    if not isinstance(body, bytes):
        raise TypeError(f"body must be bytes, got {type(body).__name__}.")
    if not isinstance(tolerance, timedelta) or tolerance < timedelta(0):
        raise ValueError(f"tolerance must be a non-negative timedelta, got {tolerance!r}.")
    if not isinstance(header, str):
        return False
    timestamps: list[str] = []
    candidates: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t":
            timestamps.append(value)
        elif name == "v1":
            candidates.append(value)
    # A timestamp of ASCII digits, short enough for int() (str.isdigit() takes "²",
    # which int() refuses, and int() refuses more than 4,300 digits): a malformed
    # header is not valid, never an error.
    if len(timestamps) != 1 or not candidates or not _unix_seconds(timestamps[0]):
        return False
    stamp = int(timestamps[0])
    current = time.time() if now is None else now
    if abs(current - stamp) > tolerance.total_seconds():
        return False
    expected = _digest(secret, body, stamp)
    # Every candidate is compared, so the time taken does not reveal which one matched;
    # as bytes, since compare_digest refuses a str with a non-ASCII character (a header
    # is read as Latin-1, so anyone can send one), which no hex digest holds anyway.
    key = expected.encode("ascii")
    given = [candidate.encode("utf-8", "surrogatepass") for candidate in candidates]
    matches = [hmac.compare_digest(key, candidate) for candidate in given]
    return any(matches)


class _SameHostRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to the same host, never from https to http, and keep the
    method, body and headers: turning a signed ``POST`` into a bodiless ``GET`` (what
    browsers do for 301/302/303) would report success for a request that never carried
    the notification."""

    max_redirections = _MAX_REDIRECTS

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        old, new = urlsplit(req.full_url), urlsplit(newurl)
        same_host = (old.hostname or "").lower() == (new.hostname or "").lower()
        downgrade = old.scheme == "https" and new.scheme != "https"
        if not same_host or downgrade or new.scheme not in ("http", "https"):
            fp.close()
            where = "another host" if not same_host else "an insecure or unsupported scheme"
            raise DeliveryFailed(
                f"refused a redirect (HTTP {code}) from {old.hostname} to {where} "
                f"({new.scheme}://{new.hostname})."
            )
        return urllib.request.Request(
            newurl,
            data=req.data,
            headers=dict(req.header_items()),
            method=req.get_method(),
        )


class WebhookChannel:
    """``POST`` the notification's payload as JSON to its destination URL.

    Each request carries ``Content-Type: application/json``, the
    ``X-Jobstate-Signature`` header (see :func:`sign_webhook`), ``Idempotency-Key`` (the
    same on every attempt of one notification), ``X-Jobstate-Notification`` (the outbox
    row's id) and ``X-Jobstate-Attempt``. Any 2xx answer is a delivery; anything else,
    a connection error or a timeout raises :class:`~jobstate.exceptions.DeliveryFailed`.

    ``secret`` defaults to ``JOBSTATE['WEBHOOK_SECRET']`` (required: unsigned webhooks
    are not sent) and ``timeout`` to ``JOBSTATE['WEBHOOK_TIMEOUT']``; the timeout bounds
    connecting and each read. Redirects are followed (at most three) only to the same
    host; see :class:`_SameHostRedirects`. Error messages name the host, never the full
    URL (webhook URLs often embed tokens) and never the secret.
    """

    @sensitive_variables("secret")
    def __init__(
        self, *, secret: str | bytes | None = None, timeout: timedelta | None = None
    ) -> None:
        self._secret = jobstate_settings.WEBHOOK_SECRET if secret is None else secret
        self._timeout = (timeout or jobstate_settings.WEBHOOK_TIMEOUT).total_seconds()
        self._opener = urllib.request.build_opener(_SameHostRedirects)

    def __repr__(self) -> str:
        # Never show the secret, not even in a debugger or a log of locals.
        return f"WebhookChannel(timeout={self._timeout}s)"

    def send(self, notification: Notification) -> None:
        if not self._secret:
            raise DeliveryFailed(
                "JOBSTATE['WEBHOOK_SECRET'] is not set; the webhook channel signs every "
                "request and sends nothing unsigned."
            )
        url = notification.destination
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise DeliveryFailed("the destination is not an http(s) URL with a host.")
        host = parts.hostname
        body = webhook_body(notification.payload)
        request = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={
                "Content-Type": "application/json",
                "User-Agent": f"django-jobstate/{__version__}",
                SIGNATURE_HEADER: sign_webhook(self._secret, body),
                IDEMPOTENCY_HEADER: notification.idempotency_key,
                NOTIFICATION_HEADER: str(notification.id),
                ATTEMPT_HEADER: str(notification.attempts),
            },
        )
        try:
            with self._opener.open(request, timeout=self._timeout) as response:
                response.read(_RESPONSE_READ_LIMIT)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise DeliveryFailed(f"{host} answered HTTP {exc.code} {exc.reason}.") from exc
        except urllib.error.URLError as exc:
            if isinstance(exc.reason, TimeoutError):
                raise DeliveryFailed(f"{host} did not answer within {self._timeout:g}s.") from exc
            raise DeliveryFailed(f"could not reach {host}: {exc.reason}.") from exc
        except TimeoutError as exc:
            raise DeliveryFailed(f"{host} did not answer within {self._timeout:g}s.") from exc
        except (http.client.HTTPException, OSError) as exc:
            raise DeliveryFailed(f"the request to {host} failed: {type(exc).__name__}.") from exc


# --- e-mail ----------------------------------------------------------------------------


class EmailChannel:
    """Send an e-mail through Django's mail backend (``EMAIL_BACKEND``).

    The destination is one address or several separated by commas. The payload holds
    ``subject`` and ``body`` (strings, required), and optionally ``html_body`` and
    ``from_email`` (default ``DEFAULT_FROM_EMAIL``). The ``Message-ID`` is derived from
    the idempotency key, so every attempt of one notification is the same message to
    mail servers and clients that drop duplicates; ``X-Jobstate-Idempotency-Key``
    carries the key itself.
    """

    def send(self, notification: Notification) -> None:
        payload = notification.payload if isinstance(notification.payload, dict) else {}
        subject, body = payload.get("subject"), payload.get("body")
        html_body, from_email = payload.get("html_body"), payload.get("from_email")
        if not isinstance(subject, str) or not isinstance(body, str):
            raise DeliveryFailed("an e-mail payload needs 'subject' and 'body' strings.")
        if html_body is not None and not isinstance(html_body, str):
            raise DeliveryFailed("'html_body' must be a string.")
        if from_email is not None and not isinstance(from_email, str):
            raise DeliveryFailed("'from_email' must be a string.")
        recipients = [part.strip() for part in notification.destination.split(",")]
        if not all(recipients):
            raise DeliveryFailed("the destination must list e-mail addresses separated by commas.")
        key = notification.idempotency_key
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]
        message = EmailMultiAlternatives(
            subject=subject,
            body=body,
            from_email=from_email,
            to=recipients,
            headers={
                "Message-ID": f"<{digest}.jobstate@{DNS_NAME}>",
                "X-Jobstate-Idempotency-Key": key,
            },
        )
        if html_body is not None:
            message.attach_alternative(html_body, "text/html")
        try:
            message.send(fail_silently=False)
        except (smtplib.SMTPException, OSError) as exc:
            raise DeliveryFailed(f"the mail backend refused the message: {exc}") from exc
        except ValueError as exc:  # BadHeaderError: a newline in the subject or a header
            raise DeliveryFailed(f"the message is malformed: {exc}") from exc


# --- Python callables ------------------------------------------------------------------

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def notification_handler(func: _Handler) -> _Handler:
    """Mark ``func`` as a target of the callable channel.

    The channel imports the dotted path stored in a notification's destination; only
    marked functions are called, so a destination cannot turn the relay into a way to
    call arbitrary code. The function receives the
    :class:`~jobstate.models.Notification` (payload, idempotency key, job id, attempt
    number), returns on success and raises to fail the attempt.
    """
    setattr(func, _HANDLER_MARK, True)
    return func


class CallableChannel:
    """Call the function at the notification's destination (a dotted path) with the
    notification. The function must be marked with :func:`notification_handler`. Any
    exception it raises fails the attempt with the exception's type and message."""

    def send(self, notification: Notification) -> None:
        path = notification.destination
        try:
            target = import_path(path)
        except NotImportable as exc:
            raise DeliveryFailed(f"cannot import {path!r}: {exc.reason}") from exc
        if not callable(target) or not getattr(target, _HANDLER_MARK, False):
            raise DeliveryFailed(
                f"{path!r} is not marked with @jobstate.outbox.channels.notification_handler."
            )
        try:
            target(notification)
        except DeliveryFailed:
            raise
        except Exception as exc:
            # The handler is the host's code; whatever it raises is this attempt's failure.
            raise DeliveryFailed(f"{path} raised {type(exc).__name__}: {exc}") from exc
