"""The torture run's summary: one JSON-ready dict, and the table printed from it."""

from __future__ import annotations

from typing import Any

from reliability._torture_checks import VIOLATION_KINDS, Findings
from reliability._torture_controller import RunFacts, RunOptions
from reliability._torture_monitor import Orphan


def _orphan_stats(orphans: list[Orphan], kind: str, promise: float, bound: float) -> dict[str, Any]:
    """The orphans of dead workers (kills, and workers killed at the stop).
    ``promise`` is lease (or stale threshold) + reap interval; ``bound`` adds the slack."""
    mine = [o for o in orphans if o.kind == kind and o.fault != "pause"]
    latencies = [o.latency for o in mine if o.how == "swept" and o.latency is not None]
    return {
        "held_at_kill": len(mine),
        "recovered": len(latencies),
        "max_latency_seconds": round(max(latencies), 3) if latencies else None,
        "promise_seconds": promise,
        "bound_seconds": bound,
    }


def _pause_stats(orphans: list[Orphan]) -> dict[str, int]:
    paused = [o for o in orphans if o.fault == "pause"]
    return {
        "held_at_pause": len(paused),
        "recovered_by_reaper": sum(1 for o in paused if o.how == "swept"),
        "finished_by_holder": sum(1 for o in paused if o.how == "holder"),
    }


def build(
    options: RunOptions, jobs: int, facts: RunFacts, figures: dict[str, Any], findings: Findings
) -> dict[str, Any]:
    timing = options.timing
    orphans = facts.monitor.orphans
    return {
        "settings": {
            "workers": options.workers,
            "duration_seconds": options.duration,
            "jobs": jobs,
            "kill_every_seconds": options.kill_every,
            "pause_share": options.pause_share,
            "lease_seconds": timing.lease,
            "stale_after_seconds": timing.stale_after,
            "heartbeat_seconds": timing.heartbeat_interval,
            "reap_interval_seconds": timing.reap_interval,
            "slack_seconds": timing.slack,
            "attempt_limit": timing.attempt_limit,
            "task_workers": options.task_workers,
            "task_max_attempts": timing.task_attempts,
            "seed": options.seed,
        },
        "duration_seconds": round(facts.fault_seconds, 2),
        "stop_seconds": round(facts.stop_seconds, 2),
        "settle_seconds": round(facts.settle_seconds, 2),
        "active_after_final_reap": facts.active_after_final_reap,
        "faults": {
            "kills": facts.kills,
            "pauses": facts.pauses,
            "restarts": facts.restarts,
            "killed_at_stop": facts.stop_kills,
            "sessions_slow_to_end": facts.slow_session_exits,
        },
        "orphans": {
            "jobs": _orphan_stats(
                orphans, "job", timing.lease + timing.reap_interval, timing.job_bound
            ),
            "runs": _orphan_stats(
                orphans, "run", timing.stale_after + timing.reap_interval, timing.run_bound
            ),
            "paused": _pause_stats(orphans),
        },
        "monitor_polls": facts.monitor.polls,
        "final_reap": facts.final_reap,
        "process_failures": [f"{f.name}: exit {f.exitcode}" for f in facts.failures]
        + facts.task_failures,
        **figures,
        "violations": dict(findings.violations),
        "violations_total": findings.total,
        "examples": findings.examples,
    }


def _counts(values: dict[str, int]) -> str:
    return ", ".join(f"{key} {count}" for key, count in values.items()) or "none"


def _latency(stats: dict[str, Any], liveness: str) -> str:
    worst = stats["max_latency_seconds"]
    shown = "-" if worst is None else f"{worst:.2f} s"
    return (
        f"{shown} ({liveness} + reap interval {stats['promise_seconds']:.1f} s, "
        f"bound with slack {stats['bound_seconds']:.1f} s)"
    )


