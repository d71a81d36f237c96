"""The state-store contract kit: the in-memory reference store and the database store
pass it, it runs twice on one persistent table, and it catches broken stores."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import pytest

from jobstate.models import Job
from jobstate.stores.base import CompletionOutcome, CompletionResult, JobId, JobStatus
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore
from jobstate.testing.state_contract import (
    STATE_CONTRACT_AREAS,
    StateStoreContractCase,
    StateStoreContractViolation,
    state_store_contract_cases,
)

pytestmark = pytest.mark.mysql

MEMORY_CASES = state_store_contract_cases(MemoryStateStore())
DATABASE_CASES = state_store_contract_cases(DatabaseStateStore())


@pytest.mark.parametrize("case", MEMORY_CASES, ids=str)
def test_memory_store_keeps_the_contract(case: StateStoreContractCase) -> None:
    case.run()


# Cases without threads run inside a rolled-back test transaction; the concurrency cases
# need committed rows that other connections can see.
@pytest.mark.django_db
@pytest.mark.parametrize(
    "case", [case for case in DATABASE_CASES if case.area != "concurrency"], ids=str
)
def test_database_store_keeps_the_contract(case: StateStoreContractCase) -> None:
    case.run()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "case", [case for case in DATABASE_CASES if case.area == "concurrency"], ids=str
)
def test_database_store_keeps_the_contract_under_concurrency(case: StateStoreContractCase) -> None:
    case.run()


@pytest.mark.django_db
def test_the_kit_runs_twice_on_one_persistent_table() -> None:
    store = DatabaseStateStore()
    for _ in range(2):
        for case in state_store_contract_cases(store, skip=["concurrency"]):
            case.run()
    assert Job.objects.count() > 100  # the second pass ran among the first pass's rows


def test_every_area_has_cases_and_names_are_unique() -> None:
    names = [case.name for case in MEMORY_CASES]
    assert len(names) == len(set(names))
    assert {case.area for case in MEMORY_CASES} == set(STATE_CONTRACT_AREAS)
    assert all(case.name.startswith(f"{case.area}: ") for case in MEMORY_CASES)
    assert len(MEMORY_CASES) >= 45


def test_skip_drops_whole_areas_and_concurrency_names_the_burst_size() -> None:
    cases = state_store_contract_cases(MemoryStateStore(), skip=("audit", "locks"), concurrency=3)
    areas = {case.area for case in cases}
    assert areas == set(STATE_CONTRACT_AREAS) - {"audit", "locks"}
    assert any("a burst of 3 concurrent claims" in case.name for case in cases)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"skip": ["queue"]}, "unknown contract area"),
        ({"concurrency": 1}, "at least 2"),
    ],
)
def test_bad_kit_options_are_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        state_store_contract_cases(MemoryStateStore(), **options)


def test_a_factory_gives_each_case_its_own_store() -> None:
    made: list[MemoryStateStore] = []

    def factory() -> MemoryStateStore:
        made.append(MemoryStateStore())
        return made[-1]

    cases = state_store_contract_cases(factory, skip=["concurrency", "leases", "listing"])
    for case in cases:
        case.run()
    assert len(made) == len(cases)


# --- the kit catches broken stores ---------------------------------------------------


class GatelessStore(MemoryStateStore):
    """Claims ignore the per-thread FIFO gate."""

    def _blocked(self, row: dict[str, Any], now: Any) -> bool:
        return False


class UnfencedStore(MemoryStateStore):
    """Reports land whatever claim token they carry."""

    def complete_claimed_job(
        self, job_id: JobId, claim_token: uuid.UUID | str, status: str, **patch: Any
    ) -> CompletionResult:
        job = self.update_job(job_id, status=status, **patch)
        return CompletionResult(CompletionOutcome.COMPLETED, job)


class ReadThenWriteStore(MemoryStateStore):
    """Claims read a candidate, let other threads run, then write: not atomic."""

    def _claim(
        self, targets: Sequence[str], owner: str, lease: timedelta, status: JobStatus
    ) -> Job | None:
        with self._mutex:
            queued = [row for row in self._jobs.values() if row["target"] in targets]
            queued = [row for row in queued if row["status"] == JobStatus.QUEUED]
        if not queued:
            return None
        time.sleep(0.02)
        row = min(queued, key=lambda row: (row["created_at"], row["id"]))
        return self.update_job(
            row["id"], status=status, executor_id=owner, claim_token=uuid.uuid4()
        )


@pytest.mark.parametrize(
    ("store_class", "failing_case", "area"),
    [
        (GatelessStore, "a thread with running work holds its next job", "threads"),
        (UnfencedStore, "a report with a stale claim token changes nothing", "completion"),
        (ReadThenWriteStore, "concurrent claims on 8 jobs claims each job once", "concurrency"),
    ],
)
def test_the_kit_catches_a_broken_store(
    store_class: type[MemoryStateStore], failing_case: str, area: str
) -> None:
    (case,) = [
        case for case in state_store_contract_cases(store_class()) if failing_case in case.name
    ]
    with pytest.raises(StateStoreContractViolation, match=rf"^\[StateStore {area}\]"):
        case.run()


def test_burst_errors_from_threads_reach_the_caller() -> None:
    class ExplodingStore(MemoryStateStore):
        def acquire_runtime_lock(self, lock_key: str, owner: str, ttl: timedelta) -> bool:
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError("store crashed")
            return super().acquire_runtime_lock(lock_key, owner, ttl)

    (case,) = [
        case
        for case in state_store_contract_cases(ExplodingStore())
        if case.name.startswith("concurrency: a burst of 8 acquisitions")
    ]
    with pytest.raises(RuntimeError, match="store crashed"):
        case.run()
