"""The worker's announcer (:mod:`jobstate.tasks.worker.announcer`): announcements run in
order on a thread of their own; a backlog past its bound tells the worker to stop
claiming; a ``--batch`` worker waits for them before it stops; a stopping worker waits
for them, and says how many it could not make."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from jobstate.core.wakeup import Wakeup
from jobstate.tasks.worker.announcer import Announcer


def test_announcements_run_in_order_on_their_own_thread() -> None:
    announcer = Announcer(name="announcer-under-test")
    seen: list[tuple[int, str]] = []
    for number in range(5):
        announcer.put(lambda number=number: seen.append((number, threading.current_thread().name)))
    announcer.close("the end", timeout=5)
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
    announcer.close("the end", timeout=5)
    assert not announcer.lagging()


def test_settling_waits_for_what_was_queued_within_its_timeout() -> None:
    """What a ``--batch`` worker asks before it stops: whether announcements were
    waiting (a receiver may enqueue a task) and were made in time."""
    announcer, wake = Announcer(name="announcer-under-test"), Wakeup()
    assert not announcer.settle(wake, 5)  # nothing queued yet
    seen: list[int] = []
    announcer.put(lambda: (time.sleep(0.2), seen.append(1)))
    assert announcer.settle(wake, 5) and seen == [1]
    wake.clear()
    assert not announcer.settle(wake, 5)  # made since
    release = threading.Event()
    announcer.put(lambda: release.wait(10))
    try:
        started = time.monotonic()
        assert not announcer.settle(wake, 0.2)  # a receiver that does not return
        threading.Timer(0.2, wake.set).start()  # a stop requested
        assert not announcer.settle(wake, 10)
        assert time.monotonic() - started < 5
        # What settling queued behind it is not counted among what was not made.
        assert announcer.close("the end", timeout=0.2) == 1
    finally:
        release.set()
    wake.close()


class _SlowToReturnWakeup(Wakeup):
    """Wakes its waiter, then keeps the announcer's thread a moment longer: what a
    busy machine may do to that thread just after it woke the worker."""

    def set(self) -> None:
        super().set()
        if threading.current_thread().name == "announcer-under-test":
            time.sleep(0.2)


def test_a_settle_right_after_one_that_was_made_waits_for_nothing() -> None:
    """A ``--batch`` worker settles, finds its queues empty and settles again: the
    second must not wait (nor claim once more) for the mark the first one queued."""
    announcer, wake = Announcer(name="announcer-under-test"), _SlowToReturnWakeup()
    announcer.put(lambda: None)
    assert announcer.settle(wake, 5)
    wake.clear()
    started = time.monotonic()
    assert not announcer.settle(wake, 5)
    assert time.monotonic() - started < 0.1
    announcer.close("the end", timeout=5)
    wake.close()


def test_a_stop_that_cannot_wait_says_how_many_were_not_made(
    capsys: pytest.CaptureFixture[str],
) -> None:
    announcer = Announcer(name="announcer-under-test")
    release = threading.Event()
    announcer.put(lambda: release.wait(10))
    announcer.put(lambda: None)
    try:
        assert announcer.close("the stop line", timeout=0.2) == 2
    finally:
        release.set()
    err = capsys.readouterr().err
    assert "2 log line(s) or task_finished announcement(s) were not made" in err
    assert "within 0.2 s" in err and err.endswith("the stop line\n")


def test_a_gathered_round_is_made_after_its_block_and_counted_whole_when_a_stop_cannot_wait(
    capsys: pytest.CaptureFixture[str],
) -> None:
    announcer = Announcer(name="announcer-under-test", backlog=1)
    started, release = threading.Event(), threading.Event()
    seen: list[int] = []
    announcer.put(lambda: (started.set(), release.wait(10)))
    assert started.wait(5)
    announcer.put(lambda: seen.append(-1))
    with announcer.gathering():
        for number in range(3):
            announcer.put(lambda number=number: seen.append(number))
        with announcer.gathering():  # an inner block belongs to the outer round
            announcer.put(lambda: seen.append(3))
        # Nothing of the round is queued until the block ends.
        assert not announcer.lagging()
    # Behind the blocked one, a single one and a round of four wait: two rounds, past a
    # backlog of 1.
    assert announcer.lagging()
    try:
        assert announcer.close("the stop line", timeout=0.2) == 6
    finally:
        release.set()
    assert "6 log line(s) or task_finished announcement(s) were not made" in capsys.readouterr().err
    assert seen == []


def test_gathered_rounds_are_made_in_order() -> None:
    announcer = Announcer(name="announcer-under-test")
    seen: list[int] = []
    for first in (0, 2):
        with announcer.gathering():
            announcer.put(lambda first=first: seen.append(first))
            announcer.put(lambda first=first: seen.append(first + 1))
    announcer.put(lambda: seen.append(4))
    assert announcer.close("the end", timeout=5) == 0
    assert seen == [0, 1, 2, 3, 4]


def test_what_a_deferring_thread_logs_is_handled_on_the_announcers_thread_in_order(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A log handler that blocks held up the worker's control loop, which logs its own
    lines (a cancel, a recovery, the stop): leases were not renewed, and a task ran
    twice. Found by an outside pass."""
    announcer = Announcer(name="announcer-under-test")
    logger = logging.getLogger("jobstate.worker")
    with caplog.at_level(logging.INFO, logger="jobstate.worker"), announcer.deferring_logs():
        logger.info("first")
        announcer.put(lambda: logger.info("second"))
        logger.warning("third")
        # Nothing is handled on this thread: the lines wait for the announcer.
        assert all(record.threadName != "announcer-under-test" for record in caplog.records)
        assert announcer.close("last", timeout=5) == 0
    assert [record.getMessage() for record in caplog.records] == [
        "first",
        "second",
        "third",
        "last",
    ]
    # Each record keeps the thread that made it.
    assert caplog.records[0].threadName == threading.current_thread().name
    assert caplog.records[1].threadName == "announcer-under-test"
    # Past the block, this thread's lines are handled at once again.
    logger.warning("after the block")
    assert caplog.records[-1].getMessage() == "after the block"


