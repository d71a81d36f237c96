"""Waking an idle worker the moment a task of its queues is enqueued (PostgreSQL).

``enqueue`` sends ``NOTIFY jobstate_tasks`` in the enqueuing transaction, so the
notification is delivered when that transaction commits. A :class:`NotificationListener`
thread holds one connection of its own in autocommit mode, ``LISTEN``\\ s, and calls
``wake`` for each notification that names one of the worker's queues.

Notifications sent while the listener is disconnected are lost, so after every
(re)connection it wakes the worker once, to poll. The worker keeps polling at its
``--interval`` whatever happens here, so a listener that cannot connect makes tasks
start later, never not at all.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Collection
from typing import Any

from django.db import connections

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import TASK_NOTIFY_CHANNEL, task_notify_payload
from jobstate.stores.database.backends import database_ops
from jobstate.tasks.worker.config import WorkerConfig

__all__ = ["NotificationListener", "QueueFilter", "listen_notify_available", "start_listener"]

logger = logging.getLogger("jobstate.worker")

#: Longest wait for a notification before the listener checks that it should go on.
_WAIT_SECONDS = 1.0
#: Waits between two failed connection attempts: doubled up to this cap.
_RECONNECT_FIRST = 0.5
_RECONNECT_CAP = 30.0

#: Django's connection parameters that configure its own cursors, not the connection.
_DJANGO_ONLY_PARAMETERS = frozenset({"cursor_factory", "context", "prepare_threshold"})


def listen_notify_available(using: str) -> bool:
    """Whether a worker on database ``using`` can wait for ``NOTIFY`` (PostgreSQL on
    psycopg 3: ``LISTEN`` needs both)."""
    return database_ops(using).can_listen


class NotificationListener(threading.Thread):
    """``LISTEN``\\ s on database ``using`` and calls ``wake()`` for each notification
    whose payload ``accepts`` (see :func:`~jobstate.core.states.task_notify_payload`)."""

    def __init__(
        self,
        using: str,
        *,
        accepts: Callable[[str], bool],
        wake: Callable[[], None],
        name: str = "jobstate-listener",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.using = using
        self._accepts = accepts
        self._wake = wake
        self._stopping = threading.Event()
        #: Set once the first ``LISTEN`` has been issued (tests and the banner wait for it).
        self.listening = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        delay = _RECONNECT_FIRST
        while not self._stopping.is_set():
            try:
                with self._connect() as conn:
                    conn.execute(f"LISTEN {TASK_NOTIFY_CHANNEL}")
                    self.listening.set()
                    delay = _RECONNECT_FIRST
                    # Whatever was announced while we were not listening is lost.
                    self._wake()
                    self._listen(conn)
            except self._errors() as exc:
                if self._stopping.is_set():
                    return
                logger.warning(
                    "LISTEN connection failed (%s); polling meanwhile, reconnecting in %.1f s",
                    exc,
                    delay,
                )
                self._wake()
                self._stopping.wait(delay)
                delay = min(delay * 2, _RECONNECT_CAP)

    def _listen(self, conn: Any) -> None:
        while not self._stopping.is_set():
            for notify in conn.notifies(timeout=_WAIT_SECONDS):
                if self._accepts(notify.payload):
                    self._wake()
                if self._stopping.is_set():
                    return
            # An idle connection a proxy or the server dropped shows up here, as an
            # error of this round trip, rather than as silence.
            conn.execute("SELECT 1")

    def _connect(self) -> Any:
        import psycopg

        params = {
            key: value
            for key, value in connections[self.using].get_connection_params().items()
            if key not in _DJANGO_ONLY_PARAMETERS
        }
        # Never prepared: its keep-alive runs often enough to reach psycopg's default
        # threshold, and behind a transaction pooler a prepared statement breaks the session.
        return psycopg.connect(**params, autocommit=True, prepare_threshold=None)

    @staticmethod
    def _errors() -> type[Exception]:
        import psycopg

        return psycopg.Error


class QueueFilter:
    """Which notifications name one of a worker's queues: a worker of named queues
    compares payloads whole; a worker of every queue (``queues`` None) reads the payload's
    target."""

    def __init__(self, target: str, queues: Collection[str] | None) -> None:
        self.target = target
        self._payloads = (
            None
            if queues is None
            else frozenset(task_notify_payload(target, name) for name in queues)
        )

    def __call__(self, payload: str) -> bool:
        if self._payloads is not None:
            return payload in self._payloads
        try:
            target, _queue = json.loads(payload)
        except (ValueError, TypeError):
            return False
        return bool(target == self.target)


def start_listener(
    config: WorkerConfig,
    *,
    target: str,
    queues: Collection[str] | None,
    wake: Callable[[], None],
) -> NotificationListener | None:
    """Start the thread that wakes a worker when a task of its queues is enqueued, or
    return None when the worker only polls."""
    # A --batch worker ends once the queue is empty, so a new task need not wake it.
    # Through a pooler in transaction mode a LISTEN ends with its transaction.
    if (
        config.batch
        or jobstate_settings.CONNECTION_POOLER == "transaction"
        or not (jobstate_settings.LISTEN_NOTIFY and listen_notify_available(config.using))
    ):
        return None
    listener = NotificationListener(config.using, accepts=QueueFilter(target, queues), wake=wake)
    listener.start()
    return listener
