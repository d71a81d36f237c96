"""The demo command leaves an admin user, runs in every state and jobs in every status,
listed by the admin; the live traffic then delivers, retries and dead-letters their
notifications."""

import random
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from jobstate.models import AuditEntry, DeliveryAttempt, Job, JobRun, JobRunStatus, Notification
from jobstate.outbox.relay import deliver_notifications
from jobstate.stores import get_state_store
from jobstate.stores.base import (
    TERMINAL_JOB_STATUSES,
    JobStatus,
    NotificationRequest,
    NotificationState,
)
from project.demo.management.commands import demo_traffic
from project.demo.management.commands.demo_traffic import (
    EXECUTOR_ID,
    REMOTE_TARGET,
    SETUP_TARGET,
    WORKER_ID,
    Held,
)
from project.demo.management.commands.demo_traffic import Command as DemoTraffic
from project.demo.notifications import ACCEPTS, ALWAYS_FAILS, BUSY_ONCE

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_setup_records_runs_in_every_state_and_the_admin_lists_them(capsys):
    call_command("demo_setup")
    out = capsys.readouterr().out
    assert "Admin user 'admin', password 'jobstate-demo'" in out

    statuses = set(JobRun.objects.values_list("status", flat=True))
    assert statuses == set(JobRunStatus.values)

    client = Client()
    assert client.login(username="admin", password="jobstate-demo")
    page = client.get("/admin/jobstate/jobrun/")
    assert page.status_code == 200
    html = page.content.decode()
    for key in ("demo.nightly-close", "demo.always-fails", "demo.report-build"):
        assert key in html
    assert "Timed out" in html and "Skipped" in html


def test_demo_setup_leaves_jobs_in_every_status_with_notifications(capsys):
    call_command("demo_setup")
    out = capsys.readouterr().out

    assert set(Job.objects.values_list("status", flat=True)) == set(JobStatus.values)
    delayed = Job.objects.filter(status=JobStatus.QUEUED, run_after__gt=timezone.now())
    assert delayed.count() == 1
    for status in (JobStatus.RUNNING, JobStatus.DISPATCHED):
        job = Job.objects.get(status=status)
        assert job.claim_token is not None and job.lease_until > timezone.now()
    assert "Sample jobs, one or more in every status: queued 2, running 1, dispatched 1" in out
    states = dict(Notification.objects.values_list("destination", "state"))
    assert states == {
        ACCEPTS: NotificationState.DELIVERED,
        BUSY_ONCE: NotificationState.PENDING,  # refused once, waiting for its retry
        ALWAYS_FAILS: NotificationState.PENDING,  # written after the relay pass
    }
    # Two jobs notify the healthy receiver: one row each, both delivered.
    assert Notification.objects.filter(destination=ACCEPTS).count() == 2
    assert Notification.objects.get(destination=BUSY_ONCE).attempts == 1


@pytest.mark.slow
def test_demo_traffic_delivers_retries_and_dead_letters_notifications():
    call_command("demo_setup", stdout=StringIO())
    out = StringIO()
    call_command(
        "demo_traffic",
        "--iterations",
        "15",
        "--tick",
        "0.05",
        "--outbox-backoff",
        "0.05",
        "--seed",
        "5",
        stdout=out,
    )

    states = set(Notification.objects.values_list("state", flat=True))
    assert {NotificationState.PENDING, NotificationState.DELIVERED, NotificationState.DEAD} <= (
        states
    )
    [dead] = Notification.objects.filter(
        destination=ALWAYS_FAILS, job__request_id__contains="setup"
    )
    assert (dead.state, dead.attempts) == (NotificationState.DEAD, 3)  # --outbox-attempts 3
    assert dead.last_error == (
        "the demo pager is offline on purpose: this notification ends as a dead letter"
    )
    assert DeliveryAttempt.objects.filter(notification=dead, succeeded=False).count() == 3
    assert AuditEntry.objects.filter(event="delivery_error", job_id=dead.job_id).exists()
    # Its retry is not due yet: the busy receiver's notification still waits.
    busy = Notification.objects.get(destination=BUSY_ONCE, job__request_id__contains="setup")
    assert (busy.state, busy.attempts) == (NotificationState.PENDING, 1)
    # The traffic's own completions notified the receivers in the same transaction.
    finished = Job.objects.filter(
        source="demo", request_id__startswith="demo-", notifications__isnull=False
    )
    assert finished.exclude(request_id__startswith="demo-setup-").exists()
    assert "notifications: pending" in out.getvalue()


