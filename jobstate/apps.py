import sys

from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class JobStateConfig(AppConfig):
    name = "jobstate"
    label = "jobstate"
    verbose_name = _("Job state")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks, the settings-reset receiver and the schedules'
        # synchronisation after migrate, and, in a process that has loaded Celery (a
        # worker or beat), the warning for an app that does not register jobstate's
        # Celery tasks; nothing else. Without Celery loaded, Celery is never imported.
        from jobstate import checks, signals  # noqa: F401
        from jobstate.core import conf  # noqa: F401

        if "celery" in sys.modules:
            from jobstate.contrib.celery.discovery import connect_start_warning

            connect_start_warning()
