"""A local HTTP server that records what the relay posts to it."""

from __future__ import annotations

import http.server
import threading
import time
from typing import Any


class Receiver:
    """A local HTTP server. ``routes`` maps a path to what it answers: an int status, a
    ``("redirect", code, location)`` or ``("sleep", seconds)``."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.routes: dict[str, Any] = {}
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self._answer(body)

            def do_GET(self) -> None:
                self._answer(b"")

            def _answer(self, body: bytes) -> None:
                receiver.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers.items()),
                        "body": body,
                    }
                )
                route = receiver.routes.get(self.path, 200)
                try:
                    if isinstance(route, tuple) and route[0] == "redirect":
                        self.send_response(route[1])
                        self.send_header("Location", route[2])
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    if isinstance(route, tuple) and route[0] == "sleep":
                        time.sleep(route[1])
                        route = 200
                    self.send_response(route)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"

    def posts_to(self, path: str) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"] == path]
