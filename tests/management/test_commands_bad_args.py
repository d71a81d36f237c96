"""Every jobstate command, run from the command line with bad arguments, exits with status
2 and a message naming the bad argument on stderr, never a traceback, before it does any
work.

The cases run in one real ``manage.py``-like process, each through Django's
``ManagementUtility`` as ``manage.py`` runs it (argparse exits 2 by itself only when a
command runs from the command line, and a traceback is what an operator would see),
pointed at a SQLite database that was never migrated: a command that got past its
argument checks and touched a jobstate table would fail there ("no such table"), so
status 2 also says the arguments were refused first. One process for every case, not
one each: the cases differ only in their arguments, and starting Django is what a
process of its own costs (over a second each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

#: (arguments, text the message on stderr must contain).
CASES: list[tuple[list[str], str]] = [
    (["run_operations_job", "--bogus"], "unrecognized arguments: --bogus"),
    (["run_operations_job"], "Name the job to run"),
    (["run_operations_job", "nope.missing"], "'nope.missing'"),
    (["run_operations_job", "demo.report-build", "--input", "{bad"], "--input is not valid JSON"),
    (["run_operations_job", "demo.report-build", "--input", "NaN"], "--input is not valid JSON"),
    (["run_operations_job", "demo.report-build", "--input", '"\\u0000"'], "NUL character"),
    (["run_operations_job", "demo.report-build", "--triggered-by", " "], "--triggered-by"),
    (["run_operations_job", "demo.report-build", "--triggered-by", "w" * 201], "--triggered-by"),
    (["run_operations_job", "demo.report-build", "--database", "nope"], "--database 'nope'"),
    (["run_operations_job", "--list", "demo.report-build"], "--list runs nothing"),
    (["reap_stale", "--limit", "0"], "--limit"),
    (["reap_stale", "--limit", "many"], "--limit"),
    (["reap_stale", "--limit", "9" * 30], "--limit"),
    (["reap_stale", "--stale-after", "-5"], "--stale-after"),
    (["reap_stale", "--stale-after", "1e308"], "--stale-after"),
    # Named an internal argument (stale_run_after) rather than the option.
    (["reap_stale", "--stale-after", "10"], "argument --stale-after: 10 s is less than twice"),
    (["reap_stale", "--batch-size", "1.5"], "--batch-size"),
    (["reap_stale", "--time-budget", "nan"], "--time-budget"),
    (["reap_stale", "--database", "nope"], "--database 'nope'"),
    (["reap_stale", "runs"], "unrecognized arguments: runs"),
    (["prune_jobstate", "--older-than", "0"], "--older-than"),
    (["prune_jobstate", "--older-than", "forever"], "--older-than"),
    (["prune_jobstate", "--older-than", "1e-13"], "--older-than"),
    (["prune_jobstate", "--older-than", "100000.5"], "above 0 and at most 100000, got 100000.5"),
    (["prune_jobstate", "--dry-run", "--batch-size", "-1"], "--batch-size"),
    # A traceback: the alias was checked inside argparse.
    (["run_bulk_operation", "1", "--database", "nope"], "--database 'nope'"),
    # Accepted: no upper bound, where every count is 1 to 2**63-1.
    (["jobstate_worker", "--max-tasks", "9" * 30], "--max-tasks"),
    # A RecursionError traceback on Python 3.11 (3.13 reads it and refuses the depth).
    (
        ["run_operations_job", "demo.report-build", "--input", "[" * 5000 + "]" * 5000],
        "nested",
    ),
    # Accepted, and written into log lines raw: a newline split one, ESC coloured it.
    (["jobstate_worker", "--worker-id", "default\n"], "must not hold a control character"),
    (["jobstate_worker", "--worker-id", "\x1b[31mred"], "U+001B"),
    (["deliver_notifications", "--relay-id", "relay\u202e1"], "U+202E"),
    (["run_operations_job", "demo.report-build", "--triggered-by", "a\tb"], "U+0009"),
    (["deliver_notifications", "--relay-id", "r\u2028x"], "U+2028"),
    (["jobstate_worker", "--worker-id", "w\u200bx"], "U+200B"),
    (["deliver_notifications", "--interval", "5"], "--interval needs --loop"),
    (["deliver_notifications", "--loop", "--interval", "1e12"], "--interval"),
    (["deliver_notifications", "--limit", "0"], "--limit"),
    (["deliver_notifications", "--relay-id", "   "], "--relay-id must be a non-empty"),
    (["deliver_notifications", "--database", "nope"], "--database 'nope'"),
    (["jobstate_metrics", "--database", "nope"], "--database 'nope'"),
    (["jobstate_metrics", "--format", "xml"], "unrecognized arguments: --format"),
    (["jobstate_ready", "--bogus"], "unrecognized arguments: --bogus"),
    # Accepted: Python's int() and float() read spaces around a number, underscores
    # between its digits and the digits of every script; an option takes 0-9 only.
    (["jobstate_worker", "--concurrency", " 5 "], "argument --concurrency: ' 5 ' is not"),
    (["jobstate_worker", "--concurrency", "\u0665"], "argument --concurrency: '\u0665' is not"),
    (["jobstate_worker", "--max-tasks", "1_000"], "argument --max-tasks: '1_000' is not"),
    (["jobstate_worker", "--max-tasks", "\uff15"], "argument --max-tasks: '\uff15' is not"),
    (["jobstate_worker", "--interval", "0.5 "], "argument --interval: '0.5 ' is not"),
    (["jobstate_worker", "--interval", "\u0661"], "argument --interval: '\u0661' is not"),
    (["jobstate_worker", "--grace", "1_0"], "argument --grace: '1_0' is not"),
    (["jobstate_worker", "--grace", "\uff13\uff10"], "argument --grace: '\uff13\uff10' is not"),
    (["deliver_notifications", "--loop", "--interval", " 2"], "argument --interval: ' 2' is"),
    (["deliver_notifications", "--limit", "1_0"], "argument --limit: '1_0' is not"),
    (["reap_stale", "--stale-after", "1_000"], "argument --stale-after: '1_000' is not"),
    (["reap_stale", "--limit", "\u0665"], "argument --limit: '\u0665' is not"),
    (["reap_stale", "--batch-size", "\t5"], "argument --batch-size: '\\t5' is not"),
    (["reap_stale", "--time-budget", "6\u0660"], "argument --time-budget: '6\u0660' is not"),
    (["prune_jobstate", "--older-than", "3_0"], "argument --older-than: '3_0' is not"),
    (["prune_jobstate", "--older-than", "1e3"], "argument --older-than: '1e3' is not"),
    (["run_bulk_operation", "\u0661"], "argument operation: '\u0661' is not"),
    (["run_bulk_operation", "1", "--batch-size", "+5"], "argument --batch-size: '+5' is not"),
]


#: Run in the child: each case through ``ManagementUtility`` as ``manage.py`` does, its
#: exit status, what it wrote, and the traceback of anything that escaped.
CHILD = """
import contextlib, io, json, sys, traceback
import django
from django.core.management import ManagementUtility

