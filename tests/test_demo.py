"""The demo command leaves an admin user and runs in every state, listed by the admin."""

import pytest
from django.core.management import call_command
from django.test import Client

from jobstate.models import JobRun, JobRunStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_setup_records_runs_in_every_state_and_the_admin_lists_them(capsys):
    call_command("demo_setup")
    out = capsys.readouterr().out
    assert "user 'admin', password 'jobstate-demo'" in out

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


def test_demo_setup_can_run_twice(capsys):
    call_command("demo_setup")
    call_command("demo_setup")
    assert "Demo ready" in capsys.readouterr().out
