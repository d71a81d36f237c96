"""The Django settings both reliability runs share; each run's settings module star-imports
them and adds its database, its process name and its liveness settings."""

SECRET_KEY = "reliability-run-only"
# DEBUG would keep every query of a long run in memory.
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "jobstate",
]
