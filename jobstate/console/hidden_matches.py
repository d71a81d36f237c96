"""An ``error:`` search matches a job's errors as the console shows them.

The console masks the values under ``JOBSTATE['ADMIN_REDACTED_KEYS']`` and the configured
secrets wherever a job's error quotes them (:mod:`.redaction`). Matched against the
stored text, a search would tell a user who may only view which jobs hold a guess of a
hidden value, and so, a prefix at a time, the whole value. So a job whose errors match
the search only inside a masked value is left out, and the list and the bulk operations
over it (which narrow jobs the same way) agree.

The database finds the jobs whose stored errors match; only those that could hide
something (a redacted key in their JSON, their notifications' payloads or their audit
entries' details, or a configured secret in their errors) are read back and checked
here, with what the job's page hides: the values under a redacted key in all of those.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet, TextField
from django.db.models.functions import Cast

from jobstate.console.redaction import (
    Redactor,
    configured_secrets,
    redacted_keys,
    redactor,
    scalar_texts,
)
from jobstate.exceptions import JobStateError
from jobstate.models import AuditEntry, Job, Notification

__all__ = ["CHECK_LIMIT", "REDACTION_SOURCES", "HiddenMatchesError", "without_hidden_matches"]

#: The job fields whose values under a redacted key the job's page hides (its redactor's
#: sources, as ``JobAdmin.redaction_sources``).
REDACTION_SOURCES = ("input", "result", "report", "usage", "metadata")

#: The most jobs one search reads back to check: more than this many matching jobs that
#: could hide a value refuse the search instead of reading them all.
CHECK_LIMIT = 10_000


class HiddenMatchesError(JobStateError, ValueError):
    """The search matched too many jobs holding hidden values to check them."""


def without_hidden_matches(matched: QuerySet[Job], value: str) -> QuerySet[Job]:
    """``matched`` (the jobs whose stored errors contain ``value``, with the attempt
    log's text annotated as ``_jobstate_attempt_text``) less those whose errors contain
    it only inside a masked value."""
    keys = redacted_keys()
    secrets = list(configured_secrets())
    if not keys and not secrets:
        return matched
    suspects = _could_hide(matched, keys, secrets)
    rows = list(
        suspects.values_list("id", "error", "attempt_log", *REDACTION_SOURCES)[: CHECK_LIMIT + 1]
    )
    if len(rows) > CHECK_LIMIT:
        raise HiddenMatchesError(
            f"error: matched more than {CHECK_LIMIT:,} jobs that hold hidden values "
            "(JOBSTATE['ADMIN_REDACTED_KEYS']); narrow the search with task:, queue: or "
            "more of the error's text."
        )
    related = _related_sources([pk for pk, *_ in rows], keys, matched.db)
    hidden_only = [
        pk
        for pk, error, log, *sources in rows
        if not _shown_match(redactor(*sources, *related.get(pk, ())), value, error, log)
    ]
    return matched.exclude(id__in=hidden_only) if hidden_only else matched


def _related_sources(pks: list[Any], keys: frozenset[str], using: str) -> dict[Any, list[Any]]:
    """The payloads of the jobs' notifications and the details of their audit entries
    that hold a redacted key (the job's page hides the values under it too), by job."""
    found: dict[Any, list[Any]] = {}
    if not pks:
        return found
    for model, name in ((Notification, "payload"), (AuditEntry, "detail")):
        rows = model.objects.using(using).filter(job_id__in=pks)
        if keys and all(key.isascii() for key in keys):
            rows = rows.annotate(_jobstate_text=Cast(name, TextField())).filter(_holds_a_key(keys))
        for job_id, source in rows.values_list("job_id", name).iterator():
            found.setdefault(job_id, []).append(source)
    return found


def _could_hide(rows: QuerySet[Job], keys: frozenset[str], secrets: Sequence[str]) -> QuerySet[Job]:
    """The jobs of ``rows`` whose page may mask something: a redacted key in their JSON
    (matched as text, without case) or a configured secret in their errors. Every one
    of ``rows`` when a key is not ASCII, whose case the databases fold differently."""
    if any(not key.isascii() for key in keys):
        return rows
    texts = {f"_jobstate_{name}_text": Cast(name, TextField()) for name in REDACTION_SOURCES}
    could = Q()
    for key in keys:
        for alias in texts:
            could |= Q(**{f"{alias}__icontains": key})
    if keys:
        for model, name in ((Notification, "payload"), (AuditEntry, "detail")):
            related = model.objects.filter(job_id=OuterRef("pk")).annotate(
                _jobstate_text=Cast(name, TextField())
            )
            could |= Q(Exists(related.filter(_holds_a_key(keys))))
    for secret in secrets:
        could |= Q(error__contains=secret) | Q(_jobstate_attempt_text__contains=secret)
    return rows.annotate(**texts).filter(could)


def _holds_a_key(keys: frozenset[str]) -> Q:
    """A row whose JSON, annotated as text ``_jobstate_text``, names a redacted key."""
    holds = Q()
    for key in keys:
        holds |= Q(_jobstate_text__icontains=key)
    return holds


def _shown_match(shown: Redactor, value: str, error: str | None, log: Any) -> bool:
    """Whether ``value`` is in the job's error or in a text of its attempt log once the
    hidden values are masked (without case: SQLite and MariaDB match so)."""
    wanted = value.casefold()
    return any(wanted in shown.text(text).casefold() for text in _texts(error, log))


def _texts(error: str | None, log: Any) -> Iterator[str]:
    if error:
        yield error
    yield from scalar_texts(log)
