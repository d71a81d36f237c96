"""What every concern module of the database state store starts from: the job queryset
on database ``using`` and the backend facts the portable paths branch on."""

from __future__ import annotations

from django.db import connections

from jobstate.models import Job, JobQuerySet

__all__ = ["is_mysql", "is_postgresql", "job_rows", "locks_rows"]


def job_rows(using: str) -> JobQuerySet:
    """Every job on database ``using``."""
    return Job.objects.using(using)


def is_postgresql(using: str) -> bool:
    """Whether ``using`` is PostgreSQL, where the one-statement paths run; elsewhere a
    portable path on the ORM does the same."""
    return connections[using].vendor == "postgresql"


def is_mysql(using: str) -> bool:
    """Whether ``using`` is MariaDB or MySQL (Django's ``mysql`` backend for both)."""
    return connections[using].vendor == "mysql"


def locks_rows(using: str) -> bool:
    """Whether writers on ``using`` run concurrently, so a path must lock what it reads
    (``SELECT ... FOR UPDATE``, ``SKIP LOCKED`` where claimers should pass each other):
    PostgreSQL, MariaDB and MySQL. SQLite's ``IMMEDIATE`` transactions take the
    database's one write lock at ``BEGIN``, so there a read already sees what the
    following write will."""
    return connections[using].vendor != "sqlite"
