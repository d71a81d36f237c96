"""Read stored runs back from the database, for the contract cases that check stored values."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from jobstate.stores.base import JobRunStatus, Trigger
from jobstate.testing.memory_runs import StoredJobRun

__all__ = ["database_run_inspector"]


def database_run_inspector(using: str = "default") -> Callable[[str], StoredJobRun | None]:
    """Return ``inspect(run_id)`` reading ``jobstate.models.JobRun`` on database ``using``.

    Pass it as ``inspect=`` to :func:`jobstate.testing.job_run_store_contract_cases` to
    enable the cases that read stored values (recorded instants, the JSON round trip).
    Building the inspector touches no database; each call reads one row, and answers
    ``None`` for an id that is not a UUID or names no row.
    """

    def inspect(run_id: str) -> StoredJobRun | None:
        from jobstate.models import JobRun

        try:
            key = run_id if isinstance(run_id, uuid.UUID) else uuid.UUID(str(run_id))
        except ValueError:
            return None
        row = JobRun.objects.using(using).filter(id=key).first()
        if row is None:
            return None
        return StoredJobRun(
            run_id=str(row.id),
            job_key=row.job_key,
            overlap_key=row.overlap_key,
            status=JobRunStatus(row.status),
            trigger=Trigger(source=row.trigger_source, triggered_by=row.triggered_by),
            input=row.input,
            summary=row.summary,
            error=row.error,
            started_at=row.started_at,
            heartbeat_at=row.heartbeat_at,
            finished_at=row.finished_at,
            duration_ms=row.duration_ms,
            service_revision=row.service_revision,
        )

    return inspect
