"""A task's job as Django's ``TaskResult``.

The job's status gives the result's: ``queued`` is ``READY``, ``running`` ``RUNNING``,
``done`` ``SUCCESSFUL``, and ``error`` and ``rejected`` (a task cancelled from the admin)
``FAILED``. ``worker_ids`` holds the worker of every ended attempt (the attempt log)
and, while one runs, the worker running it, so ``attempts`` counts attempts; ``errors``
holds one ``TaskError`` per failed attempt. Of a long log, which keeps the first and the
latest attempts only, each attempt left out has :data:`LEFT_OUT_WORKER_ID` as its worker
and one :class:`~jobstate.exceptions.AttemptsLeftOut` error stands for them all.
``enqueued_at`` is when the job was created, ``started_at`` when its first attempt
started, ``last_attempted_at`` when the latest did, and ``finished_at`` when it reached
its final status (all on the database clock, except the end of an attempt, which its
worker records).

A process that cannot import the task's module (a web process reading the results of
another service's tasks, or older code), or whose code no longer has a task at that
path, still gets the result: its ``task`` is then a stand-in of the same dotted path,
queue and priority, whose function raises ``ImportError`` if it is called. A task the
backend would refuse today (its queue since removed from ``QUEUES``) reads the same:
its ``task`` has the queue and priority it was enqueued with.
"""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from django.utils.module_loading import import_string

from jobstate.core.attempt_log import LeftOut, attempt_history
from jobstate.core.states import TASK_RESULT_STATUS_NAMES, TERMINAL_JOB_STATUSES, JobStatus
from jobstate.exceptions import AttemptsLeftOut, InvalidJobState
from jobstate.tasks.compat import (
    InvalidTask,
    Task,
    TaskError,
    TaskResult,
    TaskResultStatus,
    task_backends,
)

if TYPE_CHECKING:
    from jobstate.models import Job

__all__ = ["LEFT_OUT_WORKER_ID", "RESULT_STATUSES", "load_task", "task_of", "task_result"]

#: What ``TaskResult.worker_ids`` holds for each attempt a long attempt log left out.
LEFT_OUT_WORKER_ID = "(left out of the attempt log)"

_LEFT_OUT_PATH = f"{AttemptsLeftOut.__module__}.{AttemptsLeftOut.__qualname__}"

#: The ``TaskResult`` status of each job status.
RESULT_STATUSES: dict[str, TaskResultStatus] = {
    status: TaskResultStatus[name] for status, name in TASK_RESULT_STATUS_NAMES.items()
}


@lru_cache(maxsize=1024)
def load_task(task_path: str) -> Task[Any, Any]:
    """The task a job names by its dotted path. Raises ``ImportError`` when the path no
    longer imports and :class:`~jobstate.exceptions.InvalidJobState` when it names
    something that is not a task."""
    found = import_string(task_path)
    if not isinstance(found, Task):
        raise InvalidJobState(
            f"{task_path!r} is not a task (decorate the function with @task), "
            f"it is a {type(found).__name__}."
        )
    return found


def task_of(job: Job, alias: str) -> Task[Any, Any]:
    """The job's task as it was enqueued: its priority, queue and ``run_after``, on
    backend ``alias``."""
    if job.task_path is None:
        raise InvalidJobState(f"job {job.id} is not a task.")
    if job.run_after is None:
        # The usual case: one task per path, priority and queue, validated once by its
        # backend (a backend the settings replaced validates it again).
        return _task_on(job.task_path, job.priority, job.queue_name, alias, task_backends[alias])
    return load_task(job.task_path).using(
        priority=job.priority,
        queue_name=job.queue_name,
        run_after=job.run_after,
        backend=alias,
    )


@lru_cache(maxsize=1024)
def _task_on(
    task_path: str, priority: int, queue_name: str | None, alias: str, backend: object
) -> Task[Any, Any]:
    """The task of ``task_path`` with ``priority`` and ``queue_name`` on backend
    ``alias`` (whose instance now is ``backend``). A ``Task`` is immutable, and making
    one has its backend validate it: every attempt of the same kind shares one."""
    return load_task(task_path).using(priority=priority, queue_name=queue_name, backend=alias)


