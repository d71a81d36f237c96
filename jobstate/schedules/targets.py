"""What a schedule enqueues, and whether it can: the django.tasks task it names (or,
for an operations job, jobstate's task that runs it) on a ``JobStateBackend``.

The enqueue is part of the caller's transaction, which is what lets a slot's
occurrence row and its job be written together or not at all; so the backend must be
jobstate's, whose tasks are rows of the job table on the default database. Another
backend (one that enqueues into Redis, or runs the task at once) could not be rolled
back with the occurrence, and the system check refuses it.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import DEFAULT_DB_ALIAS

from jobstate.core.imports import NotImportable, import_path
from jobstate.core.messages import shown
from jobstate.exceptions import (
    OperationsJobInputError,
    ScheduleError,
    UnknownOperationsJob,
)
from jobstate.models.schedules import ScheduleKind
from jobstate.operations.job_registry import registry
from jobstate.schedules.definitions import ScheduleDefinition

if TYPE_CHECKING:
    from jobstate.tasks.compat import Task

__all__ = ["OPERATIONS_TASK_PATH", "enqueue_target", "target_problems"]

#: The task a schedule of an operations job enqueues.
OPERATIONS_TASK_PATH = "jobstate.schedules.operations_task.run_scheduled_operations_job"


def _task(definition: ScheduleDefinition) -> Task[Any, Any]:
    """The task ``definition`` enqueues, with its queue, priority and backend applied;
    :class:`ScheduleError` naming the schedule when that is not possible."""
    from jobstate.tasks.backend import JobStateBackend
    from jobstate.tasks.compat import InvalidTask, Task, task_backends

    where = f"schedule {definition.key!r}"
    path = definition.target if definition.kind is ScheduleKind.TASK else OPERATIONS_TASK_PATH
    try:
        found = import_path(path)
    # Any error of the module's code is a task that does not import, and stops only
    # this schedule.
    except NotImportable as exc:
        raise ScheduleError(f"{where}: the task {path!r} does not import: {exc.reason}") from exc
    if not isinstance(found, Task):
        raise ScheduleError(
            f"{where}: {path!r} is a {type(found).__name__}, not a django.tasks task "
            "(a function decorated with @task)."
        )
    aliases = task_backends.settings
    if definition.backend not in aliases:
        # Django's own error for an unknown alias speaks of a "connection".
        raise ScheduleError(
            f"{where}: the backend {shown(repr(definition.backend))} is not an alias of "
            f"TASKS (it has {', '.join(repr(alias) for alias in aliases) or 'none'})."
        )
    try:
        task = found.using(
            queue_name=definition.queue_name,
            priority=definition.priority,
            backend=definition.backend,
        )
        backend = task.get_backend()
    # The backend's own check of the task (its queue, its priority) and an unknown alias.
    except (InvalidTask, ImproperlyConfigured) as exc:
        raise ScheduleError(f"{where}: {exc}") from exc
    if not isinstance(backend, JobStateBackend):
        raise ScheduleError(
            f"{where}: TASKS[{definition.backend!r}] is {type(backend).__module__}."
            f"{type(backend).__qualname__}; a schedule needs "
            "jobstate.tasks.JobStateBackend, whose enqueue is part of the "
            "transaction that records the occurrence."
        )
    return task


def _operations_input(definition: ScheduleDefinition) -> Any:
    """The input an operations job gets: the schedule's ``kwargs`` (none when empty)."""
    value = definition.kwargs or None
    try:
        registry.get(definition.target).parse_input(value)
    except (UnknownOperationsJob, OperationsJobInputError) as exc:
        raise ScheduleError(f"schedule {definition.key!r}: {exc}") from exc
    except ImportError as exc:  # a module of OPERATIONS_JOB_MODULES (jobstate.E002)
        raise ScheduleError(
            f"schedule {definition.key!r}: the operations jobs could not be loaded: {exc}"
        ) from exc
    return value


def enqueue_target(definition: ScheduleDefinition, *, slot: datetime, using: str) -> str:
    """Enqueue what ``definition`` runs (in the caller's transaction) and return the
    result id. :class:`ScheduleError` when it cannot be enqueued."""
    if using != DEFAULT_DB_ALIAS:
        # JobStateBackend keeps its tasks on the default database; an occurrence on
        # another would not share their transaction.
        raise ScheduleError(
            f"schedule {definition.key!r}: its tasks are enqueued on the 'default' "
            f"database, so its occurrences must be recorded there too, not on {using!r}."
        )
    task = _task(definition)
    if definition.kind is ScheduleKind.TASK:
        result = task.enqueue(*definition.args, **definition.kwargs)
    else:
        value = _operations_input(definition)
        result = task.enqueue(definition.target, value, definition.key, slot.isoformat())
    return str(result.id)


def target_problems(definition: ScheduleDefinition) -> list[str]:
    """Why ``definition`` could not be enqueued, checked without enqueuing: the task
    imports and is a task its backend accepts (queue, priority), the backend is a
    ``JobStateBackend``, the operations job is registered and accepts the input."""
    try:
        _task(definition)
        if definition.kind is ScheduleKind.OPERATIONS_JOB:
            _operations_input(definition)
    except ScheduleError as exc:
        return [str(exc)]
    except ImproperlyConfigured as exc:
        # Django 5.2 without the django-tasks backport: no task can be enqueued.
        return [f"schedule {definition.key!r}: {exc}"]
    return []
