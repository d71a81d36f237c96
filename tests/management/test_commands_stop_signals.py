"""The one-shot commands stop on SIGTERM as on Ctrl-C, in one line and with status 128 +
the signal's number; the one-shot relay finishes the sends it claimed first. Found by an
operator's pass: SIGTERM ended ``run_operations_job`` at once, leaving its run RUNNING
and its overlap key held, so every later start was quietly SKIPPED (status 0) until the
run was reaped; Ctrl-C printed a traceback. Real processes, real signals."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from jobstate.models import Job, JobRun, Notification
from jobstate.stores.base import JobRunStatus, NotificationRequest
from jobstate.stores.base import NotificationState as State
from jobstate.stores.database import DatabaseStateStore
from tests.support.processes import finish, manage_py
from tests.support.tasks_kit import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.mysql]

#: An operations job that runs until it is stopped.
LONG_RUN = ("run_operations_job", "demo.nightly-close", "--input", '{"seconds": 60}')


def stopped(process: subprocess.Popen[str], signum: int) -> tuple[int, str, str]:
    process.send_signal(signum)
    try:
        return finish(process, timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_operations_job_records_its_run_and_frees_its_key(signum: int) -> None:
    process = manage_py(*LONG_RUN)

    def running() -> bool:
        # The body's first progress: the runner is past its claim and waits on the
        # body. (A signal in the moment between the claim's commit and that wait is
        # not recorded; the reaper ends such a run, see docs/reference/commands.md.)
        assert process.poll() is None, finish(process)
        return JobRun.objects.filter(status=JobRunStatus.RUNNING, summary__isnull=False).exists()

    wait_for(running, timeout=30, what="the run's body to report progress")
    code, out, err = stopped(process, signum)

    name = signal.Signals(signum).name
    assert code == 128 + signum, err
    # The body, asked to stop, may say it settled after the run was recorded.
    assert err.endswith(
        f"run_operations_job: stopped by {name}. A run it had started is recorded as "
        "failed (interrupted), which frees its key.\n"
    )
    assert "Traceback" not in err
    run = JobRun.objects.get()
    assert run.status == JobRunStatus.FAILED
    assert run.error == "job run was interrupted (Ctrl-C or a stop signal)"
    # The next start runs: the key is free.
    again = manage_py(
        "run_operations_job", "demo.nightly-close", "--input", '{"seconds": 0}', "--json"
    )
    code, out, err = finish(again)
    assert code == 0 and json.loads(out)["status"] == "SUCCEEDED", (out, err)


def test_a_one_shot_relay_sends_what_it_claimed_before_it_stops() -> None:
    store = DatabaseStateStore()
    slow = NotificationRequest("callable", "tests.outbox.test_relay.slow_delivery", {})
    for n in range(5):
        store.create_job(request_id=f"r{n}", target="llm")
        job = store.claim_next_inhub_job(["llm"], "worker-1")
        assert job is not None
        assert store.complete_job_with_notifications(job, {"status": "done"}, [slow])
    process = manage_py("deliver_notifications", "--json")

    def claimed() -> bool:
        assert process.poll() is None, finish(process)
        return Notification.objects.filter(state=State.DELIVERING).exists()

    wait_for(claimed, timeout=30, what="the relay to claim")
    code, out, err = stopped(process, signal.SIGTERM)

    assert code == 0, err
    assert json.loads(out)["delivered"] == 5
    assert "Stopped by SIGTERM after the pass: it sent what it had claimed." in err
    assert "Traceback" not in err
    assert set(Notification.objects.values_list("state", flat=True)) == {State.DELIVERED}
    assert Job.objects.count() == 5


@pytest.mark.parametrize("loop", [False, True], ids=["one-shot", "loop"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_stops_the_relay_at_once_and_says_so(signum: int, loop: bool) -> None:
    # Found by an operator's pass: the one-shot relay exited on the second signal
    # without a word, where the worker says it is exiting at once and what happens to
    # what it held.
    store = DatabaseStateStore()
    slow = NotificationRequest("callable", "tests.outbox.test_relay.slow_delivery", {})
    for n in range(10):
        store.create_job(request_id=f"r{n}", target="llm")
        job = store.claim_next_inhub_job(["llm"], "worker-1")
        assert job is not None
        assert store.complete_job_with_notifications(job, {"status": "done"}, [slow])
    process = manage_py("deliver_notifications", *(["--loop"] if loop else []), "--json")

    def claimed() -> bool:
        assert process.poll() is None, finish(process)
        return Notification.objects.filter(state=State.DELIVERING).exists()

    wait_for(claimed, timeout=30, what="the relay to claim")
    process.send_signal(signum)
    time.sleep(0.3)
    code, out, err = stopped(process, signum)

    name = signal.Signals(signum).name
    assert code == 128 + signum, err
    assert out == ""
    assert (
        f"deliver_notifications: {name} again: stopped at once. What the pass had claimed "
        "and not sent is due again when its lease ends.\n"
    ) in err
    assert "Traceback" not in err
    assert Notification.objects.filter(state=State.DELIVERING).exists()
