"""Optional state-store capabilities are declared by flags: a store refuses an operation
it does not offer with UnsupportedStoreOperation before it looks at the arguments, and a
store of one's own implements primitives, not public methods."""

from __future__ import annotations

from typing import Any

import pytest

from jobstate.exceptions import JobStateError, UnsupportedStoreOperation
from jobstate.stores.base import StateStore
from jobstate.stores.database import DatabaseStateStore
from jobstate.testing.memory_state import MemoryStateStore

#: Each optional operation of the memory store's missing capabilities, called with
#: arguments no store would accept: the flag answers first.
UNSUPPORTED_BY_MEMORY = {
    "supports_outbox": lambda store: store.complete_job_with_notifications(None, None),
    "supports_delivery_replay": lambda store: store.requeue_delivery_job_once(
        notification_id="not-a-uuid", dlq_key="", requested_by=""
    ),
    "supports_readiness": lambda store: store.schema_readiness(),
}


@pytest.mark.parametrize("flag", sorted(UNSUPPORTED_BY_MEMORY))
def test_an_operation_without_its_flag_is_refused_before_its_arguments(flag: str) -> None:
    with pytest.raises(UnsupportedStoreOperation, match=rf"\({flag} is False\)") as raised:
        UNSUPPORTED_BY_MEMORY[flag](MemoryStateStore())
    # Callers that caught NotImplementedError, or every jobstate error, still do.
    assert isinstance(raised.value, NotImplementedError)
    assert isinstance(raised.value, JobStateError)


def test_the_outbox_property_is_refused_too() -> None:
    with pytest.raises(UnsupportedStoreOperation, match="notification_outbox"):
        _ = MemoryStateStore().notification_outbox


def test_a_store_can_turn_batches_off() -> None:
    class OneAtATime(MemoryStateStore):
        supports_batch_claims = False

    store = OneAtATime()
    with pytest.raises(UnsupportedStoreOperation, match="claim_next_inhub_jobs"):
        store.claim_next_inhub_jobs(["t"], "w", limit=5)
    with pytest.raises(UnsupportedStoreOperation, match="complete_claimed_jobs"):
        store.complete_claimed_jobs([])


def test_a_flag_without_its_primitives_names_what_is_missing() -> None:
    class Boasting(MemoryStateStore):
        supports_readiness = True

    with pytest.raises(UnsupportedStoreOperation, match=r"does not implement _schema_readiness"):
        Boasting().schema_readiness()


def test_the_stores_declare_what_they_offer() -> None:
    flags = [name for name in dir(StateStore) if name.startswith("supports_")]
    assert {name: getattr(DatabaseStateStore, name) for name in flags} == dict.fromkeys(flags, True)
    memory = {name for name in flags if getattr(MemoryStateStore, name)}
    assert memory == {
        "supports_batch_claims",
        "supports_approvals",
        "supports_metrics",
        "supports_tasks",
        "supports_queue_pauses",
        "supports_worker_registry",
        "supports_job_deletion",
    }


def test_a_store_without_pauses_or_a_registry_refuses_them_before_their_arguments() -> None:
    class Plain(MemoryStateStore):
        supports_queue_pauses = False
        supports_worker_registry = False

    store = Plain()
    for call in (
        lambda: store.pause_queue(target="", by=""),
        lambda: store.resume_queue(target="", by=""),
        lambda: store.paused_queues(),
        lambda: store.register_worker(None),  # type: ignore[arg-type]
        lambda: store.beat_worker(worker_id=""),
        lambda: store.stop_worker(worker_id="", reason=""),
    ):
        with pytest.raises(UnsupportedStoreOperation, match="is False"):
            call()


def test_a_store_of_ones_own_implements_primitives_not_public_methods() -> None:
    class Empty(StateStore):
        pass

    with pytest.raises(TypeError) as raised:
        Empty()  # type: ignore[abstract]
    message = str(raised.value)
    assert "_claim" in message and "_append_audit_entry" in message
    assert "claim_next_job" not in message and "append_audit," not in message


def test_the_base_writes_the_refire_once_for_every_store() -> None:
    store = MemoryStateStore()
    job = store.create_job(request_id="r", target="t", metadata={"no_delivery": True, "k": 1})
    store.update_job(job.id, status="done")
    requeued: Any = store.requeue_job(job.id, from_statuses=["done"], by="ops", via="test")
    assert requeued.status == "queued" and requeued.metadata == {"k": 1}
    (entry,) = store.list_audit(job=job)
    assert (entry.event, entry.detail) == (
        "rerun",
        {"by": "ops", "via": "test", "prev_status": "done"},
    )
