"""SQLite: one writer at a time, instants stored as text, JSON read with ``JSON_TYPE``
and ``JSON_EXTRACT``.

jobstate requires ``transaction_mode = 'IMMEDIATE'`` here (``jobstate.E040``): every
transaction takes the database's one write lock at ``BEGIN``, so a claim's read and its
write see the same state and no per-thread gate is needed.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.models import (
    CharField,
    F,
    Field,
    FloatField,
    Func,
    IntegerField,
    Q,
    QuerySet,
    TextField,
    Value,
)

from jobstate.models import Job
from jobstate.stores.database.backends.portable import (
    BackendOperations,
    check_instant_lookup,
    input_path,
)

__all__ = ["SQLiteOperations"]


class SQLiteOperations(BackendOperations):
    vendor = "sqlite"
    # What Now() compiles to here: the clock's text, to the millisecond.
    now_sql = "STRFTIME('%%Y-%%m-%%d %%H:%%M:%%f', 'NOW')"
    # The embedded backend: its tables stay small, and it has no estimate to fall back on.
    counts_exactly = True

    def lock_thread(self, thread_id: int) -> None:
        """Nothing: the transaction already holds the database's one write lock."""

    def try_lock_thread(self, thread_id: int) -> bool:
        return True

    # --- instants: text in two spellings ---------------------------------------------
    #
    # Instants are written two ways: by the database's clock (Now(), the columns'
    # db_default) and by Django from a Python datetime. SQLite stores text, and the two
    # writers spell the same instant differently: its clock writes milliseconds
    # (2026-12-02 04:59:54.748), Django writes microseconds (...54.748000, or no fraction
    # at all on a whole second), and SQLite compares the text. A value read back from a
    # column the database's clock wrote, handed back as a parameter, is then not equal
    # to the row it came from, and sorts after it.

    def instant_filter(self, field: str, lookup: str, instant: datetime) -> Q:
        """``instant`` handed over in each spelling a writer may have stored it in: a row
        equals it when its text is one of them, is before it when its text sorts before
        the first, after it when it sorts after the last (every spelling has the same
        fixed-width prefix, so no other instant's text falls between them)."""
        check_instant_lookup(lookup)
        connection = self.connection
        spellings = _spellings(str(connection.ops.adapt_datetimefield_value(instant)))
        if lookup == "exact":
            matches = Q()
            for text in spellings:
                matches |= Q(**{field: Value(text)})
            return matches
        # Wrapped in Value, the text reaches SQLite as it is (a str given to a
        # DateTimeField lookup would be parsed and written back in Django's spelling).
        bound = spellings[0] if lookup in ("lt", "gte") else spellings[-1]
        return Q(**{f"{field}__{lookup}": Value(bound)})

    def clock_instant(self, instant: datetime) -> datetime | Value:
        """``instant`` in the clock's own spelling, so it compares with what the clock
        wrote as the same instant."""
        text = instant.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        return Value(text[:-3] if instant.microsecond % 1000 == 0 else text)

    # --- the jobs list's search ------------------------------------------------------

    def filter_input(self, rows: QuerySet[Job], value: dict[str, Any]) -> QuerySet[Job]:
        """``JSON_TYPE`` names the value's type (null, true, false, integer, real, text,
        array or object); ``JSON_EXTRACT`` gives a number or a text as an SQL value."""
        path, leaf, alias = input_path(rows, value)
        json_type = Func(F("input"), path, function="JSON_TYPE", output_field=CharField())
        if leaf is None or isinstance(leaf, bool):
            kind = "null" if leaf is None else ("true" if leaf else "false")
            return rows.alias(**{alias: json_type}).filter(**{alias: kind})
        field: Field[Any, Any] = (
            TextField()
            if isinstance(leaf, str)
            else (IntegerField() if isinstance(leaf, int) else FloatField())
        )
        kinds = ["text"] if isinstance(leaf, str) else ["integer", "real"]
        extracted = Func(F("input"), path, function="JSON_EXTRACT", output_field=field)
        return rows.alias(**{f"{alias}_type": json_type, alias: extracted}).filter(
            **{f"{alias}_type__in": kinds, alias: leaf}
        )


def _spellings(text: str) -> list[str]:
    """The texts SQLite may hold for the instant Django spells ``text``, in text order:
    Django's own, and the clock's milliseconds when the instant has no finer part."""
    if "." not in text:
        return [text, f"{text}.000"]
    if text.endswith("000"):
        return [text[:-3], text]
    return [text]
