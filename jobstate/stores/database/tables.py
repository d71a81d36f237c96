"""What every concern module of the database state store starts from: the job queryset
on database ``using``. What differs between backends is asked of the operations object
(:func:`jobstate.stores.database.backends.database_ops`)."""

from __future__ import annotations

from jobstate.models import Job, JobQuerySet

__all__ = ["job_rows"]


def job_rows(using: str) -> JobQuerySet:
    """Every job on database ``using``."""
    return Job.objects.using(using)
