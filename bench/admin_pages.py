"""The console's other pages at scale, run by ``python -m bench.admin_scale``: the job
runs, notifications, schedules, runtime locks and bulk operations lists, and the pages
of one run, one notification, one schedule and one worker.

After the jobs and audit entries of ``bench.admin_scale`` are seeded, :func:`seed`
writes a job run per ten jobs (a few still running, a few stale), a notification per
five jobs (most delivered, some pending, some dead; each pointing at its job), forty
schedules (tasks and operations jobs, a few paused) with an occurrence per schedule and
hour over the last day, and a finished bulk operation, all inside PostgreSQL. Every page
is measured like the others and checked against the same goals as the jobs pages
(:data:`bench.admin_console.PAGE_LIMIT_MS`, :data:`bench.admin_console.QUERY_LIMIT`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.admin_console import PAGE_LIMIT_MS, QUERY_LIMIT

#: Seeded rows per job.
RUNS_PER_JOB = 0.1
NOTIFICATIONS_PER_JOB = 0.2
SCHEDULES = 40

_SEED_RUNS_SQL = """
INSERT INTO jobstate_jobrun (
    id, job_key, overlap_key, status, trigger_source, triggered_by, input, summary, error,
    started_at, finished_at, duration_ms, heartbeat_at, service_revision
)
SELECT
    md5('bench-run-' || i)::uuid,
    'nightly-' || mod(i, 20),
    CASE WHEN i <= 5 THEN 'nightly-' || mod(i, 20) || ':bench-' || i END,
    CASE WHEN i <= 5 THEN 'RUNNING' WHEN mod(i, 17) = 0 THEN 'FAILED'
         WHEN mod(i, 53) = 0 THEN 'SKIPPED' ELSE 'SUCCEEDED' END,
    (ARRAY['SCHEDULER', 'CLI', 'ADMIN', 'CELERY'])[1 + mod(i, 4)],
    NULL,
    jsonb_build_object('n', i),
    CASE WHEN i > 5 THEN jsonb_build_object('rows', mod(i, 1000)) END,
    CASE WHEN i > 5 AND mod(i, 17) = 0 THEN 'RuntimeError: bench run ' || i END,
    now() - make_interval(secs => i * 30),
    CASE WHEN i > 5 THEN now() - make_interval(secs => i * 30 - 12) END,
    CASE WHEN i > 5 THEN 12000 END,
    -- Two of the running ones went silent: stale on the runs list.
    CASE WHEN i IN (4, 5) THEN now() - interval '2 hours' ELSE now() END,
    'bench'
FROM generate_series(1, %(n)s) AS i
"""

_SEED_NOTIFICATIONS_SQL = """
INSERT INTO jobstate_notification (
    id, job_id, channel, destination, payload, idempotency_key, state, attempts,
    next_attempt_at, lease_until, relay_id, last_error, delivered_at, created_at, updated_at
)
SELECT
    md5('bench-notification-' || i)::uuid,
    md5('bench-job-' || i)::uuid,
    'webhook',
    'https://hooks.example.com/jobs/' || mod(i, 50),
    jsonb_build_object('job', i, 'event', 'done'),
    'bench-notification-' || i,
    CASE WHEN mod(i, 50) = 0 THEN 'dead' WHEN mod(i, 20) = 0 THEN 'pending'
         ELSE 'delivered' END,
    CASE WHEN mod(i, 50) = 0 THEN 8 ELSE 1 END,
    now(),
    NULL,
    'relay-1',
    CASE WHEN mod(i, 50) = 0 THEN 'HTTP 503 from the receiver' END,
    CASE WHEN mod(i, 50) <> 0 AND mod(i, 20) <> 0 THEN now() - make_interval(secs => i) END,
    now() - make_interval(secs => i * 2),
    now() - make_interval(secs => i)
FROM generate_series(1, %(n)s) AS i
"""

_SEED_SCHEDULES_SQL = """
INSERT INTO jobstate_schedule (
    key, kind, target, cron, timezone, catch_up, definition, revision, effective_from,
    last_slot, next_slot, paused, paused_at, paused_by, removed_at, created_at
)
SELECT
    'bench-schedule-' || i,
    CASE WHEN mod(i, 4) = 0 THEN 'operations_job' ELSE 'task' END,
    CASE WHEN mod(i, 4) = 0 THEN 'nightly-' || i ELSE 'app.tasks.send_email' END,
    '0 * * * *',
    'UTC',
    'latest',
    jsonb_build_object('cron', '0 * * * *'),
    1,
    now() - interval '30 days',
    date_trunc('hour', now()),
    date_trunc('hour', now()) + interval '1 hour',
    mod(i, 10) = 0,
    CASE WHEN mod(i, 10) = 0 THEN now() END,
    CASE WHEN mod(i, 10) = 0 THEN 'bench' ELSE '' END,
    NULL,
    now() - interval '30 days'
