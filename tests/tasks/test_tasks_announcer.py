"""The worker's announcer (:mod:`jobstate.tasks.worker.announcer`): announcements run in
order on a thread of their own; a backlog past its bound tells the worker to stop
claiming; a stopping worker waits for them, and says how many it could not make."""

from __future__ import annotations

import logging
import threading

import pytest

from jobstate.tasks.worker.announcer import Announcer


def test_announcements_run_in_order_on_their_own_thread() -> None:
    announcer = Announcer(name="announcer-under-test")
    seen: list[tuple[int, str]] = []
    for number in range(5):
        announcer.put(lambda number=number: seen.append((number, threading.current_thread().name)))
    announcer.close(5)
    assert seen == [(number, "announcer-under-test") for number in range(5)]


def test_a_backlog_past_its_bound_is_lagging_until_it_drains() -> None:
    announcer = Announcer(name="announcer-under-test", backlog=1)
    release = threading.Event()
    announcer.put(lambda: release.wait(10))
    announcer.put(lambda: None)
    announcer.put(lambda: None)
    try:
        assert announcer.lagging()
    finally:
        release.set()
    announcer.close(5)
    assert not announcer.lagging()


def test_a_stop_that_cannot_wait_says_how_many_were_not_made(
    caplog: pytest.LogCaptureFixture,
) -> None:
    announcer = Announcer(name="announcer-under-test")
    release = threading.Event()
    announcer.put(lambda: release.wait(10))
    announcer.put(lambda: None)
    try:
        with caplog.at_level(logging.ERROR, logger="jobstate.worker"):
            announcer.close(0.2)
    finally:
        release.set()
    (record,) = caplog.records
    assert "without announcing the end of 2 task attempt(s)" in record.getMessage()
    assert "within 0.2 s" in record.getMessage()
