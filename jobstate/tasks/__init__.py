"""Django's task framework (``django.tasks``; on Django 5.2 the ``django-tasks`` backport)
on jobstate's queue.

Name the backend in ``TASKS``::

    TASKS = {"default": {"BACKEND": "jobstate.tasks.JobStateBackend"}}

The backend lives in :mod:`.backend`, its ``OPTIONS`` in :mod:`.options`, a job seen as a
``TaskResult`` in :mod:`.results`, a task's own policy (the :func:`policy` decorator and
:func:`unique_key`) in :mod:`.policies`, the version shim in :mod:`.compat` and the worker
behind ``manage.py jobstate_worker`` in :mod:`.worker`.

Importing this package imports no models: :class:`JobStateBackend` loads on first use.
"""

import warnings
from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobstate.tasks.backend import JobStateBackend
    from jobstate.tasks.policies import policy, unique_key

__all__ = ["JobStateBackend", "policy", "unique_key"]

_LAZY = {
    "JobStateBackend": "jobstate.tasks.backend",
    "policy": "jobstate.tasks.policies",
    "unique_key": "jobstate.tasks.policies",
}

# Until the package was organised by feature, jobstate.tasks held the Celery tasks; their
# names keep importing from here for one release (named by string, so the import contract
# does not see this package reach up to contrib).
_CELERY_TASKS = "jobstate.contrib.celery.celery_tasks"
_MOVED_CELERY_TASKS = frozenset(
    {
        "deliver_notifications_task",
        "enqueue_due_schedules_task",
        "prune_task",
        "reap_stale_task",
        "run_operations_job_task",
    }
)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    if name in _MOVED_CELERY_TASKS:
        warnings.warn(
            f"jobstate.tasks.{name} moved to {_CELERY_TASKS}.{name}; the old name goes "
            f"away in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(import_module(_CELERY_TASKS), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
