"""Django's task framework (``django.tasks``; on Django 5.2 the ``django-tasks`` backport)
on jobstate's queue.

Name the backend in ``TASKS``::

    TASKS = {"default": {"BACKEND": "jobstate.tasks.JobStateBackend"}}

The backend lives in :mod:`.backend`, its ``OPTIONS`` in :mod:`.options`, a job seen as a
``TaskResult`` in :mod:`.results`, the version shim in :mod:`.compat` and the worker behind
``manage.py jobstate_worker`` in :mod:`.worker`.

Importing this package imports no models: :class:`JobStateBackend` loads on first use.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobstate.tasks.backend import JobStateBackend

__all__ = ["JobStateBackend"]

_LAZY = {"JobStateBackend": "jobstate.tasks.backend"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
