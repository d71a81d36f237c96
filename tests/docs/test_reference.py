"""The reference pages of the documentation site against the code they describe.

Each list is read from the code itself (the settings' defaults, the commands
directory, the check ids the package emits, the exception module, the metric families
the exporter renders), so a setting, command, check, exception or metric added without
its entry on the site fails here, and so does an entry left behind after its code went.
"""

from __future__ import annotations

import ast
import inspect
import re
from importlib import import_module
from pathlib import Path

import pytest

import jobstate
import jobstate.exceptions
from jobstate.core.conf import DEFAULTS
from jobstate.core.states import JobOperationalMetrics, JobStatus
from jobstate.observability.metrics import metric_families
from jobstate.tasks.options import OPTION_DEFAULTS

# No database: the pages and the code are compared once, on the SQLite step.
pytestmark = pytest.mark.only_on("sqlite")

PACKAGE = Path(jobstate.__file__).resolve().parent
REFERENCE = PACKAGE.parent / "docs" / "reference"
COMMANDS = PACKAGE / "management" / "commands"
COMMANDS_PACKAGE = "jobstate.management.commands"


def _page(name: str) -> str:
    return (REFERENCE / name).read_text(encoding="utf-8")


def _labels(page: str, prefix: str) -> set[str]:
    """The names of the MyST targets ``(prefix-NAME)=`` a page declares."""
    return set(re.findall(rf"^\({re.escape(prefix)}-([A-Za-z0-9_]+)\)=$", page, re.MULTILINE))


def _headings(page: str, level: int) -> list[str]:
    """The text of a page's headings of one level, without code backticks."""
    marks = "#" * level
    return [text.strip("`") for text in re.findall(rf"^{marks} (.+)$", page, re.MULTILINE)]


def _section(page: str, heading: str) -> str:
    """A ``## heading`` section of a page, up to the next ``##`` heading."""
    match = re.search(
        rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", page, re.MULTILINE | re.DOTALL
    )
    assert match, f"no section '## {heading}'"
    return match.group(1)


# --- settings ----------------------------------------------------------------------------


def test_every_jobstate_setting_is_documented_and_every_documented_one_exists() -> None:
    documented = _labels(_page("settings.md"), "setting")
    assert sorted(set(DEFAULTS) - documented) == [], "settings missing from settings.md"
    assert sorted(documented - set(DEFAULTS)) == [], "settings.md documents removed settings"


def test_every_task_backend_option_is_documented_and_every_documented_one_exists() -> None:
    documented = _labels(_page("settings.md"), "task-option")
    assert sorted(set(OPTION_DEFAULTS) - documented) == [], "TASKS OPTIONS missing"
    assert sorted(documented - set(OPTION_DEFAULTS)) == [], "settings.md documents removed options"


def test_each_setting_entry_states_its_default() -> None:
    page = _page("settings.md")
    for name in sorted(DEFAULTS):
        entry = page.split(f"(setting-{name})=", 1)[1].split("\n(", 1)[0]
        assert "\nDefault: " in entry, f"{name}: no 'Default:' line"


# --- management commands -----------------------------------------------------------------


def _command_names() -> set[str]:
    return {path.stem for path in COMMANDS.glob("*.py") if not path.stem.startswith("_")}


def _imported_ints(tree: ast.Module, package: str) -> dict[str, int]:
    """The int constants a module imports by name, at its top or inside a function
    (a worker imports its reload status only when it reloads)."""
    found: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            source = import_module("." * node.level + node.module, package)
            for alias in node.names:
                value = getattr(source, alias.name, None)
                if isinstance(value, int) and not isinstance(value, bool):
                    found[alias.asname or alias.name] = value
    return found


