"""Per-task policy: ``jobstate.tasks.policy(...)``, declared under Django's ``@task``.

::

    from django.tasks import task          # Django 5.2: from django_tasks import task
    from jobstate.tasks import policy

    @task(queue_name="imports")
    @policy(max_attempts=5, retry_on=(ConnectionError,), unique=lambda customer_id: customer_id)
    def import_customer(customer_id: int) -> None: ...

What a task declares overrides its backend's ``OPTIONS`` for that task. ``enqueue``
stores the declared policy with the job (:meth:`TaskPolicy.stored`), and the worker that
runs the job reads it from there (:class:`StoredPolicy`), not from the code it imported:
a job keeps the policy of the deploy that enqueued it.

A **unique** task holds a key while its job is in one of the covered states; enqueueing
it again then returns the holder's result and writes nothing. The key is the task's
dotted path with either its arguments (``unique=True``), what a function of its
arguments returns (``unique=callable``; ``None`` means "not unique this time"), or a key
given at enqueue (:func:`unique_key`). A unique index of the database keeps one holder
per backend and key, whatever the number of processes enqueueing at once. With
``unique_for``, the key also covers the tasks of the same period that have finished:
periods are ``unique_for`` long, counted from the Unix epoch.

An **atomic** task (``atomic=True``) runs its body in a transaction on the worker's
database that also writes the attempt's fenced report: the body's writes commit with
the task's success, or not at all (see :mod:`jobstate.tasks.worker.atomic`).

Validation lives here: the decorator refuses a bad declaration with ``TypeError`` or
``ValueError`` when the module that declares the task is imported.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import lru_cache
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction

from jobstate.core.states import DEFAULT_UNIQUE_STATES, UNIQUE_STATE_BITS, unique_state_mask
from jobstate.exceptions import InvalidPayload
from jobstate.stores.contracts.validation import DURATION_LIMIT, text_problem
from jobstate.tasks.compat import Task
from jobstate.tasks.options import MAX_ATTEMPTS_LIMIT, TaskOptions

__all__ = [
    "CONCURRENCY_LIMIT_MAX",
    "POLICY_ATTRIBUTE",
    "UNIQUE_KEY_LIMIT",
    "ConcurrencyKey",
    "StoredPolicy",
    "TaskPolicy",
    "UniqueClaim",
    "class_path",
    "policy",
    "policy_of",
    "unique_key",
]

#: The highest ``concurrency_limit``: a claim counts a key's running jobs, at most this many.
CONCURRENCY_LIMIT_MAX = 10_000

#: The attribute of a task's function that holds its :class:`TaskPolicy`.
POLICY_ATTRIBUTE = "__jobstate_policy__"

#: Longest uniqueness key in characters (the job stores it for the console; its digest, indexed).
UNIQUE_KEY_LIMIT = 500

_Declared = TypeVar("_Declared", bound="Callable[..., Any] | Task[Any, Any]")

#: The key :func:`unique_key` gives the enqueues inside its block.
_GIVEN_KEY: ContextVar[str | None] = ContextVar("jobstate_unique_key", default=None)

#: Unset, as opposed to ``None`` (``timeout=None``: no timeout, whatever the backend says).
_UNSET: Any = object()


def class_path(cls: type) -> str:
    """How a policy names an exception class: ``module.QualifiedName``."""
    return f"{cls.__module__}.{cls.__qualname__}"


@dataclass(frozen=True)
class UniqueClaim:
    """What a unique task's job holds: its key (for the console), the digest the index
    compares and the mask of the states it covers."""

    key: str
    digest: str
    states: int


@dataclass(frozen=True)
class ConcurrencyKey:
    """The key a task's job runs under (for the console), its digest (what claims
    compare) and the most jobs of the key that may run at once."""

    key: str
    digest: str
    limit: int


@dataclass(frozen=True)
class TaskPolicy:
    """A task's declared policy (see :func:`policy`); unset fields are ``None`` and come
    from the backend's ``OPTIONS``, except ``timeout``, where :attr:`timeout_set` tells
    an explicit ``None`` (no timeout) from none declared."""

    max_attempts: int | None = None
    timeout: timedelta | None = None
    timeout_set: bool = False
    retry_backoff: timedelta | None = None
    retry_on: tuple[str, ...] | None = None
    discard_on: tuple[str, ...] = ()
    unique: bool | Callable[..., Any] = False
    unique_states: tuple[str, ...] = DEFAULT_UNIQUE_STATES
    unique_for: timedelta | None = None
    concurrency_key: str | Callable[..., Any] | None = None
    concurrency_limit: int | None = None
    atomic: bool = False

    def stored(self) -> dict[str, Any] | None:
        """The JSON kept with each job (``Job.policy``) for the worker; ``None`` when
        nothing but ``max_attempts`` (a column of its own) or uniqueness is declared."""
        stored: dict[str, Any] = {}
        if self.timeout_set:
            stored["timeout"] = None if self.timeout is None else self.timeout.total_seconds()
        if self.retry_backoff is not None:
            stored["retry_backoff"] = self.retry_backoff.total_seconds()
        if self.retry_on is not None:
            stored["retry_on"] = list(self.retry_on)
        if self.discard_on:
            stored["discard_on"] = list(self.discard_on)
        if self.atomic:
            stored["atomic"] = True
        return stored or None

    def concurrency(
        self, task_path: str, args: list[Any], kwargs: dict[str, Any]
    ) -> ConcurrencyKey | None:
        """The concurrency key this enqueue runs under, or ``None`` (no key declared, or
        the key function returned ``None``)."""
        if self.concurrency_key is None:
            return None
        if callable(self.concurrency_key):
            key: Any = self.concurrency_key(*args, **kwargs)
            if key is None:
                return None
        else:
            key = self.concurrency_key
        if not isinstance(key, str | int) or isinstance(key, bool):
            raise TypeError(
                f"the concurrency key of {task_path} must be a str or an int (or None: no "
                f"limit), got {type(key).__name__}."
            )
        key = _check_key(str(key), task_path, what="concurrency key")
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
        return ConcurrencyKey(key=key, digest=digest, limit=self.concurrency_limit or 1)

    def unique_claim(
        self, task_path: str, args: list[Any], kwargs: dict[str, Any], now: datetime
    ) -> UniqueClaim | None:
        """The key this enqueue holds, or ``None`` when it is not unique. ``args`` and
        ``kwargs`` are the JSON the job stores; a key given by :func:`unique_key` comes
        first. ``InvalidPayload`` when the key is not text a job can store."""
        if self.unique is False:
            return None  # a unique_key() block gives a key to unique tasks only
        given = _GIVEN_KEY.get()
        if given is not None:
            key: Any = given
        elif self.unique is True:
            key = json.dumps([args, kwargs], sort_keys=True, separators=(",", ":"))
            if len(key) > UNIQUE_KEY_LIMIT:
                # Long arguments: the digest compares the same, and the console shows this.
                key = f"sha256:{hashlib.sha256(key.encode('utf-8')).hexdigest()}"
        else:
            key = self.unique(*args, **kwargs)
            if key is None:
                return None
        if not isinstance(key, str | int) or isinstance(key, bool):
            raise TypeError(
                f"the unique key of {task_path} must be a str or an int (or None: not "
                f"unique), got {type(key).__name__}."
            )
        key = _check_key(str(key), task_path)
        states = self.unique_states
        scope = ""
        if self.unique_for is not None:
            states = tuple(dict.fromkeys((*states, "SUCCESSFUL", "FAILED")))
            period = int(now.timestamp() // self.unique_for.total_seconds())
            scope = f"period {period} of {self.unique_for.total_seconds():g} s"
        digest = hashlib.sha256("\x00".join((task_path, key, scope)).encode("utf-8")).hexdigest()
        return UniqueClaim(key=key, digest=digest, states=unique_state_mask(states))


def _check_key(key: str, task_path: str, *, what: str = "unique key") -> str:
    if not key:
        raise InvalidPayload(f"the {what} of {task_path} is empty.")
    if len(key) > UNIQUE_KEY_LIMIT:
        raise InvalidPayload(
            f"the {what} of {task_path} has {len(key)} characters; the limit is {UNIQUE_KEY_LIMIT}."
        )
    problem = text_problem(key)
    if problem:
        raise InvalidPayload(f"the {what} of {task_path} {problem}.")
    return key


def policy(
    *,
    max_attempts: int | None = None,
    timeout: timedelta | None = _UNSET,
    retry_backoff: timedelta | None = None,
    retry_on: tuple[type[BaseException], ...] | None = None,
    discard_on: tuple[type[BaseException], ...] = (),
    unique: bool | Callable[..., Any] = False,
    unique_states: tuple[str, ...] | None = None,
    unique_for: timedelta | None = None,
    concurrency_key: str | Callable[..., Any] | None = None,
    concurrency_limit: int | None = None,
    atomic: bool = False,
) -> Callable[[_Declared], _Declared]:
    """Declare a task's policy; place it under ``@task`` (over it works too).

    - ``max_attempts``: attempts before the task fails (``OPTIONS["MAX_ATTEMPTS"]``).
    - ``timeout``: an attempt running longer fails with ``TaskTimedOut``; ``None``: no
      timeout (``OPTIONS["TIMEOUT"]``).
    - ``retry_backoff``: the first retry's delay, doubling per attempt
      (``OPTIONS["RETRY_BACKOFF"]``).
    - ``retry_on``: only these exceptions (and their subclasses) retry; any other fails
      at once. Default: every exception retries while attempts remain.
    - ``discard_on``: these fail at once, never retried (they win over ``retry_on``).
    - ``unique``: ``True`` (the arguments are the key) or a function of the task's
      arguments returning its key (``None``: not unique this time).
    - ``unique_states``: the ``TaskResultStatus`` names the key covers: ``READY`` and
      ``RUNNING`` (the default), with ``SUCCESSFUL`` or ``FAILED`` added if wanted.
    - ``unique_for``: a ``timedelta``; the key also covers the tasks of the same period
      that finished (successful or failed).
    - ``concurrency_key``: a key (or a function of the task's arguments returning one;
      ``None``: no limit this time) shared by the tasks that may not run more than
      ``concurrency_limit`` (default 1) at once, across every worker of the backend.
    - ``atomic``: run the body in a transaction on the worker's database that also
      writes the attempt's success; a failed, interrupted or lost attempt commits
      nothing of what the body wrote. Not for ``async def`` tasks.

    A worker stops a task that overruns its timeout, and a task it retries waits
    ``retry_backoff * 2**(attempt-1)`` (±10 %). The policy is stored with each job when
    it is enqueued; a job keeps its policy whatever code later runs it.
    """
    declared = TaskPolicy(
        max_attempts=_attempts(max_attempts),
        timeout=None if timeout is _UNSET else _duration("timeout", timeout, positive=True),
        timeout_set=timeout is not _UNSET,
        retry_backoff=_duration("retry_backoff", retry_backoff, positive=False),
        retry_on=None if retry_on is None else _exceptions("retry_on", retry_on),
        discard_on=_exceptions("discard_on", discard_on),
        unique=_unique(unique),
        unique_states=_states(unique_states, unique),
        unique_for=_period(unique_for, unique),
        concurrency_key=_concurrency_key(concurrency_key),
        concurrency_limit=_concurrency_limit(concurrency_limit, concurrency_key),
        atomic=_flag("atomic", atomic),
    )

    def declare(target: _Declared) -> _Declared:
        func = target.func if isinstance(target, Task) else target
        if not callable(func):
            raise TypeError(f"@policy decorates a task's function, got {target!r}.")
        if getattr(func, POLICY_ATTRIBUTE, None) is not None:
            raise TypeError(f"{func.__qualname__} already has a @policy.")
        if declared.atomic and iscoroutinefunction(func):
            raise TypeError(
                f"policy(atomic=True) does not take the async task {func.__qualname__}: its "
                "body would run in another thread, outside the attempt's transaction."
            )
        setattr(func, POLICY_ATTRIBUTE, declared)
        return target

    return declare


def policy_of(task: Task[Any, Any]) -> TaskPolicy | None:
    """The policy ``task`` declared with :func:`policy`, or ``None``."""
    found = getattr(task.func, POLICY_ATTRIBUTE, None)
    return found if isinstance(found, TaskPolicy) else None


@contextmanager
def unique_key(key: str) -> Iterator[None]:
    """Give the unique tasks enqueued inside the block this uniqueness key instead of
    the one their ``unique`` computes::

        with unique_key(f"import:{customer.pk}"):
            import_customer.enqueue(customer.pk, full=True)

    Tasks that declare no ``unique`` stay not unique."""
    if not isinstance(key, str) or not key:
        raise TypeError(f"unique_key() takes a non-empty str, got {key!r}.")
    token = _GIVEN_KEY.set(key)
    try:
        yield
    finally:
        _GIVEN_KEY.reset(token)


# --- what the worker reads back -------------------------------------------------------


@dataclass(frozen=True)
class StoredPolicy:
    """A job's stored policy (``Job.policy``) as the worker applies it. Keys it does not
    know (a newer deploy's) are ignored; what is absent comes from ``OPTIONS``."""

    timeout: timedelta | None
    retry_backoff: timedelta
    retry_on: frozenset[str] | None = None
    discard_on: frozenset[str] = frozenset()
    #: The body runs in one transaction with the attempt's report (``atomic=True``).
    atomic: bool = False

    @classmethod
    def of(cls, stored: Mapping[str, Any] | None, options: TaskOptions) -> StoredPolicy:
        """``stored`` over the backend's ``options``."""
        timeout, backoff = options.timeout, options.retry_backoff
        if not stored:
            return _plain_policy(timeout, backoff)  # immutable: those tasks share one
        if "timeout" in stored:
            seconds = stored["timeout"]
            timeout = None if seconds is None else timedelta(seconds=seconds)
        if stored.get("retry_backoff") is not None:
            backoff = timedelta(seconds=stored["retry_backoff"])
        retry_on = stored.get("retry_on")
        return cls(
            timeout=timeout,
            retry_backoff=backoff,
            retry_on=None if retry_on is None else frozenset(retry_on),
            discard_on=frozenset(stored.get("discard_on") or ()),
            atomic=stored.get("atomic") is True,
        )

    def retries(self, error: type[BaseException]) -> bool:
        """Whether an attempt that raised ``error`` may be retried (attempts allowing):
        not when ``discard_on`` names it or a base of it, nor when ``retry_on`` is set
        and names neither."""
        return self.refusal(error) is None

    def refusal(self, error: type[BaseException]) -> str | None:
        """Why an attempt that raised ``error`` may not be retried, in words for the
        worker's log; ``None`` when it may be (attempts allowing)."""
        if self.retry_on is None and not self.discard_on:
            return None
        paths = {class_path(cls) for cls in error.__mro__}
        if paths & self.discard_on:
            return "the task's discard_on names it"
        if self.retry_on is None or paths & self.retry_on:
            return None
        return "the task's retry_on does not name it"


@lru_cache(maxsize=16)
def _plain_policy(timeout: timedelta | None, backoff: timedelta) -> StoredPolicy:
    return StoredPolicy(timeout=timeout, retry_backoff=backoff)


# --- the decorator's checks -------------------------------------------------------------


def _attempts(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"policy(max_attempts=...) takes an int, got {type(value).__name__}.")
    if not 1 <= value <= MAX_ATTEMPTS_LIMIT:
        raise ValueError(
            f"policy(max_attempts=...) must be from 1 to {MAX_ATTEMPTS_LIMIT} (1 = no retry), "
            f"got {value}."
        )
    return value


def _duration(name: str, value: Any, *, positive: bool) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise TypeError(
            f"policy({name}=...) takes a datetime.timedelta or None, got {type(value).__name__}."
        )
    low = timedelta(microseconds=1) if positive else timedelta(0)
    if not low <= value <= DURATION_LIMIT:
        raise ValueError(
            f"policy({name}=...) must be {'positive' if positive else 'zero or more'} and "
            f"at most {DURATION_LIMIT.days} days, got {value!r}."
        )
    return value


def _exceptions(name: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, type):
        value = (value,)
    if not isinstance(value, tuple | list | frozenset | set):
        raise TypeError(
            f"policy({name}=...) takes a tuple of exception classes, got {type(value).__name__}."
        )
    paths = []
    for item in value:
        if not isinstance(item, type) or not issubclass(item, BaseException):
            raise TypeError(f"policy({name}=...) holds {item!r}, which is no exception class.")
        paths.append(class_path(item))
    return tuple(sorted(set(paths)))


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"policy({name}=...) takes True or False, got {type(value).__name__}.")
    return value


