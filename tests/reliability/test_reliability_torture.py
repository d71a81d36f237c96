"""The torture run (``python -m reliability.torture``) end to end on a few seconds, and
its checks shown to catch what they are there to catch.

The short run kills and pauses real worker processes while a real reaper runs; the
test then reads the run's database itself rather than trusting the summary alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from reliability._torture_checks import (
    Findings,
    check_claims,
    check_database,
    check_watch,
    jobstate_tables,
)
from reliability._torture_config import TARGET
from reliability._torture_db import LEDGER_TABLES, create_ledger, drop_database
from reliability._torture_monitor import How, MonitorResult, Orphan
from reliability._torture_sql import Connection, dialect_of_django
from reliability._torture_tasks import check_tasks, create_task_ledger
from tests.support.servers import postgres_server_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_short_torture_run_loses_nothing_and_completes_nothing_twice(tmp_path: Path) -> None:
    url = postgres_server_url() + f"jobstate_torture_test_{os.getpid()}"
    report_path = tmp_path / "torture.json"
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    try:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "reliability.torture",
                "--duration",
                "8",
                "--workers",
                "4",
                "--jobs",
                "150",
                "--kill-every",
                "1",
                # A loaded test machine may run the reaper late; the 60 s run reports
                # the real latencies against the tight bound.
                "--slack",
                "5",
                "--task-workers",
                "2",
                "--tasks",
                "80",
                "--seed",
                "7",
                "--database-url",
                url,
                "--report",
                str(report_path),
            ],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        report = json.loads(report_path.read_text())
        assert report["violations_total"] == 0, report["examples"]
        assert set(report["violations"].values()) == {0}
        assert re.search(r"^\| violations +\| 0 \|$", result.stdout, re.MULTILINE)

        assert report["faults"]["kills"] >= 1
        assert report["faults"]["restarts"] >= report["faults"]["kills"]
        # The task workers' tasks all ended, each once (the task checks are among the
        # violations above).
        assert report["tasks_loaded"] == 80
        assert sum(report["tasks_by_status"].values()) == 80
        assert set(report["tasks_by_status"]) <= {"done", "error"}
        recovered = report["orphans"]["jobs"]["recovered"] + report["orphans"]["runs"]["recovered"]
        assert recovered >= 1, report["orphans"]

        with psycopg.connect(url, autocommit=True) as conn:
            # Every loaded job is there, and terminal or queued.
            statuses: dict[str | None, int] = dict(
                conn.execute(
                    "SELECT j.status, count(*) FROM torture_loaded l "
                    "LEFT JOIN jobstate_job j ON j.id = l.job_id GROUP BY j.status"
                ).fetchall()
            )
            assert sum(statuses.values()) == 150
            assert set(statuses) <= {"queued", "done", "error", "rejected"}, statuses
            assert statuses.get("done", 0) > 0
            # No job was completed twice, and every done job is the one recorded report.
            twice = conn.execute(
                "SELECT job_id FROM torture_completion WHERE status <> 'queued' "
                "GROUP BY job_id HAVING count(*) > 1"
            ).fetchall()
            assert twice == []
            done = conn.execute(
                "SELECT count(*) FROM jobstate_job j JOIN torture_completion c "
                "ON c.job_id = j.id AND c.status = 'done' "
                "WHERE j.status = 'done' AND j.result->>'claim_token' = c.claim_token::text"
            ).fetchone()
            assert done is not None and done[0] == statuses["done"]
            # The dead workers' work came back through the lease sweep.
            recoveries = conn.execute(
                "SELECT count(*) FROM jobstate_auditentry WHERE event = 'recovered'"
            ).fetchone()
            assert recoveries is not None
            assert recoveries[0] >= report["orphans"]["jobs"]["recovered"]
            running = conn.execute(
                "SELECT count(*) FROM jobstate_jobrun WHERE status = 'RUNNING'"
            ).fetchone()
            assert running == (0,)
    finally:
        drop_database(url)


# --- the checks can fail ---------------------------------------------------------------


def _test_database() -> Connection:
    """The test database's own connection, in the harness's wrapper."""
    connection.ensure_connection()
    return Connection(connection.connection, dialect_of_django())


@pytest.fixture
def ledger(transactional_db: None) -> Iterator[Connection]:
    """The harness's ledger tables in the test database, and the raw connection the
    checks read through."""
    conn = _test_database()
    for table in LEDGER_TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    create_ledger(conn)
    yield conn
    for table in LEDGER_TABLES:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.mark.postgres
def test_the_end_state_checks_catch_lost_unsettled_and_doubly_completed_jobs(
    ledger: Connection,
) -> None:
    from jobstate.models import Job
    from jobstate.stores import get_state_store

    store = get_state_store()
    as_stored = ledger.dialect.uuid_value
    jobs = [store.enqueue(request_id=f"check-{n}", target=TARGET)[0] for n in range(4)]
    for job in jobs:
        ledger.execute("INSERT INTO torture_loaded (job_id) VALUES (%s)", [as_stored(job.id)])
    done, forced, held, lost = jobs

    # A job completed properly, then again by a second claim nobody released it for.
    claim = store.claim_next_inhub_job([TARGET], "worker-a")
    assert claim is not None and claim.id == done.id and claim.claim_token is not None
    ledger.execute(
        "INSERT INTO torture_claim (job_id, claim_token, worker) VALUES (%s, %s, 'worker-a')",
        [as_stored(claim.id), as_stored(claim.claim_token)],
    )
    witness = {"claim_token": str(claim.claim_token)}
    assert store.complete_claimed_job(claim.id, claim.claim_token, "done", result=witness).completed
    ledger.execute(
        "INSERT INTO torture_completion (job_id, claim_token, status, worker, pid) "
        "VALUES (%s, %s, 'done', 'worker-a', 1)",
        [as_stored(claim.id), as_stored(claim.claim_token)],
    )
    second = "5f0c8d7e-0000-4000-8000-000000000002"
    ledger.execute(
        "INSERT INTO torture_claim (job_id, claim_token, worker) VALUES (%s, %s, 'worker-b')",
        [as_stored(done.id), as_stored(second)],
    )
    ledger.execute(
        "INSERT INTO torture_completion (job_id, claim_token, status, worker, pid) "
        "VALUES (%s, %s, 'done', 'worker-b', 2)",
        [as_stored(done.id), as_stored(second)],
    )
    # A job finished behind the fence, a job left running, a job gone.
    store.update_job(forced.id, status="done")
    assert store.claim_next_inhub_job([TARGET], "worker-c") is not None
    Job.objects.filter(id=lost.id).delete()

    findings = Findings()
    tables = jobstate_tables()
    check_database(ledger, tables, findings)
    check_claims(ledger, tables, findings)

    assert findings.violations["lost"] == 1
    assert findings.violations["unsettled"] == 1
    assert findings.violations["double_completion"] == 1
    assert findings.violations["double_claim"] == 1
    assert findings.violations["completion_mismatch"] == 1
    assert findings.violations["completion_unrecorded"] == 1
    assert findings.total == 6
    assert str(lost.id) in findings.examples["lost"][0]
    assert str(held.id) in findings.examples["unsettled"][0]


def test_the_watch_flags_late_missing_and_unexplained_recoveries() -> None:
    killed_at = datetime(2026, 1, 1, tzinfo=UTC)

    def orphan(ident: str, after: float | None, how: How | None) -> Orphan:
        recovered = None if after is None else killed_at + timedelta(seconds=after)
        return Orphan("job", ident, "w", "kill", killed_at, 5.0, how=how, recovered_at=recovered)

    watch = MonitorResult(
        orphans=[
            orphan("in-time", 4.9, "swept"),
            orphan("late", 5.1, "swept"),
            orphan("never", None, None),
            orphan("unexplained", 1.0, "unexplained"),
        ]
    )
    findings = Findings()
    check_watch(watch, findings)

    assert findings.violations["orphan_late"] == 1
    assert findings.violations["orphan_not_recovered"] == 1
    assert findings.violations["orphan_unexplained"] == 1
    assert findings.total == 3
    assert "late" in findings.examples["orphan_late"][0]


@pytest.fixture
def task_ledger(transactional_db: None) -> Iterator[Connection]:
    """The task ledger tables in the test database, and the raw connection the checks
    read through."""
    conn = _test_database()
    tables = ("torture_task_loaded", "torture_task_run", "torture_task_kill")
    for table in tables:
        conn.execute(f"DROP TABLE IF EXISTS {table}")
    create_task_ledger(conn)
    yield conn
    for table in tables:
        conn.execute(f"DROP TABLE IF EXISTS {table}")


@pytest.mark.postgres
def test_the_task_checks_catch_lost_unsettled_doubly_finished_and_unrecovered_tasks(
    task_ledger: Connection,
) -> None:
    from jobstate.core.states import NewTask
    from jobstate.models import Job
    from jobstate.stores import get_state_store

    store = get_state_store()

    def task(n: int) -> Any:
        new = NewTask(
            target="tasks:default",
            task_path="reliability._torture_task_functions.double",
            queue_name="default",
            priority=0,
            args=[n, 0],
            kwargs={},
            max_attempts=3,
        )
        job = store.enqueue_task(new)
        task_ledger.execute(
            "INSERT INTO torture_task_loaded (result_id, n) VALUES (%s, %s)",
            [task_ledger.dialect.uuid_value(job.id), n],
        )
        return job

    fine, twice, waiting, lost, unrecovered, miscounted = (task(n) for n in range(6))
    success = {"worker_id": "w", "outcome": "successful", "started_at": None}
    lost_attempt = {"worker_id": "w-dead", "outcome": "worker lost", "started_at": None}
    Job.objects.filter(id=fine.id).update(
        status="done", result=0, attempts=2, attempt_log=[lost_attempt, success]
    )
    Job.objects.filter(id=twice.id).update(
        status="done", result=2, attempts=2, attempt_log=[success, success]
    )
    Job.objects.filter(id=lost.id).delete()
    Job.objects.filter(id=unrecovered.id).update(
        status="done", result=8, attempts=1, attempt_log=[success]
    )
    Job.objects.filter(id=miscounted.id).update(
        status="error", attempts=3, attempt_log=[lost_attempt]
    )
    for job in (fine, unrecovered):
        task_ledger.execute(
            "INSERT INTO torture_task_kill (worker, result_id) VALUES ('w-dead', %s)",
            [task_ledger.dialect.uuid_value(job.id)],
        )

    findings = Findings()
    check_tasks(task_ledger, findings.add)

    assert findings.violations["task_lost"] == 1
    assert findings.violations["task_unsettled"] == 1
    assert findings.violations["task_finished_twice"] == 1
    assert findings.violations["task_attempt_unrecorded"] == 1
    assert findings.violations["task_orphan_unrecovered"] == 1
    assert findings.total == 5
    assert str(waiting.id) in findings.examples["task_unsettled"][0]
    assert str(twice.id) in findings.examples["task_finished_twice"][0]
