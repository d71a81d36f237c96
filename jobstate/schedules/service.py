"""Synchronising the schedule rows with settings, and evaluating them: every due slot
enqueued once, however many callers evaluate at the same instant.

How once-per-slot is kept. Each slot is enqueued in a transaction of its own that:

1. moves the schedule's watermark (``last_slot``) to the slot with one conditional
   ``UPDATE``, only if the watermark is still before the slot and the schedule is
   still active in the revision the caller read. Concurrent callers queue on that
   row; the first moves it and the others find nothing to move, so they stop before
   enqueuing anything.
2. enqueues the task (the backend's enqueue is part of the transaction);
3. inserts the occurrence ``(schedule, slot)``, whose partial unique key
   (``jobstate_schedule_once_per_slot``) refuses a second row for the slot whatever
   happened to the watermark. A violation of that key, and only of that key, means
   the slot was taken: the transaction (and its job) rolls back.

Nothing is held in Python: the guarantee is the database's, across threads,
processes and machines.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS, IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Now
from django.utils import timezone

from jobstate.core.conf import jobstate_settings
from jobstate.core.messages import SHOWN_LIMIT, shown
from jobstate.exceptions import InvalidJobState, ScheduleError
from jobstate.models.schedules import (
    ONCE_PER_SLOT,
    SCHEDULE_UNIQUE_KEY,
    CatchUp,
    OccurrenceTrigger,
    Schedule,
    ScheduleOccurrence,
)
from jobstate.schedules.definitions import (
    ScheduleDefinition,
    declaration_problems,
    parse_declaration,
)
from jobstate.schedules.targets import enqueue_target
from jobstate.stores.contracts.validation import validate_instant
from jobstate.stores.database.backends import instant_filter
from jobstate.stores.errors import translated_database_errors
from jobstate.stores.integrity import violates

__all__ = [
    "EnqueuedOccurrence",
    "ScheduleFailures",
    "SchedulePass",
    "SyncReport",
    "declared_schedules",
    "enqueue_due",
    "evaluate_schedules",
    "row_definition",
    "schedule_declarations",
    "schedule_problems",
    "sync_schedules",
]

logger = logging.getLogger("jobstate.schedules")

_OCCURRENCE_TABLE = ScheduleOccurrence._meta.db_table
_SCHEDULE_TABLE = Schedule._meta.db_table


@dataclass(frozen=True)
class EnqueuedOccurrence:
    """One occurrence a call enqueued."""

    schedule: str
    """The schedule's key."""
    slot: datetime
    """The instant the cron expression named (UTC); for a run now, when it was asked."""
    result_id: str
    """The enqueued task's result id, which is its job's id."""
    manual: bool = False
    """A run now, outside the cron slots."""


class ScheduleFailures(ScheduleError):
    """Raised by :func:`enqueue_due` when some schedules could not be enqueued; the
    others were, and are in :attr:`enqueued`."""

    def __init__(self, failures: dict[str, str], enqueued: list[EnqueuedOccurrence]) -> None:
        super().__init__(" ".join(failures.values()))
        #: Schedule key -> why it could not be enqueued.
        self.failures = failures
        #: What the call enqueued all the same.
        self.enqueued = enqueued


@dataclass
class SchedulePass:
    """What one evaluation did (:func:`evaluate_schedules`)."""

    now: datetime
    """The instant evaluated: the caller's, or the database's clock."""
    enqueued: list[EnqueuedOccurrence] = field(default_factory=list)
    next_slot: datetime | None = None
    """The earliest slot of an active schedule after ``now``."""
    failures: dict[str, str] = field(default_factory=dict)
    """Schedule key -> why it could not be enqueued (see :class:`ScheduleError`)."""


@dataclass(frozen=True)
class SyncReport:
    """The keys a synchronisation created, changed, marked removed and restored."""

    created: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    restored: tuple[str, ...] = ()


# --- settings --------------------------------------------------------------------------


