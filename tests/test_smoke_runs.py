from datetime import UTC, datetime, timedelta

import pytest

from jobstate.models import JobRun
from jobstate.stores.base import JobRunStatus, Trigger
from jobstate.stores.database import DatabaseJobRunStore

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)


def test_claim_heartbeat_complete_reap_round_trip():
    store = DatabaseJobRunStore()
    trigger = Trigger("CLI")
    run_id = store.claim(
        job_key="a.b", overlap_key="a.b", trigger=trigger, input={"x": 1}, started_at=T0
    )
    assert run_id
    assert (
        store.claim(job_key="a.b", overlap_key="a.b", trigger=trigger, input=None, started_at=T0)
        is None
    )
    assert store.heartbeat(run_id=run_id, progress={"n": 1})
    assert store.reap_stale(stale_after=timedelta(hours=1), overlap_key="a.b") == 0
    assert store.reap_stale(stale_after=timedelta(0), overlap_key="a.b") == 1
    assert not store.complete(run_id=run_id, status="SUCCEEDED", finished_at=T0, duration_ms=1)
    row = JobRun.objects.get(id=run_id)
    assert row.status == JobRunStatus.TIMED_OUT
    assert row.started_at == T0
    assert row.summary == {"n": 1}
