"""What ``scripts/demo`` prints on the terminal once the development server answers.

The script starts the traffic, the worker, the relay and the server with their output
going to the demo's log file, then asks this module (``python -m project.demo.banner``)
whether the server answers yet, and prints the banner it returns as the last thing on
the terminal, so the address and the password stay in view. Only the standard library
is imported here: a poll starts a fresh interpreter, and it must not set Django up.
"""

from __future__ import annotations

import argparse
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence

__all__ = ["DEFAULT_ADDR", "DEFAULT_PASSWORD", "DEMO_USER", "admin_password", "answers", "banner"]

DEMO_USER = "admin"
DEFAULT_PASSWORD = "jobstate-demo"
DEFAULT_ADDR = "127.0.0.1:8000"


def admin_password() -> str:
    """The demo admin's password: ``DEMO_ADMIN_PASSWORD`` or the documented default."""
    return os.environ.get("DEMO_ADMIN_PASSWORD") or DEFAULT_PASSWORD


def answers(url: str, timeout: float = 1.0) -> bool:
    """Whether an HTTP server answers at ``url`` (any status counts: it is up)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True  # the server is up; it answered with an error status
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


def banner(addr: str, log_path: str, password: str | None = None) -> str:
    """The lines that tell a newcomer where the demo is, how to log in and what to open."""
    base = f"http://{addr}/admin/"
    rows = [
        "The jobstate demo is running.",
        "",
        f"  Open       {base}",
        f"  Log in as  {DEMO_USER} / {password if password is not None else admin_password()}",
        "",
        "  Click first:",
        f"    Jobs       {base}jobstate/job/  (open a task's page from there)",
        f"    Overview   {base}jobstate/overview/",
        f"    Workers    {base}jobstate/worker/",
        f"    Schedules  {base}jobstate/schedule/",
        "",
        f"  The traffic, the worker, the relay and the server log to {log_path}",
        "  Stop everything with Ctrl-C.",
    ]
    width = max(len(row) for row in rows) + 2
    rule = "=" * width
    return "\n".join([rule, *(f" {row}".rstrip() for row in rows), rule])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m project.demo.banner",
        description="Ask whether the demo's server answers, or print the demo's banner.",
    )
    parser.add_argument("command", choices=["answers", "print"])
    parser.add_argument("--addr", default=os.environ.get("DEMO_ADDR") or DEFAULT_ADDR)
    parser.add_argument("--log", default="demo.log", help="The log file to name.")
    args = parser.parse_args(argv)
    if args.command == "answers":
        return 0 if answers(f"http://{args.addr}/admin/login/") else 1
    print(banner(args.addr, args.log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
