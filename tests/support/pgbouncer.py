"""A private PgBouncer in transaction mode between the test's workers and the test
database: started on a free loopback port, killed (``SIGKILL``) and started again on the
same port mid-test, stopped at the end. ``scripts/ensure-pgbouncer`` installs it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from urllib.parse import quote

import psycopg
from django.db import connection

PGBOUNCER = "/usr/sbin/pgbouncer"

#: PgBouncer refuses to run as root; as root it is told to become this user.
_UNPRIVILEGED = "postgres"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """One pgbouncer process pooling the test database in transaction mode, at most
    ``pool_size`` server connections."""

    def __init__(self, directory: Path, *, pool_size: int) -> None:
        if not os.access(PGBOUNCER, os.X_OK):
            raise AssertionError(f"{PGBOUNCER} is missing: run scripts/ensure-pgbouncer")
        self.pool_size = pool_size
        self.port = free_port()
        self.database = str(connection.settings_dict["NAME"])
        self.directory = directory
        self.log = directory / "pgbouncer.log"
        self.config = directory / "pgbouncer.ini"
        db = connection.settings_dict
        server = f"host={db['HOST'] or '127.0.0.1'} port={db['PORT'] or 5432}"
        if db["PASSWORD"]:
            # Clients are let in without one (auth_type any); the server may want it.
            server += f" password={db['PASSWORD']}"
        self.config.write_text(
            "[databases]\n"
            f"{self.database} = {server} dbname={self.database} "
            f"user={db['USER'] or 'postgres'}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 200\n"
            "server_login_retry = 1\n"
            "logfile =\n"
            "pidfile =\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The ``DATABASE_URL`` of a client of the pooler."""
        user = quote(str(connection.settings_dict["USER"] or "postgres"))
        return f"postgres://{user}@127.0.0.1:{self.port}/{quote(self.database)}"

    def start(self) -> None:
        command = [PGBOUNCER, self.config.name]
        if os.geteuid() == 0:
            command[1:1] = ["--user", _UNPRIVILEGED]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=self.directory, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 15
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"pgbouncer did not answer on port {self.port}: {exc}\n"
                        f"{self.log.read_text(errors='replace')}"
                    ) from exc
                time.sleep(0.05)

    def kill(self) -> None:
        """``kill -9``: every client connection and server connection it held is cut."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def server_connections(self) -> int:
        """The test database's server connections other than the test's own: the ones
        the pooler opened (the workers reach the database through it alone)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> pg_backend_pid()",
                [self.database],
            )
            (count,) = cursor.fetchone()
        return int(count)
