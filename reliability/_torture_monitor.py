"""The torture run's live watch, a thread of the controller with its own connection.

Every poll it

- looks for an overlap key with two RUNNING runs (the partial unique constraint says
  there never is one; this is the outside view of that promise, taken while the
  workers are being killed), and
- follows the orphans: the jobs and runs a killed (or paused) worker held. An orphan
  is recovered when its claim is gone. The recovery instant comes from the database:
  the ``recovered`` audit entry the lease sweep wrote for that worker's claim, or the
  ``finished_at`` the reaper stamped on the run. Every instant here is on the database
  clock, so the latency from the fault to the recovery needs no clock agreement.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from reliability._torture_sql import Connection, connect

Fault = Literal["kill", "pause", "stop"]
How = Literal["swept", "holder", "unexplained"]


@dataclass
class Orphan:
    """A job or run held by a worker when the controller killed or paused it."""

    kind: Literal["job", "run"]
    ident: str
    worker: str
    fault: Fault
    fault_at: datetime
    bound: float | None
    """Seconds within which the recovery is promised; ``None`` for a paused worker,
    which may wake up and finish its work first."""
    token: str | None = None
    sessions_gone: bool = True
    """The worker's database sessions had ended when its holdings were read, so
    nothing it sent can land afterwards."""
    recovered_at: datetime | None = None
    how: How | None = None

    @property
    def latency(self) -> float | None:
        if self.recovered_at is None:
            return None
        return max(0.0, (self.recovered_at - self.fault_at).total_seconds())

    @property
    def late(self) -> bool:
        latency = self.latency
        return self.bound is not None and latency is not None and latency > self.bound

    def describe(self) -> str:
        latency = self.latency
        outcome = "not recovered" if latency is None else f"{self.how} after {latency:.2f} s"
        bound = "" if self.bound is None else f" (bound {self.bound:.1f} s)"
        return f"{self.kind} {self.ident} of {self.worker} ({self.fault}): {outcome}{bound}"


@dataclass(frozen=True)
class OverlapSighting:
    overlap_key: str
    run_ids: tuple[str, ...]
    seen_at: datetime

    def describe(self) -> str:
        return f"{self.overlap_key}: RUNNING runs {', '.join(self.run_ids)} at {self.seen_at}"


@dataclass
class _Tables:
    job: str
    run: str
    audit: str
    reaped_error: str


def _tables() -> _Tables:
    from jobstate.models import AuditEntry, Job, JobRun
    from jobstate.stores.base import REAPED_RUN_ERROR

    return _Tables(
        job=Job._meta.db_table,
        run=JobRun._meta.db_table,
        audit=AuditEntry._meta.db_table,
        reaped_error=REAPED_RUN_ERROR,
    )


@dataclass
class MonitorResult:
    orphans: list[Orphan] = field(default_factory=list)
    overlaps: list[OverlapSighting] = field(default_factory=list)
    polls: int = 0
    error: str | None = None


class Monitor(threading.Thread):
    """Polls every ``interval`` seconds until :meth:`finish`. Django must be set up
    (the table names and error texts come from jobstate)."""

    def __init__(self, url: str, interval: float = 0.1) -> None:
        super().__init__(name="torture-monitor", daemon=True)
        self.interval = interval
        self.tables = _tables()
        self.conn: Connection = connect(url, "torture-monitor")
        self.d = self.conn.dialect
        self._lock = threading.Lock()
        self._orphans: list[Orphan] = []
        self._overlaps: dict[tuple[str, tuple[str, ...]], OverlapSighting] = {}
        self._halt = threading.Event()
        self._polls = 0
        self._error: str | None = None

    def track(self, orphans: list[Orphan]) -> None:
        with self._lock:
            self._orphans.extend(orphans)

    def run(self) -> None:
        try:
            while not self._halt.wait(self.interval):
                self.poll()
        # Any failure ends the watch; it is reported as a violation by the controller,
        # because a run whose monitor stopped cannot vouch for the overlap guarantee.
        except Exception as exc:
            self._error = f"{type(exc).__name__}: {exc}"
            raise

    def finish(self) -> MonitorResult:
        """Stop polling, take one last look, and return what was seen."""
        self._halt.set()
        self.join()
        if self._error is None:
            self.poll()
        self.conn.close()
        with self._lock:
            return MonitorResult(
                orphans=list(self._orphans),
                overlaps=list(self._overlaps.values()),
                polls=self._polls,
                error=self._error,
            )

    # --- one poll ---------------------------------------------------------------------

    def poll(self) -> None:
        self._check_overlap()
        with self._lock:
            pending = [o for o in self._orphans if o.how is None]
        if pending:
            self._follow_jobs([o for o in pending if o.kind == "job"])
            self._follow_runs([o for o in pending if o.kind == "run"])
        self._polls += 1

    def _check_overlap(self) -> None:
        d = self.d
        rows = self.conn.execute(
            f"SELECT overlap_key, {d.ids_aggregate('id')}, {d.now} "
            f"FROM {self.tables.run} WHERE status = 'RUNNING' AND overlap_key IS NOT NULL "
            "GROUP BY overlap_key HAVING count(*) > 1"
        ).fetchall()
        for key, ids, seen_at in rows:
            sighting = OverlapSighting(key, d.ids_of_aggregate(ids), seen_at)
            with self._lock:
                self._overlaps.setdefault((key, sighting.run_ids), sighting)

    def _follow_jobs(self, orphans: list[Orphan]) -> None:
        if not orphans:
            return
        d = self.d
        wanted, params = d.in_ids("id", [o.ident for o in orphans])
        current = dict(
            self.conn.execute(
                f"SELECT {d.id_text('id')}, {d.id_text('claim_token')} FROM {self.tables.job} "
                f"WHERE {wanted}",
                params,
            ).fetchall()
        )
        for orphan in orphans:
            if orphan.ident in current and current[orphan.ident] == orphan.token:
                continue  # still held by the dead worker's claim
            self._settle_job(orphan)

    def _settle_job(self, orphan: Orphan) -> None:
        # The lease sweep names the worker whose lease expired: in ``via`` when it
        # requeues, in ``executor_id`` when the last attempt moves the job to error.
        via = self.d.json_text("detail", "via")
        row = self.conn.execute(
            f"SELECT max(ts) FROM {self.tables.audit} WHERE job_id = %s AND event = 'recovered'"
            f" AND ({via} = %s OR ({via} = 'worker-lease-expired'"
            f" AND {self.d.json_text('detail', 'executor_id')} = %s))",
            [orphan.ident, f"worker-lease-expired:{orphan.worker}", orphan.worker],
        ).fetchone()
        if row is not None and row[0] is not None:
            self._settled(orphan, "swept", row[0])
            return
        held = self.conn.execute(
            "SELECT 1 FROM torture_completion WHERE job_id = %s AND claim_token = %s",
            [orphan.ident, orphan.token],
        ).fetchone()
        self._settled(orphan, "holder" if held else "unexplained", None)

    def _follow_runs(self, orphans: list[Orphan]) -> None:
        if not orphans:
            return
        wanted, params = self.d.in_ids("id", [o.ident for o in orphans])
        rows = self.conn.execute(
            f"SELECT {self.d.id_text('id')}, status, finished_at, error FROM {self.tables.run} "
            f"WHERE {wanted}",
            params,
        ).fetchall()
        found = {ident: (status, finished, error) for ident, status, finished, error in rows}
        for orphan in orphans:
            status, finished_at, error = found.get(orphan.ident, (None, None, None))
            if status == "RUNNING":
                continue
            if status == "TIMED_OUT" and error == self.tables.reaped_error:
                self._settled(orphan, "swept", finished_at)
            else:
                self._settled(orphan, "holder" if status else "unexplained", finished_at)

    def _settled(self, orphan: Orphan, how: How, at: datetime | None) -> None:
        if at is None:
            row = self.conn.execute(f"SELECT {self.d.now}").fetchone()
            assert row is not None
            at = row[0]
        # A dead worker cannot finish anything once its sessions are gone: if the
        # holder seems to have settled its own work after that, something else did.
        if how == "holder" and orphan.fault != "pause" and orphan.sessions_gone:
            how = "unexplained"
        with self._lock:
            orphan.how = how
            orphan.recovered_at = at
