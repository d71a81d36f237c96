"""Maintenance sweeps: the one layer behind the cron commands, the Celery tasks and the
demo's loop.

*Reaping* sweeps settle work whose owner is gone; *retention* sweeps delete history past
its retention. Every sweep

- is **bounded**: each statement moves or deletes at most ``batch_size`` rows (default
  ``JOBSTATE['SWEEP_BATCH_SIZE']`` for reaping, ``JOBSTATE['RETENTION_BATCH_SIZE']`` for
  retention) in its own short transaction, and one call starts no new batch once
  ``time_budget`` (default ``JOBSTATE['SWEEP_TIME_BUDGET']``) has passed; ``limit``
  optionally caps the rows of one call;
- is **idempotent**: a second call finds nothing left to do;
- is **safe on several machines at once**: candidates are locked with ``SKIP LOCKED``
  and every write re-checks its condition, so each row is moved and counted by exactly
  one caller;
- runs on the **configured stores**: the sweep store of ``JOBSTATE['STATE_STORE']`` or
  ``JOBSTATE['RUN_STORE']`` (their ``sweep_store()``), so a host's store subclass is the
  one swept, and a store that cannot be swept is refused with a clear error;
- **returns what it did** as a :class:`SweepResult`.

Each sweep is one entry of the one sweep registry (:mod:`jobstate.maintenance.sweep_table`:
:data:`REAPING_SWEEPS` and :data:`RETENTION_SWEEPS`), run by one loop
(:func:`jobstate.maintenance.sweep_loop.run_sweep`). :func:`run_reaping_sweeps` and
:func:`run_retention_sweeps` run the entries of the registry and return a
:class:`SweepReport`; each sweep also has a function of its own
(:mod:`jobstate.maintenance.sweeps`) that runs its entry.
"""

# The submodules' __all__ say what each exports; the package re-exports all of it.
from jobstate.maintenance import sweep_results, sweeps
from jobstate.maintenance.sweep_loop import SweepOptions
from jobstate.maintenance.sweep_results import *  # noqa: F403
from jobstate.maintenance.sweeps import *  # noqa: F403

__all__ = ["SweepOptions"]
__all__ += sweep_results.__all__
__all__ += sweeps.__all__
