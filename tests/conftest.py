"""Shared fixtures.

Tests marked ``postgres`` need PostgreSQL's row locks and real concurrent connections.
The test command deselects them on the SQLite run; if one is ever collected against
another backend it fails rather than skips, so a missing database cannot pass silently.
"""

from __future__ import annotations

import pytest
from django.db import connection


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("postgres") and connection.vendor != "postgresql":
        pytest.fail(
            f"{item.nodeid} needs PostgreSQL but DATABASE_URL points at {connection.vendor}; "
            "run it with DATABASE_URL=postgres://... (the test command does).",
            pytrace=False,
        )
