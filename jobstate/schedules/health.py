"""Whether a declared schedule is broken now: its declaration in settings is refused
(``jobstate.E030``) or what it runs cannot be enqueued (``jobstate.E031``). Every
evaluation skips such a schedule and logs why; the console's Schedules page marks it."""

from __future__ import annotations

from jobstate.core.conf import jobstate_settings
from jobstate.schedules.definitions import declaration_problems, parse_declaration
from jobstate.schedules.targets import target_problems

__all__ = ["schedule_problem"]


def schedule_problem(key: str) -> str | None:
    """Why the schedule ``JOBSTATE["SCHEDULES"][key]`` cannot be enqueued, one sentence
    per problem; ``None`` when it can, or when settings declare no such schedule."""
    schedules = jobstate_settings.SCHEDULES
    if key not in schedules:
        return None
    declared = schedules[key]
    problems = declaration_problems(key, declared) or target_problems(
        parse_declaration(key, declared)
    )
    return " ".join(problems) or None
