"""The ``JOBSTATE`` settings namespace.

Every default is declared here, once. The rest of the package reads settings through
``jobstate.core.conf.jobstate_settings`` and never calls ``getattr(settings, ...)`` itself.
Values are read lazily and the cache is dropped on ``setting_changed`` so tests can use
``override_settings`` / the pytest ``settings`` fixture.
"""

from __future__ import annotations

from datetime import timedelta
from difflib import get_close_matches
from typing import Any, Literal, get_args

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

from jobstate.core.clock import DURATION_LIMIT
from jobstate.core.messages import shown
from jobstate.core.storable import text_problem

#: What the runner's reap before a claim sweeps (``REAP_SCOPE``; see
#: :mod:`jobstate.operations.runner_options`).
ReapScope = Literal["overlap-key", "all", "off"]
REAP_SCOPES: tuple[str, ...] = get_args(ReapScope)

DEFAULTS: dict[str, Any] = {
    # Dotted paths of the store classes returned by get_run_store() / get_state_store().
    "RUN_STORE": "jobstate.stores.database.DatabaseJobRunStore",
    "STATE_STORE": "jobstate.stores.database.DatabaseStateStore",
    # Operations-job runner (JobRunner) defaults.
    "HEARTBEAT_INTERVAL": timedelta(seconds=30),
    "STALE_RUN_AFTER": timedelta(minutes=5),
    "DEFAULT_JOB_TIMEOUT": timedelta(minutes=10),
    "REAP_SCOPE": "overlap-key",  # "overlap-key" | "all" | "off"
    "REAP_LIMIT": 1000,  # rows one reap call may move; None = no cap
    "ERROR_TEXT_LIMIT": 4000,
    "SERVICE_REVISION": None,
    # Modules imported at start-up so their @operations_job decorators register.
    "OPERATIONS_JOB_MODULES": [],
    # Largest JSON value (input, summary, payload) a store accepts, in bytes of UTF-8.
    "MAX_PAYLOAD_BYTES": 1024 * 1024,
    # Job queue (StateStore) defaults.
    "WORKER_LEASE": timedelta(minutes=20),  # claim_next_inhub_job
    "EXECUTOR_LEASE": timedelta(minutes=4),  # claim_next_job, extend_executor_leases
    "EXECUTOR_DEAD_AFTER": timedelta(minutes=3),  # requeue_stale_dispatched, no lease
    "EXECUTOR_HARD_CAP": timedelta(hours=2),  # requeue_stale_dispatched, any lease
    "QUEUED_TTL": timedelta(minutes=30),  # expire_stale_queued
    "THREAD_INFLIGHT_QUOTA": None,  # max queued+running+dispatched jobs per thread; None = off
    "LIST_LIMIT": 500,  # rows one list_* call returns at most
    "AUDIT_PRUNE_BATCH_SIZE": 250,  # rows one prune transaction deletes
    # PostgreSQL: prepare the hot-path statements (claims, reports, the outbox completion)
    # once they have run 5 times on a connection, even where Django leaves psycopg's
    # prepared statements off. False behind PgBouncer in transaction mode before 1.22.
    "PREPARED_STATEMENTS": True,
    # Notification outbox and relay.
    "OUTBOX_MAX_ATTEMPTS": 8,  # a row is dead-lettered after this many failed attempts
    "OUTBOX_BACKOFF_BASE": timedelta(seconds=10),  # first retry delay, doubled per attempt
    "OUTBOX_BACKOFF_MAX": timedelta(hours=1),  # longest retry delay
    "OUTBOX_LEASE": timedelta(minutes=2),  # how long a relay holds a claimed row
    "OUTBOX_BATCH_SIZE": 50,  # rows one relay pass claims
    "WEBHOOK_SECRET": None,  # HMAC-SHA256 signing key of the webhook channel
    "WEBHOOK_TIMEOUT": timedelta(seconds=10),
    "CHANNELS": {
        "webhook": "jobstate.outbox.channels.WebhookChannel",
        "email": "jobstate.outbox.channels.EmailChannel",
        "callable": "jobstate.outbox.channels.CallableChannel",
    },
    # Above this many rows in the jobs table (PostgreSQL's estimate), the metrics snapshot
    # estimates the done / error / rejected counts from table statistics instead of
    # counting every finished job; None = always count exactly.
    "METRICS_EXACT_LIMIT": 100_000,
    # Readiness and metrics endpoints: None = open, else the bearer token they require.
    "OBSERVABILITY_TOKEN": None,
    # Maintenance sweeps and retention.
    "SWEEP_BATCH_SIZE": 1000,  # rows one reaping-sweep statement moves or deletes
    # Rows one retention-sweep transaction deletes: smaller, because a deleting batch
    # competes with live inserts for the write-ahead log (docs/benchmarks.md).
    "RETENTION_BATCH_SIZE": 250,
    "SWEEP_TIME_BUDGET": timedelta(seconds=30),  # one sweep call stops starting batches after this
    "WORKER_ATTEMPT_LIMIT": 3,  # expired in-process leases requeue until this many attempts
    "AUDIT_RETENTION": timedelta(days=30),
    "FINISHED_JOB_RETENTION": timedelta(days=14),
    "FINISHED_RUN_RETENTION": timedelta(days=30),
    "DELIVERED_NOTIFICATION_RETENTION": timedelta(days=7),
    # How long the Workers page keeps a worker after its last beat (stopped or lost).
    "WORKER_RETENTION": timedelta(days=1),
    # JSON keys (any depth, case-insensitive) whose values the admin shows as "••••" in
    # job input / metadata / result, notification payloads and audit details.
    "ADMIN_REDACTED_KEYS": ["password", "secret", "token", "api_key", "authorization"],
    # django.tasks: on PostgreSQL, enqueueing a task sends NOTIFY (delivered at commit)
    # and idle jobstate_worker processes LISTEN, so a task starts within milliseconds.
    # Turn it off behind a pooler in transaction mode, which does not deliver
    # notifications; workers then poll at their --interval.
    "LISTEN_NOTIFY": True,
    # How the default database is reached: None (directly, or through a pooler in session
    # mode) or "transaction" (a pooler in transaction mode, such as PgBouncer's default,
    # hands each transaction to any of its server connections). With "transaction" the
    # workers never LISTEN and poll at a short default interval, and the system checks
    # warn about settings that need a session of their own (jobstate.W050-W052).
    "CONNECTION_POOLER": None,
    # Periodic schedules, by key: what each enqueues and when (a cron expression in a
    # time zone). jobstate.schedules checks and evaluates them; see docs/schedules.md.
    "SCHEDULES": {},
    # The most missed slots one evaluation enqueues for a schedule with catch_up "all"
    # (the latest ones; older missed slots are skipped).
    "SCHEDULE_CATCH_UP_LIMIT": 100,
}

