"""Store loading by dotted path, the way Django loads session backends."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING

from django.utils.module_loading import import_string

from jobstate.core.conf import jobstate_settings
from jobstate.exceptions import ImproperlyConfiguredStore

if TYPE_CHECKING:
    from jobstate.stores.base import JobRunStore, StateStore

__all__ = ["get_run_store", "get_state_store"]


@cache
def _load(path: str) -> type:
    try:
        cls: type = import_string(path)
        return cls
    except ImportError as exc:
        raise ImproperlyConfiguredStore(f"Cannot import store {path!r}: {exc}") from exc


def get_run_store(using: str = "default") -> JobRunStore:
    """Return an instance of the ``JOBSTATE['RUN_STORE']`` class for database ``using``."""
    from jobstate.stores.base import JobRunStore

    cls = _load(jobstate_settings.RUN_STORE)
    if not issubclass(cls, JobRunStore):
        raise ImproperlyConfiguredStore(
            f"JOBSTATE['RUN_STORE'] = {jobstate_settings.RUN_STORE!r} is not a JobRunStore."
        )
    # Store classes take the database alias as their one keyword argument.
    factory: Callable[..., JobRunStore] = cls
    return factory(using=using)


def get_state_store(using: str = "default") -> StateStore:
    """Return an instance of the ``JOBSTATE['STATE_STORE']`` class for database ``using``."""
    from jobstate.stores.base import StateStore

    cls = _load(jobstate_settings.STATE_STORE)
    if not issubclass(cls, StateStore):
        raise ImproperlyConfiguredStore(
            f"JOBSTATE['STATE_STORE'] = {jobstate_settings.STATE_STORE!r} is not a StateStore."
        )
    factory: Callable[..., StateStore] = cls
    return factory(using=using)
