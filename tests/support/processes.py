"""Child processes on the test database: its URL, their environment, and reading
what they printed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from io import StringIO
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection


class Terminal(StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def database_url() -> str:
    """The URL of the test database this test runs against, for child processes."""
    db = connection.settings_dict
    scheme = {"postgresql": "postgres", "mysql": "mysql"}.get(connection.vendor)
    if scheme is not None:
        auth = quote(db["USER"] or "", safe="")
        if db["PASSWORD"]:
            auth += ":" + quote(db["PASSWORD"], safe="")
        port = f":{db['PORT']}" if db["PORT"] else ""
        return f"{scheme}://{auth}@{db['HOST'] or ''}{port}/{quote(db['NAME'], safe='')}"
    return f"sqlite:///{db['NAME']}"


def child_env(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def ignore_sigint() -> None:
    """A child's ``preexec_fn``: start it with SIGINT ignored, as a shell script starts
    its background jobs (``command &`` in a shell without job control)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def manage_py(*args: str, ignoring_sigint: bool = False) -> subprocess.Popen[str]:
    """``manage.py *args`` as a process on the test database, with the test's settings
    module (``ignoring_sigint``: started with SIGINT ignored, as a background job of a
    shell script is)."""
    base = Path(settings.BASE_DIR)
    return subprocess.Popen(
        [sys.executable, str(base / "manage.py"), *args],
        cwd=base,
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore_sigint if ignoring_sigint else None,
    )
