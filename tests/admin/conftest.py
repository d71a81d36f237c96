"""Fixtures of the admin tests."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.utils import timezone


@pytest.fixture
def skew_app_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[timedelta], None]:
    """Move the application server's clock (``timezone.now``) by an offset; the
    database's clock stays where it is."""
    true_now = timezone.now

    def skew(offset: timedelta) -> None:
        monkeypatch.setattr(timezone, "now", lambda: true_now() + offset)

    return skew
