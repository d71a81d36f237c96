"""The worker as the fleet sees it: its row in the worker registry (the console's
Workers page), registered when it starts, beaten while it runs and marked stopped when
it ends, and the line it logs when it starts."""

from __future__ import annotations

import logging
import os
import socket

from jobstate.core.conf import jobstate_settings
from jobstate.core.states import WorkerKind, WorkerRegistration
from jobstate.exceptions import StoreError
from jobstate.stores.base import StateStore
from jobstate.stores.errors import translated_database_errors
from jobstate.tasks.backend import JobStateBackend
from jobstate.tasks.worker.config import WorkerConfig
from jobstate.tasks.worker.coverage import unserved_queues_warning
from jobstate.tasks.worker.waiter import listen_notify_available

__all__ = ["WorkerPresence"]

logger = logging.getLogger("jobstate.worker")


class WorkerPresence:
    """One worker's registry row and start line; a store without a worker registry
    (``supports_worker_registry`` false) gets the line only."""

    def __init__(
        self,
        store: StateStore,
        config: WorkerConfig,
        backend: JobStateBackend,
        queues: tuple[str, ...] | None,
    ) -> None:
        self.store = store
        self.config = config
        self.backend = backend
        self.options = backend.task_options
        self.queues = queues

    def register(self) -> None:
        if not self.store.supports_worker_registry:
            return
        self.store.register_worker(
            WorkerRegistration(
                worker_id=self.config.worker_id,
                kind=WorkerKind.TASKS,
                host=socket.gethostname() or "unknown",
                pid=os.getpid(),
                lease=self.options.lease,
                backend=self.backend.alias,
                queues=self.queues,
                concurrency=self.config.concurrency,
            )
        )

    def beat(self) -> None:
        """Move the worker's last beat; a row the retention sweep forgot (a beat silent
        for that long) is written again."""
        if self.store.supports_worker_registry and not self.store.beat_worker(
            worker_id=self.config.worker_id
        ):
            self.register()

    def stopped(self, reason: str) -> None:
        """Record that the worker stopped gracefully, so the console shows it stopped
        rather than lost."""
        if not self.store.supports_worker_registry:
            return
        try:
            self.store.stop_worker(worker_id=self.config.worker_id, reason=reason)
        except StoreError as exc:
            # The console then shows the worker lost once its lease has passed.
            logger.error("Could not record that worker %s stopped: %s", self.config.worker_id, exc)

    def announce(self, *, listening: bool, claimed: bool = False) -> None:
        """Log what the worker runs and how it wakes up (``listening``: on PostgreSQL's
        ``NOTIFY``), and warn when its queues hold nothing ready while ready tasks wait
        in queues no worker serves. A worker whose first claim took a task (``claimed``)
        had a ready task in its queues, so the warning cannot apply and its reads (a
        count of every ready task by queue, as long as the backlog) are left out."""
        queues = "every queue" if self.queues is None else ", ".join(self.queues)
        if listening:
            wake = f"LISTEN/NOTIFY, polling every {self.config.interval:g} s as a fallback"
        else:
            wake = f"polling every {self.config.interval:g} s"
            could_listen = jobstate_settings.LISTEN_NOTIFY and listen_notify_available(
                self.config.using
            )
            if self.config.batch:
                # Said only where another worker would LISTEN: elsewhere it is noise.
                if could_listen:
                    wake += " (--batch: it stops once nothing is ready, so it does not LISTEN)"
            elif jobstate_settings.LISTEN_NOTIFY and jobstate_settings.CONNECTION_POOLER:
                wake += (
                    " (no LISTEN/NOTIFY: JOBSTATE['CONNECTION_POOLER'] is "
                    f"{jobstate_settings.CONNECTION_POOLER!r}, and a LISTEN through a "
                    "pooler in transaction mode ends with its transaction)"
                )
        timeout = self.options.timeout or "none"
        logger.info(
            "jobstate_worker %s started: backend %r, queues %s, concurrency %d, wake-up by "
            "%s; max attempts %d, lease %s, timeout %s",
            self.config.worker_id,
            self.backend.alias,
            queues,
            self.config.concurrency,
            wake,
            self.options.max_attempts,
            self.options.lease,
            timeout,
        )
        if self.queues is not None and not claimed and self.store.supports_worker_registry:
            try:
                with translated_database_errors("The queue coverage check", self.config.using):
                    warning = unserved_queues_warning(
                        target=self.backend.target,
                        alias=self.backend.alias,
                        queues=self.queues,
                        using=self.config.using,
                    )
            except StoreError as exc:
                if not exc.retryable:
                    raise
                # A warning only: the worker starts all the same.
                logger.warning("Could not check which queues wait for a worker: %s", exc)
                return
            if warning is not None:
                logger.warning(warning)