FROM generate_series(1, %(n)s) AS i
"""

_SEED_OCCURRENCES_SQL = """
INSERT INTO jobstate_scheduleoccurrence (schedule_id, slot, trigger, result_id, enqueued_at,
                                         enqueued_by)
SELECT s.id, date_trunc('hour', now()) - make_interval(hours => h), 'cron',
       md5('bench-job-' || (s.id * 24 + h))::uuid,
       date_trunc('hour', now()) - make_interval(hours => h), ''
FROM jobstate_schedule AS s CROSS JOIN generate_series(0, 23) AS h
"""

_SEED_BULK_SQL = """
INSERT INTO jobstate_bulkoperation (
    action, state, operator, filters, search, reason, cutoff, total, done, skipped,
    created_at, updated_at, finished_at
)
VALUES ('requeue', 'done', 'bench', '{"status__exact": "error"}'::jsonb, '', '',
        now() - interval '1 hour', 1000, 990, 10, now() - interval '1 hour',
        now() - interval '59 minutes', now() - interval '59 minutes')
"""


@dataclass(frozen=True)
class ExtraPage:
    key: str
    label: str
    url: str


def seed(connection: Any, jobs: int) -> None:
    """Runs, notifications, schedules and a bulk operation beside ``jobs`` seeded jobs."""
    with connection.cursor() as cursor:
        cursor.execute(_SEED_RUNS_SQL, {"n": max(10, int(jobs * RUNS_PER_JOB))})
        cursor.execute(_SEED_NOTIFICATIONS_SQL, {"n": max(10, int(jobs * NOTIFICATIONS_PER_JOB))})
        cursor.execute(_SEED_SCHEDULES_SQL, {"n": SCHEDULES})
        cursor.execute(_SEED_OCCURRENCES_SQL)
        cursor.execute(_SEED_BULK_SQL)


def pages(connection: Any) -> list[ExtraPage]:
    """The lists and detail pages measured beside the jobs pages."""
    from django.urls import reverse

    def one(sql: str) -> Any:
        with connection.cursor() as cursor:
            cursor.execute(sql)
            row = cursor.fetchone()
        return None if row is None else row[0]

    found = [
        ExtraPage("runs", "job runs changelist", reverse("admin:jobstate_jobrun_changelist")),
        ExtraPage(
            "notifications",
            "notifications changelist",
            reverse("admin:jobstate_notification_changelist"),
        ),
        ExtraPage(
            "schedules", "schedules changelist", reverse("admin:jobstate_schedule_changelist")
        ),
        ExtraPage(
            "locks", "runtime locks changelist", reverse("admin:jobstate_runtimelock_changelist")
        ),
        ExtraPage(
            "bulk", "bulk operations changelist", reverse("admin:jobstate_bulkoperation_changelist")
        ),
    ]
    details = [
        (
            "run_page",
            "a run's page",
            "jobrun",
            "SELECT id FROM jobstate_jobrun ORDER BY started_at DESC LIMIT 1",
        ),
        (
            "notification_page",
            "a notification's page",
            "notification",
            "SELECT id FROM jobstate_notification WHERE state = 'dead' LIMIT 1",
        ),
        (
            "schedule_page",
            "a schedule's page",
            "schedule",
            "SELECT id FROM jobstate_schedule ORDER BY id LIMIT 1",
        ),
        (
            "worker_page",
            "a worker's page",
            "worker",
            "SELECT id FROM jobstate_worker WHERE worker_id = 'worker-3'",
        ),
    ]
    for key, label, model, sql in details:
        pk = one(sql)
        if pk is not None:
            found.append(
                ExtraPage(key, label, reverse(f"admin:jobstate_{model}_change", args=[pk]))
            )
    return found


def over_budget(measurements: list[dict[str, Any]]) -> list[str]:
    """The jobstate pages whose median is over :data:`PAGE_LIMIT_MS` or whose queries
    are over :data:`QUERY_LIMIT`, one line each."""
    lines = []
    for m in measurements:
        if m.get("config", "jobstate") != "jobstate" or not m.get("url"):
            continue
        if m["median_ms"] > PAGE_LIMIT_MS or m["queries"] > QUERY_LIMIT:
            lines.append(f"{m['label']}: {m['median_ms']:.1f} ms, {m['queries']} queries")
    return lines
