"""What a schedule is: its declaration in ``JOBSTATE["SCHEDULES"]``, checked and
normalised, and the instants (slots) its cron expression names.

Cron expressions are read by cronsim, never by hand. cronsim follows Debian's cron,
daylight-saving time included, and documents how: a job at a specific time (or with a
granularity coarser than an hour) whose time falls in a gap runs once, at the first
instant after the gap; one whose time repeats when clocks go back runs once, at the
first of the two; jobs that run every hour or more often are placed on the clock as it
is. Every slot is turned into a UTC instant at once, because two aware datetimes of the
same zone compare by wall clock, ignoring which of a repeated hour's two passes they
are.
"""

from __future__ import annotations

import json
import re
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from jobstate.core.jsonvalues import ensure_json
from jobstate.core.messages import shown
from jobstate.exceptions import InvalidPayload
from jobstate.models.schedules import CatchUp, ScheduleKind

__all__ = [
    "DEFAULT_TIMEZONE",
    "KNOWN_KEYS",
    "SCHEDULE_KEY_PATTERN",
    "ScheduleDefinition",
    "Slots",
    "declaration_problems",
    "parse_declaration",
]

#: The time zone of a schedule that names none: UTC, not ``TIME_ZONE``, so changing the
#: project's display zone never moves a schedule.
DEFAULT_TIMEZONE = "UTC"

#: Every key a declaration may hold.
KNOWN_KEYS = (
    "task",
    "operations_job",
    "cron",
    "timezone",
    "args",
    "kwargs",
    "catch_up",
    "queue_name",
    "priority",
    "backend",
)

#: A schedule key: letters, digits and ``. _ : -``, starting with a letter or digit.
SCHEDULE_KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
_KEY_LIMIT = 100
_PATH_LIMIT = 300
_QUEUE_LIMIT = 100
_CRON_LIMIT = 200
_PRIORITY_RANGE = (-100, 100)

# How far back an evaluation looks for the latest missed slots before it reads the
# whole span since the watermark: each window is read only when the one before held
# too few slots, so a long outage of a minutely schedule reads about a day of slots,
# not every minute of it.
_WINDOWS = (
    timedelta(hours=1),
    timedelta(days=1),
    timedelta(days=32),
    timedelta(days=366),
)


@dataclass(frozen=True)
class ScheduleDefinition:
    """One checked declaration. ``as_json()`` is its normalised form, the one stored in
    the schedule's row and compared at each synchronisation."""

    key: str
    kind: ScheduleKind
    target: str
    """The task's dotted path, or the operations job's key."""
    cron: str
    timezone: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    catch_up: CatchUp = CatchUp.LATEST
    queue_name: str | None = None
    priority: int | None = None
    backend: str = "default"

    @property
    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone)

    @property
    def timing(self) -> tuple[str, str]:
        """What places the slots: a change of either starts the schedule afresh."""
        return (self.cron, self.timezone)

    def as_json(self) -> dict[str, Any]:
        declared: dict[str, Any] = {
            self.kind.value: self.target,
            "cron": self.cron,
            "timezone": self.timezone,
            "args": self.args,
            "kwargs": self.kwargs,
            "catch_up": self.catch_up.value,
            "backend": self.backend,
        }
        if self.queue_name is not None:
            declared["queue_name"] = self.queue_name
        if self.priority is not None:
            declared["priority"] = self.priority
        return declared

    def slots(self) -> Slots:
        return Slots(self.cron, self.zone)

    def explain(self) -> str:
        """The cron expression in words (cronsim's English), for the console."""
        return CronSim(self.cron, datetime.now(UTC)).explain()


class Slots:
    """The instants a cron expression names in a time zone, as UTC datetimes."""

    def __init__(self, cron: str, zone: ZoneInfo) -> None:
        self.cron = cron
        self.zone = zone

    def after(self, start: datetime, end: datetime | None = None) -> Iterator[datetime]:
        """The slots ``s`` with ``start < s`` (and ``s <= end``), in order."""
        try:
            iterator = CronSim(self.cron, start.astimezone(self.zone))
        except CronSimError as exc:  # checked at start-up; a row edited by hand is not
            raise ValueError(f"cron expression {self.cron!r}: {exc}") from exc
        for local in iterator:
            slot = local.astimezone(UTC)
            # Started inside a repeated hour, cronsim (on the wall clock) can name the
            # first pass of that hour, which is before ``start``.
            if slot <= start:
                continue
            if end is not None and slot > end:
                return
            yield slot

    def next_after(self, instant: datetime) -> datetime | None:
        """The first slot after ``instant``; ``None`` when none comes in 50 years."""
        return next(self.after(instant), None)

    def latest(self, after: datetime, until: datetime, count: int) -> tuple[list[datetime], bool]:
        """The latest ``count`` slots in ``(after, until]``, oldest first, and whether
        earlier ones in that span were left out."""
        if until <= after:
            return [], False
        for window in (*_WINDOWS, None):
            start = after if window is None else max(after, until - window)
            found: deque[datetime] = deque(maxlen=count)
            seen = 0
            for slot in self.after(start, until):
                found.append(slot)
                seen += 1
            if len(found) >= count or start == after:
                earlier = start > after and next(self.after(after, start), None) is not None
                return list(found), seen > len(found) or earlier
        raise AssertionError("the last window always reaches back to the watermark")


