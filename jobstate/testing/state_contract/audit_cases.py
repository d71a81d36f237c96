"""State-store contract cases of the ``audit`` area: the audit ledger: defaults filled in
from the event, refused entries, and pruning by age."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any

from jobstate.exceptions import InvalidJobState, InvalidPayload
from jobstate.stores.base import StateStore
from jobstate.testing.state_contract._kit import CaseTable, Kit, check, queue_jobs, raises

CASES = CaseTable("audit")


@CASES.case("append_audit fills stage, severity, title and summary from the event")
def _audit_fill(kit: Kit, store: StateStore) -> None:
    area = "audit"
    (job,) = queue_jobs(kit, store, kit.name("target"))
    entry = store.append_audit(
        job=job, event="retry_scheduled", detail={"attempt": 2, "delay_ms": 500}
    )
    check(
        (entry.stage, entry.severity, entry.title) == ("recovery", "warning", "Retry scheduled"),
        area,
        f"retry_scheduled must be filled as recovery/warning; got {entry.stage}/"
        f"{entry.severity} {entry.title!r}.",
    )
    check(
        "attempt: 2" in entry.summary and "delay_ms: 500" in entry.summary,
        area,
        f"the default summary must list the detail; got {entry.summary!r}.",
    )
    check(
        entry.job_id == job.id and entry.request_id == job.request_id and entry.ts is not None,
        area,
        "an entry must carry the job, its request_id and a timestamp.",
    )
    failed = store.append_audit(job=job.id, event="finished", detail={"status": "error"})
    check(
        (failed.stage, failed.severity) == ("summary", "error"),
        area,
        "a finished entry with status error must have severity error.",
    )
    listed = store.list_audit(job=job)
    check(
        [item.id for item in listed] == [entry.id, failed.id],
        area,
        "list_audit must return the job's entries oldest first.",
    )


@CASES.case("given values win and unknown events get system defaults")
def _audit_given(kit: Kit, store: StateStore) -> None:
    area = "audit"
    request_id = kit.name("req")
    given = store.append_audit(
        request_id=request_id,
        event="started",
        stage="tool",
        severity="error",
        title="Custom",
        summary="said so",
        detail={"k": "v"},
    )
    check(
        (given.stage, given.severity, given.title, given.summary, given.detail)
        == ("tool", "error", "Custom", "said so", {"k": "v"}),
        area,
        "explicit stage, severity, title, summary and detail must be kept.",
    )
    unknown = store.append_audit(request_id=request_id, event="custom_event")
    check(
        (unknown.stage, unknown.severity, unknown.title, unknown.job_id)
        == ("system", "info", "custom_event", None),
        area,
        "an unknown event must default to stage system, severity info and its own name.",
    )
    check(len(store.list_audit(request_id=request_id)) == 2, area, "both entries are listed.")


@CASES.case("bad entries raise and write nothing")
def _audit_bad(kit: Kit, store: StateStore) -> None:
    area = "audit"
    request_id = kit.name("req")
    bad: list[tuple[dict[str, Any], type[Exception]]] = [
        ({"event": ""}, InvalidJobState),
        ({"event": "x", "stage": "launchpad"}, InvalidJobState),
        ({"event": "x", "severity": "fatal"}, InvalidJobState),
        ({"event": "x", "detail": {"v": float("nan")}}, InvalidPayload),
        ({"event": "x", "detail": ["not", "a", "dict"]}, InvalidJobState),
        ({"event": "x", "at": datetime(2020, 1, 1)}, InvalidJobState),
        ({"event": "x", "job": "not-a-uuid"}, InvalidJobState),
    ]
    for fields, error in bad:
        raises(
            area,
            error,
            partial(store.append_audit, request_id=request_id, **fields),
            f"append_audit({fields!r})",
        )
    check(store.list_audit(request_id=request_id) == [], area, "nothing may be written.")


@CASES.case("prune deletes the entries older than the cutoff, batch by batch")
def _audit_prune(kit: Kit, store: StateStore) -> None:
    area = "audit"
    request_id = kit.name("req")
    for day in (1, 2, 3):
        store.append_audit(
            request_id=request_id, event="received", at=datetime(1999, 1, day, tzinfo=UTC)
        )
    kept = store.append_audit(request_id=request_id, event="finished")
    pruned = store.prune_audit_older_than(datetime(2000, 1, 1, tzinfo=UTC), batch_size=2)
    check(pruned >= 3, area, f"3 old entries must be pruned over two batches; pruned {pruned}.")
    left = store.list_audit(request_id=request_id)
    check(
        [entry.id for entry in left] == [kept.id],
        area,
        "prune must delete every entry before the cutoff and nothing after it.",
    )
    raises(
        area,
        InvalidJobState,
        lambda: store.prune_audit_older_than(datetime(2000, 1, 1)),
        "prune with a naive cutoff",
    )
