"""The runner of operations jobs, at the address hosts import it from.

The code lives in :mod:`jobstate.operations.job_runner`; this module is its stable public
name (``from jobstate.runner import JobRunner``).
"""

from jobstate.operations import job_runner
from jobstate.operations.job_runner import *  # noqa: F403

__all__ = list(job_runner.__all__)