def _text(value: Any, limit: int) -> str | None:
    if not isinstance(value, str) or not value.strip() or len(value) > limit:
        return None
    if "\x00" in value or any(0xD800 <= ord(char) <= 0xDFFF for char in value):
        return None
    return value


def _json_problem(value: Any, field: str) -> str | None:
    """Why ``value`` is not an argument the job table can hold, by the stores' own rules
    (:func:`~jobstate.core.jsonvalues.ensure_json`: no NUL, no lone surrogate, within
    ``MAX_PAYLOAD_BYTES``...), after the round trip through JSON the enqueue makes
    (tuples become lists)."""
    try:
        ensure_json(json.loads(json.dumps(value, allow_nan=False)), field=field)
    except InvalidPayload as exc:  # a ValueError: caught first
        return str(exc)
    except (TypeError, ValueError) as exc:
        return f"{field} must be JSON: {exc}."
    return None


def _shown(value: object) -> str:
    """``value`` as a problem repeats it: its ``repr``, cut when it is long."""
    return shown(repr(value))


def declaration_problems(key: Any, declared: Any) -> list[str]:
    """Every problem of one ``SCHEDULES`` entry, one sentence each, naming the schedule
    and the key at fault; ``[]`` when it is good."""
    where = f"JOBSTATE['SCHEDULES'][{_shown(key)}]"
    if not isinstance(key, str) or len(key) > _KEY_LIMIT or not SCHEDULE_KEY_PATTERN.fullmatch(key):
        return [
            f"{where}: a schedule key is 1 to {_KEY_LIMIT} letters, digits, '.', '_', ':' or "
            "'-', starting with a letter or digit."
        ]
    if not isinstance(declared, Mapping):
        return [f"{where} must be a dict, got {type(declared).__name__}."]
    problems = []
    unknown = sorted(str(name) for name in declared if name not in KNOWN_KEYS)
    if unknown:
        problems.append(
            f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; known: "
            f"{', '.join(KNOWN_KEYS)}."
        )
    named = [name for name in ("task", "operations_job") if name in declared]
    if len(named) != 1:
        problems.append(
            f"{where} must name exactly one of 'task' (a django.tasks task's dotted path) "
            f"and 'operations_job' (a registered operations job's key); it names "
            f"{' and '.join(map(repr, named)) or 'neither'}."
        )
    if "task" in declared and (
        _text(declared["task"], _PATH_LIMIT) is None or "." not in declared["task"]
    ):
        problems.append(f"{where}['task'] must be a dotted path, got {_shown(declared['task'])}.")
    if "operations_job" in declared and _text(declared["operations_job"], _PATH_LIMIT) is None:
        problems.append(
            f"{where}['operations_job'] must be an operations job's key, got "
            f"{_shown(declared['operations_job'])}."
        )
    problems += _cron_problems(where, declared)
    problems += _argument_problems(where, declared)
    catch_up = declared.get("catch_up", CatchUp.LATEST.value)
    if catch_up not in CatchUp.values:
        problems.append(f"{where}['catch_up'] must be 'latest' or 'all', got {_shown(catch_up)}.")
    if "queue_name" in declared and _text(declared["queue_name"], _QUEUE_LIMIT) is None:
        problems.append(
            f"{where}['queue_name'] must be a queue name (a non-empty string of at most "
            f"{_QUEUE_LIMIT} characters), got {_shown(declared['queue_name'])}."
        )
    priority = declared.get("priority")
    low, high = _PRIORITY_RANGE
    if "priority" in declared and (
        isinstance(priority, bool) or not isinstance(priority, int) or not low <= priority <= high
    ):
        problems.append(
            f"{where}['priority'] must be an int from {low} to {high}, got {_shown(priority)}."
        )
    if "backend" in declared and _text(declared["backend"], _QUEUE_LIMIT) is None:
        problems.append(
            f"{where}['backend'] must be a TASKS alias, got {_shown(declared['backend'])}."
        )
    return problems


#: The name the system's zone database gives the machine's own zone (``/etc/localtime``).
_MACHINE_ZONE = "localtime"


