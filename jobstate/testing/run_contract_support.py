"""What the JobRunStore contract cases (:mod:`jobstate.testing.run_contract`) are built
from: the violation they raise, binding a case to its store, claiming a key a case needs,
comparing stored JSON, and releasing calls together from several threads."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal, TypeVar, cast

from jobstate.stores.base import JobRunStore, Trigger
from jobstate.testing.fake_clock import T0

__all__ = [
    "THREAD_TIMEOUT_SECONDS",
    "TRIGGER",
    "ContractViolation",
    "JobRunStoreObligation",
    "bind",
    "claim_or_fail",
    "ms",
    "run_concurrently",
    "same_json",
    "store_factory",
]

JobRunStoreObligation = Literal["S1", "S2", "S3", "S4", "S5", "S6", "S7"]
_STORE_METHODS = ("claim", "heartbeat", "complete", "record_skipped", "reap_stale")

TRIGGER = Trigger(source="SCHEDULER", triggered_by=None)

#: How long a concurrent case waits for its threads before it calls the store hung.
THREAD_TIMEOUT_SECONDS = 60.0

_T = TypeVar("_T")


class ContractViolation(AssertionError):
    """A store broke an obligation. The message starts with ``[JobRunStore S<n>]`` and
    says how stores usually go wrong there."""

    def __init__(self, obligation: JobRunStoreObligation, message: str) -> None:
        super().__init__(f"[JobRunStore {obligation}] {message}")
        self.obligation = obligation


def bind(
    check: Callable[[JobRunStore], None], store_factory: Callable[[], JobRunStore]
) -> Callable[[], None]:
    def run() -> None:
        check(_checked_store(store_factory()))

    return run


def store_factory(
    store_or_factory: JobRunStore | Callable[[], JobRunStore],
) -> Callable[[], JobRunStore]:
    # A class has the store methods as attributes too, so it is treated as a factory.
    if not isinstance(store_or_factory, type) and _looks_like_store(store_or_factory):
        store = cast(JobRunStore, store_or_factory)
        return lambda: store
    if callable(store_or_factory):
        return store_or_factory
    raise TypeError(
        "job_run_store_contract_cases() takes a JobRunStore or a callable returning one, "
        f"got {type(store_or_factory).__name__}."
    )


def _looks_like_store(candidate: object) -> bool:
    return isinstance(candidate, JobRunStore) or all(
        callable(getattr(candidate, method, None)) for method in _STORE_METHODS
    )


def _checked_store(candidate: object) -> JobRunStore:
    if isinstance(candidate, type) or not _looks_like_store(candidate):
        raise TypeError(
            f"the store factory returned {type(candidate).__name__}, which lacks the "
            f"JobRunStore methods {', '.join(_STORE_METHODS)}."
        )
    return cast(JobRunStore, candidate)


def claim_or_fail(
    store: JobRunStore,
    obligation: JobRunStoreObligation,
    job_key: str,
    overlap_key: str,
    started_at: datetime = T0,
) -> str:
    run_id = store.claim(
        job_key=job_key,
        overlap_key=overlap_key,
        trigger=TRIGGER,
        input=None,
        started_at=started_at,
    )
    if run_id is None:
        raise ContractViolation(
            obligation, f"claim({overlap_key!r}) returned None on a key no RUNNING row holds."
        )
    return run_id


def ms(milliseconds: int) -> datetime:
    return T0 + timedelta(milliseconds=milliseconds)


def same_json(stored: Any, given: Any) -> bool:
    # Compared as canonical JSON text: key order carries no meaning (PostgreSQL's jsonb
    # reorders keys), but True vs 1 and 1 vs 1.0 do, and Python's == would blur them.
    try:
        return json.dumps(stored, sort_keys=True, allow_nan=False) == json.dumps(
            given, sort_keys=True, allow_nan=False
        )
    except (TypeError, ValueError):
        return False


def run_concurrently(
    obligation: JobRunStoreObligation, calls: Sequence[Callable[[], _T]]
) -> list[_T | BaseException]:
    """Run ``calls`` in as many threads, released together by a barrier; return each
    call's result or the exception it raised, in order."""
    barrier = threading.Barrier(len(calls))
    outcomes: list[_T | BaseException | None] = [None] * len(calls)

    def worker(index: int) -> None:
        try:
            barrier.wait(THREAD_TIMEOUT_SECONDS)
            outcomes[index] = calls[index]()
        except BaseException as exc:  # handed back to the calling thread, never lost
            outcomes[index] = exc
        finally:
            _close_thread_connections()

    threads = [
        threading.Thread(target=worker, args=(index,), name=f"jobstate-contract-{index}")
        for index in range(len(calls))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(THREAD_TIMEOUT_SECONDS)
    hung = sum(thread.is_alive() for thread in threads)
    if hung:
        raise ContractViolation(
            obligation,
            f"{hung} of {len(calls)} concurrent calls did not return within "
            f"{THREAD_TIMEOUT_SECONDS:g} s; the store deadlocked or waits on a lock forever.",
        )
    return cast(list[_T | BaseException], outcomes)


def _close_thread_connections() -> None:
    # Django opens one connection per thread and never closes a worker thread's on its
    # own; left open they would outlive the test and block dropping the test database.
    # Imported here so the cases also drive stores that have nothing to do with Django.
    from django.conf import settings

    if settings.configured:
        from django.db import connections

        connections.close_all()
