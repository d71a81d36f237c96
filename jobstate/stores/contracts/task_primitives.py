"""The django.tasks primitives of a state store (``supports_tasks``), a base of
:class:`~jobstate.stores.contracts.primitives.StateStorePrimitives`: what the task methods
of :class:`~jobstate.stores.contracts.tasks_part.TasksPart` are built on."""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from jobstate.exceptions import UnsupportedStoreOperation
from jobstate.stores.contracts.validation import ParsedReport

if TYPE_CHECKING:
    from jobstate.models import Job
    from jobstate.stores.contracts.primitives import Settled

__all__ = ["TaskPrimitives"]


class TaskPrimitives(ABC):
    """The optional task primitives; a store that sets ``supports_tasks`` implements
    those that raise here."""

    @abstractmethod
    def _create_job(self, cleaned: dict[str, Any]) -> Job:
        """See :class:`~jobstate.stores.contracts.primitives.StateStorePrimitives`."""

    @abstractmethod
    def _complete_claimed_batch(self, reports: list[ParsedReport]) -> list[Settled]:
        """See :class:`~jobstate.stores.contracts.primitives.StateStorePrimitives`."""

    @abstractmethod
    def _missing_primitive(self, flag: str, primitive: str) -> UnsupportedStoreOperation:
        """The error a store raises for a primitive its capability flag promises."""

    def _enqueue_task(self, cleaned: dict[str, Any]) -> Job:
        """Insert a task's job (``cleaned`` holds its ``request_id``, target, task
        fields and input) and return it as stored. A store that can wake waiting workers
        (PostgreSQL's ``NOTIFY``) does so here, in the same unit of work as the insert."""
        return self._create_job(cleaned)

    def _claim_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> list[Job]:
        """Claim up to ``limit`` ready queued tasks of ``target`` in ``queues`` (``None``:
        any queue), atomically, in claim order, each with the claim token
        ``task_claim_token(claim_round, id)`` (see
        :meth:`~jobstate.stores.contracts.tasks_part.TasksPart.claim_tasks`)."""
        raise self._missing_primitive("supports_tasks", "_claim_tasks")

    def _claim_keyed_tasks(
        self,
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> list[Job]:
        """Claim as :meth:`_claim_tasks` does, but only tasks under a concurrency key,
        each while fewer than its ``concurrency_limit`` of its key's tasks run (see
        :meth:`~jobstate.stores.contracts.tasks_part.TasksPart.claim_keyed_tasks`)."""
        raise self._missing_primitive("supports_tasks", "_claim_keyed_tasks")

    def _list_claimed_tasks(self, owner: str) -> list[Job]:
        """The running tasks whose ``executor_id`` is ``owner`` (a worker's tasks)."""
        raise self._missing_primitive("supports_tasks", "_list_claimed_tasks")

    def _complete_and_claim_tasks(
        self,
        reports: list[ParsedReport],
        target: str,
        queues: list[str] | None,
        owner: str,
        lease: timedelta,
        limit: int,
        claim_round: uuid.UUID,
    ) -> tuple[list[Settled], list[Job]]:
        """A worker's round (``complete_and_claim_tasks``; ``queues`` ``[]``: claim
        nothing): :meth:`_complete_claimed_batch`, then :meth:`_claim_tasks`. A backend
        that can do both in one round trip overrides it."""
        settled = self._complete_claimed_batch(reports) if reports else []
        claimed = (
            []
            if queues == []
            else self._claim_tasks(target, queues, owner, lease, limit, claim_round)
        )
        return settled, claimed

    def _list_expired_tasks(self, limit: int) -> list[Job]:
        """Up to ``limit`` running tasks whose lease ended before the store's clock,
        oldest lease first (the candidates of ``recover_expired_tasks``)."""
        raise self._missing_primitive("supports_tasks", "_list_expired_tasks")