_DURATIONS = {
    "HEARTBEAT_INTERVAL",
    "STALE_RUN_AFTER",
    "DEFAULT_JOB_TIMEOUT",
    "WORKER_LEASE",
    "EXECUTOR_LEASE",
    "EXECUTOR_DEAD_AFTER",
    "EXECUTOR_HARD_CAP",
    "QUEUED_TTL",
    "OUTBOX_BACKOFF_BASE",
    "OUTBOX_BACKOFF_MAX",
    "OUTBOX_LEASE",
    "WEBHOOK_TIMEOUT",
    "SWEEP_TIME_BUDGET",
    "AUDIT_RETENTION",
    "FINISHED_JOB_RETENTION",
    "FINISHED_RUN_RETENTION",
    "DELIVERED_NOTIFICATION_RETENTION",
    "WORKER_RETENTION",
}
# Positive ints; those in _OPTIONAL may also be None.
_POSITIVE_INTS = {
    "THREAD_INFLIGHT_QUOTA",
    "LIST_LIMIT",
    "AUDIT_PRUNE_BATCH_SIZE",
    "OUTBOX_MAX_ATTEMPTS",
    "OUTBOX_BATCH_SIZE",
    "SWEEP_BATCH_SIZE",
    "RETENTION_BATCH_SIZE",
    "WORKER_ATTEMPT_LIMIT",
    "METRICS_EXACT_LIMIT",
    "MAX_PAYLOAD_BYTES",
    "ERROR_TEXT_LIMIT",
    "SCHEDULE_CATCH_UP_LIMIT",
    "REAP_LIMIT",
}
_OPTIONAL = {"THREAD_INFLIGHT_QUOTA", "METRICS_EXACT_LIMIT", "REAP_LIMIT"}
#: The largest count a setting may hold: the stores pass counts to the database as
#: 64-bit integers (a LIMIT, a batch size), and a larger one fails there at run time.
COUNT_LIMIT = 2**63 - 1
#: The longest ``SERVICE_REVISION`` a run may record (its column's length).
SERVICE_REVISION_LENGTH = 100
_BOOLEANS = {"PREPARED_STATEMENTS"}
#: What ``CONNECTION_POOLER`` may say: nothing to know, or a pooler in transaction mode.
CONNECTION_POOLERS = (None, "transaction")


