"""Exceptions raised by jobstate.

Every error the package raises on purpose derives from :class:`JobStateError`, so a host
can catch the whole family at once. Bad input errors also derive from ``ValueError`` or
``TypeError`` so generic validation code keeps working. Do not raise ``JobStateError``
directly; raise the subclass that names the failure.
"""

from __future__ import annotations


class JobStateError(Exception):
    """Base class of every jobstate error. Do not raise directly."""


class InvalidPayload(JobStateError, ValueError):
    """A value handed to a store cannot be stored as strict JSON (NaN, cycles, objects,
    non-string keys, NUL characters) or is too large. Nothing was written."""


class InvalidJobState(JobStateError, ValueError):
    """An argument names a status, duration or instant the operation cannot accept."""


class StoreError(JobStateError):
    """The store failed for a reason other than a documented conflict (connection lost,
    serialization failure, unexpected constraint). The original error is the cause."""


class UnknownOperationsJob(JobStateError, LookupError):
    """No operations job is registered under that key."""


class OperationsJobInputError(JobStateError, ValueError):
    """The input given to an operations job was rejected before anything was written."""


class ImproperlyConfiguredStore(JobStateError):
    """The ``JOBSTATE`` settings name a store that cannot be loaded."""
