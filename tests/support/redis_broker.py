"""The Redis database the Celery tests use as their broker, one test at a time.

A test run has one Redis database (``JOBSTATE_TEST_REDIS_URL``), and a Celery test empties
it, asks every worker listening on it what it registered, and reads the tasks it
receives. The test command runs the suite in several processes (pytest-xdist), so a
Celery test first takes a lock on that database, held until it has emptied it again:
two Celery tests never share it."""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

#: The test run's Redis database (scripts/test and .ci/run set it).
BROKER_URL = os.environ.get("JOBSTATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


@contextmanager
def redis_broker(what: str) -> Iterator[str]:
    """:data:`BROKER_URL`, held by this test alone and empty; the test fails, never
    skips, when Redis does not answer. ``what`` names the test in that failure."""
    client = redis.Redis.from_url(BROKER_URL, socket_connect_timeout=3)
    try:
        client.ping()
    except redis.exceptions.RedisError as exc:
        client.close()
        pytest.fail(
            f"Redis does not answer at {BROKER_URL} ({exc}); {what} needs it "
            "(JOBSTATE_TEST_REDIS_URL). Start it with scripts/ensure-redis.",
            pytrace=False,
        )
    digest = hashlib.sha256(BROKER_URL.encode()).hexdigest()[:16]
    lock = Path(tempfile.gettempdir()) / f"jobstate-test-redis-{digest}.lock"
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # released when the file closes
        try:
            client.flushdb()
            yield BROKER_URL
            client.flushdb()
        finally:
            client.close()
