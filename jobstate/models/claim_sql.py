"""The claim's rules as SQL text, for the one-statement claims
(:mod:`jobstate.stores.database.backends`), which cannot be written on the ORM. Each text
has an ORM twin in :mod:`jobstate.models.jobs` (named in its comment);
tests/stores/test_sql_twins.py runs both on the same rows on every backend and asserts
they select the same ones. In the text the candidate job is ``c``; ``{job}`` and
``{pauses}`` stand for the quoted job and queue pause tables, ``{now}`` for the database
clock and ``{no_queue}`` for :data:`~jobstate.models.NO_QUEUE`, filled in per backend by
its operations object (``BackendOperations.sql``)."""

__all__ = [
    "CLAIM_ORDER_SQL",
    "PAUSED_SQL",
    "READY_SQL",
    "TASK_CLAIM_ORDER_SQL",
    "TASK_DUE_SQL",
    "TASK_READY_SQL",
    "THREAD_BLOCKERS_SQL",
    "UNPAUSED_SQL",
]

#: The claim's ``WHERE`` (``JobQuerySet.ready``): queued and due.
READY_SQL = "c.status = 'queued' AND (c.run_after IS NULL OR c.run_after <= {now})"

CLAIM_ORDER_SQL = "c.created_at, c.id"

#: :func:`thread_blockers` of a candidate ``c``, in SQL: a running or dispatched sibling,
#: or a ready queued sibling ahead of it. Use as ``NOT EXISTS (...)``.
THREAD_BLOCKERS_SQL = """
    SELECT 1 FROM {job} AS b
    WHERE b.thread_id = c.thread_id AND b.id <> c.id
      AND (b.status IN ('running', 'dispatched')
           OR (b.status = 'queued'
               AND (b.run_after IS NULL OR b.run_after <= {now})
               AND (b.created_at < c.created_at
                    OR (b.created_at = c.created_at AND b.id < c.id))))
"""

#: :func:`queue_paused` of a candidate ``c``, in SQL. The pause table holds a row per
#: paused queue, usually none: the probe is one lookup in its unique index per candidate
#: a claim looks at, and a claim that starts after a pause committed sees it (READ
#: COMMITTED takes each statement's snapshot when the statement starts).
PAUSED_SQL = """
    SELECT 1 FROM {pauses} AS p
    WHERE p.target = c.target AND p.queue_name = COALESCE(c.queue_name, '{no_queue}')
"""

#: ``~queue_paused()`` of a candidate ``c`` as the one-statement claims write it: first
#: whether any queue is paused at all, then, only when one is, :data:`PAUSED_SQL` per
#: candidate. The first subquery is uncorrelated, so PostgreSQL runs it once per
#: statement (an *InitPlan*: one page of an empty table) and, finding no pause, never
#: runs the second; the planner plans no anti join either. Both read the claim
#: statement's own snapshot, taken when it starts (READ COMMITTED), so a pause committed
#: before a claim starts is seen by the first and then the second: no claim that starts
#: after the pause commits takes a job of its queue, with no cache to go stale.
UNPAUSED_SQL = f"""(
    NOT EXISTS (SELECT 1 FROM {{pauses}} AS anywhere)
    OR NOT EXISTS ({PAUSED_SQL})
)"""

TASK_DUE_SQL = "COALESCE(c.run_after, c.created_at)"

#: A queued task of target ``%s`` without a concurrency key that is due
#: (``JobQuerySet.due_tasks``), written as the
#: task claim index states its condition and its due column, so PostgreSQL's planner reads
#: the index in claim order.
TASK_READY_SQL = (
    "c.status = 'queued' AND c.task_path IS NOT NULL AND c.target = %s"
    f" AND {TASK_DUE_SQL} <= {{now}} AND c.concurrency_digest IS NULL"
)

#: The order a task claim takes tasks in (``JobQuerySet.in_task_claim_order``): priority,
#: then when due, then enqueue order; the task claim index's own order.
TASK_CLAIM_ORDER_SQL = f"c.priority DESC, {TASK_DUE_SQL}, c.created_at, c.id"
