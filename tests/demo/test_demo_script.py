"""What ``scripts/demo`` shows on the terminal: a few progress lines, then a banner with
the address, the login and what to open first, and nothing alarming; everything the
background processes say goes to the log file; Ctrl-C stops every process it started.

The script's own run uses a stand-in for its virtual environment that runs this test
suite's interpreter, so nothing is installed here; the install itself is measured by
hand (CONTRIBUTING.md, "The demo").
"""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.conf import settings as django_settings

from project.demo import banner
from tests.support.tasks_kit import wait_for

BASE = Path(django_settings.BASE_DIR)

#: What must never reach the demo's terminal: a traceback, an error line, or the
#: runner's and relay's log lines about the sample data, which read like failures.
NOISE = re.compile(
    r"Traceback|ERROR|Exception|stale RUNNING|overlap key already held|attempt \d+ failed"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- the banner ---------------------------------------------------------------------------


def test_the_banner_names_the_address_the_login_the_pages_the_log_and_how_to_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DEMO_ADMIN_PASSWORD", raising=False)
    text = banner.banner("127.0.0.1:8765", "demo.log")
    assert "http://127.0.0.1:8765/admin/" in text
    assert "admin / jobstate-demo" in text
    for page in ("jobstate/job/", "jobstate/overview/", "jobstate/worker/", "jobstate/schedule/"):
        assert f"http://127.0.0.1:8765/admin/{page}" in text
    assert "demo.log" in text
    assert "Ctrl-C" in text
    lines = text.splitlines()
    assert lines[0] == lines[-1] and set(lines[0]) == {"="}
    assert all(len(line) <= len(lines[0]) for line in lines)


def test_the_banner_shows_the_password_the_demo_was_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("DEMO_ADMIN_PASSWORD", "s3cret-for-the-team")
    assert "admin / s3cret-for-the-team" in banner.banner("127.0.0.1:8000", "demo.log")


@pytest.fixture
def http_server() -> Iterator[str]:
    class NotFound(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_error(404)

        def log_message(self, format: str, *args: object) -> None:
            pass  # keeps the test's output clean

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_answering_any_status_counts_as_up(http_server: str) -> None:
    assert banner.answers(f"http://{http_server}/admin/login/")
    assert banner.main(["answers", "--addr", http_server]) == 0


def test_nothing_listening_is_not_up_yet() -> None:
    addr = f"127.0.0.1:{free_port()}"
    assert not banner.answers(f"http://{addr}/admin/login/", timeout=0.5)
    assert banner.main(["answers", "--addr", addr]) == 1


# --- the sample data, quietly -------------------------------------------------------------


def demo_env(tmp_path: Path, port: int) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'demo.sqlite3'}",
        "DEMO_ADDR": f"127.0.0.1:{port}",
        "JOBSTATE_DEMO_SCHEDULES": "1",
        "JOBSTATE_DEMO_OUTBOX": "1",
        "DJANGO_SETTINGS_MODULE": "project.settings",
    }
    for name in ("JOBSTATE_LOG_LEVEL", "DEMO_ADMIN_PASSWORD", "PYTHONPATH"):
        env.pop(name, None)
    return env


