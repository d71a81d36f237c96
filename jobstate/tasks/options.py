"""The ``OPTIONS`` and ``QUEUES`` of a ``JobStateBackend``: their defaults, their checks
(the backend's system check reports every problem at start-up), and the retry delays
they give.

``OPTIONS`` (all optional):

- ``MAX_ATTEMPTS`` (int, default 1): attempts a task makes before it is ``FAILED``;
  1 means no retry.
- ``RETRY_BACKOFF`` (timedelta, default 10 s): the delay before attempt k+1 is
  ``RETRY_BACKOFF * 2**(k-1)``, with ±10 % jitter, at most an hour (or
  ``RETRY_BACKOFF`` itself, when that is longer).
- ``LEASE`` (timedelta, default 5 minutes): how long a claimed task stays its worker's
  without a renewal; a worker renews its tasks' leases several times per ``LEASE``,
  and a task whose lease ran out is recovered as a lost attempt.
- ``TIMEOUT`` (timedelta or None, default None): an attempt running longer is
  interrupted and fails with :class:`~jobstate.exceptions.TaskTimedOut`.
- ``UNKNOWN_TASK_TIMEOUT`` (timedelta or None, default one hour): a worker that cannot
  import a task's dotted path hands the task back, uncounted, for a worker with newer
  code; once the task was enqueued longer ago than this, it fails instead with
  :class:`~jobstate.exceptions.UnknownTask`. ``None``: it is handed back for ever.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from jobstate.stores.contracts.validation import DURATION_LIMIT, text_problem

__all__ = [
    "OPTION_DEFAULTS",
    "QUEUE_NAME_LIMIT",
    "RETRY_BACKOFF_CAP",
    "TaskOptions",
    "option_problems",
    "parse_task_options",
    "queue_problems",
]

#: Every option a backend takes, with its default.
OPTION_DEFAULTS: dict[str, Any] = {
    "MAX_ATTEMPTS": 1,
    "RETRY_BACKOFF": timedelta(seconds=10),
    "LEASE": timedelta(minutes=5),
    "TIMEOUT": None,
    "UNKNOWN_TASK_TIMEOUT": timedelta(hours=1),
}

#: Longest retry delay, unless ``RETRY_BACKOFF`` itself is longer.
RETRY_BACKOFF_CAP = timedelta(hours=1)

#: Shortest ``LEASE``: a worker renews several times per lease, one statement each.
LEASE_MINIMUM = timedelta(seconds=1)

#: Most attempts a task may make (the attempt log keeps one entry per attempt).
MAX_ATTEMPTS_LIMIT = 1000

#: Longest queue name (the ``Job.queue_name`` column).
QUEUE_NAME_LIMIT = 100

#: How much a retry delay varies either way, so tasks that failed together do not all
#: come back in the same instant.
_JITTER = 0.1

#: How often a worker renews its leases: this many times per ``LEASE``, so two renewals
#: in a row can fail before a running task's lease runs out.
_BEATS_PER_LEASE = 4

#: Longest wait between two renewals, whatever the lease.
_BEAT_CAP = timedelta(seconds=60)


@dataclass(frozen=True)
class TaskOptions:
    """A backend's checked ``OPTIONS``."""

    max_attempts: int = OPTION_DEFAULTS["MAX_ATTEMPTS"]
    retry_backoff: timedelta = OPTION_DEFAULTS["RETRY_BACKOFF"]
    lease: timedelta = OPTION_DEFAULTS["LEASE"]
    timeout: timedelta | None = OPTION_DEFAULTS["TIMEOUT"]
    unknown_task_timeout: timedelta | None = OPTION_DEFAULTS["UNKNOWN_TASK_TIMEOUT"]
    _random: random.Random = field(default_factory=random.Random, repr=False, compare=False)

    @property
    def beat(self) -> timedelta:
        """How often a worker renews the leases of the tasks it runs."""
        return min(self.lease / _BEATS_PER_LEASE, _BEAT_CAP)

    def retry_delay(self, failed_attempt: int, backoff: timedelta | None = None) -> timedelta:
        """The wait before the attempt after ``failed_attempt`` (1 for the first):
        ``backoff * 2**(failed_attempt-1)``, ±10 %, capped; ``backoff`` is the task's
        policy's, or ``RETRY_BACKOFF``."""
        backoff = self.retry_backoff if backoff is None else backoff
        cap = max(RETRY_BACKOFF_CAP, backoff)
        # 2**40 times any backoff is past the cap, and bounds the float below.
        doublings = min(max(failed_attempt, 1) - 1, 40)
        base = backoff.total_seconds() * 2**doublings
        jittered = base * self._random.uniform(1 - _JITTER, 1 + _JITTER)
        return min(timedelta(seconds=jittered), cap)


