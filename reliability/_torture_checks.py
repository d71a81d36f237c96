"""The verdict of a torture run: every violation the end state and the live watch show,
and the figures of the summary.

Each check compares two independent accounts: jobstate's rows against the harness's
ledger (written by the workers in the same transaction as the store call), or against
what the monitor saw while the run was going. A violation is counted per job, run,
claim token or sighting, with a few examples kept for the report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from reliability._torture_monitor import MonitorResult
from reliability._torture_sql import Connection, Dialect
from reliability._torture_tasks import TASK_VIOLATION_KINDS

#: Every kind of violation, in the order the summary lists them.
VIOLATION_KINDS = {
    "lost": "a loaded job is missing",
    "unsettled": "a job neither terminal nor queued after the final reap",
    "claim_left_behind": "a queued or terminal job still carries claim fields",
    "double_claim": "a job claimed again while its previous claim was live, or a token reused",
    "stale_completion": "a report accepted from a claim that a later claim had replaced",
    "double_completion": "a job completed (terminal) by more than one fenced report",
    "double_report": "one claim token accepted more than one report",
    "completion_unrecorded": "a terminal job no accepted report or lease expiry explains",
    "completion_mismatch": "a job's row disagrees with the report that finished it",
    "run_double_settle": "a run the runner recorded as settled was settled otherwise",
    "unsettled_run": "a run still RUNNING after the final reap",
    "overlap": "an overlap key with two RUNNING runs, seen while running",
    "orphan_late": "a dead worker's job or run recovered after its bound",
    "orphan_not_recovered": "a dead or paused worker's job or run never recovered",
    "orphan_unexplained": "an orphan's claim ended with neither a recovery nor its holder",
    "process_error": "a worker, the reaper or the monitor failed on its own",
    **TASK_VIOLATION_KINDS,
}

#: Examples kept per kind.
EXAMPLES = 5


@dataclass
class Findings:
    violations: dict[str, int] = field(default_factory=lambda: dict.fromkeys(VIOLATION_KINDS, 0))
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, items: list[str]) -> None:
        if kind not in self.violations:
            raise KeyError(kind)
        self.violations[kind] += len(items)
        if items:
            kept = self.examples.setdefault(kind, [])
            kept.extend(items[: max(0, EXAMPLES - len(kept))])

    @property
    def total(self) -> int:
        return sum(self.violations.values())


@dataclass(frozen=True)
class Tables:
    job: str
    run: str
    audit: str
    lease_expired_error: str
    reaped_error: str


def jobstate_tables() -> Tables:
    """Table names and error texts from jobstate (Django must be set up)."""
    from jobstate.models import AuditEntry, Job, JobRun
    from jobstate.stores.base import REAPED_RUN_ERROR
    from jobstate.stores.database.sweep_statements import LEASE_EXPIRED_ERROR

    return Tables(
        Job._meta.db_table,
        JobRun._meta.db_table,
        AuditEntry._meta.db_table,
        LEASE_EXPIRED_ERROR,
        REAPED_RUN_ERROR,
    )


def _recovery_of_claim(d: Dialect) -> str:
    """The ``recovered`` audit entry of the lease sweep that took claim ``k`` back: it
    names the worker in ``via`` when it requeues, in ``executor_id`` on the last attempt."""
    via = d.json_text("a.detail", "via")
    return f"""
    a.job_id = k.job_id AND a.event = 'recovered'
    AND ({via} = {d.concat("'worker-lease-expired:'", "k.worker")}
         OR ({via} = 'worker-lease-expired'
             AND {d.json_text("a.detail", "executor_id")} = k.worker))