def _task_or_stand_in(job: Job, alias: str) -> Task[Any, Any]:
    """The job's task, or a stand-in for it when its dotted path does not import here:
    its module is missing, or raises while it is imported (whatever a host's module
    raises, as one that needs a setting this process lacks), or the path names
    something that is no longer a task (``InvalidJobState``, after a deploy). Either
    way with the priority and queue the job was enqueued with, even those the backend
    refuses now."""
    try:
        found = load_task(job.task_path or "")
    except Exception as exc:  # importing the host's module: whatever it raises
        return _stand_in(job, alias, exc)
    try:
        return task_of(job, alias)
    except InvalidTask:
        # Its queue was removed from QUEUES since, say: the result is data all the same.
        return _as_enqueued(job, alias, found.func, takes_context=found.takes_context)


def _stand_in(job: Job, alias: str, error: Exception) -> Task[Any, Any]:
    path = job.task_path or ""
    module, _, name = path.rpartition(".")
    reason = f"task {path!r} cannot be imported in this process ({error})"

    def absent(*args: Any, **kwargs: Any) -> Any:
        raise ImportError(reason)

    absent.__module__ = module
    absent.__name__ = absent.__qualname__ = name
    return _as_enqueued(job, alias, absent)


def _as_enqueued(job: Job, alias: str, func: Any, *, takes_context: bool = False) -> Task[Any, Any]:
    """A task of ``func`` with the job's priority, queue and ``run_after`` on backend
    ``alias``, made without the backend's checks (``Task.__post_init__``): they judge a
    task about to be enqueued, and this one was, under settings since changed. Queueing
    it again (``using``, ``enqueue``) checks it as any other."""
    values = {
        "func": func,
        "priority": job.priority,
        "backend": alias,
        "queue_name": job.queue_name or "default",
        "run_after": job.run_after,
        "takes_context": takes_context,
    }
    made: Task[Any, Any] = object.__new__(Task)
    for field in fields(Task):
        # A Task is frozen: its own __init__ sets its fields this way.
        object.__setattr__(made, field.name, values.get(field.name, field.default))
    return made


def task_result(job: Job, alias: str, task: Task[Any, Any] | None = None) -> TaskResult[Any, Any]:
    """The job as a ``TaskResult`` of backend ``alias`` (``task``: the job's task, when
    the caller has it already)."""
    running = job.status in (JobStatus.RUNNING, JobStatus.DISPATCHED)
    worker_ids: list[str] = []
    starts: list[Any] = []
    errors: list[TaskError] = []
    for item in attempt_history(job.attempt_log):
        if isinstance(item, LeftOut):
            # The attempts a long log left out still count: the result's attempts
            # stay exact, and its errors say which ones are missing.
            worker_ids += [LEFT_OUT_WORKER_ID] * item.count
            errors.append(TaskError(exception_class_path=_LEFT_OUT_PATH, traceback=item.describe()))
            continue
        worker_ids.append(item.worker_id)
        starts.append(item.started_at)
        if item.failed:
            errors.append(
                TaskError(exception_class_path=item.exception_class_path, traceback=item.traceback)
            )
    if running and job.executor_id:
        worker_ids.append(job.executor_id)
    if running:
        starts.append(job.claimed_at)
    payload = job.input if isinstance(job.input, dict) else {}
    result: TaskResult[Any, Any] = TaskResult(
        task=task if task is not None else _task_or_stand_in(job, alias),
        id=str(job.id),
        status=RESULT_STATUSES[job.status],
        enqueued_at=job.created_at,
        started_at=starts[0] if starts else None,
        finished_at=job.updated_at if job.status in TERMINAL_JOB_STATUSES else None,
        last_attempted_at=starts[-1] if starts else None,
        args=list(payload.get("args") or []),
        kwargs=dict(payload.get("kwargs") or {}),
        backend=alias,
        errors=errors,
        worker_ids=worker_ids,
    )
    if job.status == JobStatus.DONE:
        # TaskResult keeps the return value out of its constructor, so a result that is
        # not finished cannot be built with one.
        object.__setattr__(result, "_return_value", job.result)
    return result
