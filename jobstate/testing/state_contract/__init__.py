"""Contract cases for :class:`~jobstate.stores.base.StateStore` implementations.

``state_store_contract_cases(store)`` returns plain case objects; a host runs them with
any test framework::

    @pytest.mark.django_db(transaction=True)
    @pytest.mark.parametrize("case", state_store_contract_cases(MyStore()), ids=str)
    def test_state_store_contract(case):
        case.run()

A violated guarantee raises :class:`StateStoreContractViolation` (an ``AssertionError``)
whose message starts with ``[StateStore <area>]``. Each area's cases live in the module
of the same name in this package (``claims``, ``leases``, ...).

Each call makes a fresh namespace: every request id, target, executor id, lock key and
thread id a case uses is unique to it, and every sweep a case issues is narrowed to its
own targets. The cases therefore run against a persistent table that other work (or an
earlier pass) has filled, without truncating it. Two cases touch shared state by nature:
``audit: prune ...`` deletes entries stamped before the year 2000, and the thread-quota
case overrides ``JOBSTATE['THREAD_INFLIGHT_QUOTA']`` while it runs.

The concurrency cases start real threads. Against a database store they need a test
that commits (``django_db(transaction=True)``), and on SQLite the ``IMMEDIATE``
transaction mode; each thread closes its own database connections when it ends.
A few cases wait a fraction of a second for instants to age on the store's clock.
"""

from __future__ import annotations

from collections.abc import Iterable

from jobstate.testing.state_contract._kit import (
    Kit,
    StateStoreContractCase,
    StateStoreContractViolation,
    StoreSource,
)
from jobstate.testing.state_contract.audit_cases import CASES as AUDIT
from jobstate.testing.state_contract.batch_cases import CASES as BATCHES
from jobstate.testing.state_contract.claim_cases import CASES as CLAIMS
from jobstate.testing.state_contract.completion_cases import CASES as COMPLETION
from jobstate.testing.state_contract.concurrency_cases import CASES as CONCURRENCY
from jobstate.testing.state_contract.job_cases import CASES as JOBS
from jobstate.testing.state_contract.lease_cases import CASES as LEASES
from jobstate.testing.state_contract.listing_cases import CASES as LISTING
from jobstate.testing.state_contract.lock_cases import CASES as LOCKS
from jobstate.testing.state_contract.operator_cases import CASES as OPERATOR
from jobstate.testing.state_contract.pause_cases import CASES as PAUSES
from jobstate.testing.state_contract.thread_cases import CASES as THREADS
from jobstate.testing.state_contract.update_cases import CASES as UPDATES

__all__ = [
    "STATE_CONTRACT_AREAS",
    "StateStoreContractCase",
    "StateStoreContractViolation",
    "state_store_contract_cases",
]

# The order of this tuple is the order of the cases and of the areas.
_TABLES = (
    JOBS,
    UPDATES,
    LISTING,
    CLAIMS,
    PAUSES,
    THREADS,
    COMPLETION,
    LEASES,
    AUDIT,
    LOCKS,
    BATCHES,
    OPERATOR,
    CONCURRENCY,
)

#: The areas cases belong to; ``skip`` names areas.
STATE_CONTRACT_AREAS = tuple(table.area for table in _TABLES)

# A failing case's traceback names the path a host imports these types from, not the
# private module that defines them.
StateStoreContractCase.__module__ = __name__
StateStoreContractViolation.__module__ = __name__


def state_store_contract_cases(
    store_factory_or_store: StoreSource,
    *,
    concurrency: int = 8,
    skip: Iterable[str] = (),
) -> list[StateStoreContractCase]:
    """The contract cases, in a fixed order, for a store instance or a factory called
    once per case. ``concurrency`` is the size of the concurrent bursts (at least 2);
    ``skip`` drops every case of the named areas (see :data:`STATE_CONTRACT_AREAS`)."""
    skipped = set(skip) if not isinstance(skip, str) else {skip}
    unknown = skipped - set(STATE_CONTRACT_AREAS)
    if unknown:
        raise ValueError(
            f"unknown contract area(s) {sorted(unknown)}; known: {', '.join(STATE_CONTRACT_AREAS)}."
        )
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 2:
        raise ValueError(f"concurrency must be an int of at least 2, got {concurrency!r}.")
    kit = Kit(store_factory_or_store, concurrency)
    return [case for table in _TABLES if table.area not in skipped for case in table.build(kit)]