def schedule_problems(schedules: Any = None) -> list[str]:
    """Every problem of ``JOBSTATE["SCHEDULES"]`` (or of ``schedules``), one sentence
    each, naming the schedule and the key at fault."""
    if schedules is None:
        schedules = jobstate_settings.SCHEDULES
    if not isinstance(schedules, Mapping):
        return [f"JOBSTATE['SCHEDULES'] must be a dict, got {type(schedules).__name__}."]
    problems: list[str] = []
    for key, declared in schedules.items():
        problems += declaration_problems(key, declared)
    return problems


def declared_schedules() -> dict[str, ScheduleDefinition]:
    """The schedules of ``JOBSTATE["SCHEDULES"]``, checked; ``ImproperlyConfigured``
    naming every problem (the system check ``jobstate.E030`` reports the same)."""
    schedules = jobstate_settings.SCHEDULES
    problems = schedule_problems(schedules)
    if problems:
        raise ImproperlyConfigured(" ".join(problems))
    return {key: parse_declaration(key, declared) for key, declared in schedules.items()}


def schedule_declarations() -> tuple[dict[str, ScheduleDefinition], dict[str, str]]:
    """The good declarations of ``JOBSTATE["SCHEDULES"]`` as definitions, and why each
    broken one is broken (its problems, one sentence each), by key. A broken
    declaration stops only its own schedule: synchronisation leaves its row as it was
    and every evaluation skips it, logging why."""
    good: dict[str, ScheduleDefinition] = {}
    broken: dict[str, str] = {}
    for key, declared in jobstate_settings.SCHEDULES.items():
        problems = declaration_problems(key, declared)
        if problems:
            broken[str(key)] = " ".join(problems)
        else:
            good[key] = parse_declaration(key, declared)
    return good, broken


def row_definition(row: Schedule) -> ScheduleDefinition:
    """The definition a schedule's row holds (the one last synchronised)."""
    try:
        return parse_declaration(row.key, row.definition)
    except ValueError as exc:
        raise ScheduleError(
            f"schedule {row.key!r}: its stored definition is invalid: {exc}"
        ) from exc


def _now(now: datetime | None) -> datetime | None:
    return None if now is None else validate_instant(now, field="now")


def _row_fields(definition: ScheduleDefinition) -> dict[str, Any]:
    return {
        "kind": definition.kind.value,
        "target": definition.target,
        "cron": definition.cron,
        "timezone": definition.timezone,
        "catch_up": definition.catch_up.value,
        "definition": definition.as_json(),
    }


def _create(definition: ScheduleDefinition, now: datetime | None, using: str) -> bool:
    """Insert the row of a schedule seen for the first time; ``False`` when a
    concurrent caller inserted it first."""
    start: Any = Now() if now is None else now
    try:
        with transaction.atomic(using=using):
            Schedule.objects.using(using).create(
                key=definition.key, effective_from=start, **_row_fields(definition)
            )
    except IntegrityError as exc:
        if not violates(
            exc, constraint=SCHEDULE_UNIQUE_KEY, table=_SCHEDULE_TABLE, columns=["key"]
        ):
            raise
        return False
    return True


def _rows(using: str) -> list[Schedule]:
    # The database's clock rides on the SELECT: every caller judges slots on one clock.
    return list(Schedule.objects.using(using).annotate(database_now=Now()).order_by("key"))


def _with_rows_for(
    declared: Mapping[str, ScheduleDefinition], now: datetime | None, using: str
) -> tuple[list[Schedule], list[str]]:
    """Every schedule row, after inserting those of ``declared`` keys that have none;
    and the keys inserted."""
    rows = _rows(using)
    missing = [key for key in declared if key not in {row.key for row in rows}]
    created = [key for key in missing if _create(declared[key], now, using)]
    if missing:
        rows = _rows(using)
    return rows, created


# --- synchronisation -------------------------------------------------------------------


