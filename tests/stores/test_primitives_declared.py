"""The state store's contract in one place: every primitive a backend implements is
declared, with its docstring, in ``jobstate.stores.contracts.primitives`` (the task
primitives in its base, ``jobstate.stores.contracts.task_primitives``), and the
capability parts hold public methods only."""

from __future__ import annotations

import inspect

import pytest

from jobstate.stores.base import StateStore
from jobstate.stores.contracts import (
    fleet_part,
    ledger_part,
    operator_part,
    optional_part,
    primitives,
    queue_part,
    tasks_part,
    transitions_part,
)
from jobstate.stores.contracts.primitives import StateStorePrimitives
from jobstate.stores.contracts.task_primitives import TaskPrimitives
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore

PARTS = (
    queue_part.JobQueuePart,
    ledger_part.LedgerPart,
    transitions_part.TransitionsPart,
    operator_part.OperatorPart,
    fleet_part.FleetPart,
    tasks_part.TasksPart,
    optional_part.OptionalPart,
)

#: Helpers of the primitives class that are not primitives: the capability checks.
NOT_PRIMITIVES = {"_require", "_missing_primitive"}


def declared_primitives() -> set[str]:
    return {
        name
        for declaring in (StateStorePrimitives, TaskPrimitives)
        for name, value in vars(declaring).items()
        if name.startswith("_")
        and not name.startswith("__")
        and callable(value)
        and name not in NOT_PRIMITIVES
    }


def backend_methods(store: type[StateStore]) -> set[str]:
    """The protected methods ``store`` (and its own bases below ``StateStore``) define
    that ``StateStore`` has too: what the backend overrides."""
    names: set[str] = set()
    for cls in store.__mro__:
        if cls is StateStore or issubclass(StateStore, cls):
            continue
        names |= {
            name
            for name, value in vars(cls).items()
            if name.startswith("_")
            and not name.startswith("__")
            and callable(value)
            and hasattr(StateStore, name)
        }
    return names


def test_state_store_is_composed_of_the_capability_parts() -> None:
    for part in PARTS:
        assert issubclass(StateStore, part)
    assert set(StateStore.__bases__) <= set(PARTS)


@pytest.mark.parametrize("store", [DatabaseStateStore, MemoryStateStore])
def test_every_primitive_a_backend_implements_is_declared_in_primitives(store) -> None:
    overridden = backend_methods(store)
    assert overridden, "the backend overrides no primitive?"
    undeclared = sorted(overridden - declared_primitives())
    assert undeclared == [], f"{store.__name__} implements primitives not declared: {undeclared}"


def test_the_parts_declare_no_primitive() -> None:
    primitives_declared = declared_primitives()
    for part in PARTS:
        redeclared = sorted(set(vars(part)) & primitives_declared)
        assert redeclared == [], f"{part.__name__} redeclares {redeclared}"


def test_every_abstract_method_of_the_contract_is_a_declared_primitive() -> None:
    assert set(StateStore.__abstractmethods__) <= declared_primitives()
    for name in StateStore.__abstractmethods__:
        assert getattr(StateStore, name).__module__ == primitives.__name__


def test_every_primitive_says_what_it_must_do() -> None:
    for name in declared_primitives():
        doc = inspect.getdoc(getattr(StateStorePrimitives, name))
        assert doc and len(doc) > 20, f"{name} has no docstring"
