"""Stores backed by the Django ORM, one module per concern.

``DatabaseJobRunStore`` and ``DatabaseStateStore`` are the defaults of
``JOBSTATE["RUN_STORE"]`` and ``JOBSTATE["STATE_STORE"]``; this package is their public
address. Raw SQL appears only where the ORM cannot say a hot path in one statement; each
such place says why and has a portable path for the other backends.
"""

from jobstate.stores.database.job_runs import DatabaseJobRunStore
from jobstate.stores.database.state import DatabaseStateStore

__all__ = ["DatabaseJobRunStore", "DatabaseStateStore"]
