"""The README's quick start, run as written, in a fresh project.

Each code block of the quick start follows an HTML comment naming what to do with it
(``<!-- quickstart: append to mysite/settings.py -->``). This test makes the project the
README starts from with ``startproject``, applies the blocks in the README's order and
checks what the README says the reader will see: the status printed after the enqueue,
the worker's log line, the status and return value read back, and the console's jobs,
job and workers pages showing the task and its worker. A line ending in
``# Django 5.2: ...`` is replaced by the comment's version on Django 5.2, as the README
tells its reader to do. Nothing is taken from anywhere else: a wrong import, setting or
command in the README fails here.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import django
import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

pytestmark = [pytest.mark.slow, pytest.mark.only_on("sqlite")]

BLOCK = re.compile(
    r"<!-- quickstart: (?P<label>[^>]+?) -->\n```\w*\n(?P<body>.*?)^```", re.S | re.M
)
DJANGO_52 = re.compile(r"^(?P<code>.*?)\s+# Django 5\.2: (?P<alt>.+)$")
STARTPROJECT = re.compile(r"django-admin startproject (?P<name>\w+)")
PIP_INSTALL = re.compile(
    r'pip install (?:django-jobstate(?=\s|$)|"django-jobstate\[(?P<extras>[^\]]*)\]")'
)
EXPECTED_PRINT = re.compile(r"^print\(.*\)\s+# (?P<output>.+)$")
# What varies from run to run in the worker's log line the README shows.
VARIABLE = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|\d+(?= ms))")

DONE, FAILED = "<<quickstart block done>>", "<<quickstart block failed>>"
# Run inside `manage.py shell -c`: every block the README gives the shell is executed in
# one namespace, as in one interactive session, and the test waits between blocks.
SESSION = f"""
import json, sys, traceback
namespace = {{"__name__": "__main__"}}
for line in sys.stdin:
    try:
        exec(json.loads(line), namespace)
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        print({FAILED!r}, flush=True)
    else:
        print({DONE!r}, flush=True)
"""


def quickstart_blocks(text: str) -> list[tuple[str, str]]:
    return [(m["label"].strip(), for_this_django(m["body"])) for m in BLOCK.finditer(text)]


def for_this_django(body: str) -> str:
    """Apply the README's rule for lines that differ on Django 5.2."""
    lines = []
    for line in body.splitlines():
        match = DJANGO_52.match(line)
        if match:
            line = match["alt"] if django.VERSION < (6,) else match["code"]
        lines.append(line)
    return "\n".join(lines) + "\n"


def command(line: str) -> list[str]:
    """A README command line, run with this interpreter (the one the project is installed in)."""
    argv = shlex.split(line, comments=True)
    return [sys.executable, *argv[1:]] if argv[0] == "python" else argv


def log_line_pattern(line: str) -> re.Pattern[str]:
    parts = VARIABLE.split(line.strip())
    pattern = "".join(
        (r"[0-9a-f-]{36}" if "-" in part else r"\d+") if odd else re.escape(part)
        for odd, part in ((i % 2 == 1, part) for i, part in enumerate(parts))
    )
    return re.compile(pattern)


