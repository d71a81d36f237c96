"""An operator's hold on a schedule: run it now, pause it, resume it. Each change is
one transaction with its audit entry, which names who made it.

- **Run now** enqueues one extra occurrence (its slot is the instant it was asked, on
  the database's clock). It leaves the cron slots alone: the next one is enqueued as
  usual. A paused schedule can be run now; a removed one cannot.
- **Pause**: no slot is enqueued while a schedule is paused. A caller that read the
  schedule as active just before cannot enqueue after the pause commits, because the
  enqueue's conditional update requires an active row.
- **Resume** makes the schedule effective from that instant: the slots that came due
  while it was paused are not caught up.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, cast

from django.db import DEFAULT_DB_ALIAS, transaction
from django.db.models.functions import Now

from jobstate.exceptions import UnknownSchedule
from jobstate.models.schedules import OccurrenceTrigger, Schedule, ScheduleOccurrence
from jobstate.schedules.service import EnqueuedOccurrence, row_definition
from jobstate.schedules.targets import enqueue_target
from jobstate.stores import get_state_store
from jobstate.stores.contracts.audit import AuditSeverity, AuditStage
from jobstate.stores.contracts.validation import require_text
from jobstate.stores.errors import translated_database_errors

__all__ = ["pause_schedule", "resume_schedule", "run_schedule_now"]


def _locked(key: str, using: str) -> Schedule:
    """The declared schedule ``key``, locked until the transaction ends, with the
    database's clock read by the same statement."""
    row = (
        Schedule.objects.using(using)
        .select_for_update()
        .declared()
        .annotate(database_now=Now())
        .filter(key=key)
        .first()
    )
    if row is None:
        raise UnknownSchedule(f"No schedule is declared as {key!r}.")
    return row


def _clock(row: Schedule) -> datetime:
    return cast(datetime, row.database_now)  # type: ignore[attr-defined]


def _audit(
    using: str, *, event: str, title: str, summary: str, detail: dict[str, object], job: str | None
) -> None:
    get_state_store(using=using).append_audit(
        job=job,
        event=event,
        stage=AuditStage.SYSTEM,
        severity=AuditSeverity.INFO,
        title=title,
        summary=summary,
        detail=detail,
    )


def run_schedule_now(
    key: str, *, by: str, via: str = "admin", using: str = DEFAULT_DB_ALIAS
) -> EnqueuedOccurrence:
    """Enqueue one extra occurrence of schedule ``key`` now, with a
    ``schedule_run_now`` audit entry on its job naming ``by``.
    :class:`~jobstate.exceptions.UnknownSchedule` for a key that is not declared;
    :class:`~jobstate.exceptions.ScheduleError` when it cannot be enqueued."""
    by = require_text(by, field="by", max_length=200)
    with translated_database_errors("run_schedule_now", using), transaction.atomic(using=using):
        row = _locked(key, using)
        slot = _clock(row)
        result_id = enqueue_target(row_definition(row), slot=slot, using=using)
        ScheduleOccurrence.objects.using(using).create(
            schedule_id=row.pk,
            slot=slot,
            trigger=OccurrenceTrigger.MANUAL,
            result_id=result_id,
            enqueued_by=by,
        )
        _audit(
            using,
            event="schedule_run_now",
            title="Schedule run now",
            summary=f"{key} run now by {by}",
            detail={"schedule": key, "result_id": result_id, "by": by, "via": via},
            job=result_id,
        )
    return EnqueuedOccurrence(key, slot, result_id, manual=True)


def _switch(
    row: Schedule, key: str, *, using: str, by: str, via: str, paused: bool, **fields: Any
) -> None:
    """Pause or resume ``row`` (writing ``fields`` too) and audit it as done by ``by``."""
    Schedule.objects.using(using).filter(pk=row.pk).update(paused=paused, **fields)
    done = "paused" if paused else "resumed"
    _audit(
        using,
        event=f"schedule_{done}",
        title=f"Schedule {done}",
        summary=f"{key} {done} by {by}",
        detail={"schedule": key, "by": by, "via": via},
        job=None,
    )


def pause_schedule(key: str, *, by: str, via: str = "admin", using: str = DEFAULT_DB_ALIAS) -> bool:
    """Pause schedule ``key``; ``False`` when it already was (nothing written). A
    ``schedule_paused`` audit entry names ``by``."""
    by = require_text(by, field="by", max_length=200)
    with translated_database_errors("pause_schedule", using), transaction.atomic(using=using):
        row = _locked(key, using)
        if row.paused:
            return False
        _switch(
            row, key, using=using, by=by, via=via, paused=True, paused_at=_clock(row), paused_by=by
        )
    return True


def resume_schedule(
    key: str, *, by: str, via: str = "admin", using: str = DEFAULT_DB_ALIAS
) -> bool:
    """Resume schedule ``key``, effective from now (the slots it missed while paused
    are not caught up); ``False`` when it was not paused. A ``schedule_resumed`` audit
    entry names ``by``."""
    by = require_text(by, field="by", max_length=200)
    with translated_database_errors("resume_schedule", using), transaction.atomic(using=using):
        row = _locked(key, using)
        if not row.paused:
            return False
        now = _clock(row)
        upcoming = row_definition(row).slots().next_after(now)
        _switch(
            row,
            key,
            using=using,
            by=by,
            via=via,
            paused=False,
            paused_at=None,
            paused_by="",
            effective_from=now,
            next_slot=upcoming,
        )
    return True
