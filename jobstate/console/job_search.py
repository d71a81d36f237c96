"""Which jobs a filter of the jobs list means: its filter parameters and its search.

The jobs list (``jobstate.admin``) and the bulk operations over a filter
(:mod:`jobstate.console.bulk`) both narrow jobs through this module, so "all matching" is
exactly what the list shows.

Search syntax: whitespace-separated terms, all of which must match. A term is
``field:value``; a value with spaces is written in double quotes (``error:"connection
refused"``). A term without a field is an exact job id, request id or thread number.

=====================  ================================================================
``task:app.tasks.send`` the task's dotted path, exactly; ``task:app.tasks.*`` a prefix
``queue:emails``        the task's queue, exactly
``error:TimeoutError``  the job's error, or the error of any of its attempts, contains it
                        (a class path, words of the message or of the traceback)
``input:customer=42``   ``input`` holds that key with that value (``42``, ``"42"``,
                        ``true``, ``null``); ``a.b=1`` is a nested key
``worker:w-1``          the executor or worker holding it, or a worker of an attempt
``key:import:7``        a task's uniqueness or concurrency key
                        (``jobstate.tasks.policy``), exactly
=====================  ================================================================

``input:`` means the same on every backend: containment of ``{key: value}`` (nested
along a dotted path) in the input, with one value per term: a number (compared as a
number, ``1`` = ``1.0``), a string (exactly, case and all), ``true``, ``false`` or
``null`` (a key present with null). The path goes through objects only, and a value
inside a list is not the key's value. PostgreSQL runs it as ``input @> ...``; SQLite
and MariaDB/MySQL compare the value at the path with its JSON type (their own
containment differs: none on SQLite, a value inside a list matches on MariaDB).

A search or filter value the list cannot read (a NUL character, a lone surrogate, a
bad escape, NaN or a number out of range) raises :class:`SearchError` with a message
for the operator; it never reaches the database.

Speed at millions of rows: a bare id / request id / thread term uses the primary key,
the unique request id and the thread index; ``input:`` on PostgreSQL is a JSONB
containment (``input @> ...``) served by the ``jobstate_job_input_gin_idx`` GIN index.
The other terms (and ``input:`` elsewhere) no index serves; they look only at the newest
:data:`RECENT_SEARCH_WINDOW` jobs, so a page never reads more than that.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Q, QuerySet, TextField, Value
from django.db.models.functions import Cast, Now

from jobstate.console.hidden_matches import HiddenMatchesError, without_hidden_matches
from jobstate.console.redaction import redacted_keys
from jobstate.core.states import CLAIMED_JOB_STATUSES, JobStatus
from jobstate.exceptions import JobStateError
from jobstate.models import Job
from jobstate.stores.contracts.validation import column_limit
from jobstate.stores.database.backends import BackendOperations, database_ops

__all__ = [
    "FILTER_PARAMETERS",
    "RECENT_SEARCH_WINDOW",
    "SEARCH_FIELDS",
    "SEARCH_PARAMETER",
    "JobSearch",
    "SearchError",
    "apply_job_filter",
    "attempted_by",
    "bounded_search",
    "db_instant",
    "filter_jobs",
    "parse_search",
    "recent_window_start",
    "shortened",
    "unreadable_text",
]

#: How many of the newest jobs a search term that no index serves looks at.
RECENT_SEARCH_WINDOW = 100_000

#: How much of a value a message repeats: a URL may carry thousands of characters.
SHOWN_AT_MOST = 80

#: The longest search a console list accepts.
SEARCH_LIMIT = 500

#: The list's search parameter (Django admin's ``q``).
SEARCH_PARAMETER = "q"

#: The search fields and what each one searches, for the help text.
SEARCH_FIELDS = {
    "task": "the task's dotted path (exact, or a prefix ending in *)",
    "queue": "the task's queue",
    "error": "text in the job's error or in an attempt's error",
    "input": "a key=value inside the input (one JSON value; a.b for a nested key)",
    "worker": "the executor or worker id, now or in an attempt",
    "key": "a task's uniqueness or concurrency key, exactly",
}

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class SearchError(JobStateError, ValueError):
    """A search or filter a console list cannot read; the message says why."""


def bounded_search(term: str) -> str:
    """``term`` without the spaces around it; :class:`SearchError` when it is longer
    than :data:`SEARCH_LIMIT`. Every console list checks its search here before any
    query: a pasted page of text matches no row, and would otherwise list nothing
    without a word (or be compared with every row, on a list that matches parts)."""
    term = term.strip()
    if len(term) > SEARCH_LIMIT:
        raise SearchError(f"A search is at most {SEARCH_LIMIT} characters.")
    return term


def unreadable_text(text: str) -> str | None:
    """Why no database column can hold ``text`` (a NUL character, which PostgreSQL
    refuses in text and JSON; a lone surrogate, which is not UTF-8), or ``None``."""
    if "\x00" in text:
        return "it holds a NUL character"
    if any("\ud800" <= char <= "\udfff" for char in text):
        return "it holds a lone surrogate, which is not text"
    return None


def shortened(value: str, limit: int = SHOWN_AT_MOST) -> str:
    """``value`` as a message repeats it: whole when it is at most ``limit`` characters,
    else its first ``limit`` and an ellipsis."""
    return value if len(value) <= limit else f"{value[:limit]}…"


def _readable(text: str, what: str) -> str:
    why = unreadable_text(text)
    if why is not None:
        raise SearchError(f"Cannot search for {what}: {why}.")
    return text


# --- filter parameters -------------------------------------------------------------------


def _exact(parameter: str, field_name: str) -> Callable[[QuerySet[Job], str], QuerySet[Job]]:
    def narrow(rows: QuerySet[Job], value: str) -> QuerySet[Job]:
        longest = column_limit("Job", field_name)
        if longest is not None and len(value) > longest:
            # No job holds it; the pages repeating the filter would be that wide.
            raise SearchError(f"{parameter} must be at most {longest} characters.")
        return rows.filter(**{field_name: value})

    return narrow


def _status(rows: QuerySet[Job], value: str) -> QuerySet[Job]:
    if value not in JobStatus.values:
        raise SearchError(f"Unknown status {shortened(value)!r}.")
    return rows.filter(status=value)


def _lease(rows: QuerySet[Job], value: str) -> QuerySet[Job]:
    claimed = rows.filter(status__in=list(CLAIMED_JOB_STATUSES))
    if value == "expired":
        return claimed.filter(lease_until__lt=Now())
    if value == "held":
        return claimed.filter(lease_until__gte=Now())
    raise SearchError(f"Unknown lease filter {shortened(value)!r}.")


def _delayed(rows: QuerySet[Job], value: str) -> QuerySet[Job]:
    if value == "yes":
        return rows.filter(status=JobStatus.QUEUED, run_after__gt=Now())
    if value == "no":
        return rows.filter(status=JobStatus.QUEUED).filter(
            Q(run_after__isnull=True) | Q(run_after__lte=Now())
        )
    raise SearchError(f"Unknown delay filter {shortened(value)!r}.")


#: The jobs list's filter parameters (as they appear in its URL) and what each does.
FILTER_PARAMETERS: dict[str, Callable[[QuerySet[Job], str], QuerySet[Job]]] = {
    "status__exact": _status,
    "target": _exact("target", "target"),
    "task": _exact("task", "task_path"),
    "queue": _exact("queue", "queue_name"),
    "source": _exact("source", "source"),
    "lease": _lease,
    "delayed": _delayed,
}


def apply_job_filter(rows: QuerySet[Job], parameter: str, value: str) -> QuerySet[Job]:
    """``rows`` narrowed by one filter parameter of the jobs list."""
    why = unreadable_text(value)
    if why is not None:
        raise SearchError(f"Cannot filter by {parameter}: {why}.")
    return FILTER_PARAMETERS[parameter](rows, value)


# --- search ------------------------------------------------------------------------------

_TERM = re.compile(r'\s*(?:(?P<field>[a-z]+):)?(?P<value>(?:"(?:[^"\\]|\\.)*"|[^\s"])+)\s*')
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


#: The largest integer ``input:`` compares (64 bits, what every backend's JSON holds).
_INT_LIMIT = 2**63


def _unquote(text: str) -> str:
    """``text`` with each double-quoted segment replaced by its content (JSON string
    escapes: ``\\"``, ``\\\\``, ``\\n``, ``\\u00e9`` ...)."""

    def content(match: re.Match[str]) -> str:
        try:
            return str(json.loads(match.group(0)))
        except ValueError as exc:
            raise SearchError(
                f"Cannot read {match.group(0)[:40]}: a backslash in quotes starts an escape "
                '(\\" \\\\ \\n \\uXXXX); write \\\\ for a backslash.'
            ) from exc

    return _QUOTED.sub(content, text)


def _no_constant(name: str) -> Any:
    raise SearchError(f'input: {name} is not a JSON value; quote it ("{name}") to find the text.')


def _json_value(text: str) -> Any:
    """A value of ``input:key=value``: JSON when it reads as JSON, else the text. One
    value: a number, a string, true, false or null."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except SearchError:
        raise
    except ValueError:
        value = _unquote(text)
    if isinstance(value, (list, dict)):
        raise SearchError(
            f"input: takes a single value (a number, a string, true, false or null), not "
            f"{text[:40]}; name a nested key with a dotted path: input:order.id=7."
        )
    if isinstance(value, float) and not math.isfinite(value):
        raise SearchError(f"input: the number {text[:40]} is out of range.")
    if type(value) is int and not -_INT_LIMIT <= value < _INT_LIMIT:
        raise SearchError(f"input: the number {text[:40]} is out of range (64 bits).")
    if isinstance(value, str):
        _readable(value, "that input value")
    return value


@dataclass(frozen=True)
class JobSearch:
    """A parsed search: a condition per term, and whether some term needs the recent
    window (no index serves it)."""

    exact: str = ""
    """A term without a field: an exact id, request id or thread number."""
    conditions: list[tuple[str, Any]] = field(default_factory=list)
    """``(field, value)`` per term with a field, in the order given."""

    def needs_window(self, using: str) -> bool:
        """Whether some term no index serves on database ``using``, so the search reads
        only the newest :data:`RECENT_SEARCH_WINDOW` jobs."""
        indexed = database_ops(using).indexes_input_search
        return any(name != "input" or not indexed for name, _v in self.conditions)

    def apply(self, rows: QuerySet[Job], *, window_start: datetime | None = None) -> QuerySet[Job]:
        """``rows`` narrowed to this search. Terms no index serves are limited to jobs
        created at or after ``window_start`` (default: :func:`recent_window_start` now)."""
        ops = database_ops(rows.db)
        if self.exact:
            rows = _exact_identity(rows, self.exact)
        for name, value in self.conditions:
            rows = _SEARCHES[name](rows, value, ops)
        if self.needs_window(rows.db):
            start = window_start if window_start is not None else recent_window_start(rows.db)
            rows = rows.filter(created_at__gte=db_instant(rows.db, start))
        return rows


def parse_search(term: str) -> JobSearch:
    """Read a search of the jobs list; :class:`SearchError` when it is malformed."""
    term = bounded_search(_readable(term, "that"))
    if len(re.findall(r'(?<!\\)"', term)) % 2:
        raise SearchError("A quote is not closed.")
    exact = ""
    conditions: list[tuple[str, Any]] = []
    position = 0
    while position < len(term):
        match = _TERM.match(term, position)
        if match is None or match.end() == position:
            raise SearchError(
                f"Cannot read the search from {term[position:][:40]!r}: a quote is not closed."
            )
        position = match.end()
        name, value = match.group("field"), match.group("value")
        if name is None:
            if re.fullmatch(r"[a-z]+:", value):
                raise SearchError(f"{shortened(value)} needs a value.")
            if exact:
                raise SearchError(
                    "Only one bare term (an id, request id or thread) per search; "
                    "give the others a field, such as task: or error:."
                )
            exact = _readable(_unquote(value), "that")
            continue
        if name not in SEARCH_FIELDS:
            known = ", ".join(f"{known}:" for known in SEARCH_FIELDS)
            raise SearchError(f"Unknown search field {shortened(name)!r}; the fields are {known}.")
        conditions.append((name, _parse_value(name, value)))
    return JobSearch(exact=exact, conditions=conditions)


def _parse_value(name: str, raw: str) -> Any:
    if name != "input":
        value = _readable(_unquote(raw), f"{name}:")
        if not value:
            raise SearchError(f"{name}: needs a value.")
        return value
    key, equals, value_text = raw.partition("=")
    key = _readable(_unquote(key), "that input key")
    if not equals or not key or not value_text:
        raise SearchError("input: takes key=value, for example input:customer=42.")
    if '"' in key or "\\" in key:
        raise SearchError(f"The input key {shortened(key)!r} holds a double quote or a backslash.")
    path = key.split(".")
    if any(not part for part in path):
        raise SearchError(f"The input key {shortened(key)!r} has an empty part.")
    hidden = redacted_keys()
    if any(part.casefold() in hidden for part in path):
        # The console hides these values; a search could confirm a guess of one.
        raise SearchError(
            f"input: cannot search under {shortened(key)!r}: the console hides the values of "
            "JOBSTATE['ADMIN_REDACTED_KEYS']."
        )
    contained: Any = _json_value(value_text)
    for part in reversed(path):
        contained = {part: contained}
    return contained


def _exact_identity(rows: QuerySet[Job], term: str) -> QuerySet[Job]:
    """Jobs whose id, request id or thread number is exactly ``term`` (each served by
    an index)."""
    condition = Q()
    with contextlib.suppress(ValueError):
        condition |= Q(id=uuid.UUID(term))
    try:
        as_int = int(term)
    except ValueError:
        pass
    else:
        if -(2**63) <= as_int < 2**63:
            condition |= Q(thread_id=as_int)
    if len(term) <= 200:
        condition |= Q(request_id=term)
    return rows.filter(condition) if condition else rows.none()


def _task(rows: QuerySet[Job], value: str, ops: BackendOperations) -> QuerySet[Job]:
    if value.endswith("*"):
        return rows.filter(task_path__startswith=value[:-1])
    return rows.filter(task_path=value)


def _queue(rows: QuerySet[Job], value: str, ops: BackendOperations) -> QuerySet[Job]:
    return rows.filter(queue_name=value)


def _error(rows: QuerySet[Job], value: str, ops: BackendOperations) -> QuerySet[Job]:
    # The job's ``error`` holds the last failure only; each earlier one is in its attempt
    # log. The log is searched as its JSON text, where the value appears escaped as JSON
    # escapes it: with its non-ASCII characters as they are (PostgreSQL's jsonb text,
    # MySQL's) or as \uXXXX (what Django writes on SQLite and MariaDB).
    rows = rows.annotate(_jobstate_attempt_text=Cast("attempt_log", TextField()))
    matched = rows.filter(Q(error__contains=value) | _in_text("_jobstate_attempt_text", value))
    try:
        return without_hidden_matches(matched, value)
    except HiddenMatchesError as exc:
        raise SearchError(str(exc)) from exc


def _in_text(field_name: str, value: str) -> Q:
    """``value`` in a JSON column read as text, as either JSON escaping writes it."""
    found = Q()
    for ascii_only in (False, True):
        escaped = json.dumps(value, ensure_ascii=ascii_only)[1:-1]
        found |= Q(**{f"{field_name}__contains": escaped})
    return found


def _input(rows: QuerySet[Job], value: dict[str, Any], ops: BackendOperations) -> QuerySet[Job]:
    # On PostgreSQL input @> value, served by the GIN index; elsewhere the JSON functions
    # of the backend, answering as @> would.
    return ops.filter_input(rows, value)


def attempted_by(rows: QuerySet[Job], worker_id: str) -> QuerySet[Job]:
    """``rows`` narrowed to the jobs ``worker_id`` holds now or made an attempt of (as
    its attempt log records it): the ``worker:`` term."""
    return _worker(rows, worker_id, database_ops(rows.db))


def _key(rows: QuerySet[Job], value: str, ops: BackendOperations) -> QuerySet[Job]:
    # The keys as declared are kept in the stored policy (the digests beside them are
    # what the index and the claims compare).
    return rows.filter(
        Q(unique_digest__isnull=False, policy__unique_key=value)
        | Q(concurrency_digest__isnull=False, policy__concurrency_key=value)
    )


def _worker(rows: QuerySet[Job], value: str, ops: BackendOperations) -> QuerySet[Job]:
    in_attempts: Q
    if ops.features.supports_json_field_contains:
        in_attempts = Q(attempt_log__contains=[{"worker_id": value}])
    else:
        # The attempt log as Django's encoder writes it (``"key": value`` pairs).
        pattern = '"worker_id": ' + json.dumps(value)
        rows = rows.annotate(_jobstate_attempt_text=Cast("attempt_log", TextField()))
        in_attempts = Q(_jobstate_attempt_text__contains=pattern)
    return rows.filter(Q(executor_id=value) | in_attempts)


_SEARCHES: dict[str, Callable[[QuerySet[Job], Any, BackendOperations], QuerySet[Job]]] = {
    "task": _task,
    "queue": _queue,
    "error": _error,
    "input": _input,
    "worker": _worker,
    "key": _key,
}


def db_instant(using: str, instant: datetime) -> datetime | Value:
    """``instant`` as a comparison with ``Job.created_at`` on ``using`` should take it.

    SQLite keeps instants as text, and the database clock that stamps ``created_at``
    writes milliseconds (``…:05.123``) where Django writes a parameter with microseconds
    (``…:05.123000``); compared as text, the row would sort before the equal parameter.
    There the instant is handed over in the clock's own format."""
    return database_ops(using).clock_instant(instant)


def recent_window_start(using: str = "default") -> datetime:
    """When the oldest of the newest :data:`RECENT_SEARCH_WINDOW` jobs was created (the
    epoch when there are fewer): one scan of that many entries of the recency index."""
    start = (
        Job.objects.using(using)
        .order_by("-created_at")
        .values_list("created_at", flat=True)[RECENT_SEARCH_WINDOW - 1 : RECENT_SEARCH_WINDOW]
        .first()
    )
    return start if start is not None else _EPOCH


def filter_jobs(
    rows: QuerySet[Job],
    filters: Mapping[str, str],
    search: str = "",
    *,
    window_start: datetime | None = None,
) -> QuerySet[Job]:
    """``rows`` narrowed by the jobs list's filter parameters and search. Unknown
    parameters and malformed values raise :class:`SearchError`."""
    for name, value in filters.items():
        if name not in FILTER_PARAMETERS:
            raise SearchError(f"Unknown filter {name!r}.")
        rows = apply_job_filter(rows, name, value)
    if search.strip():
        rows = parse_search(search).apply(rows, window_start=window_start)
    return rows