class JobStateSettings:
    """Typed, lazy view over ``settings.JOBSTATE`` merged with :data:`DEFAULTS`."""

    RUN_STORE: str
    HEARTBEAT_INTERVAL: timedelta
    STALE_RUN_AFTER: timedelta
    DEFAULT_JOB_TIMEOUT: timedelta
    REAP_SCOPE: str
    REAP_LIMIT: int | None
    ERROR_TEXT_LIMIT: int
    SERVICE_REVISION: str | None
    OPERATIONS_JOB_MODULES: list[str]
    MAX_PAYLOAD_BYTES: int
    STATE_STORE: str
    WORKER_LEASE: timedelta
    EXECUTOR_LEASE: timedelta
    EXECUTOR_DEAD_AFTER: timedelta
    EXECUTOR_HARD_CAP: timedelta
    QUEUED_TTL: timedelta
    THREAD_INFLIGHT_QUOTA: int | None
    LIST_LIMIT: int
    AUDIT_PRUNE_BATCH_SIZE: int
    PREPARED_STATEMENTS: bool
    OUTBOX_MAX_ATTEMPTS: int
    OUTBOX_BACKOFF_BASE: timedelta
    OUTBOX_BACKOFF_MAX: timedelta
    OUTBOX_LEASE: timedelta
    OUTBOX_BATCH_SIZE: int
    WEBHOOK_SECRET: str | None
    WEBHOOK_TIMEOUT: timedelta
    CHANNELS: dict[str, str]
    METRICS_EXACT_LIMIT: int | None
    OBSERVABILITY_TOKEN: str | None
    SWEEP_BATCH_SIZE: int
    RETENTION_BATCH_SIZE: int
    SWEEP_TIME_BUDGET: timedelta
    WORKER_ATTEMPT_LIMIT: int
    AUDIT_RETENTION: timedelta
    FINISHED_JOB_RETENTION: timedelta
    FINISHED_RUN_RETENTION: timedelta
    DELIVERED_NOTIFICATION_RETENTION: timedelta
    WORKER_RETENTION: timedelta
    ADMIN_REDACTED_KEYS: list[str]
    LISTEN_NOTIFY: bool
    CONNECTION_POOLER: str | None
    SCHEDULES: dict[str, dict[str, Any]]
    SCHEDULE_CATCH_UP_LIMIT: int

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def _user_settings(self) -> dict[str, Any]:
        user = getattr(settings, "JOBSTATE", {}) or {}
        if not isinstance(user, dict):
            raise ImproperlyConfigured("settings.JOBSTATE must be a dict.")
        unknown = unknown_setting_problems(user)
        if unknown:
            raise ImproperlyConfigured(" ".join(unknown))
        return user

    def __getattr__(self, name: str) -> Any:
        # Only a setting not read since the last reload gets here: a read value is kept
        # as an attribute, so the hot paths read theirs without a call.
        if name.startswith("_") or name not in DEFAULTS:
            raise AttributeError(name)
        if name not in self._cache:
            self._cache[name] = checked_value(name, self._user_settings().get(name, DEFAULTS[name]))
        value = self.__dict__[name] = self._cache[name]
        return value

    def problems(self) -> list[str]:
        """Every problem of ``settings.JOBSTATE``, one sentence each: each unknown name
        (with the known one it was likely meant as) and each bad value. The system check
        ``jobstate.E001`` reports them all at once; reading a setting raises the first."""
        user = getattr(settings, "JOBSTATE", {}) or {}
        if not isinstance(user, dict):
            return ["settings.JOBSTATE must be a dict."]
        problems = unknown_setting_problems(user)
        for name, default in DEFAULTS.items():
            try:
                checked_value(name, user.get(name, default))
            except ImproperlyConfigured as exc:
                problems.append(str(exc))
        if not problems:
            problems += _pair_problems(user)
        return problems

    def read_all(self) -> None:
        """Read every setting now; each is kept until the next ``setting_changed``. The
        worker does as it starts: the code it runs (a task) may change
        ``settings.JOBSTATE``, an item of the dict or the whole dict, and a setting read
        later would be that value, one the system checks never saw."""
        for name in DEFAULTS:
            getattr(self, name)

    def reload(self) -> None:
        for name in list(self._cache):
            self.__dict__.pop(name, None)
        self._cache.clear()


