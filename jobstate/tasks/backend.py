"""``JobStateBackend``: Django's task interface (``django.tasks``) over jobstate's queue.

::

    TASKS = {
        "default": {
            "BACKEND": "jobstate.tasks.JobStateBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 3, "RETRY_BACKOFF": timedelta(seconds=5)},
        }
    }

Every task is a ``Job`` of the configured state store (target ``tasks:<alias>``), so
claims, leases, reaping, audit, metrics, retention and the admin serve tasks as they
serve every other job. ``manage.py jobstate_worker`` runs them. ``enqueue`` writes the
job in the caller's transaction: inside ``transaction.atomic()`` the task exists only if
the transaction commits, and no worker sees it before. ``get_result`` reads the job from
any process. The options are described in :mod:`jobstate.tasks.options`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import date, datetime, time
from functools import cached_property
from typing import Any, cast

from django.apps import apps
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from jobstate.core.messages import shown
from jobstate.core.states import NewTask, task_target
from jobstate.exceptions import ImproperlyConfiguredStore, InvalidJobState, InvalidPayload
from jobstate.stores import get_state_store
from jobstate.stores.base import StateStore
from jobstate.stores.contracts.validation import parse_uuid
from jobstate.tasks.compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    normalize_json,
    task_enqueued,
)
from jobstate.tasks.options import (
    TaskOptions,
    option_problems,
    parse_task_options,
    queue_problems,
)
from jobstate.tasks.policies import TaskPolicy, policy_of
from jobstate.tasks.results import task_result

__all__ = ["JobStateBackend"]


class JobStateBackend(BaseTaskBackend):
    """A durable task backend: tasks are jobs in jobstate's table, run by
    ``manage.py jobstate_worker`` with leases, retries, timeouts and crash recovery."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        #: The ``target`` of this backend's jobs.
        self.target = task_target(alias)
        # ``QUEUES`` as declared: Django keeps ``set(QUEUES)``, the letters of a string.
        self._declared_queues = params.get("QUEUES")

    @cached_property
    def task_options(self) -> TaskOptions:
        """The checked ``OPTIONS``; ``ImproperlyConfigured`` naming this alias when they
        are bad (the system check reports the same problems at start-up)."""
        try:
            return parse_task_options(self.options)
        except ImproperlyConfigured as exc:
            raise ImproperlyConfigured(f"TASKS[{self.alias!r}]: {exc}") from exc

    @property
    def store(self) -> StateStore:
        """The configured state store (``JOBSTATE['STATE_STORE']``) on the default
        database, where this backend's tasks live."""
        return get_state_store()

    # --- Django's interface -------------------------------------------------------------

    def validate_task(self, task: Task[Any, Any]) -> None:
        """Django's checks of a task, with a ``run_after`` that is not a datetime and a
        ``priority`` that is not a number refused by name first: Django's own checks
        fail on them with a bare ``AttributeError`` or ``TypeError``."""
        if task.run_after is not None and not isinstance(task.run_after, datetime):
            raise InvalidTask(
                f"run_after must be an aware datetime, got {type(task.run_after).__name__}."
            )
        if isinstance(task.priority, bool) or not isinstance(task.priority, int | float):
            raise InvalidTask(
                f"priority must be a whole number, got {type(task.priority).__name__}."
            )
        super().validate_task(task)

    def enqueue(self, task: Task[Any, Any], args: Any, kwargs: Any) -> TaskResult[Any, Any]:
        """Queue ``task`` with ``args`` and ``kwargs`` (JSON: tuples become lists) and
        return its ``READY`` result. Part of the caller's transaction, when there is
        one. Arguments that are not JSON raise ``TypeError`` (naming the argument and
        its type: ``kwargs['when'] is a datetime, ...``) or ``ValueError`` (naming bytes
        that are not UTF-8; :class:`~jobstate.exceptions.InvalidPayload` among them, for
        a cycle or nesting too deep to store too) and queue nothing. Bytes of UTF-8 text
        are stored as that text, as Django's own backends store them.

        The task's :func:`~jobstate.tasks.policy` is stored with the job. A unique task
        whose key a job of this backend holds returns that job's result (same ``id``),
        writes nothing and sends no ``task_enqueued``."""
        self.validate_task(task)
        _check_importable(task)
        try:
            # normalize_json returns JSON of the shape it is given: a list, a dict.
            job_args = cast("list[Any]", normalize_json(list(args)))
            job_kwargs = cast("dict[str, Any]", normalize_json(dict(kwargs)))
        except RecursionError as exc:
            raise InvalidPayload(
                "the task's arguments are not strict JSON: they hold a cycle or are nested "
                "too deeply."
            ) from exc
        except (TypeError, ValueError) as exc:
            # Django's message names a type, not the argument; the argument is looked
            # for only now, so a valid enqueue pays nothing for it. Its class is kept
            # (ValueError for bytes that are not UTF-8), as a host may catch it.
            unsupported = _not_json(args, kwargs)
            if unsupported is None:
                raise
            raise type(exc)(unsupported) from exc
        declared = policy_of(task)
        new_task = NewTask(
            target=self.target,
            task_path=task.module_path,
            queue_name=task.queue_name,
            priority=task.priority,
            args=job_args,
            kwargs=job_kwargs,
            max_attempts=self.task_options.max_attempts,
            run_after=task.run_after,
        )
        if declared is not None:
            new_task = _with_policy(new_task, declared)
        job = self.store.enqueue_task(new_task)
        result = task_result(job, self.alias, task)
        if job.request_id == new_task.request_id:
            # A unique task's duplicate returns the holder's result and enqueued nothing.
            task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[Any, Any]:
        """The current result of the task with that id, from any process.
        ``TaskResultDoesNotExist`` when the id is malformed or names no task of this
        backend."""
        try:
            pk = parse_uuid(result_id, field="result_id")
        except InvalidJobState as exc:
            raise TaskResultDoesNotExist(result_id) from exc
        job = self.store.get_job(pk)
        if job is None or job.task_path is None or job.target != self.target:
            raise TaskResultDoesNotExist(result_id)
        return task_result(job, self.alias)

    def configuration_messages(self) -> list[CheckMessage]:
        """jobstate's checks of this backend: the ``OPTIONS`` (``jobstate.E020``), the
        ``QUEUES`` (``jobstate.E021``), the jobstate app the tasks' table belongs to
        (``jobstate.E022``) and a configured state store that can hold tasks
        (``jobstate.E024``). The system check :func:`jobstate.checks.check_task_backends`
        runs them, whether or not ``django.tasks`` (whose own check calls
        :meth:`check`) was imported; so :meth:`check` leaves them out rather than
        report them twice."""
        messages: list[CheckMessage] = []
        where = f"TASKS[{self.alias!r}]"
        if not apps.is_installed("jobstate"):
            messages.append(
                Error(
                    f"{where} uses jobstate's task backend, but 'jobstate' is not in "
                    "INSTALLED_APPS: its tasks are rows of jobstate's job table.",
                    hint="Add 'jobstate' to INSTALLED_APPS and run manage.py migrate.",
                    id="jobstate.E022",
                )
            )
        else:
            messages += self._store_messages(where)
        messages += [
            Error(f"{where}: {problem}", id="jobstate.E020")
            for problem in option_problems(self.options)
        ]
        declared = self._declared_queues
        problems = (
            [
                f"QUEUES is the string {declared!r}; it must be a list of queue names, "
                f"such as [{declared!r}]."
            ]
            if isinstance(declared, str)
            else queue_problems(sorted(self.queues, key=str))
        )
        messages += [Error(f"{where}: {problem}", id="jobstate.E021") for problem in problems]
        return messages

    def _store_messages(self, where: str) -> list[CheckMessage]:
        """``jobstate.E024`` when the configured state store cannot hold tasks."""
        try:
            store = self.store
        except ImproperlyConfigured:
            # A bad JOBSTATE setting: jobstate.E001 names it.
            return []
        except ImproperlyConfiguredStore as exc:
            return [Error(f"{where}: {exc}", id="jobstate.E024")]
        if store.supports_tasks:
            return []
        return [
            Error(
                f"{where} uses jobstate's task backend, but JOBSTATE['STATE_STORE'] "
                f"({type(store).__qualname__}) does not support tasks "
                "(supports_tasks is False).",
                hint="Use jobstate.stores.database.DatabaseStateStore, or a store that "
                "implements the task primitives.",
                id="jobstate.E024",
            )
        ]


