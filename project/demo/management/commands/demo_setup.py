"""One-step demo set-up: migrate, an admin user, runs in every state, and jobs in every
status, some with notifications that are delivered, retried or dead-lettered."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db.models import Count
from django.db.models.functions import Now
from django.utils import timezone

from jobstate.models import Job, JobRun, Notification
from jobstate.outbox.relay import deliver_notifications
from jobstate.runner import JobRunner
from jobstate.stores import get_run_store, get_state_store
from jobstate.stores.base import JobStatus, NotificationRequest, StateStore, Trigger
from project.demo.banner import DEMO_USER, admin_password
from project.demo.notifications import ACCEPTS, ALWAYS_FAILS, BUSY_ONCE

from .demo_traffic import REMOTE_TARGET, SETUP_TARGET

__all__ = ["DEMO_USER", "Command"]

#: How each run status reads in the summary: what a newcomer sees on the Job runs list.
RUN_STATUS_WORDS = {
    "SUCCEEDED": "{n} succeeded",
    "FAILED": "{n} failed (the job raises on purpose)",
    "RUNNING": "{n} still running (held by another machine)",
    "SKIPPED": "{n} skipped (that machine held the job's overlap key)",
    "TIMED_OUT": "{n} timed out (a crashed run, cleaned up by the next start)",
}

#: The lease of the sample running and dispatched jobs. Nobody renews it, so once it
#: ends the reaping sweep (demo_traffic, reap_stale or Celery beat) hands them back,
#: and demo_traffic's remote executor runs them like any other queued job.
SAMPLE_LEASE = timedelta(minutes=2)
#: Who claims the samples: on the Workers page, claiming executors of this process.
SETUP_WORKER_ID = "demo-setup-worker"
SETUP_EXECUTOR_ID = "demo-setup-executor"


class Command(BaseCommand):
    help = (
        "Migrate the demo database, create the admin user, and record sample job runs and "
        "jobs in every state (some with notifications)."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        password = admin_password()
        user, _ = get_user_model().objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        user.set_password(password)
        user.save()
        self._record_sample_runs()
        self._record_sample_jobs()
        # scripts/demo serves the admin on DEMO_ADDR.
        address = os.environ.get("DEMO_ADDR") or "127.0.0.1:8000"
        self.stdout.write(
            self.style.SUCCESS(
                f"Admin user {DEMO_USER!r}, password {password!r}, for http://{address}/admin/"
            )
        )

    def _record_sample_runs(self) -> None:
        store = get_run_store()
        runner = JobRunner(store=store)
        trigger = Trigger("CLI", "demo_setup")
        # A run whose process "crashed" an hour ago: the next start reaps it (TIMED_OUT).
        crashed = store.claim(
            job_key="demo.nightly-close",
            overlap_key="demo.nightly-close",
            trigger=Trigger("SCHEDULER"),
            input={"seconds": 0},
            started_at=datetime.now(UTC) - timedelta(hours=1),
        )
        if crashed is not None:
            JobRun.objects.filter(id=crashed).update(heartbeat_at=Now() - timedelta(hours=1))
        runner.execute("demo.nightly-close", {"seconds": 0.2}, trigger)  # reaps, then SUCCEEDED
        runner.execute("demo.always-fails", None, trigger)  # FAILED
        runner.execute("demo.report-build", None, trigger)  # allow: runs side by side
        runner.execute("demo.report-build", None, trigger)
        # Another machine holds the key right now: this start records SKIPPED.
        store.claim(
            job_key="demo.nightly-close",
            overlap_key="demo.nightly-close",
            trigger=Trigger("SCHEDULER", "worker-2"),
            input={"seconds": 600},
            started_at=datetime.now(UTC),
        )
        runner.execute("demo.nightly-close", {"seconds": 0.2}, trigger)
        counts = dict(JobRun.objects.values_list("status").annotate(n=Count("id")))
        summary = ", ".join(
            words.format(n=counts[status])
            for status, words in RUN_STATUS_WORDS.items()
            if counts.get(status)
        )
        self.stdout.write(f"Sample operations-job runs: {summary}.")

    def _record_sample_jobs(self) -> None:
        store = get_state_store()
        batch = uuid.uuid4().hex[:8]

        def enqueue(name: str, target: str, **fields: Any) -> Job:
            job, _ = store.enqueue(
                request_id=f"demo-setup-{batch}-{name}",
                target=target,
                source="demo",
                input={"sample": name},
                **fields,
            )
            return job

        def claimed(name: str, *, in_process: bool) -> Job:
            enqueue(name, SETUP_TARGET)
            # The oldest waiting sample is taken, which is this one unless an earlier
            # set-up left one behind; either way one more job is in the claimed state.
            if in_process:
                job = store.claim_next_inhub_job([SETUP_TARGET], SETUP_WORKER_ID, SAMPLE_LEASE)
            else:
                job = store.claim_next_job([SETUP_TARGET], SETUP_EXECUTOR_ID, SAMPLE_LEASE)
            assert job is not None, "a sample job was enqueued just now"
            return job

        def notify(job: Job, receiver: str) -> NotificationRequest:
            return NotificationRequest("callable", receiver, {"job": str(job.id)})

        # Waiting: demo_traffic's remote executor picks these up (the delayed one once
        # its run_after has passed).
        enqueue("queued", REMOTE_TARGET)
        enqueue("delayed", REMOTE_TARGET, run_after=timezone.now() + timedelta(minutes=10))
        claimed("running", in_process=True)
        claimed("dispatched", in_process=False)
        done = claimed("done", in_process=True)
        self._finish(
            store,
            done,
            JobStatus.DONE,
            {"result": {"pages": 12}},
            [notify(done, ACCEPTS), notify(done, BUSY_ONCE)],
        )
        rejected = claimed("rejected", in_process=False)
        self._finish(
            store,
            rejected,
            JobStatus.REJECTED,
            {"error": "demo: not a document"},
            [notify(rejected, ACCEPTS)],
        )
        # One relay pass: the healthy receiver takes its notifications, the busy one
        # refuses the first attempt, so that notification waits for its retry.
        deliver_notifications(store=store)
        # Written after the pass: due now, for demo_traffic's relay to try until it dies.
        failed = claimed("error", in_process=True)
        self._finish(
            store,
            failed,
            JobStatus.ERROR,
            {"error": "demo: the parser crashed"},
            [notify(failed, ALWAYS_FAILS)],
        )
        # This process is done claiming and exits: its claims cannot say so, and the
        # Workers page would show both claimers live, then lost. The samples they still
        # hold stay held until their lease ends, as described at SAMPLE_LEASE.
        for owner in (SETUP_WORKER_ID, SETUP_EXECUTOR_ID):
            store.stop_worker(worker_id=owner, reason="demo_setup done")
        jobs = dict(Job.objects.values_list("status").annotate(n=Count("id")))
        notes = dict(Notification.objects.values_list("state").annotate(n=Count("id")))
        self.stdout.write(
            "Sample jobs, one or more in every status: "
            + ", ".join(f"{s} {jobs.get(s, 0)}" for s in JobStatus.values)
            + "."
        )
        self.stdout.write(
            "Sample notifications: "
            + ", ".join(f"{n} {s}" for s, n in sorted(notes.items()))
            + " (one goes to a receiver that is offline on purpose, to show a dead letter)."
        )

    @staticmethod
    def _finish(
        store: StateStore,
        job: Job,
        status: JobStatus,
        patch: dict[str, Any],
        notes: list[NotificationRequest],
    ) -> None:
        finished = store.complete_job_with_notifications(job, {"status": status, **patch}, notes)
        assert finished is not None, "the sample job was claimed just now"
