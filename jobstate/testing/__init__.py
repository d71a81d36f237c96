"""Testing kit: contract cases any store must pass, in-memory reference stores, clocks.

Shipped with the package so a host can check its own store, or its configuration of
ours, with the cases jobstate checks itself with::

    from jobstate.testing import job_run_store_contract_cases

Importing this package imports no models: the state-store names, whose reference
store builds ``Job`` instances, load on first use.
"""

from importlib import import_module
from typing import Any

from jobstate.testing.fake_clock import Clock, FakeClock, SystemClock
from jobstate.testing.memory_runs import MemoryJobRunStore, StoredJobRun
from jobstate.testing.run_contract import (
    ContractViolation,
    JobRunStoreContractCase,
    JobRunStoreObligation,
    contract_case_id,
    job_run_store_contract_cases,
)
from jobstate.testing.stored_runs import database_run_inspector

# name -> module, imported on first attribute access (they need the app registry ready).
_LAZY = {
    "MemoryStateStore": "jobstate.testing.memory_state",
    "StateStoreContractCase": "jobstate.testing.state_contract",
    "StateStoreContractViolation": "jobstate.testing.state_contract",
    "state_store_contract_cases": "jobstate.testing.state_contract",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "Clock",
    "ContractViolation",
    "FakeClock",
    "JobRunStoreContractCase",
    "JobRunStoreObligation",
    "MemoryJobRunStore",
    "MemoryStateStore",
    "StateStoreContractCase",
    "StateStoreContractViolation",
    "StoredJobRun",
    "SystemClock",
    "contract_case_id",
    "database_run_inspector",
    "job_run_store_contract_cases",
    "state_store_contract_cases",
]
