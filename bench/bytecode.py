"""Byte-compile the checkout's Python before a run, as ``pip install`` does for a wheel.

Every worker the harness starts is a new Python process. The peers' code comes from
wheels, whose modules pip compiled when it installed them; jobstate and the harness run
from this checkout. Where nothing has compiled them yet (a fresh clone, or an
environment with ``PYTHONDONTWRITEBYTECODE`` set, where Python compiles every module
from source at every start and keeps nothing), each worker would spend a tenth of a
second or more compiling jobstate's modules before it could claim anything: a cost no
host that installs jobstate pays. Compiling them first puts every contender on the
footing a host has (the harness's settings install jobstate for every contender, so
all of them paid it).
"""

from __future__ import annotations

import compileall
import os
from pathlib import Path
from typing import Any

#: The checkout's packages a benchmark's processes import: jobstate itself and the
#: harness (its settings and the peers' tasks, which every contender imports alike).
PACKAGES = ("jobstate", "bench")


def byte_compile(root: Path) -> dict[str, Any]:
    """Compile :data:`PACKAGES` under ``root`` where their bytecode is missing or older
    than the source (``compileall``'s own rule: nothing is rewritten twice), and say
    what was done, for the run's manifest."""
    compiled = all(
        compileall.compile_dir(root / package, quiet=2, workers=1) for package in PACKAGES
    )
    return {
        "byte_compiled": list(PACKAGES) if compiled else [],
        # Set or not, Python reads the compiled files; set, it writes none of its own.
        "PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
    }


def describe(figures: dict[str, Any]) -> str:
    """One line for the run's log."""
    if figures["byte_compiled"]:
        return "bytecode: jobstate and bench compiled first, as pip does when it installs a wheel"
    return (
        "warning: jobstate's modules could not be byte-compiled (a read-only checkout, or "
        "a module that does not compile); every worker compiles them at its start"
    )