django.setup()
results = []
for arguments in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    status, escaped = 0, ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            ManagementUtility(["manage.py", *arguments]).execute()
        except SystemExit as stop:
            status = stop.code if isinstance(stop.code, int) else 1
        except BaseException:
            status, escaped = 1, traceback.format_exc()
    results.append(
        {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue() + escaped}
    )
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Every case's exit status and output, from one child process."""
    database = tmp_path_factory.mktemp("bad-args") / "never-migrated.sqlite3"
    base = Path(settings.BASE_DIR)
    process = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps([arguments for arguments, _ in CASES])],
        cwd=base,
        env={
            **os.environ,
            "DATABASE_URL": f"sqlite:///{database}",
            "DJANGO_SETTINGS_MODULE": settings.SETTINGS_MODULE,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stdout + process.stderr
    results = json.loads(process.stdout.splitlines()[-1])
    assert not database.exists() or database.stat().st_size == 0
    return {
        " ".join(arguments): result for (arguments, _), result in zip(CASES, results, strict=True)
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("arguments", "message"), CASES, ids=[" ".join(args)[:60] for args, _ in CASES]
)
def test_bad_arguments_exit_2_with_a_message_and_no_traceback(
    arguments: list[str], message: str, outcomes: dict[str, dict[str, Any]]
) -> None:
    outcome = outcomes[" ".join(arguments)]
    output = outcome["stdout"] + outcome["stderr"]
    assert outcome["status"] == 2, output
    assert message in outcome["stderr"]
    assert "Traceback" not in output
    assert outcome["stdout"] == ""
