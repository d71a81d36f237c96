"""Settings of the demo / host project.

Everything environment-specific is read through django-environ, so the same file serves
the embedded SQLite demo (the default), the PostgreSQL test run and a deployment:

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/jobstate python manage.py migrate
"""

from datetime import timedelta
from pathlib import Path

import django
import environ

from jobstate.contrib.celery.beat import JOBSTATE_BEAT_SCHEDULE

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env(
    DEBUG=(bool, True),
    SECRET_KEY=(str, "insecure-demo-key-change-me-in-production-0123456789abcdef"),
    ALLOWED_HOSTS=(list, ["localhost", "127.0.0.1", "[::1]", "testserver"]),
    DATABASE_URL=(str, f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
    CELERY_BROKER_URL=(str, "redis://127.0.0.1:6379/0"),
)
environ.Env.read_env(BASE_DIR / ".env")

DEBUG = env("DEBUG")
SECRET_KEY = env("SECRET_KEY")
ALLOWED_HOSTS = env("ALLOWED_HOSTS")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "jobstate",
    "project.demo",
]
if django.VERSION < (6, 0):
    # Django 5.2 has no django.tasks: the backport's app registers its system checks.
    INSTALLED_APPS.append("django_tasks")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "project.urls"
WSGI_APPLICATION = "project.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL")}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # IMMEDIATE takes SQLite's write lock at BEGIN, so two claims never interleave;
    # the timeout makes a second writer wait instead of failing at once.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"transaction_mode": "IMMEDIATE", "timeout": 30}
    )
    # A file, not the in-memory default, so tests with several threads share one database;
    # named after the main file so two checkouts or runs with different URLs never collide.
    _sqlite_name = Path(DATABASES["default"]["NAME"])
    DATABASES["default"]["TEST"] = {
        "NAME": str(_sqlite_name.with_name(f".test-{_sqlite_name.stem}.sqlite3"))
    }

if DATABASES["default"]["ENGINE"] == "django.db.backends.mysql":
    # Django says it ignores jobstate's partial constraints and indexes there; migration
    # 0009_mysql_guards puts their replacements in place, and the deploy check
    # jobstate.E044 (check --deploy --database default) fails if they are missing.
    SILENCED_SYSTEM_CHECKS = ["models.W036", "models.W037", "models.W043"]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS: list[dict[str, str]] = []

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

# The demo's e-mail (the outbox's email channel) goes to the console. Django 6.1 reads
# MAILERS; Django 5.2 reads EMAIL_BACKEND (and ignores MAILERS).
_DEMO_MAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": _DEMO_MAIL_BACKEND}}
else:
    EMAIL_BACKEND = _DEMO_MAIL_BACKEND

CELERY_BROKER_URL = env("CELERY_BROKER_URL")
# jobstate's maintenance merged with the demo's own entry: an operations job through the
# runner, so a second start while one runs is recorded as SKIPPED on any worker.
CELERY_BEAT_SCHEDULE = {
    **JOBSTATE_BEAT_SCHEDULE,
    "demo-nightly-close": {
        "task": "jobstate.run_operations_job",
        "schedule": timedelta(days=1),
        "args": ["demo.nightly-close"],
        "kwargs": {"input": {"seconds": 2}, "triggered_by": "celery beat"},
    },
}
# CELERY_BEAT_EVERY=<seconds> runs every entry that often instead, to watch beat at work.
if _beat_every := env.float("CELERY_BEAT_EVERY", default=0):
    CELERY_BEAT_SCHEDULE = {
        name: {**entry, "schedule": timedelta(seconds=_beat_every), "options": {}}
        for name, entry in CELERY_BEAT_SCHEDULE.items()
    }

# The demo's tasks (project/demo/tasks.py) run on jobstate's task backend; start a worker
# with manage.py jobstate_worker --queue-name '*'.
TASKS = {
    "default": {
        "BACKEND": "jobstate.tasks.JobStateBackend",
        "QUEUES": ["default", "emails", "reports"],
        "OPTIONS": {
            "MAX_ATTEMPTS": 3,
            "RETRY_BACKOFF": timedelta(seconds=2),
            "LEASE": timedelta(minutes=1),
            "TIMEOUT": timedelta(minutes=2),
        },
    }
}

JOBSTATE: dict[str, object] = {
    "OPERATIONS_JOB_MODULES": [],
}
# The demo's relay (scripts/demo runs deliver_notifications --loop) gives up on a
# notification after three attempts a second or two apart, as demo_traffic's own passes
# do, so dead letters show up within seconds.
if env.bool("JOBSTATE_DEMO_OUTBOX", default=False):
    JOBSTATE["OUTBOX_MAX_ATTEMPTS"] = 3
    JOBSTATE["OUTBOX_BACKOFF_BASE"] = timedelta(seconds=1)
    JOBSTATE["OUTBOX_BACKOFF_MAX"] = timedelta(seconds=4)
# The demo's periodic schedules (the Schedules page), on when scripts/demo runs; off
# otherwise, so the test suite's workers enqueue nothing of their own.
if env.bool("JOBSTATE_DEMO_SCHEDULES", default=False):
    JOBSTATE["SCHEDULES"] = {
        "demo-welcome-mail": {
            "task": "project.demo.tasks.send_welcome_email",
            "cron": "* * * * *",
            "kwargs": {"user_id": 7},
        },
        "demo-report-build": {
            "operations_job": "demo.report-build",
            "cron": "*/5 * * * *",
            "kwargs": {"rows": 100},
        },
        "demo-nightly-close": {
            "operations_job": "demo.nightly-close",
            "cron": "30 2 * * *",
            "timezone": "Europe/Berlin",
            "kwargs": {"seconds": 2},
        },
    }

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {
        "jobstate": {"handlers": ["console"], "level": env("JOBSTATE_LOG_LEVEL", default="WARNING")}
    },
}
#: How a line of demo.log starts; demo_traffic writes its own lines the same way.
DEMO_LOG_FORMAT = "%(asctime)s %(name)s: %(message)s"
# scripts/demo keeps the terminal for its banner: jobstate's and the demo's own log lines
# (a crashed sample run being cleaned up, a notification to the demo's unreachable pager)
# go to its log file instead, with a time stamp.
if _demo_log := env("JOBSTATE_DEMO_LOG", default=""):
    LOGGING["formatters"] = {"stamped": {"format": DEMO_LOG_FORMAT}}
    LOGGING["handlers"] = {
        "demo_log": {"class": "logging.FileHandler", "filename": _demo_log, "formatter": "stamped"}
    }
    LOGGING["loggers"] = {
        name: {"handlers": ["demo_log"], "level": "INFO", "propagate": False}
        for name in ("jobstate", "project")
    }
