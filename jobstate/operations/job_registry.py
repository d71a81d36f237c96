"""The registry of operations jobs and the ``@operations_job`` decorator.

An operations job is a named piece of maintenance work (closing a business day, building
a report). This module only knows what jobs exist and how their input is checked;
:mod:`jobstate.operations.job_runner` executes them.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from importlib import import_module
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast, get_args

from django.utils.module_loading import autodiscover_modules

from jobstate.core.conf import jobstate_settings
from jobstate.exceptions import (
    DuplicateJobKey,
    InvalidJobKey,
    InvalidOperationsJob,
    OperationsJobInputError,
    UnknownOperationsJob,
)
from jobstate.stores.contracts.validation import DURATION_LIMIT

# The context module imports neither this module nor the runner, so the body's type
# needs no import back from the runner that executes it.
if TYPE_CHECKING:
    from jobstate.operations.run_context import RunContext

__all__ = [
    "JOB_KEY_PATTERN",
    "MAX_JOB_KEY_LENGTH",
    "InputSchema",
    "JobBody",
    "OperationsJob",
    "OverlapPolicy",
    "Registry",
    "operations_job",
    "operations_module_problems",
    "registry",
]

#: ``domain.action``: lower-case letters, digits and hyphens on both sides of one dot.
JOB_KEY_PATTERN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*\.[a-z0-9]+(?:-[a-z0-9]+)*")
MAX_JOB_KEY_LENGTH = 100

OverlapPolicy = Literal["forbid", "allow"]


class InputSchema(Protocol):
    """Anything with ``parse(value) -> parsed`` that raises when it rejects ``value``
    (a pydantic ``TypeAdapter``, a form-like class, a hand-written validator)."""

    def parse(self, value: Any, /) -> Any: ...


#: A job body: called with the run context and the parsed input; a ``dict`` it returns
#: becomes the run's summary (``{"ok": False, ...}`` marks the run FAILED).
JobBody = Callable[["RunContext", Any], object]
_Body = TypeVar("_Body", bound=JobBody)


def _short_repr(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class OperationsJob:
    """A registered operations job. Validated on construction: a malformed definition
    raises :class:`InvalidOperationsJob` (or :class:`InvalidJobKey`) at import time.

    ``input_schema`` is an object with ``parse(value)`` or a plain callable; it gets the
    caller's input (``None`` and ``{}`` both arrive as ``{}``) and returns what the body
    receives, or raises to reject it. A job without a schema takes no input and its
    body receives ``None``.
    """

    key: str
    func: JobBody
    description: str = ""
    overlap: OverlapPolicy = "forbid"
    timeout: timedelta | None = None
    input_schema: InputSchema | Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        if (
            not isinstance(self.key, str)
            or len(self.key) > MAX_JOB_KEY_LENGTH
            or not JOB_KEY_PATTERN.fullmatch(self.key)
        ):
            raise InvalidJobKey(
                f"Operations job key {_short_repr(self.key)} must look like 'domain.action' "
                "(lower-case letters, digits and hyphens on both sides of one dot, at most "
                f"{MAX_JOB_KEY_LENGTH} characters)."
            )
        if not callable(self.func):
            raise InvalidOperationsJob(f"{self.key}: the job body must be callable.")
        if self.overlap not in get_args(OverlapPolicy):
            raise InvalidOperationsJob(
                f"{self.key}: overlap must be 'forbid' or 'allow', got {self.overlap!r}."
            )
        if self.timeout is not None and (
            not isinstance(self.timeout, timedelta) or self.timeout <= timedelta(0)
        ):
            raise InvalidOperationsJob(
                f"{self.key}: timeout must be a positive datetime.timedelta or None, "
                f"got {self.timeout!r}."
            )
        # A run's deadline is its start plus the timeout: past the longest duration a
        # store accepts it would not be a date at all, and a run would fail after its
        # row was written.
        if self.timeout is not None and self.timeout > DURATION_LIMIT:
            raise InvalidOperationsJob(
                f"{self.key}: timeout must be at most {DURATION_LIMIT.days} days, "
                f"got {self.timeout}."
            )
        schema = self.input_schema
        if schema is not None and not (
            callable(getattr(schema, "parse", None)) or callable(schema)
        ):
            raise InvalidOperationsJob(
                f"{self.key}: input_schema must have a parse(value) method or be callable."
            )
        if not isinstance(self.description, str):
            raise InvalidOperationsJob(f"{self.key}: description must be a string.")

    def parse_input(self, value: Any) -> Any:
        """Return the value the body receives, or raise :class:`OperationsJobInputError`."""
        empty = value is None or (isinstance(value, dict) and not value)
        schema = self.input_schema
        if schema is None:
            if not empty:
                raise OperationsJobInputError(
                    f"{self.key} takes no input, got {_short_repr(value)}."
                )
            return None
        parse = getattr(schema, "parse", None)
        parser = cast(Callable[[Any], Any], parse if callable(parse) else schema)
        try:
            return parser({} if empty else value)
        # A schema rejects by raising, and the exception type is the schema's own
        # (ValueError, pydantic's ValidationError, ...), so every Exception means "rejected".
        except Exception as exc:
            raise OperationsJobInputError(f"{self.key} rejected its input: {exc}") from exc


class Registry:
    """The operations jobs a process knows, by key.

    ``get``, ``keys`` and iteration first run :meth:`autodiscover` (once), so a registry
    is complete however the process started (a management command, a Celery worker,
    a web request).
    """

    def __init__(self) -> None:
        self._jobs: dict[str, OperationsJob] = {}
        self._lock = threading.Lock()
        # A separate, re-entrant lock: the modules autodiscover imports call register().
        self._discover_lock = threading.RLock()
        self._discovered = False
        self._discovering = False

    def register(self, job: OperationsJob) -> OperationsJob:
        """Add ``job``. A second, different job under the same key raises
        :class:`DuplicateJobKey`; registering an identical definition again is a no-op."""
        if not isinstance(job, OperationsJob):
            raise InvalidOperationsJob(f"register() takes an OperationsJob, got {job!r}.")
        with self._lock:
            existing = self._jobs.get(job.key)
            if existing is not None and existing != job:
                raise DuplicateJobKey(
                    f"Duplicate operations job key {job.key!r}: already registered by "
                    f"{_describe(existing.func)}, claimed again by {_describe(job.func)}."
                )
            self._jobs[job.key] = job
        return job

    def unregister(self, key: str) -> None:
        """Remove the job registered under ``key`` (raises :class:`UnknownOperationsJob`)."""
        with self._lock:
            if key not in self._jobs:
                raise UnknownOperationsJob(f"No operations job is registered as {key!r}.")
            del self._jobs[key]

    def get(self, key: str) -> OperationsJob:
        """Return the job registered under ``key`` or raise :class:`UnknownOperationsJob`."""
        self.autodiscover()
        with self._lock:
            job = self._jobs.get(key) if isinstance(key, str) else None
            known = sorted(self._jobs)
        if job is None:
            raise UnknownOperationsJob(
                f"No operations job is registered as {_short_repr(key)}. "
                f"Known jobs: {', '.join(known) or '(none)'}."
            )
        return job

    def keys(self) -> list[str]:
        """The registered keys, sorted."""
        self.autodiscover()
        with self._lock:
            return sorted(self._jobs)

    def __iter__(self) -> Iterator[OperationsJob]:
        self.autodiscover()
        with self._lock:
            jobs = [self._jobs[key] for key in sorted(self._jobs)]
        return iter(jobs)

    def __contains__(self, key: object) -> bool:
        self.autodiscover()
        with self._lock:
            return key in self._jobs

    def __len__(self) -> int:
        self.autodiscover()
        with self._lock:
            return len(self._jobs)

    def autodiscover(self) -> None:
        """Import the modules that declare jobs, once per registry: every module named in
        ``JOBSTATE["OPERATIONS_JOB_MODULES"]``, then the ``operations`` module of every
        installed app that has one (as ``django.contrib.admin`` does for ``admin``).
        An import error inside such a module propagates; it is never swallowed."""
        with self._discover_lock:
            if self._discovered or self._discovering:
                return
            self._discovering = True
            try:
                for name in jobstate_settings.OPERATIONS_JOB_MODULES:
                    import_module(name)
                autodiscover_modules("operations")
                self._discovered = True
            finally:
                self._discovering = False


def operations_module_problems() -> list[str]:
    """One sentence per module of ``JOBSTATE["OPERATIONS_JOB_MODULES"]`` that does not
    import (the system check ``jobstate.E002``, and ``run_operations_job`` before it
    lists or runs a job). Importing one registers its jobs, as autodiscovery would."""
    problems = []
    for name in jobstate_settings.OPERATIONS_JOB_MODULES:
        try:
            import_module(name)
        # Whatever a module raises as it runs means it does not import: an
        # ImportError, or a declaration refused as it registers (InvalidJobKey...).
        except Exception as exc:
            problems.append(
                f"JOBSTATE['OPERATIONS_JOB_MODULES'] names {name!r}, which does not import: "
                f"{type(exc).__name__}: {exc}."
            )
    return problems


def _describe(func: object) -> str:
    module = getattr(func, "__module__", None) or "?"
    name = getattr(func, "__qualname__", None) or repr(func)
    return f"{module}.{name}"


#: The process-wide registry that :func:`operations_job` fills by default.
registry = Registry()


def operations_job(
    key: str,
    *,
    overlap: OverlapPolicy = "forbid",
    timeout: timedelta | None = None,
    input_schema: InputSchema | Callable[[Any], Any] | None = None,
    description: str = "",
    registry: Registry = registry,
) -> Callable[[_Body], _Body]:
    """Register the decorated function as the body of operations job ``key``.

    The function is returned unchanged (so it stays directly callable in tests). Its
    docstring's first line is the description unless ``description`` is given.
    ``timeout=None`` uses ``JOBSTATE["DEFAULT_JOB_TIMEOUT"]``.
    """

    def decorator(func: _Body) -> _Body:
        doc = (getattr(func, "__doc__", None) or "").strip()
        registry.register(
            OperationsJob(
                key=key,
                func=func,
                description=description or (doc.splitlines()[0] if doc else ""),
                overlap=overlap,
                timeout=timeout,
                input_schema=input_schema,
            )
        )
        return func

    return decorator
