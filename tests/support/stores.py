"""State stores of the tests' own, named by dotted path in ``JOBSTATE['STATE_STORE']``."""

from __future__ import annotations

from jobstate.testing.memory_state import MemoryStateStore


class NoTasksStore(MemoryStateStore):
    """An in-memory store that says it offers no django.tasks tasks."""

    supports_tasks = False