@pytest.mark.slow
def test_demo_setup_says_what_it_made_and_logs_the_rest_to_the_demo_log(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    env = {**demo_env(tmp_path, free_port()), "JOBSTATE_DEMO_LOG": str(log)}
    done = subprocess.run(
        [sys.executable, "manage.py", "demo_setup"],
        cwd=BASE,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stderr == ""
    assert not NOISE.search(done.stdout), done.stdout
    assert "Sample operations-job runs: 3 succeeded" in done.stdout
    assert "1 timed out (a crashed run, cleaned up by the next start)" in done.stdout
    assert "Sample notifications: 2 delivered, 2 pending" in done.stdout
    assert "Admin user 'admin', password 'jobstate-demo'" in done.stdout
    # The runner's own account of the crashed and the skipped sample runs is in the log.
    logged = log.read_text()
    assert "stale RUNNING job runs reaped" in logged
    assert "overlap key already held" in logged
    assert "the demo pager is offline" not in done.stdout


# --- the script, with real processes ------------------------------------------------------


def stand_in_checkout(tmp_path: Path) -> Path:
    """A checkout whose demo virtual environment is this suite's interpreter, marked as
    installed for the current pyproject.toml, so the script skips the install."""
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    for name in ("jobstate", "project", "templates", "manage.py", "pyproject.toml"):
        (root / name).symlink_to(BASE / name)
    (root / "scripts" / "demo").write_bytes((BASE / "scripts" / "demo").read_bytes())
    (root / "scripts" / "demo").chmod(0o755)
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    venv = root / f".venv-demo-{version}"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    digest = hashlib.sha1((BASE / "pyproject.toml").read_bytes()).hexdigest()[:12]
    (venv / f".installed-{digest}").touch()
    return root


def read_until(process: subprocess.Popen[str], marker: str, timeout: float) -> str:
    """The script's terminal output up to the line after the banner's closing rule."""
    assert process.stdout is not None
    seen: list[str] = []
    rules = 0
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith(marker):
            rules += 1
            if rules == 2:
                return "".join(seen)
    raise AssertionError("no banner in time; the terminal showed:\n" + "".join(seen))


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def like_a_terminal() -> None:
    # A shell started in the background inherits SIGINT ignored, and bash then could not
    # trap it; a terminal's shell has the default handler.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_demo(root: Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        ["scripts/demo"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=like_a_terminal,
    )


def ctrl_c(process: subprocess.Popen[str], timeout: float = 60) -> str:
    """Ctrl-C on a terminal (SIGINT to the whole foreground process group); what the
    terminal showed after it."""
    os.killpg(process.pid, signal.SIGINT)
    try:
        rest, _ = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return rest


#: The worker's line in demo.log once it has started.
WORKER_STARTED = re.compile(r"jobstate_worker \S+ started:")


@pytest.mark.slow
@pytest.mark.only_on("sqlite")
def test_the_script_ends_with_the_banner_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    root = stand_in_checkout(tmp_path)
    port = free_port()
    process = start_demo(root, demo_env(tmp_path, port))
    try:
        shown = read_until(process, "=====", timeout=120)
        assert "preparing the database and the sample data" in shown
        assert f"http://127.0.0.1:{port}/admin/" in shown
        assert "admin / jobstate-demo" in shown
        assert "Stop everything with Ctrl-C." in shown
        assert not NOISE.search(shown), shown
        assert banner.answers(f"http://127.0.0.1:{port}/admin/login/")
        # The background processes write to the log, not to the terminal. Ctrl-C comes
        # once the traffic and the worker have started (a worker stopped while it starts
        # dies by the signal before it can say so).
        log = root / "demo.log"

        def started() -> bool:
            text = log.read_text() if log.exists() else ""
            return "Demo traffic: a tick every" in text and bool(WORKER_STARTED.search(text))

        wait_for(started, timeout=60, what="the traffic and the worker to start")
    finally:
        rest = ctrl_c(process)
    assert process.returncode == 130
    assert "demo stopped" in rest
    assert not NOISE.search(rest), rest
    assert "Terminated" not in rest, rest  # the shell's word for a child it saw killed
    assert not group_alive(process.pid), "a demo process outlived Ctrl-C"
    assert not banner.answers(f"http://127.0.0.1:{port}/admin/login/", timeout=0.5)
    # The terminal's SIGINT reached the background worker too, which ignores it as it was
    # started ignoring it: the script's SIGTERM is its first signal, a graceful stop that
    # lets running tasks finish, not a second one that abandons them.
    logged = (root / "demo.log").read_text()
    assert "again: exiting at once" not in logged, logged[-3000:]
    assert re.search(r"jobstate_worker \S+ stopped \(SIGTERM\)", logged), logged[-3000:]


@pytest.mark.slow
@pytest.mark.only_on("sqlite")
def test_ctrl_c_names_and_kills_a_process_that_does_not_stop(tmp_path: Path) -> None:
    root = stand_in_checkout(tmp_path)
    # The relay is replaced by a process that ignores SIGTERM.
    python = next((root).glob(".venv-demo-*/bin/python"))
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$2" = deliver_notifications ]; then trap "" TERM; exec sleep 600; fi\n'
        f'exec "{sys.executable}" "$@"\n'
    )
    env = {**demo_env(tmp_path, free_port()), "DEMO_STOP_SECONDS": "3"}
    process = start_demo(root, env)
    try:
        read_until(process, "=====", timeout=120)
    finally:
        started = time.monotonic()
        rest = ctrl_c(process)
    assert process.returncode == 130, rest
    assert re.search(r"ERROR: sleep 600 \(pid \d+\) did not stop within 3 s of SIGTERM", rest), rest
    assert "demo stopped" in rest
    assert time.monotonic() - started < 30
    assert not group_alive(process.pid), "a demo process outlived Ctrl-C"


@pytest.mark.slow
def test_the_script_refuses_an_address_something_else_already_answers_at(
    tmp_path: Path, http_server: str
) -> None:
    root = stand_in_checkout(tmp_path)
    env = demo_env(tmp_path, free_port())
    env["DEMO_ADDR"] = http_server
    done = subprocess.run(
        ["scripts/demo"], cwd=root, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert f"something already answers at http://{http_server}/" in done.stderr
    assert "DEMO_ADDR=" in done.stderr
    # It stopped before setting anything up.
    assert not (tmp_path / "demo.sqlite3").exists()
    assert "preparing" not in done.stdout
