"""Python work per task of a real task worker, counted rather than timed.

``python -m bench calls`` adds these rows: a :class:`~jobstate.tasks.worker.TaskWorker`
at ``--concurrency 1 --batch``, run in this process as ``manage.py jobstate_worker``
runs it, drains ``tasks`` no-op tasks (``worker``; ``worker-policy``: tasks that carry
a policy), then twice as many. Both threads of the worker are profiled (the control
loop and its execution thread), so the count is the whole process's (before Python 3.12
with a profiler per thread, since ``cProfile`` followed only the thread that enabled it;
from 3.12 on one profiler sees every thread, and a second one cannot be enabled); what a start and
a stop cost is the same for both drains, so their difference over ``tasks`` is what one
task costs. The statements the control loop's connection sends are counted the same way.
The worker's ``--interval`` is long (see :func:`_drain`), so what it does once per
interval does not count.

``--top N`` also prints where the calls of the larger drain go: the N functions with the
most own time, and the N called most often.
"""

from __future__ import annotations

import cProfile
import io
import logging
import pstats
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["run"]

#: The rows, by the no-op task of :mod:`bench.peer_tasks` each drains.
ROWS = {"worker": "jobstate_noop", "worker-policy": "jobstate_policy_noop"}


def _enqueue(task_name: str, tasks: int) -> None:
    from django.db import transaction

    from bench import peer_tasks
    from bench.loading import PAYLOAD_PAD

    task = getattr(peer_tasks, task_name)
    with transaction.atomic():
        for n in range(tasks):
            task.enqueue(n=n, pad=PAYLOAD_PAD)


@contextmanager
def _worker_log_level() -> Iterator[None]:
    """The worker's log as ``jobstate_worker`` sets it at its default verbosity (INFO,
    unless the project set a level): its line per task is part of what a task costs."""
    logger = logging.getLogger("jobstate.worker")
    level = logger.level
    if level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)


#: From Python 3.12 on, ``cProfile`` is built on ``sys.monitoring``: one profiler counts
#: every thread, and enabling a second one raises ``ValueError`` (which, in a thread's
#: profile hook, ended the worker's execution thread before its first task and left the
#: drain waiting for ever).
_ONE_PROFILER_SEES_EVERY_THREAD = sys.version_info >= (3, 12)


class _ThreadProfiles:
    """One profiler per thread started while installed: before Python 3.12, ``cProfile``
    follows only the thread that enables it, and the worker runs each task in a thread
    of its own. From 3.12 on this installs nothing."""

    def __init__(self) -> None:
        self.profiles: list[cProfile.Profile] = []
        self.threads: list[threading.Thread] = []

    def _hook(self, frame: Any, event: str, arg: Any) -> None:
        # Called once in each new thread: enabling a profiler there replaces this hook.
        profile = cProfile.Profile()
        self.profiles.append(profile)
        self.threads.append(threading.current_thread())
        profile.enable()

    @contextmanager
    def installed(self) -> Iterator[None]:
        if _ONE_PROFILER_SEES_EVERY_THREAD:
            yield
            return
        threading.setprofile(self._hook)
        try:
            yield
        finally:
            threading.setprofile(None)  # type: ignore[arg-type]


def _drain(task_name: str, tasks: int, index: int) -> tuple[pstats.Stats, int, float]:
    """Enqueue ``tasks`` tasks, drain them with a worker in this process: the profile of
    both threads, the statements of the loop's connection and the process's CPU."""
    from django.db import connection

    from jobstate.tasks.backend import JobStateBackend
    from jobstate.tasks.compat import task_backends
    from jobstate.tasks.worker import TaskWorker, WorkerConfig

    _enqueue(task_name, tasks)
    backend = task_backends["jobstate"]
    assert isinstance(backend, JobStateBackend)
    config = WorkerConfig(
        backend=backend.alias,
        concurrency=1,
        batch=True,
        # What the worker does once per interval (it asks whether its tasks were
        # cancelled; it claims the tasks under a concurrency key first) costs per second,
        # not per task: a long interval keeps it out of the count, which would otherwise
        # grow with how slowly the profiled drain runs.
        interval=30,
        schedules=False,
        worker_id=f"calls-worker-{index}",
    )
    worker = TaskWorker(config, backend)
    statements = 0

    def count(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal statements
        statements += 1
        return execute(sql, params, many, context)

    threads = _ThreadProfiles()
    main = cProfile.Profile()
    with _worker_log_level(), connection.execute_wrapper(count), threads.installed():
        cpu = time.process_time()
        main.enable()
        summary = worker.run()
        main.disable()
    for thread in threads.threads:
        # The pool's threads end once stopped; their counts are complete once they have.
        thread.join(timeout=10)
    cpu = time.process_time() - cpu
    if summary.succeeded != tasks:
        raise RuntimeError(f"the worker drained {summary.succeeded} of {tasks} tasks: {summary}")
    stats = pstats.Stats(main)
    for profile in threads.profiles:
        stats.add(profile)
    return stats, statements, cpu


def _top(stats: pstats.Stats, top: int, log: Callable[[str], None]) -> None:
    for key in ("tottime", "ncalls"):
        out = io.StringIO()
        stats.stream = out  # type: ignore[attr-defined]
        stats.sort_stats(key).print_stats(top)
        log(f"--- the {top} functions of the larger drain with the most {key} ---")
        log(out.getvalue())
    stats.stream = sys.stdout  # type: ignore[attr-defined]


def run(
    *, tasks: int, top: int, rows: Sequence[str] = tuple(ROWS), log: Callable[[str], None]
) -> dict[str, dict[str, float]]:
    """Count the ``rows``' calls, statements and CPU per task; see the module docstring."""
    results: dict[str, dict[str, float]] = {}
    for index, (row, task_name) in enumerate(ROWS.items()):
        if row not in rows:
            continue
        few, few_statements, few_cpu = _drain(task_name, tasks, 2 * index)
        many, many_statements, many_cpu = _drain(task_name, 2 * tasks, 2 * index + 1)
        calls = many.total_calls - few.total_calls  # type: ignore[attr-defined]
        results[row] = {
            "tasks": tasks,
            "calls_per_task": calls / tasks,
            "statements_per_task": (many_statements - few_statements) / tasks,
            "cpu_us_per_task": (many_cpu - few_cpu) / tasks * 1e6,
        }
        found = results[row]
        log(
            f"{row:>14}: {found['calls_per_task']:.1f} Python calls per task, "
            f"{found['statements_per_task']:.2f} statements per task, "
            f"{found['cpu_us_per_task']:.0f} us CPU per task under the profiler "
            f"(drains of {tasks} and {2 * tasks} tasks, --concurrency 1)"
        )
        if top:
            _top(many, top, log)
    return results
