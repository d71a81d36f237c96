"""The django.tasks worker behind ``manage.py jobstate_worker``.

:class:`TaskWorker` runs the tasks of one ``JobStateBackend``: :mod:`.loop` claims, renews
and settles, as :mod:`.config` says (the command's options; the summary it returns);
:mod:`.presence` keeps its row in the worker registry and logs its start;
:mod:`.execution` runs attempts in threads; :mod:`.reports` writes how they ended;
:mod:`.waiter` wakes an idle worker on PostgreSQL's ``NOTIFY``; :mod:`.shutdown` turns
SIGTERM and SIGINT into a graceful stop, and a second one into an immediate exit;
:mod:`.unknown_tasks` hands back the tasks a worker cannot import; :mod:`.reloading`
runs a fresh worker when the code changes (``--reload``).
"""

from jobstate.tasks.worker.loop import TaskWorker, WorkerConfig, WorkerSummary, default_worker_id

__all__ = ["TaskWorker", "WorkerConfig", "WorkerSummary", "default_worker_id"]
