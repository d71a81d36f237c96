"""Module paths that moved when the package was organised by feature, kept
importable for one release with a :class:`DeprecationWarning`.

``import jobstate.tasks_backend`` (or a dotted path such as
``"jobstate.tasks_backend.JobStateBackend"`` in ``TASKS``) still works: the import system
asks :class:`MovedModuleFinder` first, which answers with the module at its new path and
warns once per old path. The table below is the whole list; CHANGELOG.md repeats it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

#: Old dotted path -> new dotted path.
MOVED_MODULES: dict[str, str] = {
    "jobstate.states": "jobstate.core.states",
    "jobstate.jsonvalues": "jobstate.core.jsonvalues",
    "jobstate.clock": "jobstate.core.clock",
    "jobstate.conf": "jobstate.core.conf",
    "jobstate.task_log": "jobstate.core.attempt_log",
    "jobstate.audit": "jobstate.stores.contracts.audit",
    "jobstate.stores.run_store": "jobstate.stores.contracts.run_store",
    "jobstate.stores.state_store": "jobstate.stores.contracts.state_store",
    "jobstate.stores.state_core": "jobstate.stores.contracts.queue_part",
    "jobstate.stores.state_fleet": "jobstate.stores.contracts.fleet_part",
    "jobstate.stores.state_tasks": "jobstate.stores.contracts.tasks_part",
    "jobstate.stores.state_primitives": "jobstate.stores.contracts.primitives",
    "jobstate.stores.sweeps": "jobstate.stores.contracts.sweep_store",
    "jobstate.stores.notification_outbox": "jobstate.stores.contracts.outbox_repository",
    "jobstate.stores.validation": "jobstate.stores.contracts.validation",
    "jobstate.stores.state_validation": "jobstate.stores.contracts.validation",
    "jobstate.stores.database.sweeps": "jobstate.stores.database.sweep_statements",
    "jobstate.stores.database.bulk": "jobstate.stores.database.bulk_transitions",
    "jobstate.stores.database.outbox": "jobstate.stores.database.notification_outbox",
    "jobstate.stores.database.runs": "jobstate.stores.database.job_runs",
    "jobstate.stores.database.fleet": "jobstate.stores.database.fleet_rows",
    "jobstate.stores.database.tasks": "jobstate.stores.database.task_queue",
    "jobstate.stores.database.observability": "jobstate.stores.database.figures",
    "jobstate.models.bulk": "jobstate.models.bulk_operations",
    "jobstate.tasks_backend": "jobstate.tasks.backend",
    "jobstate.task_options": "jobstate.tasks.options",
    "jobstate.task_results": "jobstate.tasks.results",
    "jobstate.tasks_compat": "jobstate.tasks.compat",
    "jobstate.worker": "jobstate.tasks.worker",
    "jobstate.worker.loop": "jobstate.tasks.worker.loop",
    "jobstate.worker.signals": "jobstate.tasks.worker.shutdown",
    "jobstate.worker.execution": "jobstate.tasks.worker.execution",
    "jobstate.worker.reports": "jobstate.tasks.worker.reports",
    "jobstate.worker.coverage": "jobstate.tasks.worker.coverage",
    "jobstate.worker.reloading": "jobstate.tasks.worker.reloading",
    "jobstate.worker.unknown_tasks": "jobstate.tasks.worker.unknown_tasks",
    "jobstate.worker.waiter": "jobstate.tasks.worker.waiter",
    "jobstate.run_context": "jobstate.operations.run_context",
    "jobstate.run_outcome": "jobstate.operations.outcomes",
    "jobstate.relay": "jobstate.outbox.relay",
    "jobstate.channels": "jobstate.outbox.channels",
    "jobstate.maintenance.runner": "jobstate.maintenance.sweep_loop",
    "jobstate.maintenance.results": "jobstate.maintenance.sweep_results",
    "jobstate.maintenance.table": "jobstate.maintenance.sweep_table",
    "jobstate.bulk": "jobstate.console.bulk",
    "jobstate.job_queries": "jobstate.console.job_search",
    "jobstate.admin.queue_stats": "jobstate.console.queue_stats",
    "jobstate.admin.bulk": "jobstate.admin.bulk_actions",
    "jobstate.admin.tasks": "jobstate.admin.task_display",
    "jobstate.admin.redaction": "jobstate.console.redaction",
    "jobstate.metrics": "jobstate.observability.metrics",
    "jobstate.views": "jobstate.observability.views",
    "jobstate.beat": "jobstate.contrib.celery.beat",
    "jobstate.testing.clock": "jobstate.testing.fake_clock",
    "jobstate.testing.inspect": "jobstate.testing.stored_runs",
    "jobstate.testing.memory": "jobstate.testing.memory_runs",
    "jobstate.testing.state_contract.audit": "jobstate.testing.state_contract.audit_cases",
    "jobstate.testing.state_contract.batches": "jobstate.testing.state_contract.batch_cases",
    "jobstate.testing.state_contract.claims": "jobstate.testing.state_contract.claim_cases",
    "jobstate.testing.state_contract.completion": "jobstate.testing.state_contract.completion_cases",  # noqa: E501
    "jobstate.testing.state_contract.concurrency": "jobstate.testing.state_contract.concurrency_cases",  # noqa: E501
    "jobstate.testing.state_contract.jobs": "jobstate.testing.state_contract.job_cases",
    "jobstate.testing.state_contract.leases": "jobstate.testing.state_contract.lease_cases",
    "jobstate.testing.state_contract.listing": "jobstate.testing.state_contract.listing_cases",
    "jobstate.testing.state_contract.locks": "jobstate.testing.state_contract.lock_cases",
    "jobstate.testing.state_contract.pauses": "jobstate.testing.state_contract.pause_cases",
    "jobstate.testing.state_contract.threads": "jobstate.testing.state_contract.thread_cases",
    "jobstate.testing.state_contract.updates": "jobstate.testing.state_contract.update_cases",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path by importing the new one and handing back that same module."""

    def __init__(self, new_name: str) -> None:
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new_name}; the old path goes away in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new_name)

    def exec_module(self, module: ModuleType) -> None:
        """The new module ran when it was imported; nothing is left to run."""


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old paths of :data:`MOVED_MODULES`, and nothing else."""

    def find_spec(
        self, fullname: str, path: object = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new_name = MOVED_MODULES.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new_name))


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
