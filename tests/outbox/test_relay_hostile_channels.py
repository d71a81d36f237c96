"""Channels that misbehave in every way the host's code can: the relay settles each of
their rows with a readable error, commits what it reports, and goes on with the batch.
Only the operator's own stop (a second signal, Ctrl-C) ends a pass early.

The relay refuses to run inside a transaction, so these tests commit for real, and read
the rows back through another connection: what the relay reported must be committed.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from django.db import connection, transaction

from jobstate.core.stop_signals import StopAtOnce
from jobstate.exceptions import DeliveryFailed
from jobstate.models import DeliveryAttempt, Notification
from jobstate.outbox.relay import deliver_notifications
from jobstate.stores.base import NotificationRequest, NotificationState
from jobstate.stores.database import DatabaseStateStore
from tests.support.threads import in_parallel

pytestmark = [
    pytest.mark.django_db(transaction=True, available_apps=["jobstate"]),
    pytest.mark.mysql,
]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


class UnprintableFailure(DeliveryFailed):
    def __str__(self) -> str:
        raise RuntimeError("__str__ exploded")


class Channel:
    """Each notification's destination names what the channel does."""

    def send(self, notification: Notification) -> None:
        how = notification.destination
        if how.startswith("ok"):
            return
        if how == "autocommit-off":
            transaction.set_autocommit(False)
            Notification.objects.filter(pk=notification.pk).update(payload={"written": True})
            return
        if how == "open-atomic":
            transaction.atomic().__enter__()
            Notification.objects.filter(pk=notification.pk).update(payload={"written": True})
            return
        if how == "open-atomic-and-fail":
            transaction.atomic().__enter__()
            raise DeliveryFailed("receiver said no")
        raise {
            "unprintable": Unprintable(),
            "unprintable-failure": UnprintableFailure(),
            "exit": SystemExit(3),
            "generator-exit": GeneratorExit(),
            "surrogate": DeliveryFailed("bad\ud800half"),
        }[how]


def finish(store: DatabaseStateStore, *destinations: str) -> None:
    store.create_job(request_id="r1", target="llm")
    job = store.claim_next_inhub_job(["llm"], "worker-1")
    assert job is not None
    requests = [
        NotificationRequest("hostile", where, {"n": n}) for n, where in enumerate(destinations)
    ]
    assert store.complete_job_with_notifications(job, {"status": "done"}, requests) is not None


def committed() -> dict[str, tuple[str, str | None, Any]]:
    """Each row's state, error and payload as another connection reads them."""

    def read(_: int) -> dict[str, tuple[str, str | None, Any]]:
        return {
            row.destination: (row.state, row.last_error, row.payload)
            for row in Notification.objects.all()
        }

    [rows] = in_parallel(1, read)
    return rows


@pytest.fixture
def hostile(settings: Any) -> None:
    settings.JOBSTATE = {
        **getattr(settings, "JOBSTATE", {}),
        "CHANNELS": {"hostile": "tests.outbox.test_relay_hostile_channels.Channel"},
    }


DESTINATIONS = [
    "autocommit-off",
    "ok",
    "open-atomic",
    "unprintable",
    "unprintable-failure",
    "exit",
    "generator-exit",
    "surrogate",
    "open-atomic-and-fail",
]


@pytest.mark.usefixtures("hostile")
def test_each_misbehaving_channel_fails_its_own_attempt_and_the_batch_is_committed(
    store: DatabaseStateStore, caplog: pytest.LogCaptureFixture
) -> None:
    """Found by a host's pass: a channel that turned autocommit off made the relay
    report every later row delivered while nothing was committed (and every one was
    sent again after its lease); one that left a block open did the same and failed
    the next pass with an error blaming the caller; an exception whose ``__str__``
    raises, ``SystemExit`` and ``GeneratorExit`` ended the pass, stranding the rest of
    the batch; a lone surrogate in a message was lost from the log."""
    finish(store, *DESTINATIONS, "ok-last")
    caplog.set_level(logging.WARNING)

    report = deliver_notifications(store=store, limit=len(DESTINATIONS) + 1)

    assert (report.claimed, report.delivered, report.retrying) == (10, 2, 8)
    rows = committed()
    assert rows["ok"][0] == rows["ok-last"][0] == NotificationState.DELIVERED
    errors = {where: error for where, (_, error, _) in rows.items()}
    assert errors["autocommit-off"] == (
        "channel 'hostile' turned autocommit off on database 'default' and did not turn "
        "it back on; what it wrote since was rolled back"
    )
    assert errors["open-atomic"] == (
        "channel 'hostile' left a transaction.atomic() block open on database 'default'; "
        "what it wrote in that block was rolled back"
    )
    assert errors["open-atomic-and-fail"] == (
        "receiver said no; channel 'hostile' left a transaction.atomic() block open on "
        "database 'default'; what it wrote in that block was rolled back"
    )
    assert errors["unprintable"] == "Unprintable: Unprintable"
    assert errors["unprintable-failure"] == "UnprintableFailure"
    assert errors["exit"] == "SystemExit: 3"
    assert errors["generator-exit"] == "GeneratorExit: "
    assert errors["surrogate"] == "bad\ufffdhalf"
    # What the channels wrote inside the transactions they left open was rolled back.
    assert all(payload != {"written": True} for _, _, payload in rows.values())
    # Every row that failed is pending again, each with its one attempt recorded.
    assert {state for where, (state, _, _) in rows.items() if errors[where]} == {
        NotificationState.PENDING
    }
    assert DeliveryAttempt.objects.count() == 10
    assert "bad\ufffdhalf" in caplog.text and "Logging error" not in caplog.text
    # The relay's connection is usable as it was: no block, autocommit on.
    assert not connection.in_atomic_block and connection.get_autocommit()


@pytest.mark.usefixtures("hostile")
@pytest.mark.parametrize("stop", [StopAtOnce(143), KeyboardInterrupt()])
def test_the_operator_s_stop_ends_the_pass_inside_a_send(
    store: DatabaseStateStore, monkeypatch: pytest.MonkeyPatch, stop: BaseException
) -> None:
    """A second stop signal (or Ctrl-C) interrupts whatever runs, a channel's send too:
    it ends the pass, and what was claimed is due again after its lease."""

    def interrupted(self: Channel, notification: Notification) -> None:
        raise stop

    monkeypatch.setattr(Channel, "send", interrupted)
    finish(store, "ok", "ok-last")

    with pytest.raises(type(stop)):
        deliver_notifications(store=store)

    assert {state for state, _, _ in committed().values()} == {NotificationState.DELIVERING}
