"""State-store contract cases of the ``locks`` area: runtime locks: ownership, expiry,
release and the ``runtime_lock`` block."""

from __future__ import annotations

import time
from datetime import timedelta

from jobstate.exceptions import InvalidJobState, LockHeld
from jobstate.stores.base import StateStore, runtime_lock
from jobstate.testing.state_contract._kit import AGE, HOUR, SETTLE, CaseTable, Kit, check, raises

CASES = CaseTable("locks")


@CASES.case("the owner renews, another owner is refused, a non-owner's release does nothing")
def _lock_owner(kit: Kit, store: StateStore) -> None:
    area, key = "locks", kit.name("lock")
    check(store.acquire_runtime_lock(key, "a", HOUR), area, "a free lock must be acquired.")
    check(store.acquire_runtime_lock(key, "a", HOUR), area, "the owner must be able to renew.")
    check(not store.acquire_runtime_lock(key, "b", HOUR), area, "another owner is refused.")
    store.release_runtime_lock(key, "b")
    check(
        not store.acquire_runtime_lock(key, "b", HOUR),
        area,
        "a release by a non-owner must not free the lock.",
    )


@CASES.case("an expired lock can be taken by another owner")
def _lock_expiry(kit: Kit, store: StateStore) -> None:
    area, key = "locks", kit.name("lock")
    check(store.acquire_runtime_lock(key, "a", AGE), area, "a free lock must be acquired.")
    time.sleep(SETTLE)
    check(store.acquire_runtime_lock(key, "b", HOUR), area, "an expired lock must be takeable.")
    check(
        not store.acquire_runtime_lock(key, "a", HOUR),
        area,
        "the previous owner must not take back a lock it lost.",
    )


@CASES.case("a released lock is free for the next owner")
def _lock_release(kit: Kit, store: StateStore) -> None:
    area, key = "locks", kit.name("lock")
    store.acquire_runtime_lock(key, "a", HOUR)
    store.release_runtime_lock(key, "a")
    check(store.acquire_runtime_lock(key, "b", HOUR), area, "a released lock must be free.")
    raises(
        area,
        InvalidJobState,
        lambda: store.acquire_runtime_lock(key, "b", timedelta(0)),
        "acquire_runtime_lock with a zero ttl",
    )


@CASES.case("runtime_lock holds the key for the block and raises LockHeld when taken")
def _lock_context(kit: Kit, store: StateStore) -> None:
    area, key = "locks", kit.name("lock")
    with runtime_lock(store, key, "a", HOUR):
        check(
            not store.acquire_runtime_lock(key, "b", HOUR),
            area,
            "the key must be held inside the block.",
        )
        raises(
            area,
            LockHeld,
            lambda: runtime_lock(store, key, "b", HOUR).__enter__(),
            "runtime_lock on a held key",
        )
    check(store.acquire_runtime_lock(key, "b", HOUR), area, "the block must release the key.")
    store.release_runtime_lock(key, "b")
    try:
        with runtime_lock(store, key, "a", HOUR):
            raise KeyError("boom")
    except KeyError:
        pass
    check(
        store.acquire_runtime_lock(key, "c", HOUR),
        area,
        "the key must be released when the block raises.",
    )