def stopped_and_live_on_the_workers_page() -> tuple[str, str]:
    client = Client()
    assert client.login(username="admin", password="jobstate-demo")
    workers = "/admin/jobstate/worker/"
    stopped = client.get(workers, {"state": "stopped"}).content.decode()
    return stopped, client.get(workers, {"state": "live"}).content.decode()


def test_demo_setup_says_the_claimers_it_ran_as_stopped_when_it_ends():
    call_command("demo_setup", stdout=StringIO())
    stopped, live = stopped_and_live_on_the_workers_page()
    for worker_id in ("demo-setup-worker", "demo-setup-executor"):
        assert worker_id in stopped and worker_id not in live
    assert "demo_setup done" in stopped


def test_demo_setup_can_run_twice(capsys):
    call_command("demo_setup")
    call_command("demo_setup")
    assert "Admin user 'admin'" in capsys.readouterr().out
    assert Notification.objects.filter(destination=ALWAYS_FAILS).count() == 2


# --- the traffic and the operator's actions ---------------------------------------------


def traffic(*args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("demo_traffic", "--seed", "5", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


#: How a line of demo.log starts where jobstate's and the demo's loggers write it (the
#: demo's LOGGING): the time to the millisecond, then a name.
STAMPED = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} project\.demo\.traffic: \S")


def test_demo_traffic_lines_start_with_the_time_as_the_demo_logs_other_lines_do():
    store = get_state_store()
    store.enqueue(request_id="demo-late", target=REMOTE_TARGET, source="demo", input={})
    job = store.claim_next_job([REMOTE_TARGET], EXECUTOR_ID, timedelta(minutes=1))
    # An operator requeued the job from the console: the executor's report comes late.
    assert store.requeue_job(job.id, from_statuses=[JobStatus.DISPATCHED], by="a", via="admin")
    out = StringIO()
    command = DemoTraffic(stdout=out, stderr=StringIO())
    command.store = store
    command.finish(Held(job, job.claim_token, 0, "rejected"))

    lines = [
        *out.getvalue().splitlines(),
        *traffic("--iterations", "2", "--tick", "0.01")[0].splitlines(),
    ]
    assert any("late report ignored for job" in line for line in lines)
    assert any("Demo traffic stopped after 2 ticks." in line for line in lines)
    unstamped = [line for line in lines if not STAMPED.match(line)]
    assert not unstamped, unstamped


def test_demo_traffic_finishes_a_job_an_operator_requeued_after_it_notified():
    store = get_state_store()
    store.enqueue(request_id="demo-requeued", target=REMOTE_TARGET, source="demo", input={})
    first = store.claim_next_job([REMOTE_TARGET], EXECUTOR_ID, timedelta(minutes=1))
    notes = [NotificationRequest("callable", ALWAYS_FAILS, {"job": str(first.id)})]
    assert store.complete_job_with_notifications(first, {"status": JobStatus.ERROR}, notes)
    assert store.requeue_job(first.id, from_statuses=[JobStatus.ERROR], by="admin", via="admin")
    again = store.claim_next_job([REMOTE_TARGET], EXECUTOR_ID, timedelta(minutes=1))
    assert again.id == first.id

    command = DemoTraffic(stdout=StringIO(), stderr=StringIO())
    command.store, command.rng = store, random.Random(1)
    # Failing again notifies the same receiver as the first time.
    command.finish(Held(again, again.claim_token, 0, "error"))

    job = Job.objects.get(id=first.id)
    assert (job.status, job.claim_token) == (JobStatus.ERROR, None)


def test_demo_traffic_logs_a_failing_step_and_goes_on(monkeypatch):
    calls = []

    def relay_down(**kwargs):
        calls.append(kwargs)
        if len(calls) == 1:
            raise RuntimeError("the relay tripped over something")
        return deliver_notifications(**kwargs)

    monkeypatch.setattr(demo_traffic, "deliver_notifications", relay_down)
    out, err = traffic("--iterations", "3", "--tick", "0.01")

    assert len(calls) == 3
    assert "Demo traffic stopped after 3 ticks." in out
    assert "tick 1, relay failed; the traffic goes on:" in err
    assert STAMPED.match(err), err
    assert "RuntimeError: the relay tripped over something" in err and "Traceback" in err


def test_demo_traffic_says_its_worker_and_executor_stopped_when_it_ends():
    call_command("demo_setup", stdout=StringIO())
    traffic("--iterations", "2", "--tick", "0.01")
    stopped, live = stopped_and_live_on_the_workers_page()
    for worker_id in (WORKER_ID, EXECUTOR_ID):
        assert worker_id in stopped and worker_id not in live
    assert "--iterations done" in stopped


@pytest.mark.slow
def test_demo_traffic_runs_a_setup_sample_requeued_from_the_console():
    call_command("demo_setup", stdout=StringIO())
    store = get_state_store()
    sample = Job.objects.get(request_id__endswith="-error", target=SETUP_TARGET)
    assert store.requeue_job(sample.id, from_statuses=[JobStatus.ERROR], by="admin", via="admin")

    traffic("--iterations", "60", "--tick", "0.02", "--lease", "0.3", "--sweep-every", "0.1")

    sample.refresh_from_db()
    assert sample.status in TERMINAL_JOB_STATUSES, sample.status
    assert AuditEntry.objects.filter(job_id=sample.id, event="finished").exists()


def test_demo_setup_names_the_address_the_demo_serves(capsys, monkeypatch):
    monkeypatch.setenv("DEMO_ADDR", "127.0.0.1:8123")
    call_command("demo_setup")
    assert "for http://127.0.0.1:8123/admin/" in capsys.readouterr().out


@pytest.mark.slow
def test_demo_traffic_works_off_a_backlog_an_operator_requeued():
    # "Requeue all matching" on a few dozen finished jobs: the simulated owners take
    # them up several at a time instead of one job a tick.
    store = get_state_store()
    for target in (demo_traffic.INHUB_TARGET, REMOTE_TARGET):
        for n in range(30):
            store.enqueue(
                request_id=f"backlog-{target}-{n}", target=target, source="demo", input={}
            )

    traffic("--iterations", "20", "--tick", "0.01", "--lease", "60")

    # With leases of a minute, a job still queued was never claimed.
    waiting = Job.objects.filter(request_id__startswith="backlog-", status=JobStatus.QUEUED)
    assert waiting.count() <= 10, waiting.count()


def test_a_remote_job_the_executor_crashed_on_expires_while_it_works_on_others():
    # The simulated executor keeps a second job and renews it; the job it "crashed" on
    # must not be renewed with it, or it stays dispatched as long as the executor is busy
    # (on a backlog, for ever) and the reaper never recovers it.
    store = get_state_store()
    for name in ("crashed", "busy"):
        store.enqueue(request_id=f"executor-{name}", target=REMOTE_TARGET, source="demo", input={})
    lease = timedelta(seconds=60)
    crashed = store.claim_next_job([REMOTE_TARGET], EXECUTOR_ID, lease)
    busy = store.claim_next_job([REMOTE_TARGET], EXECUTOR_ID, lease)
    command = DemoTraffic(stdout=StringIO(), stderr=StringIO())
    command.store, command.lease = store, lease
    held = [
        Held(crashed, crashed.claim_token, 3, "crash"),
        Held(busy, busy.claim_token, 3, "done"),
    ]
    Job.objects.filter(id__in=[crashed.id, busy.id]).update(lease_until=timezone.now())

    command.work(held)

    renewed = dict(Job.objects.filter(lease_until__gt=timezone.now()).values_list("id", "status"))
    assert renewed == {busy.id: JobStatus.DISPATCHED}
    assert [item.job.id for item in held] == [busy.id]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--iterations", "-5"], "argument --iterations: must be at least 1, got -5"),
        (["--iterations", "0"], "argument --iterations: must be at least 1, got 0"),
        (["--tick", "1e30"], "argument --tick: must be a number of seconds above 0 and under"),
    ],
)
def test_demo_traffic_refuses_a_count_or_a_tick_it_cannot_run(args: list[str], said: str) -> None:
    with pytest.raises(CommandError, match=said):
        call_command("demo_traffic", *args, stdout=StringIO())
    assert not Job.objects.exists()
