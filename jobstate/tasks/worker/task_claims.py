"""What a worker claims in a round: the tasks of its free slots, with or without the
round's reports, and the tasks under a concurrency key (``policy(concurrency_key=...)``).

The claim the worker makes on every round (:meth:`StateStore.claim_tasks`, or with its
reports :meth:`StateStore.complete_and_claim_tasks`: one statement on PostgreSQL) leaves
out the tasks under a concurrency key: those are claimed under their key's gate by
:meth:`StateStore.claim_keyed_tasks`, one statement more (a plain read when none is
ready, a short transaction when some is). So that round trip is not paid on every task,
a worker claims them first once a second, or once per ``--interval`` when that is longer
(:class:`KeyedPace`), its reports then going with the claim of the slots left, and
whenever its ordinary claim leaves slots free (its queues hold nothing else ready) while
keyed tasks are about: its last claim of them took some, or one of its keyed tasks has
ended since. A key's tasks therefore wait about that long at most for a free slot,
however many other tasks are queued; and a worker whose queues hold no keyed task pays
that statement once a second at most, busy or idle.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from jobstate.core.states import ClaimReport
from jobstate.stores.base import CompletionResult, StateStore

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = ["KEYED_FIRST_AT_MOST_EVERY", "KeyedPace", "TaskClaim"]


@dataclass(frozen=True)
class TaskClaim:
    """What a worker's round claims along with its reports (see
    :meth:`~jobstate.stores.contracts.tasks_part.TasksPart.complete_and_claim_tasks`)."""

    target: str
    queues: Sequence[str] | None
    worker_id: str
    lease: timedelta
    limit: int
    claim_round: uuid.UUID = field(default_factory=uuid.uuid4)
    """Each claim's own: the worker gives back what a claim whose reply was lost took
    (:mod:`.lost_claims`). Every statement of the claim uses it."""
    pace: KeyedPace | None = field(default=None, compare=False, repr=False)
    """When the worker claims the tasks under a concurrency key, which learns from each
    such claim; without one, never first and always after the others."""

    @cached_property
    def keyed_first(self) -> bool:
        """Claim the tasks under a concurrency key before the others this round."""
        return self.pace is not None and self.pace.due()

    def claim(self, store: StateStore) -> list[Job]:
        """The claim alone: the keyed tasks first when :attr:`keyed_first`, then the
        others; the keyed ones after them when those leave slots free."""
        jobs = self._keyed(store, self.limit) if self.keyed_first else []
        if len(jobs) < self.limit:
            jobs += store.claim_tasks(**self._arguments(self.limit - len(jobs)))
        return self._then_keyed(store, jobs)

    def complete_and_claim(
        self, store: StateStore, reports: list[ClaimReport], *, keyed_ending: bool = True
    ) -> tuple[list[CompletionResult], list[Job]]:
        """The claim with ``reports``: one store call, unless the keyed tasks come first
        this round. Then, when the reports end keyed tasks (``keyed_ending``), they go
        first on their own, so the keys whose tasks they end are free for the claim;
        otherwise the keyed tasks are claimed first and the reports go with the claim
        of the slots left."""
        if not self.keyed_first:
            results, jobs = store.complete_and_claim_tasks(reports, **self._arguments(self.limit))
            return results, self._then_keyed(store, jobs)
        if keyed_ending:
            results, _none = store.complete_and_claim_tasks(reports, **self._only_reports())
            return results, self.claim(store)
        keyed = self._keyed(store, self.limit)
        rest = self.limit - len(keyed)
        arguments = self._arguments(rest) if rest else self._only_reports()
        results, jobs = store.complete_and_claim_tasks(reports, **arguments)
        return results, keyed + jobs

    def _then_keyed(self, store: StateStore, jobs: list[Job]) -> list[Job]:
        if self.keyed_first or len(jobs) >= self.limit:
            return jobs
        if self.pace is not None and not self.pace.keyed_about:
            return jobs
        return jobs + self._keyed(store, self.limit - len(jobs))

    def _keyed(self, store: StateStore, limit: int) -> list[Job]:
        jobs = store.claim_keyed_tasks(**self._arguments(limit))
        if self.pace is not None:
            self.pace.claimed(len(jobs))
        return jobs

    def _only_reports(self) -> dict[str, Any]:
        """The arguments of a ``complete_and_claim_tasks`` that claims nothing."""
        return {**self._arguments(self.limit), "queues": []}

    def _arguments(self, limit: int) -> dict[str, Any]:
        return {
            "target": self.target,
            "queues": self.queues,
            "worker_id": self.worker_id,
            "lease": self.lease,
            "limit": limit,
            "claim_round": self.claim_round,
        }


#: The shortest wait between two claims that take the keyed tasks first: a worker with
#: ``--interval 0`` still pays that statement at most once a second.
KEYED_FIRST_AT_MOST_EVERY = 1.0


class KeyedPace:
    """When a worker's claims take the tasks under a concurrency key: first, once every
    ``interval`` seconds and not more than once a second (:meth:`due`); after the
    others, while :attr:`keyed_about`."""

    def __init__(self, interval: float) -> None:
        self._every = max(interval, KEYED_FIRST_AT_MOST_EVERY)
        self._next = time.monotonic()
        self.keyed_about = True
        """Whether a claim that leaves slots free claims keyed tasks after the others:
        not once a claim of them found none, until one finds some or one of this
        worker's keyed tasks ends (its key may let another start)."""

    def claimed(self, count: int) -> None:
        """A claim of keyed tasks took ``count``."""
        self.keyed_about = count > 0

    def ended(self, job: Job) -> None:
        """An attempt of ``job`` ended (called from its thread)."""
        if job.concurrency_digest:
            self.keyed_about = True

    def due(self) -> bool:
        """Whether this claim goes first to the keyed tasks (and the next one not before
        ``every`` seconds from now)."""
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + self._every
        return True
