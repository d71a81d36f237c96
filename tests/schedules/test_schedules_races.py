"""Concurrent evaluations of the same schedules with real connections: eight threads,
then two processes of four threads each, call ``enqueue_due(now=T)`` at the same
instants, and every due slot is enqueued exactly once. On PostgreSQL the callers queue
on the schedule's row and its unique key; on SQLite the writer lock serialises them,
and the outcome must be the same."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from jobstate.models import Job, ScheduleOccurrence
from jobstate.schedules import EnqueuedOccurrence, enqueue_due, sync_schedules
from tests.support.schedule_kit import T0, declare, schedules_env, slots_of
from tests.support.threads import in_parallel

pytestmark = [pytest.mark.mysql, pytest.mark.django_db(transaction=True), pytest.mark.slow]

THREADS = 8
ADD = "tests.support.task_functions.add"
SCHEDULES: dict[str, dict[str, Any]] = {
    # Twelve slots due at the first instant, then one per round.
    "every-five": {"task": ADD, "cron": "*/5 * * * *", "args": [1, 2], "catch_up": "all"},
    # One slot per round (the latest of five).
    "every-minute": {"task": ADD, "cron": "* * * * *", "args": [3, 4]},
}
#: The instants every caller evaluates, in order: an hour after the schedules began,
#: then every five minutes.
INSTANTS = [T0 + timedelta(hours=1, minutes=5 * n) for n in range(6)]


def expected_slots() -> dict[str, list[datetime]]:
    five = [T0 + timedelta(minutes=5 * n) for n in range(1, 13)]  # 12:05 ... 13:00
    five += INSTANTS[1:]
    return {"every-five": five, "every-minute": INSTANTS}


def assert_each_slot_once(enqueued: list[EnqueuedOccurrence]) -> None:
    """What the callers say they enqueued, and what the database holds, are each slot
    of each schedule exactly once, each with a job of its own."""
    claimed = Counter((item.schedule, item.slot) for item in enqueued)
    assert max(claimed.values()) == 1, [key for key, n in claimed.items() if n > 1]
    expected = expected_slots()
    assert sorted(claimed) == sorted(
        (key, slot) for key, slots in expected.items() for slot in slots
    )
    for key, slots in expected.items():
        assert slots_of(key) == slots
    occurrences = ScheduleOccurrence.objects.count()
    assert occurrences == len(claimed)
    assert Job.objects.count() == occurrences
    assert {str(i) for i in ScheduleOccurrence.objects.values_list("result_id", flat=True)} == {
        item.result_id for item in enqueued
    }


def test_eight_threads_at_the_same_instants_enqueue_each_slot_once(settings: Any) -> None:
    declare(settings, **SCHEDULES)
    sync_schedules(now=T0)
    enqueued: list[EnqueuedOccurrence] = []
    for instant in INSTANTS:
        rounds = in_parallel(THREADS, lambda _index, at=instant: enqueue_due(now=at))
        for items in rounds:
            enqueued += items
        assert not any(enqueue_due(now=instant) for _ in range(2))  # nothing left at T
    assert_each_slot_once(enqueued)


CALLER = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from datetime import datetime
    import django
    django.setup()
    from django.db import connections
    from jobstate.schedules import enqueue_due

    instants = [datetime.fromisoformat(text) for text in json.loads(sys.argv[1])]
    go, threads = sys.argv[2], int(sys.argv[3])
    done, errors = [], []

    def caller():
        try:
            for at in instants:
                # Every caller of both processes starts each round together.
                while not os.path.exists(f"{go}.{at.isoformat()}"):
                    time.sleep(0.001)
                for item in enqueue_due(now=at):
                    done.append([item.schedule, item.slot.isoformat(), item.result_id])
        except BaseException as exc:
            errors.append(repr(exc))
        finally:
            connections.close_all()

    print("ready", flush=True)
    workers = [threading.Thread(target=caller) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    print(json.dumps({"done": done, "errors": errors}), flush=True)
    """
)


def test_two_processes_of_four_threads_enqueue_each_slot_once(
    settings: Any, tmp_path: Path
) -> None:
    declare(settings, **SCHEDULES)
    sync_schedules(now=T0)
    go = str(tmp_path / "go")
    instants = json.dumps([at.isoformat() for at in INSTANTS])
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CALLER, instants, go, str(THREADS // 2)],
            cwd=django_settings.BASE_DIR,
            env=schedules_env(**SCHEDULES),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready", process.stderr
        for at in INSTANTS:
            Path(f"{go}.{at.isoformat()}").touch()
            time.sleep(0.2)  # let both processes race over this instant before the next
        outputs = [process.communicate(timeout=120) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    enqueued: list[EnqueuedOccurrence] = []
    per_process = []
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err
        report = json.loads(out.strip().splitlines()[-1])
        assert report["errors"] == [], report["errors"]
        per_process.append(len(report["done"]))
        enqueued += [
            EnqueuedOccurrence(key, datetime.fromisoformat(slot), result_id)
            for key, slot, result_id in report["done"]
        ]
    assert_each_slot_once(enqueued)
    assert sum(per_process) == len(enqueued)
