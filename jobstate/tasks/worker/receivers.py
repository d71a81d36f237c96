"""Sending a signal to every receiver, whatever each raises.

Django's ``Signal.send_robust`` catches ``Exception`` only: a receiver that raises
``SystemExit``, ``KeyboardInterrupt`` or another ``BaseException`` ends the sending, so
the receivers after it are not called, and the exception reaches the sender. The worker
sends ``task_finished`` to the host's receivers, whose code it does not trust, so
:func:`send_to_every_receiver` catches whatever a receiver raises, logs it as
``send_robust`` logs an ``Exception``, and calls the next.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from asgiref.sync import async_to_sync
from django.dispatch import Signal

__all__ = ["send_to_every_receiver"]

#: Where ``send_robust`` logs a receiver that raised.
_dispatch_logger = logging.getLogger("django.dispatch")


def send_to_every_receiver(signal: Signal, sender: Any, **named: Any) -> list[tuple[Any, Any]]:
    """``signal.send_robust(sender, **named)``, but a receiver's ``BaseException`` is
    caught, logged and returned as an ``Exception`` is: each receiver's (receiver,
    response), the exception it raised as its response. The synchronous receivers are
    called in order, then the asynchronous ones together, as ``send_robust`` does."""
    if not signal.receivers:
        return []
    # The receivers one by one: send_robust gives no way to go on after one of them.
    sync_receivers, async_receivers = signal._live_receivers(sender)
    responses: list[tuple[Any, Any]] = []
    for receiver in sync_receivers:
        try:
            response = receiver(signal=signal, sender=sender, **named)
        except BaseException as exc:  # the host's code: whatever it raises
            _log_failure(receiver, exc)
            response = exc
        responses.append((receiver, response))
    if async_receivers:

        async def guarded(receiver: Any) -> Any:
            try:
                return await receiver(signal=signal, sender=sender, **named)
            # Caught in its coroutine: asyncio lets SystemExit and KeyboardInterrupt out
            # of the event loop, past the other receivers.
            except BaseException as exc:
                _log_failure(receiver, exc)
                return exc

        async def send_all() -> list[Any]:
            return await asyncio.gather(*(guarded(receiver) for receiver in async_receivers))

        responses += zip(async_receivers, async_to_sync(send_all)(), strict=True)
    return responses


def _log_failure(receiver: Any, exc: BaseException) -> None:
    """Log ``exc`` as ``send_robust`` logs a receiver's ``Exception``."""
    name = getattr(receiver, "__qualname__", repr(receiver))
    _dispatch_logger.error("Error calling %s in Signal.send_robust() (%s)", name, exc, exc_info=exc)
