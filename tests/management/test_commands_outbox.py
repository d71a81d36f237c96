"""``deliver_notifications`` (one relay pass, or a loop that stops on SIGTERM/SIGINT),
``jobstate_metrics`` and ``jobstate_ready``: what each prints and its exit status,
through ``call_command`` and through real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import OperationalError, connections
from django.test import Client

from jobstate.core.states import WorkerKind
from jobstate.models import DeliveryAttempt, Notification, Worker
from jobstate.stores.base import JobOperationalMetrics, JobStatus, NotificationRequest
from jobstate.stores.base import NotificationState as State
from jobstate.stores.database import DatabaseStateStore
from jobstate.stores.database.notification_outbox import DatabaseNotificationOutbox
from project.demo.notifications import ACCEPTS, ALWAYS_FAILS, BUSY_ONCE
from tests.support.processes import Terminal, child_env, finish, manage_py
from tests.support.tasks_kit import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str, **options: Any) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def failing(*args: str, **options: Any) -> CommandError:
    with pytest.raises(CommandError) as raised:
        run(*args, **options)
    return raised.value


def jobstate(settings: Any, **values: object) -> None:
    settings.JOBSTATE = {**getattr(settings, "JOBSTATE", {}), **values}


def notify(*receivers: str) -> list[Notification]:
    """A finished job that notifies each receiver (a demo handler) once."""
    store = DatabaseStateStore()
    job = store.create_job(request_id=f"notify-{time.monotonic_ns()}", target="t")
    claimed = store.claim_next_inhub_job(["t"], "worker-1")
    assert claimed is not None and claimed.id == job.id
    notes = [
        NotificationRequest("callable", receiver, {"n": n}) for n, receiver in enumerate(receivers)
    ]
    assert store.complete_job_with_notifications(claimed, {"status": JobStatus.DONE}, notes)
    return list(Notification.objects.filter(job=job).order_by("destination"))


def state_of(destination: str) -> str:
    return Notification.objects.values_list("state", flat=True).get(destination=destination)


class UnreachableOutboxStore(DatabaseStateStore):
    """A state store whose database stops answering once the relay claims."""

    @property
    def notification_outbox(self) -> DatabaseNotificationOutbox:
        raise OperationalError("could not connect to server")


class UnreachableMetricsStore(DatabaseStateStore):
    def operational_metrics_snapshot(self, now: Any = None) -> JobOperationalMetrics:
        raise OperationalError("could not connect to server")


# --- deliver_notifications: one pass --------------------------------------------------------


def test_one_pass_is_silent_when_nothing_is_due() -> None:
    assert run("deliver_notifications") == ("", "")
    assert run("deliver_notifications", verbosity=2) == ("Nothing was due.\n", "")


def test_one_pass_delivers_and_schedules_retries_and_says_so() -> None:
    notify(ACCEPTS, ALWAYS_FAILS)
    out, err = run("deliver_notifications")
    assert (out, err) == (
        "Claimed 2 notifications: 1 delivered, 1 failed and will be retried.\n",
        "",
    )
    assert (state_of(ACCEPTS), state_of(ALWAYS_FAILS)) == (State.DELIVERED, State.PENDING)
    # The retry waits for its backoff: the next pass has nothing to do.
    assert run("deliver_notifications") == ("", "")


def test_a_dead_letter_is_reported_and_does_not_fail_the_command(settings: Any) -> None:
    jobstate(settings, OUTBOX_MAX_ATTEMPTS=1)
    notify(ALWAYS_FAILS)
    out, _ = run("deliver_notifications")
    assert out == "Claimed 1 notification: 1 dead-lettered.\n"
    assert state_of(ALWAYS_FAILS) == State.DEAD


def test_limit_relay_id_and_json() -> None:
    notify(ACCEPTS, BUSY_ONCE, ALWAYS_FAILS)
    out, _ = run("deliver_notifications", "--limit", "2", "--relay-id", "cron-7", "--json")
    report = json.loads(out)
    assert report == {
        "relay_id": "cron-7",
        "claimed": 2,
        "delivered": report["delivered"],
        "retrying": 2 - report["delivered"],
        "dead": 0,
        "superseded": 0,
        "unsent": 0,
    }
    assert set(DeliveryAttempt.objects.values_list("relay_id", flat=True)) == {"cron-7"}
    assert Notification.objects.filter(state=State.PENDING, attempts=0).count() == 1
    out, _ = run("deliver_notifications", "--json")
    assert json.loads(out)["claimed"] == 1
    assert json.loads(run("deliver_notifications", "--json")[0])["claimed"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "1"], "--interval needs --loop"),
        (["--relay-id", " "], "--relay-id must be a non-empty string"),
        (["--database", "nope"], "'nope' is not in settings.DATABASES"),
    ],
)
def test_invalid_options_exit_2_and_claim_nothing(args: list[str], message: str) -> None:
    [row] = notify(ACCEPTS)
    error = failing("deliver_notifications", *args)
    assert error.returncode == 2
    assert message in str(error)
    row.refresh_from_db()
    assert (row.state, row.attempts) == (State.PENDING, 0)


def test_a_database_failure_exits_1(settings: Any) -> None:
    notify(ACCEPTS)
    jobstate(settings, STATE_STORE=f"{__name__}.UnreachableOutboxStore")
    error = failing("deliver_notifications")
    assert error.returncode == 1
    assert "the database failed: could not connect to server" in str(error)
    assert state_of(ACCEPTS) == State.PENDING


# --- deliver_notifications --loop --------------------------------------------------------


def _signal_when(condition: Callable[[], bool], signum: int, errors: list[BaseException]) -> None:
    try:
        deadline = time.monotonic() + 20
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError("the condition never held")
            time.sleep(0.02)
    except BaseException as exc:
        errors.append(exc)
    finally:
        connections.close_all()
        # Always stop the loop, or the test would hang.
        os.kill(os.getpid(), signum)


def test_the_loop_relays_until_sigterm_and_shows_progress_only_on_a_terminal() -> None:
    notify(ACCEPTS, BUSY_ONCE)
    errors: list[BaseException] = []
    delivered = threading.Thread(
        target=_signal_when,
        args=(
            lambda: Notification.objects.filter(state=State.DELIVERED).exists(),
            signal.SIGTERM,
            errors,
        ),
    )
    out, terminal = StringIO(), Terminal()
    previous = signal.getsignal(signal.SIGTERM)
    delivered.start()
    try:
        call_command(
            "deliver_notifications", "--loop", "--interval", "0.05", stdout=out, stderr=terminal
        )
    finally:
        delivered.join(timeout=30)
    assert not errors, errors
    assert signal.getsignal(signal.SIGTERM) is previous  # the handlers are given back
    summary = out.getvalue().splitlines()
    assert len(summary) == 1
    assert summary[0].startswith("Relay stopped after ")
    assert summary[0].endswith(
        "Claimed 2 notifications: 1 delivered, 1 failed and will be retried."
    )
    shown = terminal.getvalue()
    assert "\r\033[KRelaying: " in shown and "1 delivered, 1 retrying, 0 dead" in shown
    assert shown.endswith("\r\033[K")  # wiped before the summary


def test_every_pass_of_the_loop_names_the_relay_the_workers_page_finds(
    admin_client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """The id an operator reads on a notification, its attempts or a log line is the id
    the Workers page lists and finds the relay by, whichever pass it came from."""
    notify(ACCEPTS, ALWAYS_FAILS)
    later: list[Notification] = []

    def sent_by_a_later_pass() -> bool:
        delivered = Notification.objects.filter(state=State.DELIVERED)
        if not later and delivered.exists():
            later.extend(notify(ACCEPTS))
        return delivered.count() == 2

    errors: list[BaseException] = []
    watcher = threading.Thread(
        target=_signal_when, args=(sent_by_a_later_pass, signal.SIGTERM, errors)
    )
    watcher.start()
    try:
        run("deliver_notifications", "--loop", "--interval", "0.05")
    finally:
        watcher.join(timeout=30)
    assert not errors, errors
    relay = Worker.objects.get(kind=WorkerKind.RELAY)
    seen = set(DeliveryAttempt.objects.values_list("relay_id", flat=True))
    seen |= set(Notification.objects.exclude(relay_id=None).values_list("relay_id", flat=True))
    assert seen == {relay.worker_id}
    assert f"relay {relay.worker_id}: notification" in caplog.text
    found = admin_client.get("/admin/jobstate/worker/", {"q": relay.worker_id})
    assert "1 worker" in found.content.decode() and relay.worker_id in found.content.decode()


def notify_and_wait_for_delivery(relay: subprocess.Popen[str]) -> None:
    """Queue a notification to the accepting receiver and wait until ``relay`` (a
    ``deliver_notifications --loop`` process) has delivered it."""
    notify(ACCEPTS)

    def delivered() -> bool:
        assert relay.poll() is None, finish(relay)
        return state_of(ACCEPTS) == State.DELIVERED

    wait_for(delivered, timeout=30, what="the relay to deliver")


@pytest.mark.slow
def test_a_relay_started_with_sigint_ignored_stops_gracefully_on_the_sigterm_after_it() -> None:
    # What Ctrl-C in a script's terminal does to the script's background relay: the
    # SIGINT reaches it too, then the script stops it with SIGTERM. The SIGINT stays
    # ignored, so the SIGTERM is the first signal (a graceful stop), not a second.
    relay = manage_py(
        "deliver_notifications", "--loop", "--interval", "0.1", "--json", ignoring_sigint=True
    )
    try:
        notify_and_wait_for_delivery(relay)
        relay.send_signal(signal.SIGINT)
        time.sleep(1.0)
        assert relay.poll() is None, finish(relay)
        relay.send_signal(signal.SIGTERM)
        code, out, err = finish(relay, timeout=10)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
    assert code == 0, err
    assert "Traceback" not in err
    assert json.loads(out)["delivered"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_relay_process_stops_on_a_signal_after_delivering_and_exits_0(signum: int) -> None:
    relay = manage_py("deliver_notifications", "--loop", "--interval", "0.1", "--json")
    try:
        notify_and_wait_for_delivery(relay)
        signalled = time.monotonic()
        relay.send_signal(signum)
        code, out, err = finish(relay, timeout=10)
    finally:
        if relay.poll() is None:
            relay.kill()
            relay.communicate()
    assert code == 0, err
    assert time.monotonic() - signalled < 5
    assert "Traceback" not in err
    totals = json.loads(out)
    assert (totals["claimed"], totals["delivered"], totals["dead"]) == (1, 1, 0)
    assert totals["passes"] >= 1
    attempt = DeliveryAttempt.objects.get()
    assert attempt.succeeded and attempt.relay_id.split(":")[1] == str(relay.pid)


# --- jobstate_metrics ------------------------------------------------------------------------


def test_metrics_print_prometheus_text_by_default_and_the_snapshot_as_json() -> None:
    store = DatabaseStateStore()
    for n in range(2):
        store.create_job(request_id=f"q{n}", target="t")
    store.create_job(request_id="d", target="t", status=JobStatus.DONE)

    out, err = run("jobstate_metrics")
    assert err == ""
    lines = out.splitlines()
    assert "# TYPE jobstate_jobs gauge" in lines
    assert 'jobstate_jobs{status="queued"} 2.0' in lines
    assert 'jobstate_jobs_terminal_15m{status="done"} 1.0' in lines
    assert "jobstate_queue_delayed_jobs 0.0" in lines

    snapshot = json.loads(run("jobstate_metrics", "--json", "--database", "default")[0])
    assert snapshot["by_status"] == {
        "queued": 2,
        "running": 0,
        "dispatched": 0,
        "done": 1,
        "error": 0,
        "rejected": 0,
    }
    assert snapshot["terminal_last_15m"] == {"done": 1, "error": 0, "rejected": 0}
    assert snapshot["oldest_queued_age_seconds"] >= 0


def test_metrics_exit_1_on_a_database_failure_and_print_nothing(settings: Any) -> None:
    jobstate(settings, STATE_STORE=f"{__name__}.UnreachableMetricsStore")
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("jobstate_metrics", stdout=out)
    assert raised.value.returncode == 1
    assert "could not connect to server" in str(raised.value)
    assert out.getvalue() == ""
    assert failing("jobstate_metrics", "--database", "nope").returncode == 2


# --- jobstate_ready ------------------------------------------------------------------------


def test_ready_is_silent_and_exits_0_when_ready() -> None:
    assert run("jobstate_ready") == ("", "")
    assert run("jobstate_ready", verbosity=2)[0] == "jobstate is ready.\n"
    assert json.loads(run("jobstate_ready", "--json")[0]) == {
        "ready": True,
        "database": "ok",
        "migrations": "ok",
        "pending": 0,
        "detail": "",
    }


def test_not_ready_exits_1_with_the_reason(settings: Any) -> None:
    out = StringIO()
    with pytest.raises(CommandError) as raised:
        call_command("jobstate_ready", "--json", "--database", "nope", stdout=out)
    assert raised.value.returncode == 1
    assert "jobstate is not ready: database unreachable" in str(raised.value)
    readiness = json.loads(out.getvalue())
    assert (readiness["ready"], readiness["database"]) == (False, "failed")

    jobstate(settings, STATE_STORE="nowhere.Store")
    error = failing("jobstate_ready")
    assert error.returncode == 1
    assert "the state store failed: ImproperlyConfiguredStore" in str(error)


@pytest.mark.slow
def test_ready_probe_processes_answer_by_exit_status_never_with_a_traceback(
    tmp_path: Path,
) -> None:
    base = Path(django_settings.BASE_DIR)

    def probe(database_url: str) -> tuple[int, str, str]:
        process = subprocess.run(
            [sys.executable, str(base / "manage.py"), "jobstate_ready"],
            cwd=base,
            env={**child_env(), "DATABASE_URL": database_url},
            capture_output=True,
            text=True,
            timeout=60,
        )
        return process.returncode, process.stdout, process.stderr

    ready = probe(child_env()["DATABASE_URL"])
    # A fresh database that was never migrated: every jobstate migration is pending.
    unmigrated = probe(f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    assert ready == (0, "", "")
    code, out, err = unmigrated
    assert (code, out) == (1, "")
    assert "jobstate is not ready: unapplied jobstate migrations: 0001_initial" in err
    assert "Traceback" not in err