def test_a_receiver_that_leaves_a_transaction_open_does_not_spoil_the_next(
    capsys: pytest.CaptureFixture[str], transactional_db: None
) -> None:
    """A receiver that left ``transaction.atomic()`` open broke the announcer thread's
    connection for every later receiver. Found by an outside pass."""
    from django.db import connection, transaction

    from jobstate.models import Job

    announcer = Announcer(name="announcer-under-test")
    counts: list[int] = []
    announcer.put(lambda: transaction.atomic().__enter__())
    announcer.put(lambda: counts.append(Job.objects.count()))
    assert announcer.close("end", timeout=5) == 0
    assert counts == [0]
    assert "a task_finished receiver left a transaction.atomic() block open" in (
        capsys.readouterr().err
    )
    assert not connection.in_atomic_block


def test_every_receiver_is_sent_a_signal_whatever_the_others_raise(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What the worker sends ``task_finished`` with: Django's ``send_robust`` stopped at
    a receiver that raised ``SystemExit``, and let it out to the worker."""
    from django.dispatch import Signal

    from jobstate.tasks.worker.receivers import send_to_every_receiver

    signal, seen = Signal(), []

    def exits(sender: object, **kwargs: object) -> None:
        raise SystemExit(3)

    def notes(sender: object, **kwargs: object) -> str:
        seen.append("sync")
        return "noted"

    async def interrupts(sender: object, **kwargs: object) -> None:
        raise KeyboardInterrupt

    async def notes_too(sender: object, **kwargs: object) -> str:
        seen.append("async")
        return "noted too"

    for receiver in (exits, notes, interrupts, notes_too):
        signal.connect(receiver)
    with caplog.at_level(logging.ERROR, logger="django.dispatch"):
        responses = send_to_every_receiver(signal, "sender")
    assert [receiver for receiver, _ in responses] == [exits, notes, interrupts, notes_too]
    assert isinstance(responses[0][1], SystemExit) and responses[1][1] == "noted"
    assert isinstance(responses[2][1], KeyboardInterrupt) and responses[3][1] == "noted too"
    assert seen == ["sync", "async"]
    logged = [record.getMessage() for record in caplog.records]
    assert any("exits" in line and "send_robust" in line for line in logged), logged
    assert any("interrupts" in line for line in logged), logged
    assert send_to_every_receiver(Signal(), "sender") == []
