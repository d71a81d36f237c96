"""What every concern module of the database state store starts from: the job queryset
on database ``using`` and the backend fact the portable paths branch on."""

from __future__ import annotations

from django.db import connections

from jobstate.models import Job, JobQuerySet

__all__ = ["is_postgresql", "job_rows"]


def job_rows(using: str) -> JobQuerySet:
    """Every job on database ``using``."""
    return Job.objects.using(using)


def is_postgresql(using: str) -> bool:
    """Whether ``using`` is PostgreSQL, where the one-statement paths and row locks run;
    elsewhere a portable path, serialised by the backend's transactions, does the same."""
    return connections[using].vendor == "postgresql"