def _cron_problems(where: str, declared: Mapping[str, Any]) -> list[str]:
    problems = []
    zone: ZoneInfo | None = None
    name = declared.get("timezone", DEFAULT_TIMEZONE)
    if _text(name, 100) is None:
        problems.append(f"{where}['timezone'] must be an IANA time zone name, got {_shown(name)}.")
    else:
        try:
            zone = ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError):
            problems.append(
                f"{where}['timezone'] {_shown(name)} is not a time zone this system knows "
                "(an IANA name such as 'Europe/Berlin' or 'UTC')."
            )
        else:
            if name == _MACHINE_ZONE:
                # Machines set to different zones would compute different slots of one
                # schedule, and each would enqueue its own.
                zone = None
                problems.append(
                    f"{where}['timezone'] 'localtime' is this machine's own time zone, which "
                    "can differ between the machines that run schedules: name the zone "
                    "(an IANA name such as 'Europe/Berlin' or 'UTC')."
                )
    if "cron" not in declared:
        return [*problems, f"{where} has no 'cron' expression."]
    cron = declared["cron"]
    if _text(cron, _CRON_LIMIT) is None:
        return [*problems, f"{where}['cron'] must be a cron expression, got {_shown(cron)}."]
    if len(cron.split()) != 5:
        return [
            *problems,
            f"{where}['cron'] {_shown(cron)} must have 5 fields (minute hour day-of-month month "
            "day-of-week); neither seconds nor a year are supported.",
        ]
    try:
        first = Slots(cron, zone or ZoneInfo("UTC")).next_after(datetime.now(UTC))
    except ValueError as exc:
        return [*problems, f"{where}['cron'] is not a valid cron expression: {exc.__cause__}."]
    if first is None:
        problems.append(f"{where}['cron'] {_shown(cron)} names no instant in the next 50 years.")
    return problems


def _argument_problems(where: str, declared: Mapping[str, Any]) -> list[str]:
    problems = []
    args = declared.get("args", [])
    if not isinstance(args, list | tuple):
        problems.append(f"{where}['args'] must be a list, got {type(args).__name__}.")
    elif problem := _json_problem(list(args), f"{where}['args']"):
        problems.append(problem)
    elif args and "operations_job" in declared:
        problems.append(
            f"{where}['args'] must be empty for an operations job: give its input as 'kwargs'."
        )
    kwargs = declared.get("kwargs", {})
    if not isinstance(kwargs, Mapping) or not all(isinstance(name, str) for name in kwargs):
        problems.append(f"{where}['kwargs'] must be a dict with string keys, got {_shown(kwargs)}.")
    elif problem := _json_problem(dict(kwargs), f"{where}['kwargs']"):
        problems.append(problem)
    elif not problems and (
        problem := _json_problem(
            _stored_input(list(args), dict(kwargs), operations="operations_job" in declared),
            f"{where}['args'] and ['kwargs'] together, as the job's input,",
        )
    ):
        # Each alone can be storable and still nest too deeply inside the job's input;
        # when one alone is not, the input is not either, and saying so twice helps no one.
        problems.append(problem)
    return problems


def _stored_input(args: list[Any], kwargs: dict[str, Any], *, operations: bool) -> Any:
    """The input of the job a slot enqueues (:func:`~jobstate.schedules.targets.
    enqueue_target`): a task's arguments as they are; an operations job's kwargs as the
    second argument of the task that runs it (its other arguments are text)."""
    if operations:
        return {"args": ["", kwargs or None, "", ""], "kwargs": {}}
    return {"args": args, "kwargs": kwargs}


def parse_declaration(key: str, declared: Mapping[str, Any]) -> ScheduleDefinition:
    """The definition of a declaration :func:`declaration_problems` found no problem
    in; ``ValueError`` naming every problem otherwise."""
    problems = declaration_problems(key, declared)
    if problems:
        raise ValueError(" ".join(problems))
    kind = ScheduleKind.TASK if "task" in declared else ScheduleKind.OPERATIONS_JOB
    # A round trip through JSON: tuples become lists, as they will in the job.
    args = json.loads(json.dumps(list(declared.get("args", []))))
    kwargs = json.loads(json.dumps(dict(declared.get("kwargs", {}))))
    return ScheduleDefinition(
        key=key,
        kind=kind,
        target=declared[kind.value],
        cron=" ".join(declared["cron"].split()),
        timezone=declared.get("timezone", DEFAULT_TIMEZONE),
        args=args,
        kwargs=kwargs,
        catch_up=CatchUp(declared.get("catch_up", CatchUp.LATEST.value)),
        queue_name=declared.get("queue_name"),
        priority=declared.get("priority"),
        backend=declared.get("backend", "default"),
    )
