"""Checks of a job's fields: which fields each operation may write, their values
(lengths read from the :class:`~jobstate.models.Job` model), the claim fields every
release clears, and the errors of intake a backend raises from inside its atomic step."""

from __future__ import annotations

import json
import re
from typing import Any

from jobstate.core.conf import jobstate_settings
from jobstate.core.jsonvalues import JSON_DEPTH_LIMIT, ensure_json, nested_deeper_than
from jobstate.core.states import (
    RELEASE_JOB_STATUSES,
    TASK_TARGET_PREFIX,
    UNIQUE_STATE_BITS,
    JobStatus,
    NewTask,
)
from jobstate.exceptions import (
    DuplicateRequestId,
    IdempotencyConflict,
    ImmutableField,
    InvalidJobState,
    InvalidPatch,
    InvalidPayload,
    ThreadQuotaExceeded,
)
from jobstate.stores.contracts.validation.values import (
    column_limit,
    parse_choice,
    parse_thread_id,
    parse_uuid,
    require_text,
    text_problem,
    validate_instant,
)

__all__ = [
    "CLEARED_CLAIM",
    "ENQUEUE_FIELDS",
    "ENQUEUE_PAYLOAD_FIELDS",
    "JOB_CLAIM_FIELDS",
    "JOB_COMPLETION_FIELDS",
    "JOB_CREATE_FIELDS",
    "JOB_DEFAULTS",
    "JOB_ENQUEUE_FIELDS",
    "JOB_IDENTITY_FIELDS",
    "JOB_PATCH_FIELDS",
    "JOB_REPORT_FIELDS",
    "check_same_request",
    "check_thread_quota",
    "clean_job_fields",
    "clean_job_value",
    "duplicate_request",
    "required_request_id",
    "task_job_fields",
    "validate_release_status",
]

#: Fields ``update_job`` / ``update_job_if_status`` may write.
JOB_PATCH_FIELDS = frozenset(
    {
        "status",
        "target",
        "source",
        "thread_id",
        "session_id",
        "input",
        "input_preview",
        "result",
        "report",
        "usage",
        "error",
        "metadata",
        "callback_url",
        "attempts",
        "run_after",
        "claimed_at",
        "lease_until",
        "executor_id",
        "dispatched_at",
        "claim_token",
        # django.tasks (see jobstate.core.attempt_log): what a task is, and its attempt log.
        "task_path",
        "queue_name",
        "priority",
        "max_attempts",
        "attempt_log",
    }
)

#: Fields no patch may name: set once at creation (``request_id``) or by the store.
JOB_IDENTITY_FIELDS = frozenset({"id", "request_id", "created_at", "updated_at"})

#: Fields a claim sets and every release (requeue, terminal completion) clears.
JOB_CLAIM_FIELDS = ("executor_id", "claimed_at", "lease_until", "dispatched_at", "claim_token")

#: The claim fields as every release (requeue, report, terminal transition) writes them.
CLEARED_CLAIM: dict[str, Any] = dict.fromkeys(JOB_CLAIM_FIELDS)

#: Fields ``enqueue`` accepts besides ``request_id``: a new job is always queued and unclaimed.
ENQUEUE_FIELDS = frozenset(
    {
        "target",
        "source",
        "thread_id",
        "session_id",
        "input",
        "input_preview",
        "metadata",
        "callback_url",
        "attempts",
        "run_after",
    }
)

#: Fields only a task's enqueue sets, and nothing changes afterwards: its declared
#: policy and, for a unique task, its key's digest and the states the key covers.
TASK_POLICY_FIELDS = frozenset(
    {"policy", "unique_digest", "unique_states", "concurrency_digest", "concurrency_limit"}
)

#: Fields ``create_job`` accepts.
JOB_CREATE_FIELDS = JOB_PATCH_FIELDS | {"request_id"} | TASK_POLICY_FIELDS

#: Fields ``enqueue`` accepts.
JOB_ENQUEUE_FIELDS = ENQUEUE_FIELDS | {"request_id"}

#: Fields a claim holder's report may patch: the status is its own argument, and the
#: claim fields are cleared by the report itself.
JOB_REPORT_FIELDS = JOB_PATCH_FIELDS - {"status", *JOB_CLAIM_FIELDS}