def _pair_problems(user: dict[Any, Any]) -> list[str]:
    """Settings valid alone that contradict each other: a run's liveness budget below
    two heartbeats, which the runner refuses at its start (every ``manage.py`` command
    that runs an operations job would fail), is reported by the check instead; so is a
    first retry delay of the outbox longer than its longest, which would leave the
    backoff no room to grow (every retry would wait the longest delay)."""
    problems = []
    beat = user.get("HEARTBEAT_INTERVAL", DEFAULTS["HEARTBEAT_INTERVAL"])
    stale = user.get("STALE_RUN_AFTER", DEFAULTS["STALE_RUN_AFTER"])
    if stale < 2 * beat:
        problems.append(
            f"JOBSTATE['STALE_RUN_AFTER'] ({stale}) must be at least twice "
            f"JOBSTATE['HEARTBEAT_INTERVAL'] ({beat}), or a live run whose heartbeat is "
            "a little late would be reaped."
        )
    base = user.get("OUTBOX_BACKOFF_BASE", DEFAULTS["OUTBOX_BACKOFF_BASE"])
    longest = user.get("OUTBOX_BACKOFF_MAX", DEFAULTS["OUTBOX_BACKOFF_MAX"])
    if base > longest:
        problems.append(
            f"JOBSTATE['OUTBOX_BACKOFF_BASE'] ({base}), the first retry's delay, must not "
            f"be longer than JOBSTATE['OUTBOX_BACKOFF_MAX'] ({longest}), the longest: "
            "every retry would wait the longest delay."
        )
    return problems


def unknown_setting_problems(user: dict[Any, Any]) -> list[str]:
    """One sentence per name of ``user`` that is no ``JOBSTATE`` setting, suggesting
    the known setting it is closest to (a typo of ``HEARTBEAT_INTERVAL``)."""
    problems = []
    for name in sorted(set(user) - set(DEFAULTS), key=str):
        close = get_close_matches(str(name), DEFAULTS, n=1) if isinstance(name, str) else []
        hint = (
            f"did you mean {close[0]}?"
            if close
            else f"known settings: {', '.join(sorted(DEFAULTS))}."
        )
        problems.append(f"Unknown JOBSTATE setting {name!r}; {hint}")
    return problems


def checked_value(name: str, value: Any) -> Any:
    """``value`` of setting ``name`` if it is valid, else ``ImproperlyConfigured``."""
    if name in _DURATIONS and not (isinstance(value, timedelta) and value > timedelta(0)):
        raise ImproperlyConfigured(
            f"JOBSTATE[{name!r}] must be a positive datetime.timedelta, got {value!r}."
        )
    if name in _DURATIONS and value > DURATION_LIMIT:
        # Added to (or taken from) the clock, a longer one leaves the years 1-9999.
        raise ImproperlyConfigured(
            f"JOBSTATE[{name!r}] must be at most {DURATION_LIMIT.days} days, got {value}."
        )
    if (
        name in _POSITIVE_INTS
        and not (value is None and name in _OPTIONAL)
        and (isinstance(value, bool) or not isinstance(value, int) or value < 1)
    ):
        allowed = "a positive int or None" if name in _OPTIONAL else "a positive int"
        raise ImproperlyConfigured(f"JOBSTATE[{name!r}] must be {allowed}, got {value!r}.")
    if name in _POSITIVE_INTS and value is not None and value > COUNT_LIMIT:
        raise ImproperlyConfigured(
            f"JOBSTATE[{name!r}] must be at most {COUNT_LIMIT} (a 64-bit count), got {value}."
        )
    if name in _BOOLEANS and not isinstance(value, bool):
        raise ImproperlyConfigured(f"JOBSTATE[{name!r}] must be True or False, got {value!r}.")
    _check_shape(name, value)
    return value


