"""The PgBouncer of a test: :class:`bench.pgbouncer.PgBouncer` (shared with the PgBouncer
benchmark) in front of the test database, whose server connections the test counts on
its own connection."""

from __future__ import annotations

from pathlib import Path

from django.db import connection

from bench import pgbouncer


class PgBouncer(pgbouncer.PgBouncer):
    """One pgbouncer process pooling the test database in transaction mode, at most
    ``pool_size`` server connections."""

    def __init__(self, directory: Path, *, pool_size: int) -> None:
        db = connection.settings_dict
        super().__init__(
            directory,
            database=str(db["NAME"]),
            host=db["HOST"] or "127.0.0.1",
            port=db["PORT"] or 5432,
            user=db["USER"] or "postgres",
            password=db["PASSWORD"] or "",
            pool_size=pool_size,
        )

    def server_connections(self) -> int:
        """The test database's server connections other than the test's own: the ones
        the pooler opened (the workers reach the database through it alone)."""
        with connection.cursor() as cursor:
            return self.count_server_connections(cursor)
