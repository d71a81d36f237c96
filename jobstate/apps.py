from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class JobStateConfig(AppConfig):
    name = "jobstate"
    label = "jobstate"
    verbose_name = _("Job state")
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Registers the system checks, the settings-reset receiver and the schedules'
        # synchronisation after migrate; nothing else.
        from jobstate import checks, signals  # noqa: F401
        from jobstate.core import conf  # noqa: F401
