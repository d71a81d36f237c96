"""Who evaluates the schedules: ``jobstate_worker`` (which also runs what it enqueued),
``manage.py enqueue_due_schedules`` from cron, the Celery beat task, and ``migrate``,
which brings the rows in step with settings. Commands and workers are real processes."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.apps import apps
from django.utils import timezone

from jobstate.contrib.celery.beat import JOBSTATE_BEAT_SCHEDULE, beat_schedule
from jobstate.core.states import JobStatus
from jobstate.models import Job, JobRun, Schedule, ScheduleOccurrence
from jobstate.schedules import sync_schedules
from jobstate.signals import sync_schedules_after_migrate
from jobstate.tasks.compat import TaskResultStatus
from tests.support.schedule_kit import declare, jobs_of, manage, slots_of
from tests.support.task_functions import add

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ADD = "tests.support.task_functions.add"
# Yearly, and declared more than a year ago: exactly one slot (this year's) is due, and
# none comes due while a test runs (short of New Year's midnight).
YEARLY = {"task": ADD, "cron": "0 0 1 1 *", "args": [2, 3]}
REPORT = {"operations_job": "demo.report-build", "cron": "0 0 1 1 *", "kwargs": {"rows": 4}}


def declared_a_while_ago(settings: Any, **schedules: dict[str, Any]) -> None:
    """Declare ``schedules`` and synchronise them as a deploy's migrate did 400 days
    ago, so this year's slot is due now."""
    declare(settings, **schedules)
    sync_schedules(now=timezone.now() - timedelta(days=400))


# --- manage.py enqueue_due_schedules ---------------------------------------------------


def test_the_command_enqueues_the_due_slot_once_and_is_quiet_after(settings: Any) -> None:
    declared_a_while_ago(settings, yearly=YEARLY)
    first = manage("enqueue_due_schedules", "--verbosity", "2", schedules={"yearly": YEARLY})
    assert first.returncode == 0, first.stderr
    (slot,) = slots_of("yearly")
    (job,) = jobs_of("yearly")
    assert first.stdout == f"Enqueued yearly for {slot.isoformat()} as {job.id}\n"
    assert first.stderr == ""
    occurrence = ScheduleOccurrence.objects.get()
    assert occurrence.enqueued_by == "enqueue_due_schedules"
    assert slot.year == timezone.now().year and (slot.month, slot.day) == (1, 1)
    # Run again (or from a second machine): nothing, silently.
    second = manage("enqueue_due_schedules", schedules={"yearly": YEARLY})
    assert (second.returncode, second.stdout, second.stderr) == (0, "", "")
    assert slots_of("yearly") == [slot]


def test_the_command_prints_nothing_at_verbosity_1_when_all_went_well(settings: Any) -> None:
    # From cron, output means mail: only trouble should send one.
    declared_a_while_ago(settings, yearly=YEARLY)
    done = manage("enqueue_due_schedules", schedules={"yearly": YEARLY})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert len(slots_of("yearly")) == 1


def test_the_command_prints_json(settings: Any) -> None:
    declared_a_while_ago(settings, yearly=YEARLY)
    done = manage("enqueue_due_schedules", "--json", schedules={"yearly": YEARLY})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (item,) = report["enqueued"]
    assert item["schedule"] == "yearly" and report["failures"] == {}
    assert Job.objects.filter(id=item["result_id"]).exists()
    assert report["next_slot"] > item["slot"]


def test_a_schedule_that_cannot_be_enqueued_exits_1_and_the_others_are(settings: Any) -> None:
    gone = {**YEARLY, "task": "tests.support.task_functions.gone"}
    declared_a_while_ago(settings, yearly=YEARLY, broken=YEARLY)
    # The system check would refuse to start with this task; a cron job that skips the
    # checks, or a task removed under a running deploy, meets it here.
    done = manage(
        "enqueue_due_schedules",
        "--skip-checks",
        schedules={"yearly": YEARLY, "broken": gone},
    )
    assert done.returncode == 1, done.stderr
    assert (
        "schedule 'broken': the task 'tests.support.task_functions.gone' does not import"
        in done.stderr
    )
    assert "Traceback" not in done.stderr
    assert len(slots_of("yearly")) == 1 and slots_of("broken") == []