def _with_policy(new_task: NewTask, declared: TaskPolicy) -> NewTask:
    """``new_task`` with what its task declared: its attempt limit, the policy its worker
    applies and, when it has them this time, its uniqueness and concurrency keys."""
    stored = declared.stored() or {}
    keys: dict[str, Any] = {}
    path, args, kwargs = new_task.task_path, new_task.args, new_task.kwargs
    claim = declared.unique_claim(path, args, kwargs, timezone.now())
    if claim is not None:
        stored["unique_key"] = claim.key
        keys.update(unique_digest=claim.digest, unique_states=claim.states)
    concurrency = declared.concurrency(path, args, kwargs)
    if concurrency is not None:
        stored.update(concurrency_key=concurrency.key, concurrency_limit=concurrency.limit)
        keys.update(concurrency_digest=concurrency.digest, concurrency_limit=concurrency.limit)
    return replace(
        new_task,
        max_attempts=declared.max_attempts or new_task.max_attempts,
        policy=stored or None,
        **keys,
    )


#: What Django's ``normalize_json`` keeps as it is (``bytes`` it decodes, when they are
#: UTF-8): a dict's key of any other type, it refuses.
_SCALARS = (str, bytes, int, float, bool, type(None))

#: What bytes that are not UTF-8 are, in a message.
_NOT_UTF8 = "bytes that are not UTF-8"


