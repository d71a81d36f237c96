"""The django.tasks part of a torture run: ``jobstate_worker`` processes run tasks while
the controller kills some of them with SIGKILL (and restarts them), and the reaper's
``tasks`` sweep hands their tasks back.

At the end the task workers are stopped with SIGTERM, the tasks the killed workers held
are recovered, one last ``jobstate_worker --batch`` runs what is left, and the checks
ask of every loaded task:

- it exists and ended ``SUCCESSFUL`` or ``FAILED`` (``done`` / ``error``): none lost,
  none left waiting or running;
- it finished once: at most one successful attempt in its log, the last one, with the
  right return value, and an ``error`` task has none;
- every attempt that started is recorded once: ``attempts`` equals the length of the
  attempt log;
- every task a killed worker held has that worker's lost attempt in its log.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from reliability._torture_config import Timing, process_environment
from reliability._torture_sql import Connection, MySQLDialect

__all__ = [
    "TASK_VIOLATION_KINDS",
    "TaskWorkers",
    "check_tasks",
    "create_task_ledger",
    "drain_tasks",
    "load_tasks",
    "task_figures",
]

TASK_LEDGER_DDL = [
    "CREATE TABLE torture_task_loaded (result_id uuid PRIMARY KEY, n integer NOT NULL)",
    """CREATE TABLE torture_task_run (
        id bigserial PRIMARY KEY, result_id uuid NOT NULL, attempt integer NOT NULL,
        worker_pid integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())""",
    """CREATE TABLE torture_task_kill (
        id bigserial PRIMARY KEY, worker text NOT NULL, result_id uuid NOT NULL)""",
]

#: The same on MariaDB / MySQL (``{uuid}``: the type Django gives a uuid there).
MYSQL_TASK_LEDGER_DDL = [
    "CREATE TABLE torture_task_loaded (result_id {uuid} PRIMARY KEY, n INTEGER NOT NULL)",
    """CREATE TABLE torture_task_run (
        id BIGINT AUTO_INCREMENT PRIMARY KEY, result_id {uuid} NOT NULL,
        attempt INTEGER NOT NULL, worker_pid INTEGER NOT NULL,
        at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))""",
    """CREATE TABLE torture_task_kill (
        id BIGINT AUTO_INCREMENT PRIMARY KEY, worker VARCHAR(64) NOT NULL,
        result_id {uuid} NOT NULL)""",
]

#: The task checks' violations, as ``VIOLATION_KINDS`` lists the others.
TASK_VIOLATION_KINDS = {
    "task_lost": "a loaded task is missing",
    "task_unsettled": "a task neither SUCCESSFUL nor FAILED at the end",
    "task_finished_twice": "a task with more than one successful attempt, or a wrong result",
    "task_attempt_unrecorded": "a task whose attempt count and attempt log disagree",
    "task_orphan_unrecovered": "a task a killed worker held, without that worker's lost attempt",
}

#: Milliseconds each task works, at most: a kill usually lands on a task in hand.
WORK_MS = 300

#: Seconds a worker process may need to set Django up and install its signal handlers;
#: a SIGTERM before that ends it like any process (status -15), so stopping waits for it.
#: Generous: on a loaded 2-core machine a restarted worker took longer than 5 s.
STARTUP_SECONDS = 15.0


def create_task_ledger(conn: Connection) -> None:
    d = conn.dialect
    if isinstance(d, MySQLDialect):
        for statement in MYSQL_TASK_LEDGER_DDL:
            conn.execute(statement.format(uuid=d.uuid_type))
        return
    for statement in TASK_LEDGER_DDL:
        conn.execute(statement)


def load_tasks(count: int, log: Callable[[str], None], batch: int = 500) -> None:
    """Enqueue ``count`` tasks with Django's ``enqueue``, noting each in
    ``torture_task_loaded`` in the same transaction (Django must be set up)."""
    from django.db import connection, transaction

    from reliability._torture_sql import dialect_of_django
    from reliability._torture_task_functions import double

    uuid_value = dialect_of_django().uuid_value
    rng = random.Random(count)
    for start in range(0, count, batch):
        with transaction.atomic(), connection.cursor() as cursor:
            rows = []
            for n in range(start, min(start + batch, count)):
                result = double.enqueue(n, rng.randint(0, WORK_MS))
                rows.append((uuid_value(result.id), n))
            cursor.executemany(
                "INSERT INTO torture_task_loaded (result_id, n) VALUES (%s, %s)", rows
            )
    log(f"loaded {count} tasks")


@dataclass
class TaskWorkers:
    """``count`` ``jobstate_worker`` processes, each restarted under a new id after a
    kill (``torture-t<slot>-<incarnation>``, also its ``application_name``)."""

    database_url: str
    timing: Timing
    count: int
    concurrency: int = 2
    kills: int = 0
    processes: list[subprocess.Popen[str]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    incarnations: list[int] = field(default_factory=list)
    started: list[float] = field(default_factory=list)

    def start(self) -> None:
        for slot in range(self.count):
            self.incarnations.append(0)
            self.ids.append("")
            self.started.append(0.0)
            self.processes.append(self._spawn(slot))

    def _spawn(self, slot: int, *args: str) -> subprocess.Popen[str]:
        worker_id = f"torture-t{slot}-{self.incarnations[slot]}"
        self.ids[slot] = worker_id
        self.started[slot] = time.monotonic()
        return worker_process(
            self.database_url,
            self.timing,
            worker_id,
            "--concurrency",
            str(self.concurrency),
            "--worker-id",
            worker_id,
            "--grace",
            "60",
            *args,
        )

    def kill_one(
        self,
        rng: random.Random,
        probe: Connection,
        wait_gone: Callable[[str], bool],
    ) -> None:
        """SIGKILL a random task worker and restart it; once its database sessions are
        gone (nothing it sent can still land), note the tasks it held."""
        slot = rng.randrange(self.count)
        worker = self.ids[slot]
        self.processes[slot].send_signal(signal.SIGKILL)
        self.processes[slot].communicate()
        self.kills += 1
        self.incarnations[slot] += 1
        self.processes[slot] = self._spawn(slot)
        wait_gone(worker)
        held = probe.execute(
            "SELECT id FROM jobstate_job WHERE status = 'running' AND executor_id = %s",
            [worker],
        ).fetchall()
        for (result_id,) in held:
            probe.execute(
                "INSERT INTO torture_task_kill (worker, result_id) VALUES (%s, %s)",
                [worker, result_id],
            )

    def failures(self) -> list[str]:
        """Workers that exited on their own (then restarted): each is a failure."""
        failed = []
        for slot, process in enumerate(self.processes):
            if process.poll() is not None:
                _out, err = process.communicate()
                failed.append(f"{self.ids[slot]}: exit {process.returncode}: {err[-500:]}")
                self.incarnations[slot] += 1
                self.processes[slot] = self._spawn(slot)
        return failed

    def stop(self, timeout: float) -> list[str]:
        """SIGTERM every worker and wait; the ones that fail to stop are killed."""
        if self.started:
            time.sleep(max(0.0, max(self.started) + STARTUP_SECONDS - time.monotonic()))
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        failed = []
        for slot, process in enumerate(self.processes):
            try:
                process.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
                failed.append(f"{self.ids[slot]}: did not stop on SIGTERM")
                continue
            if process.returncode != 0:
                failed.append(f"{self.ids[slot]}: exit {process.returncode} on SIGTERM")
        return failed

    def abandon(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.communicate()


def worker_process(
    database_url: str, timing: Timing, name: str, *args: str
) -> subprocess.Popen[str]:
    """``python -m django jobstate_worker *args`` on the run's database."""
    return subprocess.Popen(
        [sys.executable, "-m", "django", "jobstate_worker", "-v", "0", *args],
        env={**os.environ, **process_environment(database_url, timing, name)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def drain_tasks(
    database_url: str, timing: Timing, probe: Connection, log: Callable[[str], None]
) -> list[str]:
    """Once the killed workers' leases have run out and the reaper has recovered their
    tasks, run one ``--batch`` worker over what is left. Failures, as text."""
    deadline = time.monotonic() + timing.job_bound + 10
    while time.monotonic() < deadline:
        row = probe.execute(
            "SELECT count(*) FROM jobstate_job WHERE status = 'running' AND task_path IS NOT NULL"
        ).fetchone()
        if row is None or row[0] == 0:
            break
        time.sleep(0.2)
    log("draining the tasks left")
    drain = worker_process(database_url, timing, "torture-drain", "--batch", "--concurrency", "8")
    _out, err = drain.communicate(timeout=600)
    return [] if drain.returncode == 0 else [f"final drain: exit {drain.returncode}: {err[-500:]}"]


def _rows(conn: Connection, sql: str) -> list[str]:
    return [" ".join(str(value) for value in row) for row in conn.execute(sql).fetchall()]


def check_tasks(conn: Connection, add: Callable[[str, list[str]], None]) -> None:
    """The task checks of the module docstring; ``add(kind, items)`` records each."""
    add(
        "task_lost",
        _rows(
            conn,
            "SELECT l.result_id FROM torture_task_loaded l "
            "LEFT JOIN jobstate_job j ON j.id = l.result_id WHERE j.id IS NULL",
        ),
    )
    add(
        "task_unsettled",
        _rows(
            conn,
            "SELECT j.id, j.status FROM torture_task_loaded l JOIN jobstate_job j "
            "ON j.id = l.result_id WHERE j.status NOT IN ('done', 'error')",
        ),
    )
    d = conn.dialect
    outcome = d.element_text("a", "outcome")
    successes = f"""(SELECT count(*) FROM {d.elements("j.attempt_log", "a")}
                    WHERE {outcome} = 'successful')"""
    last_outcome = d.last_element_text("j.attempt_log", "outcome")
    add(
        "task_finished_twice",
        _rows(
            conn,
            f"""SELECT j.id, j.status, {successes} FROM torture_task_loaded l
                JOIN jobstate_job j ON j.id = l.result_id
                WHERE {successes} > 1
                   OR (j.status = 'done' AND ({successes} <> 1
                       OR {last_outcome} <> 'successful'
                       OR {d.json_differs_from_int("j.result", "2 * l.n")}))
                   OR (j.status = 'error' AND {successes} <> 0)""",
        ),
    )
    add(
        "task_attempt_unrecorded",
        _rows(
            conn,
            f"SELECT j.id, j.attempts, {d.array_length('j.attempt_log')} "
            "FROM torture_task_loaded l JOIN jobstate_job j ON j.id = l.result_id "
            "WHERE j.status IN ('done', 'error') "
            f"AND j.attempts <> {d.array_length('j.attempt_log')}",
        ),
    )
    add(
        "task_orphan_unrecovered",
        _rows(
            conn,
            f"""SELECT k.result_id, k.worker FROM torture_task_kill k
               JOIN jobstate_job j ON j.id = k.result_id
               WHERE NOT EXISTS (SELECT 1 FROM {d.elements("j.attempt_log", "a")}
                                 WHERE {d.element_text("a", "worker_id")} = k.worker
                                   AND {outcome} = 'worker lost')""",
        ),
    )


def task_figures(conn: Connection, kills: int) -> dict[str, Any]:
    d = conn.dialect

    def one(sql: str) -> Any:
        row = conn.execute(sql).fetchone()
        return None if row is None else row[0]

    return {
        "tasks_loaded": one("SELECT count(*) FROM torture_task_loaded"),
        "tasks_by_status": {
            str(status): int(count)
            for status, count in conn.execute(
                "SELECT j.status, count(*) FROM torture_task_loaded l JOIN jobstate_job j "
                "ON j.id = l.result_id GROUP BY j.status ORDER BY j.status"
            ).fetchall()
        },
        "task_worker_kills": kills,
        "tasks_held_by_killed_workers": one("SELECT count(*) FROM torture_task_kill"),
        "task_attempts_lost": one(
            f"SELECT count(*) FROM jobstate_job j, {d.elements('j.attempt_log', 'a')} "
            f"WHERE j.task_path IS NOT NULL AND {d.element_text('a', 'outcome')} = 'worker lost'"
        ),
        "tasks_run_to_the_end_more_than_once": one(
            "SELECT count(*) FROM (SELECT result_id FROM torture_task_run "
            "GROUP BY result_id HAVING count(*) > 1) AS again"
        ),
        "task_max_attempts_used": one(
            "SELECT coalesce(max(j.attempts), 0) FROM torture_task_loaded l "
            "JOIN jobstate_job j ON j.id = l.result_id"
        ),
    }