#: Fields the ``patch`` of ``complete_job_with_notifications`` may name.
JOB_COMPLETION_FIELDS = JOB_PATCH_FIELDS - set(JOB_CLAIM_FIELDS)

#: What "the same request" means for ``enqueue``: these stored values must equal the
#: given ones (an absent field counts as its default). Fields the job's own life changes
#: (status, attempts, session, metadata, run_after) are not compared.
ENQUEUE_PAYLOAD_FIELDS = ("target", "source", "thread_id", "input", "callback_url")

#: Values of the non-nullable fields when a new job leaves them out. Every other field
#: defaults to ``None``.
JOB_DEFAULTS: dict[str, Any] = {
    "status": "queued",
    "source": "",
    "input_preview": "",
    "attempts": 0,
    "metadata": {},
    "priority": 0,
}

#: The text fields; their longest values are the model's ``max_length``.
_JOB_TEXT_FIELDS = frozenset(
    {
        "request_id",
        "target",
        "source",
        "session_id",
        "executor_id",
        "callback_url",
        "input_preview",
        "error",
        "task_path",
        "queue_name",
        "unique_digest",
        "concurrency_digest",
    }
)

_JOB_JSON_FIELDS = frozenset(
    {"input", "result", "report", "usage", "metadata", "attempt_log", "policy"}
)

_JOB_INSTANT_FIELDS = frozenset({"run_after", "claimed_at", "lease_until", "dispatched_at"})

_POSITIVE_INT_MAX = 2**31 - 1

#: The range of the ``priority`` column (django.tasks itself allows -100 to 100).
_PRIORITY_RANGE = (-(2**31), 2**31 - 1)


def clean_job_fields(
    fields: dict[str, Any], *, allowed: frozenset[str], action: str
) -> dict[str, Any]:
    """Check the fields of a patch or a new job and return them normalised.

    Raises :class:`~jobstate.exceptions.ImmutableField` for an identity field,
    :class:`~jobstate.exceptions.InvalidPatch` for an unknown or disallowed field, a
    ``None`` for a required field or a value of the wrong type,
    :class:`~jobstate.exceptions.InvalidJobState` for a bad status or a naive instant and
    :class:`~jobstate.exceptions.InvalidPayload` for a value that is not strict JSON.
    ``claim_token`` comes back as a :class:`uuid.UUID`.
    """

    for name in fields:
        if name in JOB_IDENTITY_FIELDS and name not in allowed:
            raise ImmutableField(
                f"{name} identifies the job and cannot be changed by {action}.", field=name
            )
        if name not in allowed:
            known = name in JOB_PATCH_FIELDS
            reason = "is not accepted by" if known else "is not a job field; rejected by"
            raise InvalidPatch(f"{name!r} {reason} {action}.", field=name)
    return {name: clean_job_value(name, value) for name, value in fields.items()}


def _check_text_size(name: str, value: str) -> None:
    """A text column without a length of its own (``error``, ``input_preview``) holds at
    most ``JOBSTATE['MAX_PAYLOAD_BYTES']`` bytes of UTF-8, as a JSON value does."""
    most = jobstate_settings.MAX_PAYLOAD_BYTES
    # A character is 1 to 4 bytes of UTF-8: a short text is never encoded.
    if len(value) * 4 <= most:
        return
    size = len(value.encode("utf-8"))
    if size > most:
        raise InvalidPatch(
            f"{name} is {size} bytes of UTF-8; the limit is {most} "
            "(JOBSTATE['MAX_PAYLOAD_BYTES']).",
            field=name,
        )


