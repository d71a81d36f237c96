"""Store loading by dotted path, the way Django loads session backends."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING

from jobstate.core.conf import jobstate_settings
from jobstate.core.imports import NotImportable, import_path
from jobstate.exceptions import ImproperlyConfiguredStore

if TYPE_CHECKING:
    from jobstate.stores.base import JobRunStore, StateStore

__all__ = ["get_run_store", "get_state_store", "store_class"]


@cache
def _load(path: str) -> type:
    try:
        found = import_path(path)
    except NotImportable as exc:
        raise ImproperlyConfiguredStore(f"Cannot import store {path!r}: {exc.reason}") from exc
    if not isinstance(found, type):
        raise ImproperlyConfiguredStore(f"Store {path!r} is a {type(found).__name__}, not a class.")
    return found


def store_class(setting: str, base: type) -> type:
    """The class ``JOBSTATE[setting]`` names, checked to be a subclass of ``base``;
    :class:`~jobstate.exceptions.ImproperlyConfiguredStore` saying why it is not."""
    path = getattr(jobstate_settings, setting)
    cls = _load(path)
    if not issubclass(cls, base):
        raise ImproperlyConfiguredStore(
            f"JOBSTATE[{setting!r}] = {path!r} is not a {base.__name__}."
        )
    return cls


def get_run_store(using: str = "default") -> JobRunStore:
    """Return an instance of the ``JOBSTATE['RUN_STORE']`` class for database ``using``."""
    from jobstate.stores.base import JobRunStore

    # Store classes take the database alias as their one keyword argument.
    factory: Callable[..., JobRunStore] = store_class("RUN_STORE", JobRunStore)
    return factory(using=using)


def get_state_store(using: str = "default") -> StateStore:
    """Return an instance of the ``JOBSTATE['STATE_STORE']`` class for database ``using``."""
    from jobstate.stores.base import StateStore

    factory: Callable[..., StateStore] = store_class("STATE_STORE", StateStore)
    return factory(using=using)
