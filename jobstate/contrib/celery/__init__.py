"""Celery for jobstate's maintenance: the Celery tasks (:mod:`.celery_tasks`, task names
``jobstate.reap_stale``, ``jobstate.prune``, ``jobstate.deliver_notifications``,
``jobstate.run_operations_job`` and ``jobstate.enqueue_due_schedules``) and a beat
schedule for them (:mod:`.beat`). A worker or beat whose app misses the line below
while its beat schedule names these tasks logs a warning at start (:mod:`.discovery`).

A host's Celery app finds the tasks with one line::

    app.autodiscover_tasks(["jobstate.contrib.celery"], related_name="celery_tasks")

Importing this package imports neither Celery nor models, so settings may import
:mod:`.beat`.
"""
