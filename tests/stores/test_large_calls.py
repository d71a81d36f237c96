"""Calls whose size a statement cannot take in one piece: a claim over more targets than
a statement has parameters for is refused as the caller's mistake (it was reported as a
lost database, which callers retry forever), and a batch of reports larger than that
is applied in turns, each report fenced as always."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from jobstate.exceptions import InvalidJobState
from jobstate.models import Job
from jobstate.stores.base import ClaimReport, JobStatus
from jobstate.stores.contracts import queue_part
from jobstate.stores.contracts.validation import CLAIM_TARGET_LIMIT
from jobstate.stores.database import DatabaseStateStore

pytestmark = [pytest.mark.django_db, pytest.mark.mysql]

#: Reports enough that their parameters (id, token, status and eight patched fields
#: each) pass the 65,535 a statement may take on PostgreSQL and MySQL.
REPORTS = 6000


def test_a_claim_over_more_targets_than_a_statement_takes_is_refused(
    store: DatabaseStateStore,
) -> None:
    store.create_job(request_id="r1", target="t1")
    for targets in (
        [f"t{n}" for n in range(CLAIM_TARGET_LIMIT + 1)],
        [f"t{n}" for n in range(65535)],
    ):
        with pytest.raises(InvalidJobState, match=r"a claim names at most 1,000 targets"):
            store.claim_next_inhub_job(targets, "worker-1")
        with pytest.raises(InvalidJobState, match=r"a claim names at most 1,000 targets"):
            store.claim_next_inhub_jobs(targets, "worker-1", limit=5)
    assert Job.objects.get().status == JobStatus.QUEUED
    # Names repeated are one target: the limit counts distinct ones.
    repeated = [f"t{n % CLAIM_TARGET_LIMIT}" for n in range(5 * CLAIM_TARGET_LIMIT)]
    job = store.claim_next_inhub_job(repeated, "worker-1")
    assert job is not None and job.request_id == "r1"


@pytest.mark.slow
def test_more_reports_than_one_statement_takes_are_all_applied(
    store: DatabaseStateStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = REPORTS
    if connection.vendor == "sqlite":
        # SQLite takes 250,000 parameters, and claims and reports one job at a time:
        # the turns are shown on a smaller batch.
        count = 450
        monkeypatch.setattr(queue_part, "REPORTS_PER_STATEMENT", 100)
    Job.objects.bulk_create(Job(request_id=f"r{n}", target="bulk") for n in range(count))
    claimed = store.claim_next_inhub_jobs(["bulk"], "worker-1", limit=count)
    assert len(claimed) == count
    stale = ClaimReport(uuid.uuid4(), uuid.uuid4(), JobStatus.DONE)
    reports = [stale] + [
        ClaimReport(
            job.id,
            job.claim_token or uuid.uuid4(),
            JobStatus.DONE,
            {
                "result": {"n": index},
                "report": {"ok": True},
                "usage": {"tokens": index},
                "metadata": {"batch": 1},
                "session_id": "s",
                "input_preview": "p",
                "source": "bulk",
                "attempts": 1,
            },
        )
        for index, job in enumerate(claimed)
    ]

    results = store.complete_claimed_jobs(reports)

    assert [result.completed for result in results] == [False] + [True] * count
    assert Job.objects.filter(status=JobStatus.DONE, attempts=1).count() == count
    last = claimed[-1]
    assert Job.objects.get(id=last.id).result == {"n": count - 1}