def _unique(value: Any) -> bool | Callable[..., Any]:
    if isinstance(value, bool) or callable(value):
        return value
    raise TypeError(
        "policy(unique=...) takes True (the arguments are the key) or a function of the "
        f"task's arguments returning its key, got {type(value).__name__}."
    )


def _states(value: Any, unique: Any) -> tuple[str, ...]:
    if value is None:
        return DEFAULT_UNIQUE_STATES
    if unique is False:
        raise ValueError("policy(unique_states=...) needs unique=...: the task is not unique.")
    if isinstance(value, str) or not isinstance(value, tuple | list | frozenset | set):
        raise TypeError(
            f"policy(unique_states=...) takes a tuple of names, got {type(value).__name__}."
        )
    names = [str(getattr(item, "name", item)) for item in value]
    unknown = [name for name in names if name not in UNIQUE_STATE_BITS]
    if unknown:
        raise ValueError(
            f"policy(unique_states=...) takes names among {', '.join(UNIQUE_STATE_BITS)}; "
            f"{', '.join(map(repr, unknown))} is none of them."
        )
    if not set(DEFAULT_UNIQUE_STATES) <= set(names):
        # A task keeps its key from enqueue to its end: a retry, or a lost attempt put back
        # in the queue, must never meet a duplicate enqueued while it ran.
        raise ValueError(
            "policy(unique_states=...) must include READY and RUNNING (a task holds its key "
            "until it ends); add SUCCESSFUL or FAILED to keep it longer, got "
            f"{list(value)!r}."
        )
    return tuple(dict.fromkeys(names))


