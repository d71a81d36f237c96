"""What the restart run checks once the load has drained: read the components' event
files, the relay's delivery file and the database, and list every violation.

- **Nothing committed is lost.** Every job the producer got acknowledged exists and is
  ``done``; every job and notification that was done or delivered before a restart
  (snapshots taken just before each one) still is.
- **No notification is skipped.** Every done job has its notification, every
  notification is delivered and reached the receiver; deliveries of unknown keys are
  violations, repeats are reported (delivery is at least once).
- **No run is left RUNNING**, and every run the runner reported as settled has the
  status it reported; a final write the runner could not make is a violation.
- **Every component rode it out**: alive at the end of the load, made progress after
  the last restart, stopped cleanly (exit 0) when asked.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reliability._restart_common import read_events

#: Event that shows each kind of component doing its work.
PROGRESS = {
    "producer": "enqueued",
    "worker": "completed",
    "runner": "run",
    "reaper": "swept",
}


@dataclass
class Snapshot:
    """What was committed just before one restart."""

    restart: int
    done_jobs: set[str]
    delivered: set[str]


@dataclass
class Process:
    """How one component process ended."""

    name: str
    role: str
    alive_at_end_of_load: bool
    exit_code: int | None
    stderr_tail: str


@dataclass
class Findings:
    violations: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def fail(self, message: str) -> None:
        self.violations.append(message)


def snapshot(restart: int) -> Snapshot:
    from jobstate.models import Job, Notification
    from jobstate.stores.base import JobStatus, NotificationState

    done = Job.objects.filter(status=JobStatus.DONE).values_list("id", flat=True)
    delivered = Notification.objects.filter(state=NotificationState.DELIVERED).values_list(
        "id", flat=True
    )
    return Snapshot(restart, {str(pk) for pk in done}, {str(pk) for pk in delivered})


def outstanding() -> dict[str, int]:
    """What still has to settle before the run can be checked (zero everywhere when
    the components have drained)."""
    from jobstate.models import Job, JobRun, Notification
    from jobstate.stores.base import JobRunStatus, JobStatus, NotificationState

    return {
        "jobs": Job.objects.exclude(status=JobStatus.DONE).count(),
        "notifications": Notification.objects.exclude(state=NotificationState.DELIVERED).count(),
        "runs": JobRun.objects.filter(status=JobRunStatus.RUNNING).count(),
    }


def check(
    *,
    events: dict[str, Path],
    roles: dict[str, str],
    deliveries: Path,
    processes: list[Process],
    snapshots: list[Snapshot],
    last_restart_at: float | None,
    relay_totals: dict[str, int] | None,
) -> Findings:
    findings = Findings()
    logs = {name: read_events(path) for name, path in events.items()}
    received = read_events(deliveries)
    _check_processes(findings, processes, logs, roles, received, last_restart_at, relay_totals)
    _check_jobs(findings, logs, roles, snapshots)
    _check_notifications(findings, received, snapshots)
    _check_runs(findings, [e for name, log in logs.items() if roles[name] == "runner" for e in log])
    return findings


def _check_processes(
    findings: Findings,
    processes: list[Process],
    logs: dict[str, list[dict[str, Any]]],
    roles: dict[str, str],
    received: list[dict[str, Any]],
    last_restart_at: float | None,
    relay_totals: dict[str, int] | None,
) -> None:
    reconnects: dict[str, int] = {}
    for process in processes:
        if not process.alive_at_end_of_load:
            findings.fail(
                f"{process.name} died during the load (exit {process.exit_code}): "
                f"{process.stderr_tail}"
            )
        elif process.exit_code != 0:
            findings.fail(
                f"{process.name} did not stop cleanly (exit {process.exit_code}): "
                f"{process.stderr_tail}"
            )
        if process.role == "relay":
            reconnects[process.name] = (relay_totals or {}).get("failed_passes", 0)
            progress = [entry["t"] for entry in received]
        else:
            log = logs.get(process.name, [])
            reconnects[process.name] = sum(1 for entry in log if _survived_error(entry))
            progress = [e["t"] for e in log if e["event"] == PROGRESS[roles[process.name]]]
        if not progress:
            findings.fail(f"{process.name} never made progress")
        elif last_restart_at is not None and max(progress) <= last_restart_at:
            findings.fail(f"{process.name} made no progress after the last restart")
    findings.figures["reconnects"] = reconnects


def _survived_error(entry: dict[str, Any]) -> bool:
    """A store error the component met and went on from: one its own loop retried, or
    one the runner logged (a failed heartbeat or reap, a final write tried again)."""
    if entry["event"] == "store_error":
        return True
    if entry["event"] != "runner_warning":
        return False
    return entry.get("error") is not None or "trying again" in entry["message"]


def _check_jobs(
    findings: Findings,
    logs: dict[str, list[dict[str, Any]]],
    roles: dict[str, str],
    snapshots: list[Snapshot],
) -> None:
    from jobstate.models import Job
    from jobstate.stores.base import JobStatus

    acknowledged = {
        entry["request_id"]
        for name, log in logs.items()
        if roles[name] == "producer"
        for entry in log
        if entry["event"] == "enqueued"
    }
    statuses = dict(Job.objects.values_list("request_id", "status"))
    lost = sorted(acknowledged - statuses.keys())
    if lost:
        findings.fail(f"{len(lost)} acknowledged jobs are missing, e.g. {lost[:3]}")
    unfinished = Counter(status for status in statuses.values() if status != JobStatus.DONE)
    if unfinished:
        findings.fail(f"jobs not done after the drain: {dict(unfinished)}")
    done_ids = {
        str(pk) for pk in Job.objects.filter(status=JobStatus.DONE).values_list("id", flat=True)
    }
    for shot in snapshots:
        gone = shot.done_jobs - done_ids
        if gone:
            findings.fail(f"{len(gone)} jobs done before restart {shot.restart} are no longer done")
    retried = sum(
        1
        for name, log in logs.items()
        if roles[name] == "producer"
        for entry in log
        if entry["event"] == "store_error"
    )
    findings.figures["jobs"] = {
        "acknowledged": len(acknowledged),
        "in_database": len(statuses),
        "done": len(statuses) - sum(unfinished.values()),
        "lost": len(lost),
        "enqueue_retries": retried,
        "stale_completions": sum(
            1 for log in logs.values() for entry in log if entry["event"] == "stale"
        ),
    }


def _check_notifications(
    findings: Findings, received: list[dict[str, Any]], snapshots: list[Snapshot]
) -> None:
    from jobstate.models import Job, Notification
    from jobstate.stores.base import JobStatus, NotificationState

    rows = list(Notification.objects.values("id", "job_id", "state", "idempotency_key"))
    keys = {row["idempotency_key"] for row in rows}
    done_jobs = set(Job.objects.filter(status=JobStatus.DONE).values_list("id", flat=True))
    per_job = Counter(row["job_id"] for row in rows)
    missing = [pk for pk in done_jobs if per_job[pk] != 1]
    if missing:
        findings.fail(f"{len(missing)} done jobs lack their one notification")
    states = Counter(row["state"] for row in rows if row["state"] != NotificationState.DELIVERED)
    if states:
        findings.fail(f"notifications not delivered after the drain: {dict(states)}")
    sent = Counter(entry["key"] for entry in received)
    never = keys - sent.keys()
    if never:
        findings.fail(f"{len(never)} notifications never reached the receiver")
    unknown = sent.keys() - keys
    if unknown:
        findings.fail(f"the receiver got {len(unknown)} notifications the outbox never had")
    delivered_ids = {str(row["id"]) for row in rows if row["state"] == NotificationState.DELIVERED}
    for shot in snapshots:
        gone = shot.delivered - delivered_ids
        if gone:
            findings.fail(
                f"{len(gone)} notifications delivered before restart {shot.restart} are not now"
            )
    findings.figures["notifications"] = {
        "created": len(rows),
        "delivered": len(rows) - sum(states.values()),
        "received": sum(sent.values()),
        "sent_more_than_once": sum(1 for count in sent.values() if count > 1),
    }


def _check_runs(findings: Findings, log: list[dict[str, Any]]) -> None:
    from jobstate.models import JobRun
    from jobstate.stores.base import REAPED_RUN_ERROR, JobRunStatus

    stored = {
        str(pk): (status, error)
        for pk, status, error in JobRun.objects.values_list("id", "status", "error")
    }
    reported = {entry["run"]: entry for entry in log if entry["event"] == "run"}
    running = [pk for pk, (status, _) in stored.items() if status == JobRunStatus.RUNNING]
    if running:
        findings.fail(f"{len(running)} runs left RUNNING, e.g. {running[:3]}")
    for run_id, entry in reported.items():
        if entry["recorded"] == "unrecorded":
            findings.fail(f"the runner could not record run {run_id} ({entry['status']})")
        elif entry["recorded"] == "settled" and stored.get(run_id, (None,))[0] != entry["status"]:
            findings.fail(
                f"run {run_id} was reported {entry['status']} but is {stored.get(run_id)}"
            )
    orphans = [
        pk
        for pk, (status, error) in stored.items()
        if pk not in reported and status == JobRunStatus.TIMED_OUT and error == REAPED_RUN_ERROR
    ]
    findings.figures["runs"] = {
        "reported": len(reported),
        "by_status": dict(Counter(entry["status"] for entry in reported.values())),
        "superseded": sum(1 for entry in reported.values() if entry["recorded"] == "superseded"),
        "orphaned_claims_reaped": len(orphans),
        "left_running": len(running),
    }