def test_a_broken_declaration_is_named_and_skipped_and_bad_options_stop_the_command(
    settings: Any,
) -> None:
    bad = manage("enqueue_due_schedules", schedules={"yearly": {**YEARLY, "cron": "61 * * * *"}})
    assert bad.returncode == 1
    assert "schedule 'yearly' is broken" in bad.stderr and "['yearly']['cron']" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert not Schedule.objects.exists()
    unknown = manage("enqueue_due_schedules", "--database", "nope", schedules={})
    assert unknown.returncode == 2 and "--database 'nope'" in unknown.stderr
    bogus = manage("enqueue_due_schedules", "--bogus", schedules={})
    assert bogus.returncode == 2 and "unrecognized arguments: --bogus" in bogus.stderr


# --- jobstate_worker -------------------------------------------------------------------


def test_a_worker_enqueues_a_due_slot_and_runs_the_task(settings: Any) -> None:
    declared_a_while_ago(settings, yearly=YEARLY, report=REPORT)
    done = manage(
        "jobstate_worker",
        "--batch",
        "--worker-id",
        "worker-s",
        schedules={"yearly": YEARLY, "report": REPORT},
    )
    assert done.returncode == 0, done.stderr
    (job,) = jobs_of("yearly")
    result = add.get_result(str(job.id))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert result.worker_ids == ["worker-s"]
    assert ScheduleOccurrence.objects.filter(enqueued_by="worker-s").count() == 2
    (slot,) = slots_of("yearly")
    assert f"Schedule yearly: enqueued its slot {slot.isoformat()} as {job.id}" in done.stderr
    # The operations job ran through the runner, triggered by its schedule and slot.
    (ops,) = jobs_of("report")
    assert Job.objects.get(id=ops.id).status == JobStatus.DONE
    (run,) = JobRun.objects.all()
    (report_slot,) = slots_of("report")
    assert (run.job_key, run.status, run.input) == ("demo.report-build", "SUCCEEDED", {"rows": 4})
    assert (run.trigger_source, run.triggered_by) == (
        "SCHEDULER",
        f"report @ {report_slot.isoformat()}",
    )


def test_a_worker_with_no_schedules_leaves_them_alone(settings: Any) -> None:
    declared_a_while_ago(settings, yearly=YEARLY)
    done = manage("jobstate_worker", "--batch", "--no-schedules", schedules={"yearly": YEARLY})
    assert done.returncode == 0, done.stderr
    assert not ScheduleOccurrence.objects.exists() and not Job.objects.exists()


# --- beat and migrate ------------------------------------------------------------------


def test_the_beat_task_enqueues_due_slots_and_reports_failures(settings: Any) -> None:
    from jobstate.contrib.celery.celery_tasks import enqueue_due_schedules_task
    from project.celery import app

    app.loader.import_default_modules()
    entry = JOBSTATE_BEAT_SCHEDULE["jobstate-enqueue-due-schedules"]
    assert entry["task"] == "jobstate.enqueue_due_schedules" and entry["task"] in app.tasks
    assert entry["schedule"] == timedelta(seconds=10)
    assert "jobstate-enqueue-due-schedules" not in beat_schedule(schedules_every=None)
    declared_a_while_ago(settings, yearly=YEARLY)
    report = enqueue_due_schedules_task.apply().get()
    (item,) = report["enqueued"]
    assert item["schedule"] == "yearly" and report["failures"] == {}
    assert ScheduleOccurrence.objects.get().enqueued_by == "celery beat"
    assert enqueue_due_schedules_task.apply().get() == {"enqueued": [], "failures": {}}


def test_migrate_brings_the_rows_in_step_with_settings(settings: Any) -> None:
    declare(settings, yearly=YEARLY)
    sync_schedules_after_migrate(sender=apps.get_app_config("jobstate"), using="default")
    assert list(Schedule.objects.values_list("key", "removed_at")) == [("yearly", None)]
    declare(settings)
    sync_schedules_after_migrate(sender=apps.get_app_config("auth"), using="default")
    assert Schedule.objects.get().removed_at is None  # another app's migrate
    sync_schedules_after_migrate(sender=apps.get_app_config("jobstate"), using="default")
    assert Schedule.objects.get().removed_at is not None
