"""Claims whose reply was lost: given back at once, not left to their leases.

A claim (alone, or with a round's reports) that fails on its way may have committed
before its connection died: the tasks it took are then ``running`` under this worker,
which never learnt their ids, so nothing runs them. Left alone, they would wait for their
leases to run out and be recovered as lost attempts, spending an attempt of a task that
never started (with the default ``MAX_ATTEMPTS`` of 1, failing it).

Each claim has its own round (:attr:`~.task_claims.TaskClaim.claim_round`), from which the
store derives every claimed task's token. When a claim fails, its round is kept here, and
before the worker's next claim :meth:`UnsureClaims.release` asks the store to give back,
uncounted, whatever that round took (``release_task_claim``, fenced by those tokens):
nothing when the claim never committed.
"""

from __future__ import annotations

import logging
import uuid
from contextlib import AbstractContextManager
from typing import Any

from jobstate.stores.base import StateStore
from jobstate.tasks.worker.task_claims import TaskClaim

__all__ = ["UnsureClaims"]

logger = logging.getLogger("jobstate.worker")


class UnsureClaims:
    """The rounds of one worker's claims that failed on their way."""

    def __init__(self, store: StateStore, worker_id: str) -> None:
        self.store = store
        self.worker_id = worker_id
        self._rounds: list[uuid.UUID] = []

    def watching(self, claim: TaskClaim | None) -> AbstractContextManager[None]:
        """Keep ``claim``'s round when the block fails, whatever it raises (the
        exception goes on): it may have committed."""
        return _Watching(self._rounds, claim)

    def release(self) -> int:
        """Give back what the kept rounds took; how many tasks. A round is forgotten
        once the store has answered for it; a store error leaves the rest kept, for
        the next call."""
        released = 0
        while self._rounds:
            claim_round = self._rounds[0]
            count = self.store.release_task_claim(worker_id=self.worker_id, claim_round=claim_round)
            self._rounds.pop(0)
            if count:
                logger.warning(
                    "Gave back %d task(s) claimed by a claim whose reply was lost with its "
                    "connection (they had not started; no attempt is counted)",
                    count,
                )
            released += count
        return released


class _Watching:
    """:meth:`UnsureClaims.watching`'s block. A class rather than a generator context
    manager: the worker enters one per round, and this costs half the calls."""

    __slots__ = ("claim", "rounds")

    def __init__(self, rounds: list[uuid.UUID], claim: TaskClaim | None) -> None:
        self.rounds = rounds
        self.claim = claim

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is not None and self.claim is not None:
            self.rounds.append(self.claim.claim_round)
