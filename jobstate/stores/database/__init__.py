"""Stores backed by the Django ORM, one module per concern.

``DatabaseJobRunStore`` and ``DatabaseStateStore`` are the defaults of
``JOBSTATE["RUN_STORE"]`` and ``JOBSTATE["STATE_STORE"]``; this package is their public
address. What differs between database backends is asked of the backend's operations
object (:mod:`jobstate.stores.database.backends`), never of the vendor's name; SQL of one
backend appears only there, where the ORM cannot say a hot path in one statement, and each
such statement has a portable path on the ORM in the concern module that calls it.
"""

from jobstate.stores.database.job_runs import DatabaseJobRunStore
from jobstate.stores.database.state import DatabaseStateStore

__all__ = ["DatabaseJobRunStore", "DatabaseStateStore"]
