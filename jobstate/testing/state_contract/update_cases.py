"""State-store contract cases of the ``updates`` area: patching jobs: partial writes,
``updated_at`` on the store's clock, refused fields and values that write nothing, and
updates conditional on the status."""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from functools import partial
from typing import Any

from django.utils import timezone

from jobstate.exceptions import ImmutableField, InvalidJobState, InvalidPatch, InvalidPayload
from jobstate.stores.base import JobStatus, StateStore
from jobstate.testing.state_contract._kit import (
    HOUR,
    CaseTable,
    Kit,
    check,
    present,
    queue_jobs,
    raises,
    reread,
    unclaimed,
)

CASES = CaseTable("updates")


@CASES.case("update_job writes only the given fields and None clears a nullable field")
def _update_partial(kit: Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = queue_jobs(kit, store, kit.name("target"), input={"keep": True}, source="api")
    now = timezone.now()
    claimed = present(
        area,
        store.update_job(
            job.id,
            status=JobStatus.RUNNING,
            executor_id="worker-1",
            claimed_at=now,
            lease_until=now + HOUR,
            claim_token=uuid.uuid4(),
            report={"step": 1},
        ),
        "update_job",
    )
    check(
        claimed.executor_id == "worker-1" and claimed.lease_until == now + HOUR,
        area,
        "update_job must persist the fields it was given.",
    )
    cleared = present(
        area,
        store.update_job(
            job.id,
            executor_id=None,
            claimed_at=None,
            lease_until=None,
            claim_token=None,
            result={"ok": True},
        ),
        "update_job with None values",
    )
    stored = reread(area, store, job.id)
    check(
        unclaimed(stored), area, "None must clear nullable fields (claim fields were not cleared)."
    )
    check(
        (stored.input, stored.source, stored.report, stored.status, stored.result)
        == ({"keep": True}, "api", {"step": 1}, JobStatus.RUNNING, {"ok": True}),
        area,
        "fields absent from a patch must keep their values.",
    )
    check(cleared.result == {"ok": True}, area, "update_job must return the job re-read.")


@CASES.case("updated_at moves on every write and created_at never does")
def _update_clock(kit: Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = queue_jobs(kit, store, kit.name("target"))
    time.sleep(0.02)
    first = present(area, store.update_job(job.id), "update_job with an empty patch")
    time.sleep(0.02)
    second = present(area, store.update_job(job.id, error="x"), "update_job")
    check(
        job.updated_at < first.updated_at < second.updated_at,
        area,
        "updated_at must move to the store's clock on every write.",
    )
    check(second.created_at == job.created_at, area, "created_at must never change.")


@CASES.case("identity and unknown fields are refused and nothing is written")
def _update_refused(kit: Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = queue_jobs(kit, store, kit.name("target"))
    refused: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"id": uuid.uuid4()}, ImmutableField),
        ({"request_id": "other"}, ImmutableField),
        ({"created_at": timezone.now()}, ImmutableField),
        ({"updated_at": timezone.now()}, ImmutableField),
        ({"bogus": 1}, InvalidPatch),
        ({"status": None}, InvalidPatch),
        ({"metadata": None}, InvalidPatch),
        ({"attempts": None}, InvalidPatch),
        ({"error": "x", "request_id": "other"}, ImmutableField),
    ]
    for patch, error in refused:
        raises(
            area,
            error,
            partial(store.update_job, job.id, **patch),
            f"update_job({patch})",
        )
        raises(
            area,
            error,
            partial(store.update_job_if_status, job.id, [JobStatus.QUEUED], **patch),
            f"update_job_if_status({patch})",
        )
    stored = reread(area, store, job.id)
    check(
        (stored.updated_at, stored.error, stored.request_id)
        == (job.updated_at, None, job.request_id),
        area,
        "a refused patch must write nothing.",
    )


@CASES.case("values of the wrong kind raise and write nothing")
def _update_bad_values(kit: Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = queue_jobs(kit, store, kit.name("target"))
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    bad: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"status": "paused"}, InvalidJobState),
        ({"run_after": datetime(2030, 1, 1)}, InvalidJobState),
        ({"lease_until": "tomorrow"}, InvalidJobState),
        ({"input": float("nan")}, InvalidPayload),
        ({"result": cyclic}, InvalidPayload),
        ({"metadata": ["not", "a", "dict"]}, InvalidPatch),
        ({"attempts": -1}, InvalidPatch),
        ({"attempts": True}, InvalidPatch),
        ({"thread_id": "seven"}, InvalidJobState),
        ({"claim_token": "not-a-uuid"}, InvalidJobState),
        ({"target": 5}, InvalidPatch),
        ({"error": "nul\x00byte"}, InvalidPatch),
        ({"error": "fine", "input": float("inf")}, InvalidPayload),
    ]
    for patch, error in bad:
        raises(
            area,
            error,
            partial(store.update_job, job.id, **patch),
            f"update_job({patch!r})",
        )
    stored = reread(area, store, job.id)
    check(
        (stored.updated_at, stored.error, stored.input) == (job.updated_at, None, None),
        area,
        "a rejected value must write nothing, not even the other fields of its patch.",
    )
    raises(
        area,
        InvalidJobState,
        lambda: store.create_job(request_id=kit.name("bad"), run_after=datetime(2030, 1, 1)),
        "create_job with a naive run_after",
    )


@CASES.case("update_job_if_status writes only while the status matches")
def _update_if_status(kit: Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = queue_jobs(kit, store, kit.name("target"))
    moved = store.update_job_if_status(
        job.id, [JobStatus.QUEUED], status=JobStatus.RUNNING, executor_id="w1"
    )
    moved = present(area, moved, "update_job_if_status on a matching status")
    check(
        moved.status == JobStatus.RUNNING and moved.executor_id == "w1",
        area,
        "a matching conditional update must apply its patch.",
    )
    again = store.update_job_if_status(
        job.id, [JobStatus.QUEUED], status=JobStatus.RUNNING, executor_id="w2"
    )
    check(again is None, area, "a conditional update on a moved-on status must return None.")
    stored = reread(area, store, job.id)
    check(
        stored.executor_id == "w1" and stored.updated_at == moved.updated_at,
        area,
        "a refused conditional update must leave the job unchanged.",
    )
    check(
        store.update_job_if_status(uuid.uuid4(), [JobStatus.QUEUED], error="x") is None,
        area,
        "a conditional update of an unknown job must return None.",
    )


@CASES.case("an empty expected-status list writes nothing")
def _update_if_status_empty(kit: Kit, store: StateStore) -> None:
    area = "updates"
    (job,) = queue_jobs(kit, store, kit.name("target"))
    check(
        store.update_job_if_status(job.id, [], status=JobStatus.DONE) is None,
        area,
        "update_job_if_status with no expected statuses must return None.",
    )
    stored = reread(area, store, job.id)
    check(
        stored.status == JobStatus.QUEUED and stored.updated_at == job.updated_at,
        area,
        "update_job_if_status with no expected statuses must write nothing.",
    )
    raises(
        area,
        InvalidJobState,
        lambda: store.update_job_if_status(job.id, "queued", error="x"),
        "update_job_if_status with a bare string of statuses",
    )
