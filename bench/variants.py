"""The connection settings a drain cell runs under, and the contenders that run what a
host's worker runs (the seed's completion path).

A Django contender's statements are prepared or not depending on the host's settings:
Django leaves psycopg's automatic preparation off unless ``OPTIONS["prepare_threshold"]``
is set, and procrastinate's worker pool takes the same connection parameters. So every
contender whose statements those settings can change runs once per setting, in the same
interleaved rounds as the others:

- ``defaults``: Django's defaults, no ``prepare_threshold`` in ``OPTIONS`` (what a new
  host runs).
- ``prepared``: ``OPTIONS["prepare_threshold"] = 5``, psycopg's own default (a host that
  turned preparation on).
- ``unprepared``: Django's defaults and ``JOBSTATE["PREPARED_STATEMENTS"] = False`` (what
  a host behind PgBouncer in transaction mode before 1.21 must set): nothing prepared.

Raw psycopg contenders run at psycopg's default (``psycopg``: prepared after 5 runs),
and django-tasks-db's ORM statements are bound on the client, which no setting prepares
(``any``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bench.loading import TARGET


@dataclass(frozen=True)
class Setting:
    name: str
    label: str
    #: Environment of the worker process, read by ``bench.settings``.
    env: dict[str, str]


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in [
        Setting(
            "defaults",
            "Django's defaults (no prepare_threshold in OPTIONS)",
            {"JOBSTATE_BENCH_PREPARE_THRESHOLD": "off"},
        ),
        Setting(
            "prepared",
            "OPTIONS prepare_threshold = 5 (psycopg's default)",
            {"JOBSTATE_BENCH_PREPARE_THRESHOLD": "5"},
        ),
        Setting(
            "unprepared",
            "Django's defaults and JOBSTATE PREPARED_STATEMENTS = False",
            {
                "JOBSTATE_BENCH_PREPARE_THRESHOLD": "off",
                "JOBSTATE_BENCH_PREPARED_STATEMENTS": "off",
            },
        ),
        Setting("psycopg", "raw psycopg at its default (prepare after 5 runs)", {}),
        Setting("any", "ORM statements bound on the client: never prepared", {}),
    ]
}

#: Settings a run can choose between (the other two belong to one contender each).
SELECTABLE = ("defaults", "prepared", "unprepared")

#: The settings each kind of contender runs under.
JOBSTATE_SETTINGS = ("defaults", "prepared", "unprepared")
DJANGO_POOL_SETTINGS = ("defaults", "prepared")
RAW_SETTINGS = ("psycopg",)
CLIENT_BINDING_SETTINGS = ("any",)


# --- the seed's completion path -----------------------------------------------------------

HOOK = "https://hooks.example.com/jobs"
MAILBOX = "ops@example.com"


def prepare_jobstate_seed(
    notifications: int,
) -> Callable[[str, int, int], Callable[[Callable[[int], None]], int]]:
    """The seed's worker loop: ``claim_next_inhub_job`` then
    ``complete_job_with_notifications(job, {"status": "done", "result": {...}}, [...])``
    with ``notifications`` requests per job (a webhook, then an e-mail)."""

    def prepare(url: str, index: int, batch: int) -> Callable[[Callable[[int], None]], int]:
        from django.db import connection

        from jobstate.stores import get_state_store
        from jobstate.stores.base import NotificationRequest

        store = get_state_store()
        connection.ensure_connection()
        worker = f"jobstate-seed-{notifications}-{index}"

        def drain(tick: Callable[[int], None]) -> int:
            done = 0
            while True:
                job = store.claim_next_inhub_job([TARGET], worker)
                if job is None:
                    return done
                number = job.input["n"]
                requests = [
                    NotificationRequest("webhook", HOOK, {"job": number, "status": "done"}),
                    NotificationRequest(
                        "email", MAILBOX, {"subject": f"job {number} done", "body": "ok"}
                    ),
                ][:notifications]
                finished = store.complete_job_with_notifications(
                    job, {"status": "done", "result": {"n": number, "ok": True}}, requests
                )
                if finished is None:
                    raise RuntimeError("a fresh claim's completion was refused")
                done += 1
                tick(done)

        return drain

    return prepare