def _concurrency_key(value: Any) -> str | Callable[..., Any] | None:
    if value is None or callable(value):
        return value
    if value == "":
        raise ValueError("policy(concurrency_key=...) is empty: give a key, or leave it out.")
    if isinstance(value, str):
        return _check_key(value, "this task", what="concurrency key")
    raise TypeError(
        "policy(concurrency_key=...) takes a non-empty str or a function of the task's "
        f"arguments returning its key, got {type(value).__name__}."
    )


def _concurrency_limit(value: Any, key: Any) -> int | None:
    if value is None:
        return None
    if key is None:
        raise ValueError(
            "policy(concurrency_limit=...) needs concurrency_key=...: a limit per key."
        )
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"policy(concurrency_limit=...) takes an int, got {type(value).__name__}.")
    if not 1 <= value <= CONCURRENCY_LIMIT_MAX:
        raise ValueError(
            f"policy(concurrency_limit=...) must be from 1 to {CONCURRENCY_LIMIT_MAX}, got {value}."
        )
    return value


def _period(value: Any, unique: Any) -> timedelta | None:
    if value is None:
        return None
    if unique is False:
        raise ValueError("policy(unique_for=...) needs unique=...: the task is not unique.")
    period = _duration("unique_for", value, positive=True)
    if period is not None and period < timedelta(seconds=1):
        raise ValueError(f"policy(unique_for=...) must be at least one second, got {value!r}.")
    return period