def _not_json(args: Any, kwargs: Any) -> str | None:
    """The part of the arguments ``normalize_json`` refused with a ``TypeError`` or a
    ``ValueError``, named as the caller wrote it (``kwargs['when']``,
    ``args[0][1]['due']``), with what to pass instead; ``None`` when no part is of a
    type or value it refuses. The parts are walked in its order (each of a dict's keys
    before its value), so the part named is the one it refused and the walk ends: a
    cycle on the way would have made it recurse without end rather than raise."""
    # (where, value, whether the value is a dict's key), the next part last.
    parts = [(f"kwargs[{name!r}]", value, False) for name, value in dict(kwargs).items()][::-1]
    parts += [(f"args[{n}]", value, False) for n, value in enumerate(args)][::-1]
    while parts:
        where, value, is_key = parts.pop()
        if is_key:
            if not isinstance(value, _SCALARS) or not _decodes(value):
                kind = _NOT_UTF8 if isinstance(value, bytes) else f"a {type(value).__name__}"
                return (
                    f"{where} has a key that is {kind}, {shown(repr(value))}, which is not "
                    "JSON: an object's keys are text."
                )
        elif isinstance(value, Mapping):
            inner: list[tuple[str, Any, bool]] = []
            for key, item in value.items():
                inner += [(where, key, True), (f"{where}[{shown(repr(key))}]", item, False)]
            parts += inner[::-1]
        elif isinstance(value, bytes):
            if not _decodes(value):
                return f"{where} is {_NOT_UTF8}, which is not JSON: {_instead(value)}"
        elif isinstance(value, Sequence) and not isinstance(value, str):
            parts += [(f"{where}[{n}]", item, False) for n, item in enumerate(value)][::-1]
        elif not isinstance(value, _SCALARS):
            return f"{where} is a {type(value).__name__}, which is not JSON: {_instead(value)}"
    return None


def _decodes(value: object) -> bool:
    """Whether ``normalize_json`` takes ``value``: anything but bytes that are not UTF-8
    (it stores those that are as their text)."""
    if not isinstance(value, bytes):
        return True
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _instead(value: Any) -> str:
    """What to pass for ``value``, of a type JSON lacks."""
    if isinstance(value, datetime | date | time):
        kind = type(value).__name__
        return f"pass its .isoformat() text, and {kind}.fromisoformat() reads it back in the task."
    if isinstance(value, bytes):
        return (
            "pass text (.decode() them with their encoding) or, for binary data, "
            "base64.b64encode(data).decode(), which base64.b64decode() reads back in the task."
        )
    if isinstance(value, set | frozenset):
        # A set's order is not fixed between processes; a unique key of it would differ.
        return "pass a list (sorted, so that equal sets are equal lists)."
    return "pass str, int, float, bool, None, or lists and dicts of them."


def _check_importable(task: Task[Any, Any]) -> None:
    """Refuse ``task`` when a worker cannot find it by its dotted path: defined in
    ``manage.py shell`` or in a script run as ``__main__``, it would be queued under a
    path no worker imports. The module is looked up, not imported: it is loaded, since
    the task's function is."""
    func = task.func
    found: object = None if func.__module__ == "__main__" else sys.modules.get(func.__module__)
    for part in func.__qualname__.split("."):
        found = getattr(found, part, None)
    if not (isinstance(found, Task) and found.func is func):
        raise InvalidTask(
            f"{task.module_path} cannot be imported by a worker, so no worker could run it: "
            "define the task in a module of your project (its tasks.py, say) and import it "
            "from there."
        )
