"""A clock for tests: :class:`FakeClock` only moves when a test moves it, so timings
are exact instead of slept for. ``Clock`` and ``SystemClock`` live in :mod:`jobstate.core.clock`
and are re-exported here for convenience.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

from jobstate.core.clock import Clock, SystemClock

__all__ = ["T0", "Clock", "FakeClock", "SystemClock"]

#: The instant a :class:`FakeClock` starts at unless told otherwise (2023-11-14 22:13:20 UTC).
T0 = datetime.fromtimestamp(1_700_000_000, UTC)


class FakeClock:
    """A clock that stands still until :meth:`advance` moves it. Safe to share between
    threads: reads and moves are serialised."""

    def __init__(self, start: datetime = T0) -> None:
        _check_aware(start)
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, delta: timedelta) -> datetime:
        """Move the clock by ``delta`` and return the new instant. A negative ``delta``
        moves it back, to model a host clock that jumps."""
        if not isinstance(delta, timedelta):
            raise TypeError(f"advance() takes a datetime.timedelta, got {type(delta).__name__}.")
        with self._lock:
            self._now += delta
            return self._now

    def set(self, instant: datetime) -> None:
        """Jump to ``instant`` (an aware ``datetime``)."""
        _check_aware(instant)
        with self._lock:
            self._now = instant

    def __repr__(self) -> str:
        return f"FakeClock({self.now().isoformat()})"


def _check_aware(value: datetime) -> None:
    if not isinstance(value, datetime):
        raise TypeError(f"a clock instant must be a datetime, got {type(value).__name__}.")
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("a clock instant must be an aware datetime (it has no time zone).")