def option_problems(options: Any) -> list[str]:
    """Every problem of an ``OPTIONS`` value, one sentence each; ``[]`` when it is good."""
    if not isinstance(options, Mapping):
        return [f"OPTIONS must be a dict, got {type(options).__name__}."]
    problems = []
    unknown = sorted(str(name) for name in options if name not in OPTION_DEFAULTS)
    if unknown:
        problems.append(
            f"OPTIONS has unknown key(s) {', '.join(unknown)}; known: {', '.join(OPTION_DEFAULTS)}."
        )
    attempts = options.get("MAX_ATTEMPTS", OPTION_DEFAULTS["MAX_ATTEMPTS"])
    if (
        isinstance(attempts, bool)
        or not isinstance(attempts, int)
        or not 1 <= attempts <= MAX_ATTEMPTS_LIMIT
    ):
        problems.append(
            f"OPTIONS['MAX_ATTEMPTS'] must be an int from 1 to {MAX_ATTEMPTS_LIMIT} "
            f"(1 = no retry), got {attempts!r}."
        )
    backoff = options.get("RETRY_BACKOFF", OPTION_DEFAULTS["RETRY_BACKOFF"])
    if not _duration(backoff, minimum=timedelta(0)):
        problems.append(
            "OPTIONS['RETRY_BACKOFF'] must be a datetime.timedelta of zero or more "
            f"(at most {DURATION_LIMIT.days} days), got {backoff!r}."
        )
    lease = options.get("LEASE", OPTION_DEFAULTS["LEASE"])
    if not _duration(lease, minimum=LEASE_MINIMUM):
        problems.append(
            "OPTIONS['LEASE'] must be a datetime.timedelta of at least "
            f"{LEASE_MINIMUM.total_seconds():g} second, got {lease!r}."
        )
    timeout = options.get("TIMEOUT", OPTION_DEFAULTS["TIMEOUT"])
    if timeout is not None and not _duration(timeout, minimum=timedelta(microseconds=1)):
        problems.append(
            f"OPTIONS['TIMEOUT'] must be None or a positive datetime.timedelta, got {timeout!r}."
        )
    unknown_task = options.get("UNKNOWN_TASK_TIMEOUT", OPTION_DEFAULTS["UNKNOWN_TASK_TIMEOUT"])
    if unknown_task is not None and not _duration(unknown_task, minimum=timedelta(0)):
        problems.append(
            "OPTIONS['UNKNOWN_TASK_TIMEOUT'] must be None or a datetime.timedelta of zero or "
            f"more (at most {DURATION_LIMIT.days} days), got {unknown_task!r}."
        )
    return problems


def queue_problems(queues: Iterable[Any]) -> list[str]:
    """Every problem of a backend's ``QUEUES``: each name must be a non-empty string a
    worker's ``--queue-name`` can name (no comma, not ``*``) and the queue column holds."""
    problems = []
    for name in queues:
        if not isinstance(name, str) or not name.strip():
            problems.append(f"QUEUES holds {name!r}; a queue name is a non-empty string.")
        elif name == "*" or "," in name:
            problems.append(
                f"QUEUES holds {name!r}; a queue name cannot be '*' or contain a comma "
                "(jobstate_worker --queue-name reads them as 'every queue' and a list)."
            )
        elif len(name) > QUEUE_NAME_LIMIT:
            problems.append(
                f"QUEUES holds a name of {len(name)} characters; the limit is {QUEUE_NAME_LIMIT}."
            )
        elif problem := text_problem(name):
            problems.append(f"QUEUES holds {name!r}, which {problem}.")
    return problems


def parse_task_options(options: Mapping[str, Any]) -> TaskOptions:
    """``options`` as :class:`TaskOptions`; ``ImproperlyConfigured`` naming every problem."""
    problems = option_problems(options)
    if problems:
        raise ImproperlyConfigured(" ".join(problems))
    values = {**OPTION_DEFAULTS, **options}
    return TaskOptions(
        max_attempts=values["MAX_ATTEMPTS"],
        retry_backoff=values["RETRY_BACKOFF"],
        lease=values["LEASE"],
        timeout=values["TIMEOUT"],
        unknown_task_timeout=values["UNKNOWN_TASK_TIMEOUT"],
    )


def _duration(value: Any, *, minimum: timedelta) -> bool:
    return isinstance(value, timedelta) and minimum <= value <= DURATION_LIMIT
