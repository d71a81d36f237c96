"""The argument checks of the store contracts: one import address, and the column
limits read from the models instead of retyped."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobstate.exceptions import InvalidJobState, InvalidPatch
from jobstate.models import Job, QueuePause, Worker
from jobstate.stores.contracts import validation
from jobstate.stores.contracts.validation import column_limit
from jobstate.testing.memory_state import MemoryStateStore

TEXT_FIELDS = ["request_id", "target", "source", "session_id", "executor_id", "callback_url"]


def test_the_checks_answer_at_one_address() -> None:
    for module in (
        validation.values,
        validation.job_fields,
        validation.state_arguments,
        validation.run_arguments,
    ):
        for name in module.__all__:
            assert getattr(validation, name) is getattr(module, name)
        assert len(Path(module.__file__).read_text().splitlines()) < 500


@pytest.mark.parametrize("name", [*TEXT_FIELDS, "task_path", "queue_name"])
def test_job_text_limits_are_the_models(name) -> None:
    limit = Job._meta.get_field(name).max_length
    assert column_limit("Job", name) == limit
    store = MemoryStateStore()
    with pytest.raises(InvalidPatch, match=f"longer than {limit}"):
        store.create_job(**{"request_id": "r", name: "x" * (limit + 1)})
    job = store.create_job(**{"request_id": f"ok-{name}", name: "x" * limit})
    assert len(getattr(job, name)) == limit


def test_fleet_limits_are_the_models() -> None:
    store = MemoryStateStore()
    longest = QueuePause._meta.get_field("queue_name").max_length
    assert store.pause_queue(target="t", queue="q" * longest, by="me")
    with pytest.raises(InvalidJobState, match=f"at most {longest}"):
        store.pause_queue(target="t", queue="q" * (longest + 1), by="me")
    assert column_limit("Worker", "host") == Worker._meta.get_field("host").max_length


def test_text_fields_without_a_limit_take_long_text() -> None:
    assert column_limit("Job", "error") is None
    job = MemoryStateStore().create_job(request_id="r", error="e" * 100_000)
    assert len(job.error) == 100_000


def test_a_tuple_of_queues_is_checked_once_and_a_bad_one_every_time() -> None:
    """A worker claims from the same tuple of queues every round: its check is kept,
    never a refusal."""
    store = MemoryStateStore()
    claim = {"target": "tasks:default", "worker_id": "w", "lease": None, "limit": 1}
    for _ in range(2):
        assert store.claim_tasks(queues=("emails", "emails", "default"), **claim) == []
        with pytest.raises(InvalidJobState, match="queue name"):
            store.claim_tasks(queues=("emails", 7), **claim)  # type: ignore[arg-type]
        with pytest.raises(InvalidJobState, match="queue name"):
            store.claim_tasks(queues=("emails", " "), **claim)


@pytest.mark.parametrize(
    ("reason", "said"),
    [
        ("x" * 2001, "reason must be at most 2000 characters."),
        ("nul\x00", "reason contains a NUL character, which cannot be stored."),
        ("\ud800", "reason is not valid Unicode (it holds a lone surrogate)."),
    ],
    ids=["long", "nul", "surrogate"],
)
def test_a_bad_reason_is_refused_saying_what_is_wrong_with_it(reason: str, said: str) -> None:
    store = MemoryStateStore()
    job = store.create_job(request_id="r")
    with pytest.raises(InvalidJobState) as refused:
        store.reject_queued_job(job.id, by="ops", reason=reason)
    assert str(refused.value) == said


@pytest.mark.parametrize("name", ["error", "input_preview"])
def test_text_fields_without_a_limit_are_held_to_the_payload_limit(settings, name) -> None:
    """In bytes of UTF-8, as JSON values are: a row is never larger for its text."""
    settings.JOBSTATE = {"MAX_PAYLOAD_BYTES": 64}
    store = MemoryStateStore()
    with pytest.raises(InvalidPatch, match=r"66 bytes of UTF-8; the limit is 64 \(JOBSTATE"):
        store.create_job(**{"request_id": "r", name: "é" * 33})
    job = store.create_job(**{"request_id": "ok", name: "é" * 32})
    assert getattr(job, name) == "é" * 32


@pytest.mark.django_db
def test_a_report_with_too_long_an_error_changes_nothing(settings) -> None:
    from jobstate.stores.database import DatabaseStateStore

    settings.JOBSTATE = {"MAX_PAYLOAD_BYTES": 1024}
    store = DatabaseStateStore()
    store.create_job(request_id="big-error", target="t")
    job = store.claim_next_inhub_job(["t"], "w")
    assert job is not None
    with pytest.raises(InvalidPatch, match="error is 1025 bytes"):
        store.complete_job_with_notifications(job, {"status": "error", "error": "x" * 1025}, [])
    stored = Job.objects.get(id=job.id)
    assert (stored.status, stored.error, stored.claim_token) == ("running", None, job.claim_token)