def _exit_codes(module_name: str) -> set[str]:
    """The exit statuses a module chooses itself: every ``returncode=`` of a
    ``CommandError`` and every ``SystemExit(...)`` whose status is a constant, and
    ``128 + signal`` for the second-signal exits."""
    module = import_module(module_name)
    tree = ast.parse(Path(inspect.getfile(module)).read_text(encoding="utf-8"))
    names = {
        **_imported_ints(tree, COMMANDS_PACKAGE),
        **{
            name: value
            for name, value in vars(module).items()
            if isinstance(value, int) and not isinstance(value, bool)
        },
    }
    codes: set[str] = set()

    def resolve(node: ast.expr) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            codes.add(str(node.value))
        elif isinstance(node, ast.Name) and node.id in names:
            codes.add(str(names[node.id]))
        elif (
            isinstance(node, ast.BinOp)
            and isinstance(node.left, ast.Constant)
            and node.left.value == 128
        ):
            codes.add("128 + signal")

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for keyword in node.keywords:
            if keyword.arg == "returncode":
                resolve(keyword.value)
        if isinstance(node.func, ast.Name) and node.func.id == "SystemExit" and node.args:
            resolve(node.args[0])
    return codes


def _command_exit_codes(name: str) -> set[str]:
    """Every status command ``name`` can exit with: 0, its own, and those of the shared
    option types and error mapping (``_common``) when it uses them."""
    codes = {"0"} | _exit_codes(f"{COMMANDS_PACKAGE}.{name}")
    source = (COMMANDS / f"{name}.py").read_text(encoding="utf-8")
    if re.search(r"^from (\.|jobstate\.management\.commands\.)_common import", source, re.M):
        codes |= _exit_codes(f"{COMMANDS_PACKAGE}._common")
    return codes


def test_every_command_has_a_section_and_every_section_is_a_command() -> None:
    documented = set(_headings(_page("commands.md"), 2))
    assert sorted(_command_names() - documented) == [], "commands missing from commands.md"
    assert sorted(documented - _command_names()) == [], "commands.md documents removed commands"


@pytest.mark.parametrize("name", sorted(_command_names()))
def test_each_command_documents_every_exit_code_it_can_return(name: str) -> None:
    section = _section(_page("commands.md"), name)
    assert "Exit codes" in section, f"{name}: no 'Exit codes' part"
    missing = sorted(code for code in _command_exit_codes(name) if f"**{code}**" not in section)
    assert missing == [], f"{name}: exit codes not documented"


# --- system checks -----------------------------------------------------------------------


def _check_ids() -> set[str]:
    """Every check id the package's code names (registered checks, backend checks)."""
    return {
        match
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.parts
        for match in re.findall(r"jobstate\.[EW]\d{3}", path.read_text(encoding="utf-8"))
    }


def test_every_check_id_is_documented_and_every_documented_one_exists() -> None:
    documented = {text for text in _headings(_page("checks.md"), 3)}
    assert len(_check_ids()) > 10, "the scan of the package found no check ids"
    assert sorted(_check_ids() - documented) == [], "check ids missing from checks.md"
    assert sorted(documented - _check_ids()) == [], "checks.md documents removed check ids"


# --- exceptions --------------------------------------------------------------------------


def _exception_names() -> set[str]:
    return {
        name
        for name, value in inspect.getmembers(jobstate.exceptions, inspect.isclass)
        if issubclass(value, BaseException)
        and value.__module__ == jobstate.exceptions.__name__
        and not name.startswith("_")
    }


def test_every_exception_is_documented_and_every_documented_one_exists() -> None:
    documented = set(_headings(_page("exceptions.md"), 3))
    assert sorted(_exception_names() - documented) == [], "exceptions missing"
    assert sorted(documented - _exception_names()) == [], "exceptions.md documents removed ones"


# --- metrics -----------------------------------------------------------------------------


def _metric_names() -> set[str]:
    """The metric families the exporter renders, from a snapshot of an empty queue."""
    snapshot = JobOperationalMetrics(
        by_status={status.value: 0 for status in JobStatus},
        terminal_last_15m={},
        oldest_queued_age_seconds=0.0,
        delayed_queued_jobs=0,
        expired_leases=0,
        blocked_threads=0,
    )
    return {family.name for family in metric_families(snapshot)}


def test_every_metric_is_documented_and_every_documented_one_exists() -> None:
    rows = re.findall(r"^\| `(jobstate_\w+)` \|", _page("metrics.md"), re.MULTILINE)
    assert sorted(_metric_names() - set(rows)) == [], "metrics missing from metrics.md"
    assert sorted(set(rows) - _metric_names()) == [], "metrics.md documents removed metrics"
