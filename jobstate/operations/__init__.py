"""Operations jobs: the registry and ``@operations_job`` (:mod:`.job_registry`), the
runner that executes them with an overlap guard, a heartbeat and a deadline
(:mod:`.job_runner`, also importable as :mod:`jobstate.runner`; its options in
:mod:`.runner_options`), what a body sees of its run (:mod:`.run_context`) and how a
run ends (:mod:`.outcomes`).
"""

from jobstate.operations import job_registry
from jobstate.operations.job_registry import *  # noqa: F403

__all__ = list(job_registry.__all__)
