"""The number options of jobstate's management commands, read in one place.

A number option takes what an operator types for a number and nothing else: the ASCII
digits 0-9, and for seconds or days a decimal point. Python's ``int()`` and ``float()``
read more: spaces around the number (``" 5 "``), underscores between its digits
(``"1_000"``), the digits of every script (Arabic-Indic, fullwidth), a plus sign, an
exponent, ``"inf"`` and ``"nan"``. An option read that way takes a value pasted with a
stray space, or typed on another keyboard layout, for a number the operator may not
have meant, so each type here checks the text first and refuses anything else, naming
the value (argparse names the option). A leading minus is read, so that ``-5`` is
refused as out of range rather than as not a number.
"""

from __future__ import annotations

import argparse
import math
import re
from datetime import timedelta
from decimal import Decimal

from jobstate.core.messages import shown
from jobstate.stores.contracts.validation import BIGINT_MAX, DURATION_LIMIT

#: An integer option's text: ASCII digits, after an optional minus.
_INTEGER = re.compile(r"-?[0-9]+")
#: A seconds or days option's text: ASCII digits with an optional decimal point.
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)")

#: Longest ``--interval`` of a relay loop: a wait longer than a day is a typo, and
#: ``threading.Event.wait`` refuses timeouts past ``threading.TIMEOUT_MAX``.
INTERVAL_LIMIT = timedelta(days=1)


def quoted(text: str) -> str:
    """``text`` quoted for an error message, cut when it is long (:func:`shown`)."""
    return shown(repr(text))


def plain(value: object) -> str:
    """``value`` as an error message repeats it unquoted (a number), cut the same way."""
    return shown(str(value))


def integer(text: str) -> int:
    """``text`` as an integer written in the digits 0-9, else ``ArgumentTypeError``."""
    if _INTEGER.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not an integer (digits 0-9 only)")
    try:
        return int(text)
    except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits)
        raise argparse.ArgumentTypeError(f"{quoted(text)} is not an integer: too long") from None


def decimal(text: str, *, unit: str) -> float:
    """``text`` as a number of ``unit`` written in the digits 0-9 with an optional
    decimal point, else ``ArgumentTypeError``."""
    if _DECIMAL.fullmatch(text) is None:
        raise argparse.ArgumentTypeError(
            f"{quoted(text)} is not a number of {unit} (digits 0-9 and a decimal point only)"
        )
    return float(text)


def option_text(value: str | int | float) -> str:
    """A ``call_command`` keyword value as the command line would have given it: a
    float as its decimal digits (``str(0.00001)`` is ``'1e-05'``, which no number
    option reads)."""
    if isinstance(value, float) and math.isfinite(value):
        return format(Decimal(repr(value)), "f")
    return str(value)


def _duration(text: str, *, unit: str, most: float, out_of_range: str = "") -> timedelta:
    """``text`` as a positive number of ``unit`` (``"seconds"`` or ``"days"``), at most
    ``most``, that makes a duration of at least a microsecond, else
    ``ArgumentTypeError``. ``out_of_range``, when given, says both why a number at or
    below 0 and why one above ``most`` is refused (``--older-than`` has one message)."""
    amount = decimal(text, unit=unit)
    # Digits alone can still make an infinite float ("9" * 400).
    if not amount > 0 or amount == math.inf:
        reason = out_of_range or f"must be a positive number of {unit}"
        raise argparse.ArgumentTypeError(f"{reason}, got {plain(text)}")
    if amount > most:
        reason = out_of_range or f"must be at most {most:.0f} {unit}"
        raise argparse.ArgumentTypeError(f"{reason}, got {plain(text)}")
    duration = timedelta(**{unit: amount})
    if not duration:
        raise argparse.ArgumentTypeError(f"must be at least one microsecond, got {plain(text)}")
    return duration


def positive_seconds(text: str) -> timedelta:
    """``--stale-after`` / ``--time-budget``: a positive number of seconds, at most the
    longest duration a store accepts."""
    return _duration(text, unit="seconds", most=DURATION_LIMIT.total_seconds())


def interval_seconds(text: str) -> timedelta:
    """``--interval``: a positive number of seconds, at most :data:`INTERVAL_LIMIT`."""
    return _duration(text, unit="seconds", most=INTERVAL_LIMIT.total_seconds())


def positive_days(text: str) -> timedelta:
    """``--older-than``: a positive number of days (fractions allowed)."""
    return _duration(
        text,
        unit="days",
        most=100_000,
        out_of_range="must be a number of days above 0 and at most 100000",
    )


def positive_int(text: str) -> int:
    """``--limit`` / ``--batch-size``: an integer from 1 to 2**63-1 (what a database
    ``LIMIT`` takes)."""
    value = integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {plain(value)}")
    if value > BIGINT_MAX:
        raise argparse.ArgumentTypeError(f"must be at most {BIGINT_MAX}, got {plain(value)}")
    return value
