"""The PostgreSQL server the test run uses, as a URL for the harnesses (benchmarks,
fault runs) that make databases of their own on it."""

from __future__ import annotations

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
