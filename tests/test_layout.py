"""The package's layout checks, kept true: modules small enough to read whole, one module
per name, and the differences between databases in one place."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import jobstate

PACKAGE = Path(jobstate.__file__).resolve().parent

#: The longest a module may be, in lines; longer ones are split by concern.
MODULE_LINE_LIMIT = 500

#: Where the code that tells one database from another may read ``connection.vendor``.
VENDOR_CHECKS_ALLOWED = ("stores/database/backends/", "checks.py")


def _relative(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def _modules() -> list[Path]:
    """Every Python module of the package but its migrations."""
    return sorted(
        path
        for path in PACKAGE.rglob("*.py")
        if "migrations" not in path.relative_to(PACKAGE).parts
    )


def test_the_package_is_found() -> None:
    assert len(_modules()) > 100


def test_no_module_is_longer_than_the_limit() -> None:
    long = {
        _relative(path): count
        for path in _modules()
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINE_LIMIT
    }
    assert not long, f"modules over {MODULE_LINE_LIMIT} lines (split them by concern): {long}"


def test_no_two_modules_share_a_name() -> None:
    """Apart from ``__init__.py``, a module name is used once in the package; an admin
    page module may share its name with the models module of the model it shows."""
    places: dict[str, list[str]] = defaultdict(list)
    for path in _modules():
        places[path.name].append(_relative(path))
    model_modules = {path.name for path in (PACKAGE / "models").glob("*.py")}
    repeated = {
        name: sorted(found)
        for name, found in places.items()
        if len(found) > 1
        and name != "__init__.py"
        and not (name in model_modules and sorted(found) == [f"admin/{name}", f"models/{name}"])
    }
    assert not repeated, f"module names used more than once: {repeated}"


def test_database_vendors_are_told_apart_in_one_place() -> None:
    readers = sorted(
        f"{_relative(path)}:{number}"
        for path in PACKAGE.rglob("*")
        if path.is_file()
        and path.suffix in {".py", ".html", ".txt", ".sql"}
        and not _relative(path).startswith(VENDOR_CHECKS_ALLOWED)
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if "connection.vendor" in line
    )
    assert not readers, f"connection.vendor read outside the backends: {readers}"
