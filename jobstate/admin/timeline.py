"""A job's timeline on its page: what happened to it, in order, readable without the
audit admin — enqueued, each attempt of a task once (its worker, how long after the
previous failure it started, how long it ran, its outcome and error, the traceback
folded), its heartbeats summarised (the lease they keep), retries scheduled, operator
actions, finished.

It merges the job's audit entries with its task attempt log and its current claim.
Everything shown passes through the page's redactor (:mod:`jobstate.console.redaction`),
like the rest of the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.dateparse import parse_datetime
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from jobstate.admin.common import relative_time, short_duration
from jobstate.admin.display import moment, worker_link
from jobstate.admin.job_page import audit_summary
from jobstate.admin.status_words import status_name
from jobstate.console.redaction import Redactor
from jobstate.core.attempt_log import AttemptOutcome, LeftOut, TaskAttempt, attempt_history
from jobstate.core.bidi import isolated, isolated_parts
from jobstate.core.states import (
    AUDIT_SUMMARY_SEPARATOR,
    CLAIMED_JOB_STATUSES,
    TERMINAL_JOB_STATUSES,
    JobStatus,
)
from jobstate.models import AuditEntry, Job

__all__ = ["TimelineEvent", "job_timeline", "left_out_text", "traceback_fold"]


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
    error: str = ""
    """A failed attempt's exception: class path and message."""

    @property
    def moment(self) -> SafeString | str:
        return moment(self.at)


def _local(instant: datetime) -> datetime:
    """``instant`` in the server's zone, as :func:`~jobstate.admin.display.moment` shows
    times (the attempt log and audit data keep theirs as written)."""
    return timezone.localtime(instant) if timezone.is_aware(instant) else instant


def _length(seconds: float) -> str:
    """A length of time, with tenths below ten seconds (retries often wait less)."""
    if abs(seconds) < 10:
        return _("%(n).1f s") % {"n": abs(seconds)}
    return short_duration(seconds)


def _audit_event(entry: AuditEntry, page: Redactor) -> TimelineEvent:
    text = isolated_parts(
        page.summary(audit_summary(entry.summary, entry.detail), entry.detail),
        AUDIT_SUMMARY_SEPARATOR,
    )
    detail = entry.detail if isinstance(entry.detail, dict) else {}
    if entry.event == "retry_scheduled" and isinstance(detail.get("retry_at"), str):
        retry_at = parse_datetime(detail["retry_at"])
        if retry_at is not None:
            wait = _length((retry_at - entry.ts).total_seconds())
            text = " · ".join(
                part
                for part in (
                    _("retry at %(at)s (after %(wait)s)")
                    % {"at": _local(retry_at).strftime("%Y-%m-%d %H:%M:%S"), "wait": wait},
                    text,
                )
                if part
            )
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


def traceback_fold(text: str, page: Redactor) -> SafeString | str:
    """A traceback, redacted, folded in a ``<details>`` whose summary is its last line
    (the exception), so an attempt reads in one line until it is opened."""
    if not text:
        return ""
    shown = page.text(text)
    lines = shown.rstrip("\n").split("\n")
    return format_html(
        '<details class="jobstate-traceback"><summary>{}</summary><pre class="jobstate-text">'
        "{}</pre></details>",
        ngettext("Traceback (%(n)d line)", "Traceback (%(n)d lines)", len(lines))
        % {"n": len(lines)},
        shown,
    )


def _attempt_title(number: int, worker: str, outcome: str, severity: str) -> SafeString:
    return format_html(
        '{} <span class="jobstate-attempt-worker">{}</span> '
        '<span class="jobstate-attempt-outcome jobstate-outcome-{}">{}</span>',
        _("Attempt %(n)d on") % {"n": number},
        worker_link(worker),
        severity,
        outcome,
    )


def _attempt_text(attempt: TaskAttempt, previous_end: datetime | None) -> str:
    """How long the attempt ran (or, lost, when it was found so), and how long after
    the previous one ended it started."""
    parts = []
    if previous_end is not None and attempt.started_at is not None:
        parts.append(
            _("retried %(wait)s after the previous attempt ended")
            % {"wait": _length((attempt.started_at - previous_end).total_seconds())}
        )
    if attempt.started_at is not None and attempt.finished_at is not None:
        took = _length((attempt.finished_at - attempt.started_at).total_seconds())
        if attempt.outcome is AttemptOutcome.WORKER_LOST:
            parts.append(
                _("found lost %(time)s after it started, at %(at)s")
                % {"time": took, "at": _local(attempt.finished_at).strftime("%H:%M:%S")}
            )
        else:
            parts.append(_("ran %(time)s") % {"time": took})
    elif attempt.outcome is AttemptOutcome.WORKER_LOST:
        parts.append(_("found lost (when was not recorded)"))
    return " · ".join(parts)


def _attempt_events(job: Job, page: Redactor) -> list[TimelineEvent]:
    """One item per ended attempt, at its start: its worker, outcome, how long it ran,
    and for a failure the error with its traceback folded; the attempts a long log
    left out as one item where they were."""
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
        severity = "info"
        if attempt.failed:
            severity = "warning" if attempt.outcome is AttemptOutcome.WORKER_LOST else "error"
        error = ""
        if attempt.failed:
            error = attempt.exception_class_path
            if attempt.message:
                error = f"{error}: {attempt.message}"
        events.append(
            TimelineEvent(
                attempt.started_at,
                "failed" if attempt.failed else "succeeded",
                _attempt_title(number, attempt.worker_id, attempt.outcome.value, severity),
                _attempt_text(attempt, previous_end),
                traceback_fold(attempt.traceback, page) if attempt.failed else "",
                severity=severity,
                error=page.text(error),
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
    title = format_html(_("Claimed by {holder} ({status})"), holder=holder, status=status_name(job))
    if job.task_path is not None:
        title = format_html(
            _("Attempt {n} claimed by {holder}, running"), n=job.attempts, holder=holder
        )
    events = [TimelineEvent(job.claimed_at, "claimed", title)]
    if job.task_path is not None:
        running = _attempt_title(job.attempts, holder, _("running"), "info")
        events = [TimelineEvent(job.claimed_at, "claimed", running)]
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
        _("Finished: %(status)s") % {"status": status_name(job)},
        severity=severity,
    )


def _describe_source(job: Job) -> str:
    parts = [isolated(job.target) if job.target else "—"]
    if job.task_path:
        queue = f" · {isolated(job.queue_name)}" if job.queue_name else ""
        parts.append(isolated(job.task_path) + queue)
    if job.source:
        parts.append(_("from %(source)s") % {"source": isolated(job.source)})
    return " · ".join(parts)