"""


def check_claims(conn: Connection, tables: Tables, findings: Findings) -> None:
    """Claims against the ledger: one live claim per job at a time, and reports only
    from the live claim.

    Ledger instants are the database clock inside each transaction, and the row lock
    orders the transactions of one job, so a claim, its report and the next claim are
    stamped in the order they took effect. A claim ``k`` may be followed by the next
    claim of its job only once ``k`` ended: given back by its holder (a ``queued``
    report) or taken back by the lease sweep (its ``recovered`` entry, stamped with
    the sweep's transaction start, which comes after the lease ran out).
    """
    d = conn.dialect
    findings.add(
        "double_claim",
        _ids(
            conn,
            "SELECT claim_token, count(*) FROM torture_claim "
            "GROUP BY claim_token HAVING count(*) > 1",
        ),
    )
    findings.add(
        "double_claim",
        _ids(
            conn,
            f"""WITH k AS (
                SELECT job_id, claim_token, worker, at,
                       lead(at) OVER (PARTITION BY job_id ORDER BY at, id) AS next_at
                FROM torture_claim)
            SELECT k.job_id, k.claim_token, k.worker FROM k
            WHERE k.next_at IS NOT NULL
              AND NOT EXISTS (SELECT 1 FROM torture_completion c
                              WHERE c.claim_token = k.claim_token AND c.status = 'queued'
                                AND c.at <= k.next_at)
              AND NOT EXISTS (SELECT 1 FROM {tables.audit} a WHERE {_recovery_of_claim(d)}
                                AND a.ts >= k.at AND a.ts <= k.next_at)""",
        ),
    )
    findings.add(
        "stale_completion",
        _ids(
            conn,
            "SELECT c.job_id, c.claim_token, c.worker FROM torture_completion c "
            "LEFT JOIN torture_claim k ON k.claim_token = c.claim_token "
            "WHERE k.id IS NULL OR k.job_id <> c.job_id OR EXISTS ("
            "  SELECT 1 FROM torture_claim later WHERE later.job_id = c.job_id"
            "  AND later.at > k.at AND later.at < c.at)",
        ),
    )


def _ids(conn: Connection, sql: str, params: list[Any] | None = None) -> list[str]:
    return [" ".join(str(value) for value in row) for row in conn.execute(sql, params).fetchall()]


def check_database(conn: Connection, tables: Tables, findings: Findings) -> None:
    """The end-state checks: nothing lost, everything settled, every completion fenced."""
    job, run, d = tables.job, tables.run, conn.dialect
    witness = d.json_text("j.result", "claim_token")
    findings.add(
        "lost",
        _ids(
            conn,
            f"SELECT l.job_id FROM torture_loaded l LEFT JOIN {job} j ON j.id = l.job_id "
            "WHERE j.id IS NULL",
        ),
    )
    findings.add(
        "unsettled",
        _ids(
            conn,
            f"SELECT j.id, j.status FROM torture_loaded l JOIN {job} j ON j.id = l.job_id "
            "WHERE j.status NOT IN ('queued', 'done', 'error', 'rejected')",
        ),
    )
    findings.add(
        "claim_left_behind",
        _ids(
            conn,
            f"SELECT j.id, j.status FROM torture_loaded l JOIN {job} j ON j.id = l.job_id "
            "WHERE j.status IN ('queued', 'done', 'error', 'rejected') AND (j.claim_token"
            " IS NOT NULL OR j.executor_id IS NOT NULL OR j.lease_until IS NOT NULL"
            " OR j.claimed_at IS NOT NULL)",
        ),
    )
    findings.add(
        "double_completion",
        _ids(
            conn,
            "SELECT job_id, count(*) FROM torture_completion WHERE status <> 'queued' "
            "GROUP BY job_id HAVING count(*) > 1",
        ),
    )
    findings.add(
        "double_report",
        _ids(
            conn,
            "SELECT claim_token, count(*) FROM torture_completion "
            "GROUP BY claim_token HAVING count(*) > 1",
        ),
    )
    # A job may end terminal without a report of its own only through the lease sweep's
    # last attempt, which says so in its error text.
    findings.add(
        "completion_unrecorded",
        _ids(
            conn,
            f"SELECT j.id, j.status FROM torture_loaded l JOIN {job} j ON j.id = l.job_id "
            "WHERE j.status IN ('done', 'error', 'rejected') "
            f"AND NOT (j.status = 'error' AND {d.same('j.error', '%s')}) "
            "AND NOT EXISTS (SELECT 1 FROM torture_completion c "
            "WHERE c.job_id = j.id AND c.status <> 'queued')",
            [tables.lease_expired_error],
        ),
    )
    findings.add(
        "completion_mismatch",
        _ids(
            conn,
            f"SELECT j.id, j.status, c.status FROM torture_completion c JOIN {job} j "
            "ON j.id = c.job_id WHERE c.status <> 'queued' AND (j.status <> c.status "
            f"OR NOT {d.same(witness, d.uuid_text('c.claim_token'))})",
        ),
    )
    # The runner told the worker its outcome was written: the row must hold exactly that
    # outcome, not a reaper's.
    findings.add(
        "run_double_settle",
        _ids(
            conn,
            f"SELECT o.run_id, o.status, r.status FROM torture_run_outcome o JOIN {run} r "
            "ON r.id = o.run_id WHERE o.recorded = 'settled' AND (r.status <> o.status "
            f"OR (r.status = 'TIMED_OUT' AND {d.same('r.error', '%s')}))",
            [tables.reaped_error],
        ),
    )
    findings.add("unsettled_run", _ids(conn, f"SELECT id FROM {run} WHERE status = 'RUNNING'"))


def check_watch(monitor: MonitorResult, findings: Findings) -> None:
    """The live checks: overlap sightings, and each orphan's recovery."""
    findings.add("overlap", [sighting.describe() for sighting in monitor.overlaps])
    findings.add("orphan_late", [o.describe() for o in monitor.orphans if o.late])
    findings.add("orphan_not_recovered", [o.describe() for o in monitor.orphans if o.how is None])
    findings.add(
        "orphan_unexplained",
        [o.describe() for o in monitor.orphans if o.how == "unexplained"],
    )
    if monitor.error is not None:
        findings.add("process_error", [f"monitor: {monitor.error}"])


def figures(conn: Connection, tables: Tables, paused_workers: list[str]) -> dict[str, Any]:
    """The counts of the summary, read from the database at the end.

    ``renewals_refused_unpaused`` counts lease renewals refused to a worker that was
    never paused: a worker that keeps renewing should keep its job, so anything here
    means a worker stalled longer than its lease (a very loaded machine) or a renewal
    that did not protect the claim."""

    d = conn.dialect
    unpaused, unpaused_params = d.not_in("worker", paused_workers)
    refusal = d.concat("kind", "': '", "outcome")

    def pairs(sql: str) -> dict[str, int]:
        return {str(key): int(count) for key, count in conn.execute(sql).fetchall()}

    def one(sql: str, params: list[Any] | None = None) -> Any:
        row = conn.execute(sql, params).fetchone()
        return None if row is None else row[0]

    reap_totals: dict[str, int] = {}
    for (counts,) in conn.execute("SELECT counts FROM torture_reap_pass").fetchall():
        # jsonb comes back decoded; MariaDB's JSON is text.
        for key, value in (json.loads(counts) if isinstance(counts, str) else counts).items():
            reap_totals[key] = reap_totals.get(key, 0) + int(value)
    return {
        "jobs_loaded": one("SELECT count(*) FROM torture_loaded"),
        "jobs_by_status": pairs(
            f"SELECT j.status, count(*) FROM torture_loaded l JOIN {tables.job} j "
            "ON j.id = l.job_id GROUP BY j.status ORDER BY j.status"
        ),
        "jobs_failed_by_lease_limit": one(
            f"SELECT count(*) FROM torture_loaded l JOIN {tables.job} j ON j.id = l.job_id "
            "WHERE j.status = 'error' AND j.error = %s",
            [tables.lease_expired_error],
        ),
        "reports_accepted": pairs(
            "SELECT status, count(*) FROM torture_completion GROUP BY status ORDER BY status"
        ),
        "refused": pairs(
            f"SELECT {refusal}, count(*) FROM torture_refusal GROUP BY kind, outcome ORDER BY 1"
        ),
        "renewals_refused_unpaused": one(
            f"SELECT count(*) FROM torture_refusal WHERE kind = 'renewal' AND {unpaused}",
            unpaused_params,
        ),
        "runs_by_status": pairs(
            f"SELECT status, count(*) FROM {tables.run} GROUP BY status ORDER BY status"
        ),
        "run_outcomes_by_recorded": pairs(
            "SELECT recorded, count(*) FROM torture_run_outcome GROUP BY recorded ORDER BY 1"
        ),
        "runs_reaped": one(
            f"SELECT count(*) FROM {tables.run} WHERE status = 'TIMED_OUT' AND error = %s",
            [tables.reaped_error],
        ),
        "reaper_passes": one("SELECT count(*) FROM torture_reap_pass"),
        "reaper_slowest_pass_seconds": one(
            "SELECT coalesce(max(seconds), 0) FROM torture_reap_pass"
        ),
        "reaper_moved": reap_totals,
    }
