"""A private PostgreSQL cluster for the restart run, so restarting it disturbs nobody.

The cluster lives in a temporary directory: ``initdb`` into it, a free TCP port on
127.0.0.1, the Unix socket in the same directory. Run as root, every server binary runs
as the ``postgres`` operating-system user (PostgreSQL refuses to run as root); run as
anyone else, as that user. The settings live in ``postgresql.conf``, so ``pg_ctl
restart`` brings the server back exactly as it was.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ClusterError", "PrivateCluster", "find_server_binaries"]

#: What the run needs from a PostgreSQL server installation.
SERVER_BINARIES = ("initdb", "pg_ctl", "postgres")
#: How long ``pg_ctl`` may wait for a start, stop or restart on a loaded machine.
PG_CTL_WAIT_SECONDS = 120
_SERVER_USER = "postgres"


class ClusterError(RuntimeError):
    """The private cluster could not be made, started, restarted or stopped."""


def find_server_binaries(bindir: str | None = None) -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: ``bindir`` when
    given, else ``pg_config --bindir``, else the newest ``/usr/lib/postgresql/*/bin``.
    Raises :class:`ClusterError` naming what is missing."""
    candidates: list[Path] = []
    if bindir is not None:
        candidates.append(Path(bindir))
    else:
        pg_config = shutil.which("pg_config")
        if pg_config is not None:
            found = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=False
            )
            if found.returncode == 0 and found.stdout.strip():
                candidates.append(Path(found.stdout.strip()))
        versions = sorted(
            glob.glob("/usr/lib/postgresql/*/bin"),
            key=lambda path: int(Path(path).parent.name) if Path(path).parent.name.isdigit() else 0,
        )
        candidates.extend(Path(path) for path in reversed(versions))
    for candidate in candidates:
        if all((candidate / name).is_file() for name in SERVER_BINARIES):
            return candidate
    looked = ", ".join(str(path) for path in candidates) or "nowhere (no pg_config on PATH)"
    raise ClusterError(
        f"PostgreSQL server binaries ({', '.join(SERVER_BINARIES)}) not found; looked in "
        f"{looked}. Install the PostgreSQL server package (Debian: postgresql) or pass "
        "--pg-bindir."
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@dataclass
class PrivateCluster:
    """One PostgreSQL cluster in ``root`` (a directory the caller owns and removes)."""

    bindir: Path
    root: Path
    port: int = 0

    @property
    def home(self) -> Path:
        """The server's own directory (owned by the server user when run as root)."""
        return self.root / "pg"

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def log(self) -> Path:
        return self.home / "server.log"

    def url(self, database: str) -> str:
        return f"postgres://{_SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def create(self) -> None:
        """``initdb`` and configure: trust authentication on 127.0.0.1 and the socket
        directory only, a free port, the socket in this directory."""
        self.home.mkdir(mode=0o700)
        (self.home / "socket").mkdir(mode=0o700)
        if os.geteuid() == 0:
            # The server user must reach its directory through the caller's.
            self.root.chmod(0o711)
            try:
                user = pwd.getpwnam(_SERVER_USER)
            except KeyError:
                raise ClusterError(
                    f"running as root needs a {_SERVER_USER!r} user to run PostgreSQL as."
                ) from None
            for path in (self.home, self.home / "socket"):
                os.chown(path, user.pw_uid, user.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            _SERVER_USER,
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        self.port = _free_port()
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.home / 'socket'}'",
            "max_connections": "60",
            "shared_buffers": "32MB",
            "log_min_messages": "warning",
            "log_line_prefix": "'%m [%p] '",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n# restart run\n")
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())

    def start(self) -> None:
        self._pg_ctl("start")

    def restart(self, mode: str) -> float:
        """``pg_ctl restart -m mode``; returns how long the server was away (seconds)."""
        started = time.monotonic()
        self._pg_ctl("restart", "-m", mode)
        return time.monotonic() - started

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self._pg_ctl("stop", "-m", "fast")

    def _pg_ctl(self, action: str, *options: str) -> None:
        self._run(
            "pg_ctl",
            action,
            "-D",
            str(self.data),
            "-l",
            str(self.log),
            "-w",
            "-t",
            str(PG_CTL_WAIT_SECONDS),
            *options,
        )

    def _run(self, binary: str, *args: str) -> None:
        command = [str(self.bindir / binary), *args]
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                raise ClusterError(
                    "running as root needs runuser(1) to start PostgreSQL as the "
                    f"{_SERVER_USER!r} user."
                )
            command = [runuser, "-u", _SERVER_USER, "--", *command]
        # The server user's working directory must be one it can read.
        done = subprocess.run(command, cwd=self.home, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-10:])
            raise ClusterError(f"{binary} {' '.join(args[:1])} failed ({done.returncode}):\n{tail}")
