"""The one loop behind every maintenance sweep: :func:`run_sweep` runs any entry of the
sweep table in bounded batches, or counts its candidates for a dry run."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypedDict, Unpack

from django.db import DEFAULT_DB_ALIAS

from jobstate.core.conf import jobstate_settings
from jobstate.maintenance.sweep_results import SweepProgress, SweepResult
from jobstate.maintenance.sweep_table import Sweep, SweepKind
from jobstate.stores.contracts.validation import validate_duration, validate_positive_int

__all__ = ["SweepBounds", "SweepOptions", "check_options", "run_sweep"]

logger = logging.getLogger("jobstate.maintenance")


class SweepOptions(TypedDict, total=False):
    """The keyword options every sweep takes, each optional.

    ``using``: the database alias (default ``"default"``). ``batch_size``: rows per
    batch (default ``SWEEP_BATCH_SIZE`` for reaping, ``RETENTION_BATCH_SIZE`` for
    retention). ``time_budget``: no new batch starts after this (default
    ``SWEEP_TIME_BUDGET``). ``limit``: at most this many rows in the call (default: no
    cap). ``dry_run``: count what the call would move now and write nothing.
    ``on_batch``: called after every batch with the sweep's name and its rows so far.
    """

    using: str
    batch_size: int | None
    time_budget: timedelta | None
    limit: int | None
    dry_run: bool
    on_batch: SweepProgress | None


@dataclass(frozen=True)
class SweepBounds:
    """How far one sweep call may go: rows per batch, time budget, optional row cap."""

    batch_size: int
    time_budget: timedelta
    limit: int | None


def check_options(kind: SweepKind, options: SweepOptions) -> SweepBounds:
    """The bounds of a call of a sweep of ``kind``, each given in ``options`` or from
    its setting; :class:`~jobstate.exceptions.InvalidJobState` for a bad one, and
    ``TypeError`` for an option no sweep takes (a misspelt ``dry_run`` must not sweep)."""
    unknown = sorted(set(options) - SweepOptions.__optional_keys__)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}; a sweep takes "
            f"{', '.join(sorted(SweepOptions.__optional_keys__))} and its own arguments."
        )
    size, budget, limit = (
        options.get("batch_size"),
        options.get("time_budget"),
        options.get("limit"),
    )
    if size is None:
        size = getattr(jobstate_settings, kind.batch_size_setting)
    return SweepBounds(
        batch_size=validate_positive_int(size, field="batch_size"),
        time_budget=validate_duration(
            jobstate_settings.SWEEP_TIME_BUDGET if budget is None else budget,
            field="time_budget",
            allow_zero=False,
        ),
        limit=None if limit is None else validate_positive_int(limit, field="limit"),
    )


def run_sweep(
    sweep: Sweep[Any],
    arguments: Mapping[str, Any] | None = None,
    /,
    **options: Unpack[SweepOptions],
) -> SweepResult:
    """Run ``sweep`` with its own ``arguments`` (absent or ``None``: their settings).

    Every argument is checked before the sweep store is asked for anything. A dry run
    asks the store for a count; otherwise batches move until one comes back short,
    ``limit`` rows have moved, or the time budget has passed, and the result is logged.
    """
    bounds = check_options(sweep.kind, options)
    given = sweep.resolve(arguments or {})
    store = sweep.store(options.get("using", DEFAULT_DB_ALIAS))
    if options.get("dry_run", False):
        count, detail = sweep.tally(sweep.count(store, bounds.limit, given))
        return SweepResult(sweep.name, count, dry_run=True, detail=detail)
    result = _run_batches(sweep, store, given, bounds, options.get("on_batch"))
    if result.count:
        logger.info(
            "sweep %s: %d rows in %d batches (%s)",
            result.sweep,
            result.count,
            result.batches,
            sweep.transition,
            extra={"sweep": result.sweep, "count": result.count, "detail": dict(result.detail)},
        )
    return result


def _run_batches(
    sweep: Sweep[Any],
    store: Any,
    given: Mapping[str, Any],
    bounds: SweepBounds,
    on_batch: SweepProgress | None,
) -> SweepResult:
    deadline = time.monotonic() + bounds.time_budget.total_seconds()
    cap = bounds.limit
    total = batches = 0
    detail = dict.fromkeys(sweep.outcomes, 0)
    while True:
        want = bounds.batch_size if cap is None else min(bounds.batch_size, cap - total)
        moved, split = sweep.tally(sweep.move(store, want, given))
        total += moved
        batches += 1
        for outcome, count in split.items():
            detail[outcome] += count
        if on_batch is not None:
            on_batch(sweep.name, total)
        # A short batch means no unlocked candidate was left: the rest, if any, belongs
        # to a concurrent sweeper that holds it.
        if moved < want:
            return SweepResult(sweep.name, total, batches, complete=True, detail=detail)
        if (cap is not None and total >= cap) or time.monotonic() >= deadline:
            logger.info(
                "sweep %s stopped after %d rows in %d batches (limit or time budget); "
                "the next call continues",
                sweep.name,
                total,
                batches,
            )
            return SweepResult(sweep.name, total, batches, complete=False, detail=detail)