def sync_schedules(*, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS) -> SyncReport:
    """Make the schedule rows say what ``JOBSTATE["SCHEDULES"]`` says: insert the rows
    of new keys, store changed definitions, mark keys gone from settings as removed
    (their rows and occurrences stay), restore keys that come back.

    A new, restored or re-timed schedule (its cron or time zone changed) is effective
    from ``now`` (default: the database's clock): no slot at or before it is ever
    enqueued. Other changes (arguments, queue, catch-up) keep the watermark. Run on
    ``migrate``, at each worker's start, and by ``enqueue_due_schedules`` and the beat
    task; two processes with different settings each make the rows say theirs."""
    declared, broken = schedule_declarations()
    at = _now(now)
    with translated_database_errors("sync_schedules", using):
        rows, created = _with_rows_for(declared, at, using)
        changed: list[str] = []
        removed: list[str] = []
        restored: list[str] = []
        for row in rows:
            clock = at or row.database_now  # type: ignore[attr-defined]
            definition = declared.get(row.key)
            if row.key in broken:
                continue
            if definition is None:
                if row.removed_at is None and _mark_removed(row, clock, using):
                    removed.append(row.key)
                continue
            if row.removed_at is None and row.definition == definition.as_json():
                continue
            if _store_definition(row, definition, clock, using):
                (restored if row.removed_at is not None else changed).append(row.key)
    report = SyncReport(tuple(created), tuple(changed), tuple(removed), tuple(restored))
    if report != SyncReport():
        logger.info(
            "Schedules synchronised from settings: created %s; changed %s; removed %s; restored %s",
            ", ".join(report.created) or "none",
            ", ".join(report.changed) or "none",
            ", ".join(report.removed) or "none",
            ", ".join(report.restored) or "none",
        )
    return report


def _mark_removed(row: Schedule, now: datetime, using: str) -> bool:
    return bool(
        Schedule.objects.using(using)
        .filter(pk=row.pk, revision=row.revision, removed_at__isnull=True)
        .update(removed_at=now, next_slot=None, revision=F("revision") + 1)
    )


def _store_definition(
    row: Schedule, definition: ScheduleDefinition, now: datetime, using: str
) -> bool:
    changes: dict[str, Any] = {
        **_row_fields(definition),
        "removed_at": None,
        "revision": F("revision") + 1,
    }
    if row.removed_at is not None or (row.cron, row.timezone) != definition.timing:
        changes["effective_from"] = now
        changes["next_slot"] = definition.slots().next_after(now)
    # Conditional on the revision read: of two synchronisations at once, one applies.
    return bool(
        Schedule.objects.using(using).filter(pk=row.pk, revision=row.revision).update(**changes)
    )


# --- evaluation ------------------------------------------------------------------------


def enqueue_due(
    *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS
) -> list[EnqueuedOccurrence]:
    """Enqueue every due occurrence of every active schedule and return what this call
    enqueued, oldest slot first per schedule.

    A slot is due when it is at or before ``now`` (default: the database's clock),
    after the schedule's watermark (the latest slot enqueued) and after the instant the
    schedule became effective. Of the due slots, ``catch_up: "latest"`` enqueues the
    latest; ``"all"`` each, up to ``JOBSTATE["SCHEDULE_CATCH_UP_LIMIT"]`` (the latest
    ones). Each ``(schedule, slot)`` is enqueued once across every concurrent caller
    (see the module docstring); a paused or removed schedule enqueues nothing.

    Declared schedules without a row get one first (effective from ``now``). A schedule
    that cannot be enqueued (its task no longer imports, its backend refuses it) does
    not stop the others: the call then raises :class:`ScheduleFailures` (a
    :class:`ScheduleError`) naming each, with ``enqueued`` set to what was enqueued."""
    result = evaluate_schedules(now=now, using=using)
    if result.failures:
        raise ScheduleFailures(result.failures, result.enqueued)
    return result.enqueued


