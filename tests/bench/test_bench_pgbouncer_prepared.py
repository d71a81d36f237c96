"""The PgBouncer benchmark keeps jobstate's prepared statements only behind a PgBouncer
that can keep them (1.22 or newer, ``--max-prepared-statements``): asked of an older
one, it refuses before starting anything, naming the version, rather than measure
workers that fail with "prepared statement does not exist"."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.pg import BenchError
from bench.pgbouncer import PGBOUNCER, PREPARED_SINCE, PgBouncer, version


def _debian_version() -> tuple[int, ...]:
    printed = subprocess.run([PGBOUNCER, "--version"], capture_output=True, text=True).stdout
    return tuple(int(part) for part in printed.split()[1].split("."))


@pytest.mark.postgres
def test_the_version_is_read_from_the_binary() -> None:
    assert version() == _debian_version()


@pytest.mark.postgres
def test_prepared_statements_are_refused_behind_a_pgbouncer_too_old_to_keep_them(
    tmp_path: Path,
) -> None:
    if version() >= PREPARED_SINCE:
        pytest.fail(f"{PGBOUNCER} keeps prepared statements: this test needs an older one")
    with pytest.raises(BenchError, match=r"is PgBouncer 1\.\d+\.\d+: keeping prepared"):
        PgBouncer(tmp_path, database="any", pool_size=2, max_prepared_statements=10)
    assert not (tmp_path / "pgbouncer.ini").exists()


@pytest.mark.postgres
def test_without_prepared_statements_the_config_leaves_the_key_out(tmp_path: Path) -> None:
    # PgBouncer before 1.21 does not know max_prepared_statements.
    PgBouncer(tmp_path, database="any", pool_size=2)
    config = (tmp_path / "pgbouncer.ini").read_text()
    assert "pool_mode = transaction" in config
    assert "max_prepared_statements" not in config


def test_a_missing_binary_is_named(tmp_path: Path) -> None:
    missing = str(tmp_path / "pgbouncer")
    with pytest.raises(BenchError, match="pgbouncer is missing: not executable"):
        PgBouncer(tmp_path, database="any", pool_size=2, binary=missing)
