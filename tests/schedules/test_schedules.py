"""Periodic schedules in one process: first evaluation, missed slots and catch-up, time
zones and daylight-saving transitions, pause and resume, run now, synchronisation with
settings, and what the unique key refuses. On SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from django.core import checks

from jobstate.exceptions import InvalidJobState, ScheduleError, UnknownSchedule
from jobstate.models import AuditEntry, Job, ScheduleOccurrence
from jobstate.schedules import (
    ScheduleFailures,
    enqueue_due,
    pause_schedule,
    resume_schedule,
    run_schedule_now,
    sync_schedules,
)
from jobstate.schedules.targets import OPERATIONS_TASK_PATH
from tests.support.schedule_kit import T0, declare, jobs_of, row, slots_of, utc
from tests.support.task_functions import nested

pytestmark = [pytest.mark.mysql, pytest.mark.django_db]

ADD = "tests.support.task_functions.add"
BERLIN = ZoneInfo("Europe/Berlin")


def every_five(**extra: Any) -> dict[str, Any]:
    return {"task": ADD, "cron": "*/5 * * * *", "args": [1, 2], **extra}


# --- first evaluation ------------------------------------------------------------------


def test_a_schedule_first_seen_by_an_evaluation_enqueues_nothing_before_it(settings: Any) -> None:
    declare(settings, sums=every_five())
    # 12:07: the 12:05 slot is before the schedule existed.
    assert enqueue_due(now=T0 + timedelta(minutes=7)) == []
    assert row("sums").effective_from == T0 + timedelta(minutes=7)
    assert row("sums").next_slot == T0 + timedelta(minutes=10)
    (item,) = enqueue_due(now=T0 + timedelta(minutes=10))
    assert (item.schedule, item.slot) == ("sums", T0 + timedelta(minutes=10))
    job = Job.objects.get(id=item.result_id)
    assert (job.task_path, job.input) == (ADD, {"args": [1, 2], "kwargs": {}})


def test_a_first_evaluation_after_the_sync_enqueues_the_latest_slot_since(settings: Any) -> None:
    declare(settings, sums=every_five())
    sync_schedules(now=T0 + timedelta(minutes=7))  # migrate at 12:07
    (item,) = enqueue_due(now=T0 + timedelta(minutes=23))  # first worker at 12:23
    # 12:10, 12:15 and 12:20 came due since; "latest" collapses them to 12:20. 12:05 is
    # before the schedule existed and is never enqueued.
    assert item.slot == T0 + timedelta(minutes=20)
    assert slots_of("sums") == [T0 + timedelta(minutes=20)]
    assert row("sums").last_slot == T0 + timedelta(minutes=20)


def test_catch_up_all_enqueues_each_slot_since_the_sync_and_none_before(settings: Any) -> None:
    declare(settings, sums=every_five(catch_up="all"))
    sync_schedules(now=T0 + timedelta(minutes=7))
    items = enqueue_due(now=T0 + timedelta(minutes=23))
    expected = [T0 + timedelta(minutes=m) for m in (10, 15, 20)]
    assert [item.slot for item in items] == expected
    assert slots_of("sums") == expected
    assert len({item.result_id for item in items}) == 3


def test_a_second_call_at_the_same_instant_enqueues_nothing(settings: Any) -> None:
    declare(settings, sums=every_five(catch_up="all"))
    sync_schedules(now=T0)
    assert len(enqueue_due(now=T0 + timedelta(minutes=30))) == 6
    assert enqueue_due(now=T0 + timedelta(minutes=30)) == []
    assert enqueue_due(now=T0 + timedelta(minutes=34)) == []
    assert Job.objects.count() == 6


def test_missed_slots_collapse_to_the_latest_after_an_outage(settings: Any) -> None:
    declare(settings, sums=every_five())
    sync_schedules(now=T0)
    enqueue_due(now=T0 + timedelta(minutes=5))
    # The scheduler was down for three days.
    (item,) = enqueue_due(now=T0 + timedelta(days=3, minutes=2))
    assert item.slot == T0 + timedelta(days=3)
    assert slots_of("sums") == [T0 + timedelta(minutes=5), T0 + timedelta(days=3)]


def test_catch_up_all_is_capped_at_the_latest_slots(settings: Any) -> None:
    declare(settings, limit=4, sums=every_five(catch_up="all"))
    sync_schedules(now=T0)
    items = enqueue_due(now=T0 + timedelta(hours=2))  # 24 missed slots
    expected = [T0 + timedelta(minutes=m) for m in (105, 110, 115, 120)]
    assert [item.slot for item in items] == expected
    # Every slot of a day-long outage is read in day-sized windows, not one by one.
    assert len(enqueue_due(now=T0 + timedelta(days=400))) == 4


# --- time zones and daylight saving ----------------------------------------------------


def test_a_daily_slot_in_the_spring_gap_runs_once_right_after_it(settings: Any) -> None:
    declare(
        settings,
        close={
            "task": ADD,
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "args": [0, 0],
            "catch_up": "all",
        },
    )
    sync_schedules(now=utc(2026, 3, 27, 12))
    enqueue_due(now=utc(2026, 3, 30, 12))
    # 02:30 does not exist on 29 March in Berlin (02:00 CET -> 03:00 CEST): cronsim,
    # like Debian's cron, runs it at 03:00 CEST.
    assert slots_of("close") == [
        utc(2026, 3, 28, 1, 30),
        utc(2026, 3, 29, 1),
        utc(2026, 3, 30, 0, 30),
    ]
    assert [s.astimezone(BERLIN).strftime("%d %H:%M") for s in slots_of("close")] == [
        "28 02:30",
        "29 03:00",
        "30 02:30",
    ]


def test_a_daily_slot_in_the_autumn_repeat_runs_once(settings: Any) -> None:
    declare(
        settings,
        close={
            "task": ADD,
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "args": [0, 0],
            "catch_up": "all",
        },
    )
    sync_schedules(now=utc(2026, 10, 24, 12))
    enqueue_due(now=utc(2026, 10, 26, 12))
    # 02:30 happens twice on 25 October (CEST, then CET): only the first is a slot.
    assert slots_of("close") == [utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_a_half_hourly_schedule_follows_the_clock_through_both_transitions(
    settings: Any,
) -> None:
    declare(
        settings,
        often={
            "task": ADD,
            "cron": "*/30 * * * *",
            "timezone": "Europe/Berlin",
            "args": [0, 0],
            "catch_up": "all",
        },
    )
    sync_schedules(now=utc(2026, 10, 24, 23, 50))
    enqueue_due(now=utc(2026, 10, 25, 2, 10))
    # Every real half hour, the repeated hour's two passes included.
    assert slots_of("often") == [utc(2026, 10, 25, h, m) for h in (0, 1) for m in (0, 30)] + [
        utc(2026, 10, 25, 2)
    ]
    expected = []
    iterator = CronSim("*/30 * * * *", utc(2026, 10, 24, 23, 50).astimezone(BERLIN))
    while (slot := next(iterator).astimezone(UTC)) <= utc(2026, 10, 25, 2, 10):
        expected.append(slot)
    assert slots_of("often") == expected  # where the cron library puts them


def test_slots_are_placed_in_the_schedules_time_zone(settings: Any) -> None:
    declare(
        settings,
        tokyo={"task": ADD, "cron": "0 9 * * *", "timezone": "Asia/Tokyo", "args": [0, 0]},
        utc={"task": ADD, "cron": "0 9 * * *", "args": [0, 0]},
    )
    sync_schedules(now=T0)
    enqueue_due(now=T0 + timedelta(days=1))
    assert slots_of("tokyo") == [utc(2026, 3, 2, 0)]  # 09:00 in Tokyo is midnight UTC
    assert slots_of("utc") == [utc(2026, 3, 1, 9) + timedelta(days=1)]


# --- pause, resume, run now ------------------------------------------------------------


def test_a_paused_schedule_enqueues_nothing_and_resumes_from_its_resume(settings: Any) -> None:
    declare(settings, sums=every_five(catch_up="all"))
    sync_schedules(now=T0)
    assert pause_schedule("sums", by="alice") is True
    assert pause_schedule("sums", by="alice") is False
    assert enqueue_due(now=T0 + timedelta(hours=1)) == []
    assert resume_schedule("sums", by="bob") is True
    resumed = row("sums").effective_from
    assert resumed > T0 + timedelta(hours=1)  # the database's clock: today, not 2026
    # Nothing the pause skipped is caught up; the next slot after the resume is due.
    assert enqueue_due(now=resumed) == []
    assert row("sums").next_slot is not None and row("sums").next_slot > resumed
    events = list(AuditEntry.objects.order_by("id").values_list("event", "summary"))
    assert events == [
        ("schedule_paused", "sums paused by alice"),
        ("schedule_resumed", "sums resumed by bob"),
    ]


def test_run_now_enqueues_one_extra_occurrence_and_leaves_the_slots_alone(
    settings: Any,
) -> None:
    declare(settings, sums=every_five())
    sync_schedules(now=T0)
    enqueue_due(now=T0 + timedelta(minutes=5))
    pause_schedule("sums", by="alice")
    extra = run_schedule_now("sums", by="carol")
    assert extra.manual and extra.schedule == "sums"
    assert row("sums").last_slot == T0 + timedelta(minutes=5)
    occurrence = ScheduleOccurrence.objects.get(result_id=extra.result_id)
    assert (occurrence.trigger, occurrence.enqueued_by) == ("manual", "carol")
    entry = AuditEntry.objects.get(event="schedule_run_now")
    assert str(entry.job_id) == extra.result_id and entry.detail["by"] == "carol"
    assert len(jobs_of("sums")) == 2
    with pytest.raises(UnknownSchedule):
        run_schedule_now("nope", by="carol")
    with pytest.raises(InvalidJobState):
        run_schedule_now("sums", by="")


# --- synchronisation with settings -----------------------------------------------------


def test_sync_marks_removed_schedules_and_keeps_their_history(settings: Any) -> None:
    declare(settings, sums=every_five(), other=every_five())
    sync_schedules(now=T0)
    enqueue_due(now=T0 + timedelta(minutes=5))
    declare(settings, other=every_five())
    report = sync_schedules(now=T0 + timedelta(minutes=6))
    assert report.removed == ("sums",)
    assert row("sums").removed_at == T0 + timedelta(minutes=6)
    assert slots_of("sums") == [T0 + timedelta(minutes=5)]  # history kept
    assert [item.schedule for item in enqueue_due(now=T0 + timedelta(minutes=10))] == ["other"]
    with pytest.raises(UnknownSchedule):
        pause_schedule("sums", by="alice")
    # Declared again: it starts afresh from the sync, like a new schedule.
    declare(settings, sums=every_five(), other=every_five())
    assert sync_schedules(now=T0 + timedelta(minutes=21)).restored == ("sums",)
    assert row("sums").removed_at is None
    assert row("sums").effective_from == T0 + timedelta(minutes=21)
    assert [
        i.slot for i in enqueue_due(now=T0 + timedelta(minutes=25)) if i.schedule == "sums"
    ] == [T0 + timedelta(minutes=25)]


def test_a_new_cron_starts_afresh_and_new_arguments_keep_the_watermark(settings: Any) -> None:
    declare(settings, sums=every_five())
    sync_schedules(now=T0)
    enqueue_due(now=T0 + timedelta(minutes=5))
    declare(settings, sums=every_five(args=[5, 5]))
    assert sync_schedules(now=T0 + timedelta(minutes=6)).changed == ("sums",)
    assert row("sums").effective_from == T0 and row("sums").revision == 2
    (item,) = enqueue_due(now=T0 + timedelta(minutes=10))
    assert Job.objects.get(id=item.result_id).input["args"] == [5, 5]
    declare(settings, sums={"task": ADD, "cron": "0 * * * *", "args": [5, 5]})
    sync_schedules(now=T0 + timedelta(minutes=59))
    assert row("sums").effective_from == T0 + timedelta(minutes=59)
    assert [i.slot for i in enqueue_due(now=T0 + timedelta(minutes=61))] == [
        T0 + timedelta(hours=1)
    ]
    assert sync_schedules(now=T0 + timedelta(hours=2)) == type(sync_schedules())()


# --- what is enqueued ------------------------------------------------------------------


def test_queue_priority_and_operations_job_input_reach_the_job(settings: Any) -> None:
    declare(
        settings,
        emails={
            "task": ADD,
            "cron": "* * * * *",
            "args": [1, 1],
            "queue_name": "emails",
            "priority": 7,
        },
        report={"operations_job": "demo.report-build", "cron": "* * * * *", "kwargs": {"rows": 3}},
    )
    sync_schedules(now=T0)
    enqueue_due(now=T0 + timedelta(minutes=1))
    (email,) = jobs_of("emails")
    assert (email.queue_name, email.priority) == ("emails", 7)
    (report,) = jobs_of("report")
    assert report.task_path == OPERATIONS_TASK_PATH
    assert report.input == {
        "args": ["demo.report-build", {"rows": 3}, "report", "2026-03-01T12:01:00+00:00"],
        "kwargs": {},
    }


def test_a_schedule_that_cannot_be_enqueued_is_named_and_the_others_go_on(
    settings: Any,
) -> None:
    declare(settings, sums=every_five(), broken=every_five(task="tests.support.task_functions.add"))
    sync_schedules(now=T0)
    # The code changed under the running process: the task is gone.
    declare(
        settings, sums=every_five(), broken=every_five(task="tests.support.task_functions.gone")
    )
    sync_schedules(now=T0)
    with pytest.raises(ScheduleFailures, match=r"'broken'.*does not import") as raised:
        enqueue_due(now=T0 + timedelta(minutes=5))
    assert isinstance(raised.value, ScheduleError)
    assert [item.schedule for item in raised.value.enqueued] == ["sums"]
    assert list(raised.value.failures) == ["broken"]
    assert slots_of("broken") == [] and row("broken").last_slot is None
    assert Job.objects.count() == 1


def test_a_slot_already_recorded_is_not_enqueued_again(settings: Any) -> None:
    """The unique key alone: an occurrence of the 12:05 slot exists (the watermark, which
    would stop a caller first, never saw it), so enqueuing 12:05 rolls back whole."""
    declare(settings, sums=every_five())
    sync_schedules(now=T0)
    ScheduleOccurrence.objects.create(
        schedule=row("sums"),
        slot=T0 + timedelta(minutes=5),
        trigger="cron",
        result_id="01a2325e-263a-7000-8164-d8a71595a477",
    )
    assert enqueue_due(now=T0 + timedelta(minutes=5)) == []
    assert row("sums").last_slot is None and not Job.objects.exists()
    (item,) = enqueue_due(now=T0 + timedelta(minutes=10))
    assert item.slot == T0 + timedelta(minutes=10)


def test_now_must_be_aware(settings: Any) -> None:
    declare(settings, sums=every_five())
    with pytest.raises(InvalidJobState, match="aware"):
        enqueue_due(now=datetime(2026, 3, 1, 12))


# --- the system check ------------------------------------------------------------------


def messages(settings: Any, **schedules: Any) -> list[tuple[str, str]]:
    declare(settings, **schedules)
    return [
        (m.id, m.msg)
        for m in checks.run_checks()
        if m.id in ("jobstate.E001", "jobstate.E030", "jobstate.E031")
    ]


def test_the_check_names_each_bad_declaration(settings: Any) -> None:
    found = messages(
        settings,
        a={"task": ADD, "cron": "61 * * * *"},
        b={"task": ADD, "cron": "0 0 * * * *"},
        c={"task": ADD, "cron": "0 * * * *", "timezone": "Mars/Olympus"},
        d={"task": ADD, "operations_job": "demo.report-build", "cron": "0 * * * *"},
        e={"task": ADD, "cron": "0 * * * *", "every": 5, "catch_up": "some"},
        f={"task": ADD, "cron": "0 0 31 2 *"},
        g={"task": ADD, "cron": "0 * * * *", "args": [float("nan")], "priority": 1000},
    )
    assert all(kind == "jobstate.E030" for kind, _ in found)
    text = "\n".join(message for _, message in found)
    for expected in (
        "['a']['cron'] is not a valid cron expression: Bad minute",
        "['b']['cron'] '0 0 * * * *' must have 5 fields",
        "['c']['timezone'] 'Mars/Olympus' is not a time zone",
        "['d'] must name exactly one of 'task'",
        "['e'] has unknown key(s) 'every'",
        "['e']['catch_up'] must be 'latest' or 'all'",
        "['f']['cron'] is not a valid cron expression",
        "['g']['args'] must be JSON",
        "['g']['priority'] must be an int from -100 to 100",
    ):
        assert expected in text, expected
    assert messages(settings, **{"bad key!": {"task": ADD, "cron": "* * * * *"}})


def test_the_machines_own_time_zone_fails_the_check(settings: Any) -> None:
    # "localtime" names whatever zone each machine is set to: two machines set to
    # different zones would compute different slots of one schedule, and each enqueue its
    # own, so the task would run twice.
    found = messages(settings, local={"task": ADD, "cron": "0 9 * * *", "timezone": "localtime"})
    assert [kind for kind, _ in found] == ["jobstate.E030"]
    assert "['local']['timezone'] 'localtime' is this machine's own time zone" in found[0][1]
    assert not messages(settings, utc={"task": ADD, "cron": "0 9 * * *", "timezone": "UTC"})


def test_arguments_that_nest_too_deeply_inside_the_jobs_input_fail_the_check(
    settings: Any,
) -> None:
    # Each argument is storable alone; inside the job's input ({"args": [...]}) the first
    # would be 32 levels deep, which MariaDB cannot store: each slot's enqueue would fail.
    found = messages(
        settings,
        deep={"task": ADD, "cron": "* * * * *", "args": [nested(30)]},
        fits={"task": ADD, "cron": "* * * * *", "args": [nested(29)]},
    )
    assert [kind for kind, _ in found] == ["jobstate.E030"]
    assert "['deep']['args'] and ['kwargs'] together, as the job's input" in found[0][1]
    assert "is nested more than 31 levels deep" in found[0][1]
    # The deepest that fits is enqueued and stored as it is, on every database.
    declare(settings, fits={"task": ADD, "cron": "*/5 * * * *", "args": [nested(29)]})
    sync_schedules(now=T0)
    (item,) = enqueue_due(now=T0 + timedelta(minutes=5))
    assert Job.objects.get(id=item.result_id).input == {"args": [nested(29)], "kwargs": {}}


def test_the_check_names_what_a_schedule_cannot_run(settings: Any) -> None:
    found = messages(
        settings,
        gone={"task": "tests.support.task_functions.gone", "cron": "* * * * *"},
        plain={"task": "tests.support.schedule_kit.utc", "cron": "* * * * *"},
        queue={"task": ADD, "cron": "* * * * *", "queue_name": "nowhere"},
        alias={"task": ADD, "cron": "* * * * *", "backend": "elsewhere"},
        job={"operations_job": "demo.unknown", "cron": "* * * * *"},
        rows={
            "operations_job": "demo.report-build",
            "cron": "* * * * *",
            "kwargs": {"rows": "many"},
        },
    )
    assert {kind for kind, _ in found} == {"jobstate.E031"}
    text = "\n".join(message for _, message in found)
    for expected in (
        "schedule 'gone': the task 'tests.support.task_functions.gone' does not import",
        "schedule 'plain': 'tests.support.schedule_kit.utc' is a function, not a django.tasks task",
        "schedule 'queue': Queue 'nowhere' is not valid for backend",
        # Django's own message for an unknown alias spoke of a "connection".
        "schedule 'alias': the backend 'elsewhere' is not an alias of TASKS (it has 'default'",
        "schedule 'job': No operations job is registered as 'demo.unknown'",
        "schedule 'rows': demo.report-build rejected its input",
    ):
        assert expected in text, expected
    assert messages(settings, fine=every_five()) == []


def test_arguments_that_are_not_json_are_named_once(settings: Any) -> None:
    """Arguments JSON cannot hold were reported twice: alone, and again as part of the
    job's input."""
    found = messages(settings, nan={"task": ADD, "cron": "* * * * *", "args": [float("nan")]})
    [(kind, message)] = found
    assert kind == "jobstate.E030"
    # Python 3.13's own message adds the value (": nan").
    assert message.startswith(
        "JOBSTATE['SCHEDULES']['nan']['args'] must be JSON: "
        "Out of range float values are not JSON compliant"
    ), message


def test_a_backend_that_is_not_jobstates_is_refused(settings: Any) -> None:
    settings.TASKS = {
        **settings.TASKS,
        "immediate": {
            "BACKEND": settings.TASKS["default"]["BACKEND"].replace(
                "jobstate.tasks.JobStateBackend", IMMEDIATE
            )
        },
    }
    found = messages(settings, now={"task": ADD, "cron": "* * * * *", "backend": "immediate"})
    assert found and "needs jobstate.tasks.JobStateBackend" in found[0][1]


IMMEDIATE = (
    "django.tasks.backends.immediate.ImmediateBackend"
    if __import__("django").VERSION >= (6, 0)
    else "django_tasks.backends.immediate.ImmediateBackend"
)
