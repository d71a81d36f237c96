"""One-step demo set-up: migrate, an admin user, and runs in every state."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db.models import Count
from django.db.models.functions import Now

from jobstate.models import JobRun
from jobstate.runner import JobRunner
from jobstate.stores import get_run_store
from jobstate.stores.base import Trigger

DEMO_USER = "admin"


class Command(BaseCommand):
    help = "Migrate the demo database, create the admin user and record sample job runs."

    def handle(self, *args: Any, **options: Any) -> None:
        call_command("migrate", interactive=False, verbosity=0)
        password = os.environ.get("DEMO_ADMIN_PASSWORD", "jobstate-demo")
        user, _ = get_user_model().objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        user.set_password(password)
        user.save()
        self._record_sample_runs()
        self.stdout.write(
            self.style.SUCCESS(
                f"Demo ready. Admin: http://127.0.0.1:8000/admin/  "
                f"user {DEMO_USER!r}, password {password!r}"
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
        counts = JobRun.objects.values("status").annotate(n=Count("id")).order_by("status")
        summary = ", ".join(f"{row['status']} {row['n']}" for row in counts)
        self.stdout.write(f"Job runs by status: {summary}")
