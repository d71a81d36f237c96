"""The seconds and days options' values, read by ``jobstate.management.commands._numbers``
without a process: what each accepts, and the message argparse shows after the option's
name for each value it refuses."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import timedelta

import pytest

from jobstate.management.commands._numbers import (
    interval_seconds,
    positive_days,
    positive_seconds,
)

#: More nines than a float holds: float() reads it as infinity.
HUGE = "9" * 400


@pytest.mark.parametrize(
    ("read", "text", "duration"),
    [
        (positive_seconds, "1.5", timedelta(seconds=1.5)),
        (positive_seconds, "31536000000", timedelta(days=365_000)),
        (interval_seconds, ".25", timedelta(milliseconds=250)),
        (interval_seconds, "86400", timedelta(days=1)),
        (positive_days, "1.5", timedelta(days=1, hours=12)),
        (positive_days, "100000", timedelta(days=100_000)),
        (positive_days, "0.000000000012", timedelta(microseconds=1)),
    ],
)
def test_a_duration_option_reads_its_value(
    read: Callable[[str], timedelta], text: str, duration: timedelta
) -> None:
    assert read(text) == duration


@pytest.mark.parametrize(
    ("read", "text", "says"),
    [
        (positive_seconds, "0", "must be a positive number of seconds, got 0"),
        (positive_seconds, "-5", "must be a positive number of seconds, got -5"),
        (positive_seconds, HUGE, f"must be a positive number of seconds, got {'9' * 80}..."),
        (
            positive_seconds,
            "31536000000.5",
            "must be at most 31536000000 seconds, got 31536000000.5",
        ),
        (positive_seconds, "0.0000001", "must be at least one microsecond, got 0.0000001"),
        (interval_seconds, "0", "must be a positive number of seconds, got 0"),
        (interval_seconds, "86400.001", "must be at most 86400 seconds, got 86400.001"),
        (interval_seconds, "1e3", "'1e3' is not a number of seconds (digits 0-9 and a decimal"),
        (positive_days, "0", "must be a number of days above 0 and at most 100000, got 0"),
        (positive_days, "-1", "must be a number of days above 0 and at most 100000, got -1"),
        (
            positive_days,
            "100000.5",
            "must be a number of days above 0 and at most 100000, got 100000.5",
        ),
        (
            positive_days,
            HUGE,
            f"must be a number of days above 0 and at most 100000, got {'9' * 80}...",
        ),
        (positive_days, "0.000000000001", "must be at least one microsecond, got 0.000000000001"),
        (positive_days, "nan", "'nan' is not a number of days (digits 0-9 and a decimal point"),
    ],
)
def test_a_duration_option_refuses_a_value_saying_why(
    read: Callable[[str], timedelta], text: str, says: str
) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        read(text)
    assert str(refused.value).startswith(says)
