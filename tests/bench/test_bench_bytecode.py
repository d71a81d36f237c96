"""Before a run the harness compiles the checkout's packages, as pip compiles a wheel's
modules when it installs it: a worker it starts then loads jobstate's bytecode, also
where ``PYTHONDONTWRITEBYTECODE`` keeps Python from writing any, and a checkout it
cannot compile is named in the run's log instead of measured silently."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from bench.bytecode import PACKAGES, byte_compile, describe


def _checkout(root: Path, *, broken: bool = False) -> list[Path]:
    sources = []
    for package in PACKAGES:
        (root / package).mkdir()
        (root / package / "__init__.py").write_text("")
        module = root / package / "module.py"
        module.write_text("def f(:\n" if broken and package == "jobstate" else "VALUE = 1\n")
        sources.append(module)
    return sources


def test_every_package_is_compiled_where_python_would_write_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    sources = _checkout(tmp_path)
    assert not any(Path(importlib.util.cache_from_source(str(s))).exists() for s in sources)

    figures = byte_compile(tmp_path)

    assert all(Path(importlib.util.cache_from_source(str(s))).exists() for s in sources)
    assert figures == {"byte_compiled": ["jobstate", "bench"], "PYTHONDONTWRITEBYTECODE": "1"}
    assert describe(figures).startswith("bytecode: jobstate and bench compiled first")


def test_a_checkout_that_does_not_compile_is_named_in_the_log(tmp_path: Path) -> None:
    _checkout(tmp_path, broken=True)

    figures = byte_compile(tmp_path)

    assert figures["byte_compiled"] == []
    assert describe(figures).startswith("warning: jobstate's modules could not be byte-compiled")