def _check_shape(name: str, value: Any) -> None:
    """The settings whose mistakes would otherwise only show on a request: an empty
    token would leave the endpoints it guards open, a bare string of keys would redact
    by its letters."""
    if name == "OBSERVABILITY_TOKEN" and value is not None and not _sendable_token(value):
        raise ImproperlyConfigured(
            "JOBSTATE['OBSERVABILITY_TOKEN'] must be None or a non-empty string of "
            "printable ASCII without spaces at either end (what an Authorization header "
            f"can carry), got {_token_shown(value)}."
        )
    if name == "SERVICE_REVISION" and value is not None and not _revision_label(value):
        raise ImproperlyConfigured(
            "JOBSTATE['SERVICE_REVISION'] must be None or a non-empty string of at most "
            f"{SERVICE_REVISION_LENGTH} characters, without NUL characters or lone "
            f"surrogates (every run records it), got {shown(repr(value))}."
        )
    if (
        name == "WEBHOOK_SECRET"
        and value is not None
        and not (
            (isinstance(value, bytes) and value)
            or (isinstance(value, str) and value and text_problem(value) is None)
        )
    ):
        # A str signs as its UTF-8 bytes, which a lone surrogate has none of: every
        # webhook would fail its sends.
        raise ImproperlyConfigured(
            "JOBSTATE['WEBHOOK_SECRET'] must be None or a non-empty str or bytes (the "
            "webhook channel's signing key), without a NUL character or a lone "
            f"surrogate, got {_secret_shown(value)}."
        )
    if name in ("STATE_STORE", "RUN_STORE") and not (
        isinstance(value, str) and "." in value.strip(".")
    ):
        raise ImproperlyConfigured(
            f"JOBSTATE[{name!r}] must be the dotted path of a store class "
            f"('package.module.ClassName'), got {value!r}."
        )
    if name == "REAP_SCOPE" and value not in REAP_SCOPES:
        raise ImproperlyConfigured(
            f"JOBSTATE['REAP_SCOPE'] must be 'overlap-key', 'all' or 'off', got {value!r}."
        )
    if name == "LISTEN_NOTIFY" and not isinstance(value, bool):
        raise ImproperlyConfigured(
            f"JOBSTATE['LISTEN_NOTIFY'] must be True or False, got {value!r}."
        )
    if name == "CONNECTION_POOLER" and value not in CONNECTION_POOLERS:
        raise ImproperlyConfigured(
            "JOBSTATE['CONNECTION_POOLER'] must be None or 'transaction' (a pooler in "
            f"transaction mode, such as PgBouncer's default), got {value!r}."
        )
    # Each path is imported by the outbox's own check (jobstate.E003); here the shape.
    if name == "CHANNELS" and not (
        isinstance(value, dict)
        and all(isinstance(key, str) and key for key in value)
        and all(isinstance(path, str) and "." in path.strip(".") for path in value.values())
    ):
        raise ImproperlyConfigured(
            "JOBSTATE['CHANNELS'] must be a dict of channel name -> dotted path of a "
            f"channel class ('package.module.ClassName'), got {value!r}."
        )
    # Each schedule's own keys are checked by jobstate.schedules (jobstate.E030), one
    # message per problem; here only what every reader relies on.
    if name == "SCHEDULES" and not isinstance(value, dict):
        raise ImproperlyConfigured(
            "JOBSTATE['SCHEDULES'] must be a dict of schedule key -> declaration, got "
            f"{type(value).__name__}."
        )
    if name == "OPERATIONS_JOB_MODULES" and (
        isinstance(value, str)
        or not isinstance(value, list | tuple)
        or not all(isinstance(module, str) and module for module in value)
    ):
        raise ImproperlyConfigured(
            "JOBSTATE['OPERATIONS_JOB_MODULES'] must be a list of dotted module names, got "
            f"{value!r}."
        )
    if name == "ADMIN_REDACTED_KEYS" and (
        isinstance(value, str)
        or not isinstance(value, list | tuple | set | frozenset)
        or not all(isinstance(key, str) and key for key in value)
    ):
        raise ImproperlyConfigured(
            f"JOBSTATE['ADMIN_REDACTED_KEYS'] must be a list of non-empty strings, got {value!r}."
        )


def _sendable_token(value: Any) -> bool:
    """Whether a client can send ``value`` as ``Authorization: Bearer <value>``: HTTP
    strips the spaces at a header's ends, and a header carries ASCII only, so any other
    token could never match and the endpoints would be closed to everyone."""
    return (
        isinstance(value, str)
        and value != ""
        and value == value.strip()
        and all(" " <= char <= "~" for char in value)
    )


def _token_shown(value: Any) -> str:
    # The token is a secret: the message names what is wrong with it, never its text.
    if not isinstance(value, str):
        return type(value).__name__
    if not value.strip():
        return "an empty string" if not value else "only spaces"
    if value != value.strip():
        return "a string with spaces at an end"
    return "a string with a character outside printable ASCII"


def _secret_shown(value: Any) -> str:
    # A secret too: what is wrong with it, never its text.
    if not isinstance(value, str | bytes):
        return type(value).__name__
    if isinstance(value, str) and value:
        return f"a string that {text_problem(value)}"
    return "an empty value"


def _revision_label(value: Any) -> bool:
    """Whether ``value`` is a service revision every run can record: non-empty text
    of at most :data:`SERVICE_REVISION_LENGTH` characters that every database can keep."""
    return (
        isinstance(value, str)
        and 0 < len(value) <= SERVICE_REVISION_LENGTH
        and text_problem(value) is None
    )


jobstate_settings = JobStateSettings()


@receiver(setting_changed)
def _reload_jobstate_settings(*, setting: str, **kwargs: Any) -> None:
    if setting == "JOBSTATE":
        jobstate_settings.reload()