def evaluate_schedules(
    *, now: datetime | None = None, using: str = DEFAULT_DB_ALIAS, by: str = ""
) -> SchedulePass:
    """:func:`enqueue_due`, reporting instead of raising what could not be enqueued,
    and the next slot; ``by`` names the caller in the occurrences (a worker's id)."""
    declared, broken = schedule_declarations()
    at = _now(now)
    with translated_database_errors("enqueue_due", using):
        rows, _created = _with_rows_for(declared, at, using)
    active = [
        row for row in rows if row.removed_at is None and not row.paused and row.key not in broken
    ]
    result = SchedulePass(
        now=at or (rows[0].database_now if rows else timezone.now())  # type: ignore[attr-defined]
    )
    for key, problems in broken.items():
        # A broken declaration's key may be anything (a NUL, 5,000 characters): the log
        # line names it printably.
        named = key if key.isprintable() and len(key) <= SHOWN_LIMIT else shown(repr(key))
        logger.error("Schedule %s is broken and was skipped: %s", named, problems)
        result.failures[key] = f"schedule {key!r} is broken: {problems}"
    for row in active:
        try:
            definition = row_definition(row)
            with translated_database_errors("enqueue_due", using):
                upcoming = _evaluate(row, definition, result, using, by)
        except ScheduleError as exc:
            logger.error("Schedule %s was not enqueued: %s", row.key, exc)
            result.failures[row.key] = str(exc)
            continue
        if upcoming is not None and (result.next_slot is None or upcoming < result.next_slot):
            result.next_slot = upcoming
    return result


def _evaluate(
    row: Schedule, definition: ScheduleDefinition, result: SchedulePass, using: str, by: str
) -> datetime | None:
    """Enqueue the due slots of one schedule; its next slot after ``result.now``."""
    now = result.now
    slots = definition.slots()
    start = row.effective_from if row.last_slot is None else max(row.effective_from, row.last_slot)
    count = (
        1 if definition.catch_up is CatchUp.LATEST else jobstate_settings.SCHEDULE_CATCH_UP_LIMIT
    )
    due, left_out = slots.latest(start, now, count)
    upcoming = slots.next_after(max(now, start))
    if left_out and due:
        logger.warning(
            "Schedule %s missed slots before %s; catch_up %r enqueues %s",
            row.key,
            due[0].isoformat(),
            definition.catch_up.value,
            "only the latest" if count == 1 else f"at most the latest {count}",
        )
    for slot in due:
        result_id = _enqueue_slot(row, definition, slot, upcoming, using, by)
        if result_id is None:
            continue
        result.enqueued.append(EnqueuedOccurrence(row.key, slot, result_id))
        logger.debug("Schedule %s enqueued its slot %s as %s", row.key, slot.isoformat(), result_id)
    if not due and row.next_slot != upcoming:
        # Only the display of the next run changes; a stale row (another revision,
        # paused meanwhile) is left to whoever changed it.
        Schedule.objects.using(using).filter(pk=row.pk, revision=row.revision).filter(
            _unchanged_start(row, using)
        ).exclude(next_slot=upcoming).update(next_slot=upcoming)
    return upcoming


def _unchanged_start(row: Schedule, using: str) -> Q:
    """The row still starts where ``row`` read it: ``effective_from`` is often written
    by the database's clock, so it is compared in the database's own terms."""
    return instant_filter(using, "effective_from", "exact", row.effective_from)


def _enqueue_slot(
    row: Schedule,
    definition: ScheduleDefinition,
    slot: datetime,
    upcoming: datetime | None,
    using: str,
    by: str,
) -> str | None:
    """Enqueue ``slot`` of ``row`` in a transaction of its own (see the module
    docstring); its result id, or ``None`` when another caller had it."""
    try:
        with transaction.atomic(using=using):
            moved = (
                Schedule.objects.using(using)
                .active()
                .filter(pk=row.pk, revision=row.revision)
                .filter(_unchanged_start(row, using))
                .filter(Q(last_slot__isnull=True) | Q(last_slot__lt=slot))
                .update(last_slot=slot, next_slot=upcoming)
            )
            if not moved:
                return None
            result_id = enqueue_target(definition, slot=slot, using=using)
            ScheduleOccurrence.objects.using(using).create(
                schedule_id=row.pk,
                slot=slot,
                trigger=OccurrenceTrigger.CRON,
                result_id=result_id,
                enqueued_by=by[:200],
            )
    except IntegrityError as exc:
        if not violates(
            exc, constraint=ONCE_PER_SLOT, table=_OCCURRENCE_TABLE, columns=["schedule_id", "slot"]
        ):
            raise
        return None
    except InvalidJobState as exc:
        # The store refused the task's arguments (a value it cannot hold as JSON).
        raise ScheduleError(f"schedule {row.key!r}: {exc}") from exc
    return result_id
