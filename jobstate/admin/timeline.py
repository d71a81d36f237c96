"""A job's timeline on its page: what happened to it, in order, readable without the
audit admin — enqueued, each attempt claimed (by which worker, and how long after the
previous failure), its heartbeats summarised (the lease they keep), failed with the
traceback or succeeded, retries scheduled, operator actions, finished.

It merges the job's audit entries with its task attempt log and its current claim.
Everything shown passes through the page's redactor (:mod:`jobstate.admin.redaction`),
like the rest of the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _

from jobstate.admin.common import relative_time, short_duration, text_block
from jobstate.admin.display import worker_link
from jobstate.admin.redaction import Redactor
from jobstate.core.attempt_log import LeftOut, attempt_history
from jobstate.core.states import CLAIMED_JOB_STATUSES, TERMINAL_JOB_STATUSES, JobStatus
from jobstate.models import AuditEntry, Job

__all__ = ["TimelineEvent", "job_timeline", "left_out_text"]


@dataclass(frozen=True)
class TimelineEvent:
    at: datetime | None
    kind: str
    """A CSS-friendly word: enqueued, claimed, heartbeat, failed, succeeded, left-out,
    audit."""
    title: SafeString | str
    text: str = ""
    traceback: SafeString | str = ""
    severity: str = "info"


def _length(seconds: float) -> str:
    """A length of time, with tenths below ten seconds (retries often wait less)."""
    if abs(seconds) < 10:
        return _("%(n).1f s") % {"n": abs(seconds)}
    return short_duration(seconds)


def _audit_event(entry: AuditEntry, page: Redactor) -> TimelineEvent:
    text = page.summary(entry.summary, entry.detail)
    detail = entry.detail if isinstance(entry.detail, dict) else {}
    if entry.event == "retry_scheduled" and isinstance(detail.get("retry_at"), str):
        retry_at = parse_datetime(detail["retry_at"])
        if retry_at is not None:
            wait = _length((retry_at - entry.ts).total_seconds())
            text = _("retry at %(at)s (after %(wait)s) · %(rest)s") % {
                "at": retry_at.strftime("%Y-%m-%d %H:%M:%S"),
                "wait": wait,
                "rest": text,
            }
    return TimelineEvent(
        at=entry.ts,
        kind="audit",
        title=page.text(entry.title or entry.event),
        text=text,
        severity=entry.severity,
    )


def left_out_text(gap: LeftOut) -> str:
    """What the job page says in place of the attempts a long log left out."""
    return _(
        "Attempts %(first)d-%(last)d (%(count)d in all) were left out of the attempt log, "
        "which keeps the first and the latest attempts of a task."
    ) % {"first": gap.first, "last": gap.last, "count": gap.count}


def _attempt_events(job: Job, page: Redactor) -> list[TimelineEvent]:
    events: list[TimelineEvent] = []
    previous_end: datetime | None = None
    number = 1
    # A gap's place in time: the end of the attempt before it, else the start of the next.
    undated_gap: int | None = None
    for attempt in attempt_history(job.attempt_log):
        if isinstance(attempt, LeftOut):
            if previous_end is None:
                undated_gap = len(events)
            events.append(TimelineEvent(previous_end, "left-out", left_out_text(attempt)))
            number += attempt.count
            previous_end = None  # the attempt before the next one is not in the log
            continue
        if undated_gap is not None:
            gap = events[undated_gap]
            events[undated_gap] = TimelineEvent(attempt.started_at, gap.kind, gap.title)
            undated_gap = None
        claimed = format_html(
            _("Attempt {n} claimed by {worker}"), n=number, worker=worker_link(attempt.worker_id)
        )
        text = ""
        if previous_end is not None and attempt.started_at is not None:
            text = _("retried %(wait)s after the previous attempt ended") % {
                "wait": _length((attempt.started_at - previous_end).total_seconds())
            }
        events.append(TimelineEvent(attempt.started_at, "claimed", claimed, text))
        took = ""
        if attempt.started_at and attempt.finished_at:
            took = _("after %(time)s") % {
                "time": _length((attempt.finished_at - attempt.started_at).total_seconds())
            }
        if attempt.failed:
            error = attempt.exception_class_path
            if attempt.message:
                error = f"{error}: {attempt.message}"
            events.append(
                TimelineEvent(
                    attempt.finished_at,
                    "failed",
                    _("Attempt %(n)d %(outcome)s %(took)s")
                    % {"n": number, "outcome": attempt.outcome.value, "took": took},
                    page.text(error),
                    text_block(attempt.traceback, page) if attempt.traceback else "",
                    severity="error",
                )
            )
        else:
            events.append(
                TimelineEvent(
                    attempt.finished_at,
                    "succeeded",
                    _("Attempt %(n)d succeeded %(took)s") % {"n": number, "took": took},
                )
            )
        previous_end = attempt.finished_at
        number += 1
    return events


def _current_claim(job: Job, now: datetime) -> list[TimelineEvent]:
    """The claim in progress: who holds it since when, and what its heartbeats (lease
    renewals) show — the lease they keep running, or that they stopped."""
    if job.status not in CLAIMED_JOB_STATUSES or job.claimed_at is None:
        return []
    holder = worker_link(job.executor_id)
    title = format_html(
        _("Claimed by {holder} ({status})"), holder=holder, status=JobStatus(job.status).label
    )
    if job.task_path is not None:
        title = format_html(
            _("Attempt {n} claimed by {holder}, running"), n=job.attempts, holder=holder
        )
    events = [TimelineEvent(job.claimed_at, "claimed", title)]
    if job.lease_until is not None:
        held = short_duration((now - job.claimed_at).total_seconds())
        if job.lease_until >= now:
            text = _("heartbeats keep the lease: held for %(held)s, ends %(when)s") % {
                "held": held,
                "when": relative_time(job.lease_until, now),
            }
            events.append(TimelineEvent(now, "heartbeat", _("Heartbeats"), text))
        else:
            text = _("no heartbeat renewed the lease: it expired %(when)s") % {
                "when": relative_time(job.lease_until, now)
            }
            events.append(
                TimelineEvent(
                    job.lease_until, "heartbeat", _("Heartbeats stopped"), text, "", "warning"
                )
            )
    return events


def job_timeline(
    job: Job, trail: list[AuditEntry], page: Redactor, now: datetime
) -> list[TimelineEvent]:
    """Every event of ``job`` in time order (events without a time last, in the order
    they happened)."""
    events = [TimelineEvent(job.created_at, "enqueued", _("Enqueued"), _describe_source(job))]
    events += _attempt_events(job, page)
    events += _current_claim(job, now)
    events += [_audit_event(entry, page) for entry in trail]
    if job.status in TERMINAL_JOB_STATUSES and not any(
        entry.event in ("finished", "rejected") for entry in trail
    ):
        # A successful task writes no audit entry of its end; its row says it.
        events.append(_finished(job))
    order: dict[int, int] = {id(event): index for index, event in enumerate(events)}

    def key(event: TimelineEvent) -> tuple[Any, ...]:
        return (event.at is None, event.at or now, order[id(event)])

    return sorted(events, key=key)


def _finished(job: Job) -> TimelineEvent:
    status = JobStatus(job.status)
    severity = {JobStatus.ERROR: "error", JobStatus.REJECTED: "warning"}.get(status, "info")
    return TimelineEvent(
        job.updated_at,
        "finished",
        _("Finished: %(status)s") % {"status": status.label},
        severity=severity,
    )


def _describe_source(job: Job) -> str:
    parts = [job.target or "—"]
    if job.task_path:
        parts.append(job.task_path + (f" · {job.queue_name}" if job.queue_name else ""))
    if job.source:
        parts.append(_("from %(source)s") % {"source": job.source})
    return " · ".join(parts)
