"""Django's task API under one set of names: ``django.tasks`` on Django 6, the
``django-tasks`` backport (``pip install "django-jobstate[tasks]"``) on Django 5.2.

The two are the same interface (the backport is what Django 6 merged), with two names
spelled differently; everything jobstate's backend and worker use of it comes from here.
Type checking reads Django 6's names (django-stubs describe ``django.tasks``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import django
from django.core.exceptions import ImproperlyConfigured

__all__ = [
    "DJANGO_TASKS_APP",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "builtin_tasks",
    "normalize_json",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

#: Whether Django itself has ``django.tasks`` (6.0 and later).
builtin_tasks = django.VERSION >= (6, 0)

#: The app that registers the task system checks on Django 5.2 (``INSTALLED_APPS``).
DJANGO_TASKS_APP = "django_tasks"

if TYPE_CHECKING or builtin_tasks:
    from django.tasks import (
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        task,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import TaskError
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.json import normalize_json
else:
    try:
        from django_tasks import (
            TaskContext,
            TaskResult,
            TaskResultStatus,
            task,
            task_backends,
        )
        from django_tasks.backends.base import BaseTaskBackend
        from django_tasks.base import Task, TaskError
        from django_tasks.exceptions import InvalidTaskError as InvalidTask
        from django_tasks.exceptions import TaskResultDoesNotExist
        from django_tasks.signals import task_enqueued, task_finished, task_started
        from django_tasks.utils import normalize_json
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"jobstate's task backend needs django.tasks: Django {django.get_version()} "
            "has no django.tasks, so install the django-tasks backport with "
            'pip install "django-jobstate[tasks]" (or upgrade to Django 6).'
        ) from exc
