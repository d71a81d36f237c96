"""The JobRunStore contract as executable cases.

:func:`job_run_store_contract_cases` returns the obligations S1-S7 of
:class:`~jobstate.stores.base.JobRunStore` as plain case objects. They depend on no test
framework: each has a ``name``, an ``obligation`` and a ``run()`` that returns quietly or
raises :class:`ContractViolation`. A host drives them from pytest::

    from jobstate.stores.database import DatabaseJobRunStore
    from jobstate.testing import (
        contract_case_id,
        database_run_inspector,
        job_run_store_contract_cases,
    )

    @pytest.mark.django_db(transaction=True)
    @pytest.mark.parametrize(
        "case",
        job_run_store_contract_cases(DatabaseJobRunStore, inspect=database_run_inspector()),
        ids=contract_case_id,
    )
    def test_run_store_contract(case):
        case.run()

**Safe on a persistent table.** Each call draws a fresh namespace
(``contract-<12 hex digits>``) and every job key and overlap key the cases use starts with
it; every reap a case issues is narrowed to those keys. The same table can therefore run
the suite again and again without being emptied, and no case ever moves a row it did not
create. Rows left behind are inert: the next call uses other keys.

The concurrent cases (the S1 burst and the S4 double reap) start real threads behind a
``threading.Barrier``. A database store must therefore see committed data from several
connections: under pytest-django use ``django_db(transaction=True)``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, cast, get_args

from jobstate.stores.base import JobRunStore
from jobstate.testing.fake_clock import T0
from jobstate.testing.memory_runs import StoredJobRun
from jobstate.testing.run_contract_support import (
    TRIGGER,
    ContractViolation,
    JobRunStoreObligation,
    bind,
    claim_or_fail,
    ms,
    run_concurrently,
    same_json,
    store_factory,
)

__all__ = [
    "ContractViolation",
    "JobRunStoreContractCase",
    "JobRunStoreObligation",
    "contract_case_id",
    "job_run_store_contract_cases",
]

_OBLIGATIONS: tuple[str, ...] = get_args(JobRunStoreObligation)

ONE_HOUR = timedelta(hours=1)
NO_TIME = timedelta(0)


@dataclass(frozen=True)
class JobRunStoreContractCase:
    """One contract case, bound to the store (or store factory) it was built for."""

    name: str
    obligation: JobRunStoreObligation
    _run: Callable[[], None] = field(repr=False, compare=False)

    def run(self) -> None:
        """Run the case; raise :class:`ContractViolation` if the store breaks it. Errors
        the store raises where the contract expects an answer propagate unchanged."""
        self._run()

    def __str__(self) -> str:
        return self.name


def contract_case_id(case: object) -> str:
    """Test id of a case: its name. For ``pytest.mark.parametrize(..., ids=contract_case_id)``."""
    if not isinstance(case, JobRunStoreContractCase):
        raise TypeError(f"expected a JobRunStoreContractCase, got {type(case).__name__}.")
    return case.name


def job_run_store_contract_cases(
    store_or_factory: JobRunStore | Callable[[], JobRunStore],
    *,
    inspect: Callable[[str], StoredJobRun | None] | None = None,
    concurrency: int = 8,
    skip: Iterable[JobRunStoreObligation] = (),
) -> list[JobRunStoreContractCase]:
    """Return the JobRunStore contract cases, in a fixed order.

    ``store_or_factory`` is a store, shared by every case, or a callable taking no
    arguments (a store class, for instance) that is called once per case run.
    ``inspect(run_id)`` reads one stored run back; without it the three cases that
    can only be judged from stored values (S6 recorded instants, S7 twice) are left out,
    giving 13 cases instead of 16. ``concurrency`` is the size of the S1 burst: that many
    threads claim one key at once, so a database store needs that many connections.
    ``skip`` drops every case of the named obligations.
    """
    factory = store_factory(store_or_factory)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 2:
        raise ValueError(f"concurrency must be an int of at least 2, got {concurrency!r}.")
    if isinstance(skip, str):
        raise TypeError(f"skip takes a collection of obligations, e.g. ('S4',), not {skip!r}.")
    skipped = set(skip)
    unknown = skipped - set(_OBLIGATIONS)
    if unknown:
        raise ValueError(
            f"unknown obligation(s) in skip: {', '.join(sorted(map(str, unknown)))}; "
            f"expected some of {', '.join(_OBLIGATIONS)}."
        )
    if inspect is not None and not callable(inspect):
        raise TypeError(f"inspect must be callable, got {type(inspect).__name__}.")

    namespace = f"contract-{uuid.uuid4().hex[:12]}"

    def key(name: str) -> str:
        return f"{namespace}.{name}"

    cases: list[tuple[str, JobRunStoreObligation, Callable[[JobRunStore], None]]] = []

    def case(
        obligation: JobRunStoreObligation, name: str
    ) -> Callable[[Callable[[JobRunStore], None]], Callable[[JobRunStore], None]]:
        def register(check: Callable[[JobRunStore], None]) -> Callable[[JobRunStore], None]:
            cases.append((name, obligation, check))
            return check

        return register

    @case(
        "S1",
        f"S1: a burst of {concurrency} concurrent claims on one overlap key "
        "yields exactly one winner",
    )
    def burst(store: JobRunStore) -> None:
        def claim() -> str | None:
            return store.claim(
                job_key=key("burst"),
                overlap_key=key("burst"),
                trigger=TRIGGER,
                input=None,
                started_at=T0,
            )

        outcomes = run_concurrently("S1", [claim] * concurrency)
        raised = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
        if raised:
            raise ContractViolation(
                "S1",
                f"{len(raised)} of {concurrency} concurrent claims raised instead of answering "
                f"(first: {type(raised[0]).__name__}: {raised[0]}). A claim that loses the "
                "race must return None; only the overlap key's uniqueness violation may be "
                "turned into None.",
            ) from raised[0]
        winners = sum(outcome is not None for outcome in outcomes)
        if winners != 1:
            raise ContractViolation(
                "S1",
                f"{winners} of {concurrency} concurrent claims succeeded, expected exactly 1. "
                "Either the overlap key has no partial unique index "
                "(WHERE status = 'RUNNING'), or claim() is not an atomic compare-and-set "
                "(reading first and inserting after lets several callers through). Run this "
                "against a pool of at least 2 connections: one shared connection serialises "
                "the burst and hides the defect.",
            )

    @case("S1", "S1: the overlap key is free again once the run is settled")
    def free_again(store: JobRunStore) -> None:
        run_id = claim_or_fail(store, "S1", key("reclaim"), key("reclaim"))
        store.complete(run_id=run_id, status="SUCCEEDED", finished_at=ms(10), duration_ms=10)
        second = store.claim(
            job_key=key("reclaim"),
            overlap_key=key("reclaim"),
            trigger=TRIGGER,
            input=None,
            started_at=ms(20),
        )
        if second is None:
            raise ContractViolation(
                "S1",
                "the overlap key was still held after its run settled. The unique index "
                "must be PARTIAL (WHERE status = 'RUNNING'): a plain unique index lets the "
                "first row hold the key forever, and every later trigger is recorded as a "
                "harmless-looking SKIPPED.",
            )

    @case("S1", "S1: distinct overlap keys do not block one another")
    def distinct_keys(store: JobRunStore) -> None:
        claim_or_fail(store, "S1", key("allow"), f"{key('allow')}#1")
        claim_or_fail(store, "S1", key("allow"), f"{key('allow')}#2")

    @case("S2", "S2: a heartbeat on a settled run writes nothing and answers false")
    def heartbeat_settled(store: JobRunStore) -> None:
        run_id = claim_or_fail(store, "S2", key("beat"), key("beat"))
        store.complete(run_id=run_id, status="SUCCEEDED", finished_at=ms(5), duration_ms=5)
        if store.heartbeat(run_id=run_id, progress={"processed": 99}):
            raise ContractViolation(
                "S2", "heartbeat() answered True for a run that is no longer RUNNING."
            )

    @case("S2", "S2: an accepted heartbeat advances the liveness watermark and never rewinds it")
    def heartbeat_advances(store: JobRunStore) -> None:
        run_id = claim_or_fail(store, "S2", key("beat2"), key("beat2"))
        if not store.heartbeat(run_id=run_id):
            raise ContractViolation("S2", "heartbeat() answered False for a RUNNING run.")
        if not store.heartbeat(run_id=run_id, progress={"processed": 1}):
            raise ContractViolation(
                "S2", "the second heartbeat() answered False for a RUNNING run."
            )
        reaped = store.reap_stale(stale_after=ONE_HOUR, overlap_key=key("beat2"))
        if reaped != 0:
            raise ContractViolation(
                "S2",
                f"a run that had just sent two heartbeats was reaped under a one-hour budget "
                f"({reaped} rows moved): the watermark was never advanced, or moved backwards.",
            )

    @case("S3", "S3: completing twice writes once and answers false the second time")
    def complete_twice(store: JobRunStore) -> None:
        run_id = claim_or_fail(store, "S3", key("done"), key("done"))
        first = store.complete(run_id=run_id, status="SUCCEEDED", finished_at=ms(7), duration_ms=7)
        if not first:
            raise ContractViolation("S3", "the first complete() of a RUNNING run answered False.")
        second = store.complete(
            run_id=run_id,
            status="FAILED",
            finished_at=ms(9),
            duration_ms=9,
            error="second write must not land",
        )
        if second:
            raise ContractViolation(
                "S3",
                "complete() overwrote a settled run. Update only WHERE status = 'RUNNING'.",
            )

    @case("S3", "S3: a run the reaper already settled refuses a late completion")
    def complete_after_reap(store: JobRunStore) -> None:
        run_id = claim_or_fail(store, "S3", key("reaped"), key("reaped"))
        reaped = store.reap_stale(stale_after=NO_TIME, overlap_key=key("reaped"))
        if reaped != 1:
            raise ContractViolation(
                "S3", f"reap_stale(stale_after=0) should have moved 1 row, it moved {reaped}."
            )
        late = store.complete(run_id=run_id, status="SUCCEEDED", finished_at=ms(11), duration_ms=11)
        if late:
            raise ContractViolation(
                "S3", "a late complete() overwrote a run the reaper had already settled."
            )

    @case("S4", "S4: two concurrent reaps of three stale rows report three moves in total")
    def concurrent_reaps(store: JobRunStore) -> None:
        for suffix in ("a", "b", "c"):
            claim_or_fail(store, "S4", key("sweep"), f"{key('sweep')}#{suffix}")

        def reap() -> int:
            return store.reap_stale(stale_after=NO_TIME, job_key=key("sweep"))

        left, right = run_concurrently("S4", [reap, reap])
        for outcome in (left, right):
            if isinstance(outcome, BaseException):
                raise ContractViolation(
                    "S4",
                    f"a reap running beside another one raised "
                    f"{type(outcome).__name__}: {outcome}. Concurrent reapers must skip each "
                    "other's rows, not fail.",
                ) from outcome
        total = cast(int, left) + cast(int, right)
        if total != 3:
            raise ContractViolation(
                "S4",
                f"two concurrent reaps reported {left} + {right} = {total} moves for 3 stale "
                "rows. Select and update in ONE statement with FOR UPDATE SKIP LOCKED; a "
                "SELECT followed by a separate UPDATE counts rows twice.",
            )

    @case("S4", "S4: a fresh RUNNING row survives a generous liveness budget")
    def fresh_survives(store: JobRunStore) -> None:
        claim_or_fail(store, "S4", key("fresh"), key("fresh"))
        # Narrowed on purpose: an unscoped reap would time out a host's real runs that
        # happen to be an hour old.
        reaped = store.reap_stale(stale_after=ONE_HOUR, job_key=key("fresh"))
        if reaped != 0:
            raise ContractViolation(
                "S4", f"a fresh RUNNING row was reaped under a one-hour budget ({reaped} rows)."
            )

    @case("S4", "S4: reap narrowed to one overlap key leaves other keys alone")
    def narrowed_reap(store: JobRunStore) -> None:
        kept, swept = f"{key('narrow')}#kept", f"{key('narrow')}#swept"
        claim_or_fail(store, "S4", key("narrow"), kept)
        claim_or_fail(store, "S4", key("narrow"), swept)
        reaped = store.reap_stale(stale_after=NO_TIME, overlap_key=swept)
        if reaped != 1:
            raise ContractViolation(
                "S4", f"a reap narrowed to one overlap key moved {reaped} rows, expected 1."
            )
        blocked = store.claim(
            job_key=key("narrow"),
            overlap_key=kept,
            trigger=TRIGGER,
            input=None,
            started_at=ms(1),
        )
        if blocked is not None:
            raise ContractViolation(
                "S4", "a reap narrowed to another overlap key released this one as collateral."
            )

    @case("S4", "S4: limit caps how many rows one reap may move")
    def limited_reap(store: JobRunStore) -> None:
        claim_or_fail(store, "S4", key("limit"), f"{key('limit')}#1")
        claim_or_fail(store, "S4", key("limit"), f"{key('limit')}#2")
        reaped = store.reap_stale(stale_after=NO_TIME, job_key=key("limit"), limit=1)
        if reaped != 1:
            raise ContractViolation("S4", f"a reap with limit=1 moved {reaped} rows.")

    @case("S5", "S5: every claimed and skipped run gets a distinct id")
    def distinct_ids(store: JobRunStore) -> None:
        first = claim_or_fail(store, "S5", key("ids"), f"{key('ids')}#1")
        second = claim_or_fail(store, "S5", key("ids"), f"{key('ids')}#2")
        skipped = store.record_skipped(
            job_key=key("ids"), trigger=TRIGGER, input=None, at=T0, reason="overlap"
        )
        if len({first, second, skipped}) != 3:
            raise ContractViolation(
                "S5",
                f"run ids repeated across two claims and one skipped run: "
                f"{first!r}, {second!r}, {skipped!r}.",
            )

    @case("S6", "S6: claim initialises the liveness watermark from the store clock")
    def watermark_initialised(store: JobRunStore) -> None:
        claim_or_fail(store, "S6", key("live"), key("live"))
        reaped = store.reap_stale(stale_after=NO_TIME, overlap_key=key("live"))
        if reaped != 1:
            raise ContractViolation(
                "S6",
                f"reap_stale(stale_after=0) right after a claim moved {reaped} rows, expected "
                "1. A NULL liveness watermark never compares as stale, so the row can never "
                "be reaped and holds the overlap key forever: set it in the claim itself, "
                "from the store clock (heartbeat_at NOT NULL DEFAULT now()).",
            )
        second = store.claim(
            job_key=key("live"),
            overlap_key=key("live"),
            trigger=TRIGGER,
            input=None,
            started_at=ms(1),
        )
        if second is None:
            raise ContractViolation("S6", "the overlap key stayed held after its run was reaped.")

    if inspect is not None:
        read = inspect

        @case("S6", "S6: recording instants are stored verbatim from the runner clock")
        def instants_verbatim(store: JobRunStore) -> None:
            started_at = ms(12_345)
            finished_at = started_at + timedelta(milliseconds=250)
            run_id = claim_or_fail(store, "S6", key("stamps"), key("stamps"), started_at)
            store.complete(
                run_id=run_id, status="SUCCEEDED", finished_at=finished_at, duration_ms=250
            )
            row = read(run_id)
            if row is None:
                raise ContractViolation("S6", "inspect() found no row for a completed run.")
            if row.started_at != started_at or row.finished_at != finished_at:
                raise ContractViolation(
                    "S6",
                    f"recorded instants were rewritten: started_at={row.started_at!r}, "
                    f"finished_at={row.finished_at!r}, expected {started_at!r} and "
                    f"{finished_at!r}. Store the runner's values as bound parameters instead "
                    "of the store's now().",
                )

        @case("S7", "S7: input and summary survive a JSON round trip")
        def json_round_trip(store: JobRunStore) -> None:
            given_input = {"limit": 10, "nested": {"flag": True, "list": [1, 2, 3]}}
            given_summary = {"ok": True, "processed": 3}
            run_id = store.claim(
                job_key=key("json"),
                overlap_key=key("json"),
                trigger=TRIGGER,
                input=given_input,
                started_at=T0,
            )
            if run_id is None:
                raise ContractViolation("S7", "claim() answered None on a free overlap key.")
            store.complete(
                run_id=run_id,
                status="SUCCEEDED",
                finished_at=ms(1),
                duration_ms=1,
                summary=given_summary,
            )
            row = read(run_id)
            if row is None:
                raise ContractViolation("S7", "inspect() found no row for a completed run.")
            if not same_json(row.input, given_input):
                raise ContractViolation(
                    "S7", f"the stored input did not round-trip: got {row.input!r}."
                )
            if not same_json(row.summary, given_summary):
                raise ContractViolation(
                    "S7", f"the stored summary did not round-trip: got {row.summary!r}."
                )

        @case("S7", "S7: a value that cannot be stored raises instead of being dropped")
        def unstorable_raises(store: JobRunStore) -> None:
            cyclic: dict[str, Any] = {}
            cyclic["self"] = cyclic
            try:
                store.claim(
                    job_key=key("cyclic"),
                    overlap_key=key("cyclic"),
                    trigger=TRIGGER,
                    input=cyclic,
                    started_at=T0,
                )
            except Exception:
                return
            raise ContractViolation(
                "S7", "a value that cannot be stored (a cyclic input) was accepted silently."
            )

    return [
        JobRunStoreContractCase(name=name, obligation=obligation, _run=bind(check, factory))
        for name, obligation, check in cases
        if obligation not in skipped
    ]
