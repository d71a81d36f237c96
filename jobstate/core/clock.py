"""Clocks: the one thing the runner and the in-memory stores ask of time.

A clock is any object with a ``now()`` method returning an aware ``datetime``. The runner
takes one so tests can drive recorded instants; liveness instants never come from it
(they come from the store's own clock).

How an instant read back from the database compares with the column it came from, and
how a new connection's session is put on the clock Django writes in, differ per backend:
the backend's operations object answers both (``instant_filter`` and
``prepare_connection`` in :mod:`jobstate.stores.database.backends`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

__all__ = ["DURATION_LIMIT", "Clock", "SystemClock"]

#: Longest duration jobstate accepts, in a setting or a store. The database adds
#: durations to its clock, and an instant past the year 9999 can be neither computed by
#: every backend nor read back into a Python ``datetime``.
DURATION_LIMIT = timedelta(days=365 * 1000)


@runtime_checkable
class Clock(Protocol):
    """Anything that can tell the current instant."""

    def now(self) -> datetime:
        """Return the current instant as an aware ``datetime``."""
        ...


class SystemClock:
    """The wall clock, in UTC."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def __repr__(self) -> str:
        return "SystemClock()"