class Session:
    """One `python manage.py shell`, fed the README's shell blocks one at a time."""

    def __init__(self, project: Path, env: dict[str, str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "--verbosity", "0", "-c", SESSION],
            cwd=project,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def run(self, block: str, timeout: float = 60) -> list[str]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(block) + "\n")
        self.process.stdin.flush()
        output: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                pytest.fail(f"the shell block did not finish in {timeout} s:\n{block}\n{output}")
            if line is None:
                pytest.fail(f"the shell ended during the block:\n{block}\n" + "\n".join(output))
            if line == FAILED:
                pytest.fail(f"the README's shell block raised:\n{block}\n" + "\n".join(output))
            if line == DONE:
                return output
            output.append(line)

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Background:
    """A command the README starts in another terminal; Ctrl-C stops its process group."""

    def __init__(self, argv: list[str], project: Path, env: dict[str, str]) -> None:
        self.log = project / "background.log"
        with self.log.open("w") as sink:
            self.process = subprocess.Popen(
                argv,
                cwd=project,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def output(self) -> str:
        return self.log.read_text()

    def wait_for(self, patterns: list[re.Pattern[str]], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not all(p.search(self.output()) for p in patterns):
            if self.process.poll() is not None or time.monotonic() > deadline:
                missing = [p.pattern for p in patterns if not p.search(self.output())]
                pytest.fail(f"the worker never logged {missing}; it logged:\n{self.output()}")
            time.sleep(0.2)

    def interrupt(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
            pytest.fail(f"Ctrl-C did not stop the worker within {timeout} s:\n{self.output()}")


@pytest.fixture
def project_env() -> dict[str, str]:
    """The environment a reader's terminal has: no settings module of ours (the project's
    manage.py names its own), and this checkout's jobstate ahead of any installed copy."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL")
    }
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def stopped() -> Iterator[list[Background | Session]]:
    """What the quick start started, stopped whatever the test's outcome."""
    started: list[Background | Session] = []
    yield started
    for thing in started:
        if isinstance(thing, Background):
            if thing.process.poll() is None:
                os.killpg(thing.process.pid, signal.SIGKILL)
                thing.process.wait()
        else:
            thing.close()


def test_the_readme_quick_start_runs_as_written(
    tmp_path: Path, project_env: dict[str, str], stopped: list[Background | Session]
) -> None:
    text = README.read_text()
    blocks = quickstart_blocks(text)
    labels = {label for label, _ in blocks}
    assert {"install", "run", "python manage.py shell", "start in another terminal"} <= labels, (
        f"the README's quick start lost a step; its marked blocks are {sorted(labels)}"
    )
    started = STARTPROJECT.search(text)
    assert started, "the README no longer says which project its quick start starts from"
    name = started["name"]
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", name],
        cwd=tmp_path,
        env=project_env,
        check=True,
    )
    project = tmp_path / name
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    )

    session: Session | None = None
    worker: Background | None = None
    for label, body in blocks:
        if label == "install":
            installs = list(PIP_INSTALL.finditer(body))
            assert installs, f"the install block does not install django-jobstate: {body}"
            for group in [m["extras"] for m in installs if m["extras"] is not None]:
                unknown = {e.strip() for e in group.split(",")} - extras
                assert not unknown, f"the README installs extras pyproject.toml lacks: {unknown}"
        elif label.startswith("append to "):
            target = project / label.removeprefix("append to ")
            assert target.is_file(), (
                f"the README appends to {target.name}, which startproject did not make"
            )
            target.write_text(target.read_text() + "\n" + body)
        elif label.startswith("write "):
            target = project / label.removeprefix("write ")
            assert not target.exists(), (
                f"the README writes {target.name} over a file of startproject"
            )
            target.write_text(body)
        elif label == "run":
            for line in filter(str.strip, body.splitlines()):
                done = subprocess.run(
                    command(line),
                    cwd=project,
                    env=project_env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                assert done.returncode == 0, f"{line} failed:\n{done.stdout}\n{done.stderr}"
        elif label == "python manage.py shell":
            if session is None:
                session = Session(project, project_env)
                stopped.append(session)
            expected = [m["output"] for m in map(EXPECTED_PRINT.match, body.splitlines()) if m]
            output = session.run(body)
            assert output == expected, f"the README shows {expected}, the shell printed {output}"
        elif label == "start in another terminal":
            worker = Background(command(body.strip()), project, project_env)
            stopped.append(worker)
        elif label == "worker output":
            assert worker is not None, "the README shows the worker's output before starting it"
            worker.wait_for([log_line_pattern(line) for line in body.splitlines() if line.strip()])
        else:
            pytest.fail(f"the README marks a quick-start block this test cannot apply: {label!r}")

    assert worker is not None
    assert worker.interrupt() == 0, worker.output()
    worker_id = re.search(r"jobstate_worker (\S+) started", worker.output())
    assert worker_id, worker.output()
    the_console_shows_the_task_and_its_worker(project, project_env, worker_id[1])


# What the README says the console shows after the quick start, read as a signed-in
# superuser would (the project's own admin URLs, from startproject).
CONSOLE = """
import json
from django.contrib.auth import get_user_model
from django.test import Client
from jobstate.models import Job

user = get_user_model().objects.create_superuser("admin", "admin@example.com", None)
client = Client(HTTP_HOST="localhost")
client.force_login(user)
job = Job.objects.get()
pages = {
    "index": "/admin/",
    "jobs": "/admin/jobstate/job/",
    "job": f"/admin/jobstate/job/{job.pk}/change/",
    "workers": "/admin/jobstate/worker/",
}
print(json.dumps({name: client.get(url).content.decode() for name, url in pages.items()}))
"""


def the_console_shows_the_task_and_its_worker(
    project: Path, env: dict[str, str], worker_id: str
) -> None:
    done = subprocess.run(
        [sys.executable, "manage.py", "shell", "--verbosity", "0", "-c", CONSOLE],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    pages = json.loads(done.stdout.strip().splitlines()[-1])
    assert 'href="/admin/jobstate/job/"' in pages["index"]
    assert 'href="/admin/jobstate/worker/"' in pages["index"]
    assert "mysite.tasks.add" in pages["jobs"]
    assert "mysite.tasks.add" in pages["job"] and worker_id in pages["job"]
    assert worker_id in pages["workers"]