def clean_job_value(name: str, value: Any) -> Any:
    """Validate one job field value; see :func:`clean_job_fields`."""

    if value is None:
        if name in JOB_DEFAULTS or name == "request_id":
            raise InvalidPatch(f"{name} is required and cannot be cleared with None.", field=name)
        return None
    if name == "status":
        return parse_choice(JobStatus, value, field="status")
    if name in _JOB_TEXT_FIELDS:
        if not isinstance(value, str):
            raise InvalidPatch(f"{name} must be a string, got {type(value).__name__}.", field=name)
        problem = text_problem(value)
        if problem:
            raise InvalidPatch(f"{name} {problem}.", field=name)
        limit = column_limit("Job", name)
        if limit is not None and len(value) > limit:
            raise InvalidPatch(f"{name} is longer than {limit} characters.", field=name)
        if limit is None:
            _check_text_size(name, value)
        if name == "request_id" and not value.strip():
            raise InvalidPatch("request_id must be a non-empty string.", field=name)
        return value
    if name in _JOB_JSON_FIELDS:
        if name == "metadata" and not isinstance(value, dict):
            raise InvalidPatch(f"metadata must be a dict, got {type(value).__name__}.", field=name)
        if name == "attempt_log" and not (
            isinstance(value, list) and all(isinstance(entry, dict) for entry in value)
        ):
            raise InvalidPatch("attempt_log must be a list of dicts.", field=name)
        return ensure_json(value, field=name)
    if name in _JOB_INSTANT_FIELDS:
        return validate_instant(value, field=name)
    if name == "thread_id":
        return parse_thread_id(value)
    if name in ("attempts", "max_attempts", "priority", "unique_states", "concurrency_limit"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidPatch(f"{name} must be an int, got {value!r}.", field=name)
        low, high = _PRIORITY_RANGE if name == "priority" else (0, _POSITIVE_INT_MAX)
        if not low <= value <= high:
            raise InvalidPatch(f"{name} must be between {low} and {high}, got {value}.", field=name)
        return value
    if name == "claim_token":
        return parse_uuid(value, field="claim_token")
    raise InvalidPatch(f"{name!r} is not a job field.", field=name)


def validate_release_status(status: str) -> JobStatus:
    """A terminal status, or ``queued`` to give a claimed job back; else ``InvalidJobState``."""

    parsed = parse_choice(JobStatus, status, field="status")
    if parsed not in RELEASE_JOB_STATUSES:
        raise InvalidJobState(
            f"a claim holder reports done, error, rejected or queued, not {parsed.value}."
        )
    return parsed


# --- intake ----------------------------------------------------------------------------


def required_request_id(cleaned: dict[str, Any], *, action: str) -> str:
    """The ``request_id`` of cleaned new-job fields; ``InvalidPatch`` when missing."""

    request_id = cleaned.get("request_id")
    if request_id is None:
        raise InvalidPatch(f"{action} needs a request_id.", field="request_id")
    return str(request_id)


def check_same_request(request_id: str, stored: dict[str, Any], given: dict[str, Any]) -> None:
    """Raise :class:`~jobstate.exceptions.IdempotencyConflict` unless the
    :data:`ENQUEUE_PAYLOAD_FIELDS` of ``given`` (absent ones at their defaults) equal the
    ``stored`` ones. Values compare as canonical JSON, which tells ``1``, ``1.0`` and
    ``true`` apart and ignores key order."""
    differing = tuple(
        name
        for name in ENQUEUE_PAYLOAD_FIELDS
        if json.dumps(stored.get(name), sort_keys=True)
        != json.dumps(given.get(name, JOB_DEFAULTS.get(name)), sort_keys=True)
    )
    if differing:
        raise IdempotencyConflict(
            f"request_id {request_id!r} was queued before with a different "
            f"{', '.join(differing)}; a request id names one request.",
            request_id=request_id,
            fields=differing,
        )


def duplicate_request(request_id: str) -> DuplicateRequestId:
    """The error ``create_job`` raises for a ``request_id`` that is taken."""
    return DuplicateRequestId(
        f"a job with request_id {request_id!r} already exists.", request_id=request_id
    )


def check_thread_quota(thread_id: int, inflight: int, quota: int) -> None:
    """Raise :class:`ThreadQuotaExceeded` when a thread with ``inflight`` in-flight jobs
    may not take another one. A store calls it inside the atomic step that counts the
    thread's jobs and inserts the new one."""
    if inflight >= quota:
        raise ThreadQuotaExceeded(
            f"thread {thread_id} already has {inflight} jobs in flight; "
            f"the quota is {quota} (JOBSTATE['THREAD_INFLIGHT_QUOTA']).",
            thread_id=thread_id,
            inflight=inflight,
            quota=quota,
        )


def task_job_fields(task: NewTask) -> dict[str, Any]:
    """The cleaned fields of the job that holds ``task`` (see
    :meth:`~jobstate.stores.contracts.tasks_part.TasksPart.enqueue_task`): a request id of
    its own (``task-<uuid>``; a task is found by its job id), the task's target, path,
    queue, priority and attempt limit, and its arguments as the job's input."""
    if not isinstance(task, NewTask):
        raise InvalidJobState(f"task must be a NewTask, got {type(task).__name__}.")
    if not isinstance(task.args, list) or not isinstance(task.kwargs, dict):
        raise InvalidPayload("a task's args must be a list and its kwargs a dict.")
    if not isinstance(task.target, str) or not task.target.startswith(TASK_TARGET_PREFIX):
        raise InvalidJobState(
            f"a task's target starts with {TASK_TARGET_PREFIX!r}, got {task.target!r}."
        )
    if task.max_attempts is None:
        raise InvalidJobState("a task needs max_attempts (1 = no retry).")
    fields: dict[str, Any] = {
        "request_id": task.request_id,
        "target": task.target,
        "task_path": task.task_path,
        "queue_name": task.queue_name,
        "priority": task.priority,
        "max_attempts": task.max_attempts,
        "input": {"args": task.args, "kwargs": task.kwargs},
        "attempt_log": [],
        "run_after": task.run_after,
        "policy": task.policy,
    }
    if task.unique_digest is not None or task.unique_states is not None:
        fields.update(_unique_fields(task))
    if task.concurrency_digest is not None or task.concurrency_limit is not None:
        fields.update(_concurrency_fields(task))
    try:
        cleaned = clean_job_fields(fields, allowed=JOB_CREATE_FIELDS, action="enqueue_task")
    except InvalidPayload as exc:
        refused = _refused_argument(task)
        if refused is None:
            raise
        raise InvalidPayload(refused) from exc
    for name in ("task_path", "queue_name"):
        require_text(cleaned[name], field=name, max_length=None)
    if cleaned["max_attempts"] < 1:
        raise InvalidPatch("max_attempts must be at least 1.", field="max_attempts")
    return cleaned


#: The levels left to one argument inside the job's input: ``{"args": [argument]}``.
ARGUMENT_DEPTH_LIMIT = JSON_DEPTH_LIMIT - 2


def _refused_argument(task: NewTask) -> str | None:
    """Why the input of ``task`` was refused, naming the argument at fault, when one is:
    the caller wrote ``args[1]`` or ``kwargs['name']``, not the job's ``input``. Each
    argument is checked as the input was, its depth against the levels left to it (the
    input's own limit counts two levels the caller never wrote)."""
    arguments = [(f"args[{n}]", value) for n, value in enumerate(task.args)]
    arguments += [(f"kwargs[{name!r}]", value) for name, value in task.kwargs.items()]
    for name, value in arguments:
        if isinstance(value, dict | list) and nested_deeper_than(value, ARGUMENT_DEPTH_LIMIT):
            return (
                f"{name} is nested more than {ARGUMENT_DEPTH_LIMIT} levels deep (lists and "
                f"objects): a task's arguments are stored inside its job's input, which "
                f"jobstate keeps at most {JSON_DEPTH_LIMIT} levels deep on every database, "
                "MariaDB's limit."
            )
        try:
            ensure_json(value, field=name)
        except InvalidPayload as exc:
            return str(exc)
    return None


_DIGEST = re.compile(r"[0-9a-f]{64}")


def _unique_fields(task: NewTask) -> dict[str, Any]:
    """A unique task's digest (64 lowercase hex digits) and state mask (a non-empty
    subset of :data:`~jobstate.core.states.UNIQUE_STATE_BITS`)."""
    digest, states = task.unique_digest, task.unique_states
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidJobState(f"a unique task's digest is 64 hex digits, got {digest!r}.")
    every = sum(UNIQUE_STATE_BITS.values())
    if isinstance(states, bool) or not isinstance(states, int) or not 0 < states <= every:
        raise InvalidJobState(
            f"a unique task's states are a mask from 1 to {every}, got {states!r}."
        )
    return {"unique_digest": digest, "unique_states": states}


def _concurrency_fields(task: NewTask) -> dict[str, Any]:
    """A concurrency key's digest (64 lowercase hex digits) and its limit (at least 1)."""
    digest, limit = task.concurrency_digest, task.concurrency_limit
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise InvalidJobState(f"a concurrency key's digest is 64 hex digits, got {digest!r}.")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidJobState(f"a concurrency limit is an int of at least 1, got {limit!r}.")
    return {"concurrency_digest": digest, "concurrency_limit": limit}
