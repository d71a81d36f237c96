"""A private PgBouncer (Debian's ``/usr/sbin/pgbouncer``, or another binary) in
transaction mode in front of one PostgreSQL database: started on a free loopback port,
killed (``SIGKILL``) and started again on the same port, stopped at the end. The
PgBouncer benchmark (:mod:`bench.pooled`) and the test suite's PgBouncer tests both start
theirs with it; ``scripts/ensure-pgbouncer`` installs Debian's binary."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlsplit

import psycopg

from bench.pg import BenchError

PGBOUNCER = "/usr/sbin/pgbouncer"

#: The first PgBouncer that keeps protocol-level prepared statements in transaction mode
#: the way psycopg uses them: 1.21 added ``max_prepared_statements``, 1.22 the
#: ``DEALLOCATE ALL`` and ``DISCARD ALL`` psycopg sends after a rollback.
PREPARED_SINCE = (1, 22)

#: PgBouncer refuses to run as root; as root it is told to become this user.
_UNPRIVILEGED = "postgres"

#: The server connections of one database, other than the asking connection's own.
_SERVER_CONNECTIONS_SQL = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
)


class Cursor(Protocol):
    """A DB-API cursor (psycopg's or Django's): what :meth:`PgBouncer.count_server_connections`
    asks with."""

    def execute(self, sql: str, params: Any = ...) -> Any: ...

    def fetchone(self) -> Any: ...


def version(binary: str = PGBOUNCER) -> tuple[int, ...]:
    """The version ``binary --version`` prints first (``PgBouncer 1.18.0``)."""
    printed = subprocess.run(
        [binary, "--version"], capture_output=True, text=True, check=False, timeout=10
    ).stdout
    found = re.match(r"PgBouncer (\d+)\.(\d+)(?:\.(\d+))?", printed)
    if found is None:
        raise BenchError(f"{binary} --version printed no PgBouncer version: {printed!r}")
    return tuple(int(part) for part in found.groups(default="0"))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class PgBouncer:
    """One pgbouncer process pooling ``database`` on the server at ``host``:``port`` in
    transaction mode, with at most ``pool_size`` server connections and
    ``max_client_conn`` client connections."""

    def __init__(
        self,
        directory: Path,
        *,
        database: str,
        host: str = "127.0.0.1",
        port: int | str = 5432,
        user: str = "postgres",
        password: str = "",
        pool_size: int,
        max_client_conn: int = 200,
        binary: str = PGBOUNCER,
        max_prepared_statements: int = 0,
    ) -> None:
        if not os.access(binary, os.X_OK):
            hint = "run scripts/ensure-pgbouncer" if binary == PGBOUNCER else "not executable"
            raise BenchError(f"{binary} is missing: {hint}")
        if pool_size < 1 or max_client_conn < 1:
            raise BenchError(
                f"pool_size and max_client_conn must be at least 1, got {pool_size} and "
                f"{max_client_conn}"
            )
        if max_prepared_statements < 0:
            raise BenchError(
                f"max_prepared_statements must be 0 or more, got {max_prepared_statements}"
            )
        self.binary = binary
        self.version = version(binary)
        if max_prepared_statements and self.version < PREPARED_SINCE:
            raise BenchError(
                f"{binary} is PgBouncer {'.'.join(map(str, self.version))}: keeping "
                "prepared statements in transaction mode needs "
                f"{'.'.join(map(str, PREPARED_SINCE))} or newer"
            )
        self.max_prepared_statements = max_prepared_statements
        self.pool_size = pool_size
        self.port = free_port()
        self.database = database
        self.user = user
        self.directory = directory
        self.log = directory / "pgbouncer.log"
        self.config = directory / "pgbouncer.ini"
        server = f"host={host} port={port}"
        # Written only when asked for: PgBouncer before 1.21 does not know the key.
        prepared = (
            f"max_prepared_statements = {max_prepared_statements}\n"
            if max_prepared_statements
            else ""
        )
        if password:
            # Clients are let in without one (auth_type any); the server may want it.
            server += f" password={password}"
        self.config.write_text(
            "[databases]\n"
            f"{database} = {server} dbname={database} user={user}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = any\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {pool_size}\n"
            f"max_client_conn = {max_client_conn}\n"
            "server_login_retry = 1\n"
            f"{prepared}"
            "logfile =\n"
            "pidfile =\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    @classmethod
    def for_url(cls, directory: Path, url: str, **options: Any) -> PgBouncer:
        """A PgBouncer in front of the database a ``postgres://`` URL names."""
        parts = urlsplit(url)
        return cls(
            directory,
            database=unquote(parts.path.lstrip("/")),
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 5432,
            user=unquote(parts.username or "postgres"),
            password=unquote(parts.password or ""),
            **options,
        )

    @property
    def url(self) -> str:
        """The ``postgres://`` URL of a client of the pooler."""
        return f"postgres://{quote(self.user)}@127.0.0.1:{self.port}/{quote(self.database)}"

    def start(self) -> None:
        """Starts pgbouncer (again, on the same port) and returns once it answers."""
        command = [self.binary, self.config.name]
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
                    raise BenchError(
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

    def count_server_connections(self, cursor: Cursor) -> int:
        """The pooled database's server connections other than ``cursor``'s own, asked
        on a direct connection to it: the ones the pooler opened, when the clients reach
        the database through it alone."""
        cursor.execute(_SERVER_CONNECTIONS_SQL, [self.database])
        (count,) = cursor.fetchone()
        return int(count)