def _task_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The task workers' rows (none when the run had no task workers)."""
    if not report["settings"]["task_workers"]:
        return []
    return [
        (
            "tasks",
            f"{report['tasks_loaded']} loaded by {report['settings']['task_workers']} task "
            f"workers: {_counts(report['tasks_by_status'])}",
        ),
        (
            "task workers killed",
            f"{report['task_worker_kills']}, holding {report['tasks_held_by_killed_workers']} "
            f"tasks; {report['task_attempts_lost']} lost attempts recorded",
        ),
        (
            "tasks run to the end again",
            f"{report['tasks_run_to_the_end_more_than_once']} (at least once: a killed "
            f"worker's task may have finished before its report); most attempts "
            f"{report['task_max_attempts_used']} of {report['settings']['task_max_attempts']}",
        ),
    ]


def table(report: dict[str, Any]) -> str:
    """The summary as a Markdown table, then the violations by kind."""
    s = report["settings"]
    faults, orphans = report["faults"], report["orphans"]
    jobs, runs, paused = orphans["jobs"], orphans["runs"], orphans["paused"]
    accepted = report["reports_accepted"]
    rows = [
        (
            "setup",
            f"{s['workers']} workers, lease {s['lease_seconds']:g} s, stale after "
            f"{s['stale_after_seconds']:g} s, reap every {s['reap_interval_seconds']:g} s, "
            f"slack {s['slack_seconds']:g} s",
        ),
        (
            "duration",
            f"{report['duration_seconds']:.1f} s, then {report['stop_seconds']:.1f} s to stop "
            f"and {report['settle_seconds']:.1f} s to settle",
        ),
        ("jobs", f"{report['jobs_loaded']} loaded: {_counts(report['jobs_by_status'])}"),
        ("completed", f"{accepted.get('done', 0)} done, {accepted.get('error', 0)} error"),
        ("retries given back", str(accepted.get("queued", 0))),
        ("failed by lease limit", str(report["jobs_failed_by_lease_limit"])),
        ("refused after the claim ended", _counts(report["refused"])),
        ("renewals refused, never paused", str(report["renewals_refused_unpaused"])),
        ("runs", _counts(report["runs_by_status"])),
        ("runner outcomes", _counts(report["run_outcomes_by_recorded"])),
        ("kills (SIGKILL)", str(faults["kills"])),
        ("pauses (SIGSTOP)", str(faults["pauses"])),
        ("restarts", str(faults["restarts"])),
        (
            "orphans recovered",
            f"jobs {jobs['recovered']}/{jobs['held_at_kill']}, "
            f"runs {runs['recovered']}/{runs['held_at_kill']}",
        ),
        ("max recovery, jobs", _latency(jobs, "lease")),
        ("max recovery, runs", _latency(runs, "stale after")),
        (
            "paused workers' work",
            f"{paused['held_at_pause']} held: {paused['recovered_by_reaper']} recovered by "
            f"the reaper, {paused['finished_by_holder']} finished by the holder",
        ),
        (
            "reaper",
            f"{report['reaper_passes']} passes (slowest "
            f"{report['reaper_slowest_pass_seconds']:.2f} s): "
            f"{_counts({k: n for k, n in report['reaper_moved'].items() if n})}",
        ),
        *_task_rows(report),
        ("jobstate's checks here", "; ".join(report.get("jobstate_checks", [])) or "none"),
        ("violations", str(report["violations_total"])),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"| {'measure':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
    lines.append("")
    kinds = max(len(kind) for kind in VIOLATION_KINDS)
    lines += [f"| {'violation':<{kinds}} | count |", f"|{'-' * (kinds + 2)}|------:|"]
    for kind, count in report["violations"].items():
        lines.append(f"| {kind:<{kinds}} | {count:>5} |")
    for kind in VIOLATION_KINDS:
        examples = report["examples"].get(kind)
        if not examples:
            continue
        lines.append("")
        lines.append(f"{kind} ({VIOLATION_KINDS[kind]}):")
        lines += [f"  - {example}" for example in examples]
    return "\n".join(lines)
