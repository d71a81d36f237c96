"""The torture run on MariaDB (``--database-url mysql://...``) end to end on a few
seconds, then its checks shown to catch, in MariaDB's SQL, what they are there to catch:
violations are written into the finished run's database and must be found.

The run makes its own database on the MariaDB server of the test run (the test
database's server on the MariaDB leg, else ``JOBSTATE_TEST_MYSQL_URL``), so it does not
depend on which database the rest of the suite is on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from reliability._torture_checks import Findings, check_claims, check_database, jobstate_tables
from reliability._torture_db import drop_database
from reliability._torture_sql import Connection, connect
from reliability._torture_tasks import check_tasks
from tests.support.servers import mysql_server_url

ROOT = Path(__file__).resolve().parents[2]


def _run(url: str, report_path: Path) -> dict[str, Any]:
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [
            *(sys.executable, "-m", "reliability.torture", "--database-url", url),
            *("--duration", "6", "--workers", "3", "--jobs", "120", "--kill-every", "1"),
            *("--slack", "5", "--task-workers", "1", "--tasks", "40", "--seed", "11"),
            *("--report", str(report_path)),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode in (0, 1), result.stdout[-4000:] + result.stderr[-4000:]
    report: dict[str, Any] = json.loads(report_path.read_text())
    assert (result.returncode == 0) == (report["violations_total"] == 0)
    return report


@pytest.mark.mysql
@pytest.mark.only_on("mysql")
@pytest.mark.slow
def test_a_short_torture_run_on_mariadb_loses_nothing_and_its_checks_can_fail(
    tmp_path: Path,
) -> None:
    url = mysql_server_url() + f"jobstate_torture_mysql_test_{os.getpid()}"
    try:
        report = _run(url, tmp_path / "torture.json")
        # Every kind of violation is 0, overlap included: migration 0009's guards give
        # S1 on MariaDB, and jobstate's checks find nothing missing there.
        assert set(report["violations"].values()) == {0}, report["examples"]
        assert report["jobstate_checks"] == [], report["jobstate_checks"]
        assert report["faults"]["kills"] >= 1
        assert report["tasks_loaded"] == 40
        assert set(report["tasks_by_status"]) <= {"done", "error"}
        assert report["jobs_loaded"] == 120
        assert set(report["jobs_by_status"]) <= {"queued", "done", "error", "rejected"}
        assert report["jobs_by_status"].get("done", 0) > 0

        with connect(url, "torture-test") as conn:
            _break_the_end_state(conn)
            findings = Findings()
            tables = jobstate_tables()
            check_database(conn, tables, findings)
            check_claims(conn, tables, findings)
            check_tasks(conn, findings.add)
        assert findings.violations["lost"] == 1
        assert findings.violations["double_completion"] == 1
        assert findings.violations["completion_mismatch"] == 1
        assert findings.violations["double_claim"] == 1
        assert findings.violations["task_finished_twice"] == 1
        assert findings.violations["task_attempt_unrecorded"] == 1
        assert findings.total == 6, findings.examples
    finally:
        drop_database(url)


def _break_the_end_state(conn: Connection) -> None:
    """One lost job, one job completed a second time by a claim nobody released it for,
    one task finished twice without the attempt being counted."""
    d = conn.dialect
    ids = d.id_text("j.id")
    done = conn.execute(
        f"SELECT {ids} FROM jobstate_job j JOIN torture_loaded l ON l.job_id = j.id "
        "WHERE j.status = 'done' ORDER BY j.id LIMIT 2"
    ).fetchall()
    assert len(done) == 2, "the run finished fewer than two jobs"
    (lost,), (again,) = done
    conn.execute("SET FOREIGN_KEY_CHECKS = 0")
    conn.execute("DELETE FROM jobstate_job WHERE id = %s", [lost])
    conn.execute("SET FOREIGN_KEY_CHECKS = 1")
    token = d.uuid_value(uuid.uuid4())
    conn.execute(
        "INSERT INTO torture_claim (job_id, claim_token, worker) VALUES (%s, %s, 'intruder')",
        [again, token],
    )
    conn.execute(
        "INSERT INTO torture_completion (job_id, claim_token, status, worker, pid) "
        "VALUES (%s, %s, 'done', 'intruder', 1)",
        [again, token],
    )
    task = conn.execute(
        f"SELECT {ids} FROM jobstate_job j JOIN torture_task_loaded l ON l.result_id = j.id "
        "WHERE j.status = 'done' AND j.attempts = 1 ORDER BY j.id LIMIT 1"
    ).fetchone()
    assert task is not None, "no task finished on its first attempt"
    success = {"worker_id": "w", "outcome": "successful", "started_at": None}
    conn.execute(
        "UPDATE jobstate_job SET attempt_log = %s WHERE id = %s",
        [json.dumps([success, success]), task[0]],
    )
