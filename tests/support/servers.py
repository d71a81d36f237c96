"""The PostgreSQL and MariaDB servers the test run uses, as URLs for the harnesses (benchmarks,
fault runs) that make databases of their own on it."""

from __future__ import annotations

import os
from urllib.parse import quote

from django.db import connection


def postgres_server_url(database: str = "") -> str:
    """``postgres://user[:password]@host:port/<database>`` of the test database's server."""
    settings = connection.settings_dict
    user = quote(settings["USER"] or "postgres")
    password = f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else ""
    host = settings["HOST"] or "127.0.0.1"
    port = settings["PORT"] or 5432
    return f"postgres://{user}{password}@{host}:{port}/{database}"


def mysql_server_url() -> str:
    """The MariaDB server of the test run: the test database's when the run is on
    MariaDB, else ``JOBSTATE_TEST_MYSQL_URL`` (scripts/test's default otherwise)."""
    if connection.vendor == "mysql":
        settings = connection.settings_dict
        user = quote(settings["USER"] or "root")
        password = f":{quote(settings['PASSWORD'])}" if settings["PASSWORD"] else ""
        host = settings["HOST"] or "127.0.0.1"
        return f"mysql://{user}{password}@{host}:{settings['PORT'] or 3306}/"
    url = os.environ.get("JOBSTATE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/jobstate")
    return url.rsplit("/", 1)[0] + "/"
