"""Clocks: the one thing the runner and the in-memory stores ask of time, and how an
instant read back from the database is compared with the column it came from.

A clock is any object with a ``now()`` method returning an aware ``datetime``. The runner
takes one so tests can drive recorded instants; liveness instants never come from it
(they come from the store's own clock).

Instants in the database are written two ways: by the database's clock (``Now()``, the
columns' ``db_default``) and by Django from a Python ``datetime``. PostgreSQL and MariaDB
store both as the same timestamp, to the microsecond. SQLite stores text, and the two
writers spell the same instant differently: its clock writes milliseconds
(``2026-12-02 04:59:54.748``), Django writes microseconds (``…54.748000``, or no
fraction at all on a whole second), and SQLite compares the text. A value read back from
a column the database's clock wrote, handed back as a parameter, is then not equal to
the row it came from, and sorts after it. Every filter on such a value goes through
:func:`instant_filter`, which compares in the database's own terms.

MariaDB and MySQL answer the clock (``CURRENT_TIMESTAMP``) in the session's time zone,
the server's own (``SYSTEM``) unless set, while Django writes and reads UTC there: a
server whose machine is not on UTC would stamp schedules' starts, jobs and audit
entries hours off, and run delayed jobs and retries hours early or late.
:func:`clock_in_utc` puts each new connection's session on UTC (connected to
``connection_created`` by :mod:`jobstate.signals`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Protocol, runtime_checkable

from django.conf import settings
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Q, Value

__all__ = ["Clock", "SystemClock", "clock_in_utc", "instant_filter"]


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


#: The lookups :func:`instant_filter` takes.
INSTANT_LOOKUPS = frozenset({"exact", "lt", "lte", "gt", "gte"})


def instant_filter(using: str, field: str, lookup: str, instant: datetime) -> Q:
    """The filter ``field__lookup=instant`` on database ``using``, true exactly when the
    stored instant compares so with ``instant``, whichever clock wrote the row (see the
    module's docstring): ``lookup`` is one of ``exact``, ``lt``, ``lte``, ``gt``, ``gte``.

    On SQLite ``instant`` is handed over in each spelling a writer may have stored it in:
    a row equals it when its text is one of them, is before it when its text sorts
    before the first, after it when it sorts after the last (every spelling has the same
    fixed-width prefix, so no other instant's text falls between them). Other databases
    compare timestamps and get ``instant`` as it is."""
    if lookup not in INSTANT_LOOKUPS:
        raise ValueError(f"lookup must be one of {sorted(INSTANT_LOOKUPS)}, got {lookup!r}.")
    connection = connections[using]
    if connection.vendor != "sqlite":
        return Q(**{f"{field}__{lookup}": instant})
    spellings = _sqlite_spellings(str(connection.ops.adapt_datetimefield_value(instant)))
    if lookup == "exact":
        matches = Q()
        for text in spellings:
            matches |= Q(**{field: Value(text)})
        return matches
    # Wrapped in Value, the text reaches SQLite as it is (a str given to a DateTimeField
    # lookup would be parsed and written back in Django's spelling).
    bound = spellings[0] if lookup in ("lt", "gte") else spellings[-1]
    return Q(**{f"{field}__{lookup}": Value(bound)})


def _sqlite_spellings(text: str) -> list[str]:
    """The texts SQLite may hold for the instant Django spells ``text``, in text order:
    Django's own, and the clock's milliseconds when the instant has no finer part."""
    if "." not in text:
        return [text, f"{text}.000"]
    if text.endswith("000"):
        return [text[:-3], text]
    return [text]


def clock_in_utc(*, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """On a new MariaDB or MySQL connection that Django reads and writes in UTC
    (``USE_TZ`` and no ``TIME_ZONE`` of the database's own), set the session's time zone
    to UTC, so the database's clock speaks the same time as every instant Django
    writes. Other databases, and hosts that keep local times, are left as they are."""
    if connection.vendor != "mysql" or not settings.USE_TZ or connection.timezone_name != "UTC":
        return
    with connection.cursor() as cursor:
        cursor.execute("SET time_zone = '+00:00'")
