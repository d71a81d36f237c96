"""The module paths that moved when the package was organised by feature keep importing
for one release, with a DeprecationWarning that names the new path; the public names
hosts use (``jobstate.tasks.JobStateBackend``, ``jobstate.runner``) import without one."""

from __future__ import annotations

import importlib
import sys
import warnings
from typing import Any

import pytest
from django.core import checks
from django.utils.module_loading import import_string

from jobstate.moved import MOVED_MODULES


def _forget(name: str) -> None:
    """Drop an old path from the module cache, so importing it goes through the finder
    (and warns) again."""
    sys.modules.pop(name, None)


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_every_old_path_is_the_module_at_its_new_path_and_warns(old: str) -> None:
    new = MOVED_MODULES[old]
    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        _forget(name)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new};"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_the_old_backend_path_in_tasks_still_loads_the_backend() -> None:
    from jobstate.tasks.backend import JobStateBackend

    _forget("jobstate.tasks_backend")
    with pytest.warns(DeprecationWarning, match="jobstate.tasks_backend moved to"):
        assert import_string("jobstate.tasks_backend.JobStateBackend") is JobStateBackend
    assert import_string("jobstate.channels.WebhookChannel") is import_string(
        "jobstate.outbox.channels.WebhookChannel"
    )


def test_the_celery_tasks_still_import_from_jobstate_tasks_with_a_warning() -> None:
    from jobstate.contrib.celery.celery_tasks import reap_stale_task

    with pytest.warns(DeprecationWarning, match="jobstate.tasks.reap_stale_task moved to"):
        from jobstate.tasks import reap_stale_task as old

    assert old is reap_stale_task


#: The module paths DESIGN.md and the docs give hosts: they are modules of their own,
#: never aliases of a moved path.
PUBLIC_MODULES = [
    "jobstate.exceptions",
    "jobstate.models",
    "jobstate.operations",
    "jobstate.runner",
    "jobstate.schedules",
    "jobstate.stores",
    "jobstate.stores.base",
    "jobstate.stores.database",
    "jobstate.tasks",
    "jobstate.testing",
    "jobstate.urls",
]


@pytest.mark.parametrize("name", PUBLIC_MODULES)
def test_a_public_module_is_no_moved_alias(name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        module = importlib.import_module(name)
    assert name not in MOVED_MODULES
    assert module.__name__ == name, f"{name} resolves to {module.__name__}"


def test_the_public_names_resolve_to_their_homes() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        backend = import_string("jobstate.tasks.JobStateBackend")
        runner = import_string("jobstate.runner.JobRunner")
    assert backend.__module__ == "jobstate.tasks.backend"
    assert runner.__module__ == "jobstate.operations.job_runner"


# The system checks include Django's model checks, and on SQLite Django 6.1's JSONField
# check asks the database once per process whether it supports JSON: a test that runs
# them needs the database (it passed only while an earlier test had asked).
@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        "jobstate.tasks.JobStateBackend",
        "jobstate.tasks.backend.JobStateBackend",
        "jobstate.tasks_backend.JobStateBackend",
    ],
)
def test_the_system_checks_see_the_backend_under_each_of_its_paths(
    settings: Any, path: str
) -> None:
    """A host that still names the old path keeps its OPTIONS checked."""
    settings.TASKS = {"default": {"BACKEND": path, "OPTIONS": {"MAX_ATTEMPTS": 0}}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        messages = [m for m in checks.run_checks() if m.id == "jobstate.E020"]
    assert len(messages) == 1 and "'MAX_ATTEMPTS'] must be an int from 1" in messages[0].msg
