"""State stores of the tests' own, named by dotted path in ``JOBSTATE['STATE_STORE']``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from jobstate.testing import FakeClock
from jobstate.testing.memory_state import MemoryStateStore


class NoTasksStore(MemoryStateStore):
    """An in-memory store that says it offers no django.tasks tasks."""

    supports_tasks = False


class SharedMemoryStateStore(MemoryStateStore):
    """The in-memory store a test installed, as ``JOBSTATE['STATE_STORE']``.

    ``get_state_store()`` makes a new store on every call, which for an in-memory store
    would be a new, empty one: the backend's ``enqueue``, the worker and the test's own
    reads would each see different tasks. Naming this class instead hands every caller
    :attr:`installed`, the one store (with its clock) the test set up."""

    installed: ClassVar[MemoryStateStore | None] = None

    def __new__(cls, using: str = "default", **kwargs: Any) -> Any:
        if cls.installed is None:
            raise RuntimeError("no in-memory store is installed for this test")
        # Not an instance of cls, so Python does not run __init__ on it again.
        return cls.installed


@dataclass
class MemoryTasks:
    """The in-memory store every ``get_state_store()`` of the test answers with, and the
    one clock of the test: the store's, and ``timezone.now`` (which the worker reads
    when it schedules a retry)."""

    store: MemoryStateStore
    clock: FakeClock
