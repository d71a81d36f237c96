"""One sweep registry: the runners (and through them the commands and the Celery tasks)
and each sweep's own function run the entries of ``sweep_table``."""

from __future__ import annotations

import pytest

from jobstate import maintenance
from jobstate.maintenance import sweep_table
from jobstate.maintenance.sweep_table import Sweep, SweepKind

pytestmark = pytest.mark.django_db


def test_the_package_exports_the_registry_itself() -> None:
    assert maintenance.REAPING_SWEEPS is sweep_table.REAPING_SWEEPS
    assert maintenance.RETENTION_SWEEPS is sweep_table.RETENTION_SWEEPS
    for registry, kind in (
        (maintenance.REAPING_SWEEPS, SweepKind.REAPING),
        (maintenance.RETENTION_SWEEPS, SweepKind.RETENTION),
    ):
        for name, sweep in registry.items():
            assert isinstance(sweep, Sweep)
            assert (sweep.name, sweep.kind) == (name, kind)


@pytest.mark.parametrize(
    ("registry", "runner"),
    [
        ("REAPING_SWEEPS", maintenance.run_reaping_sweeps),
        ("RETENTION_SWEEPS", maintenance.run_retention_sweeps),
    ],
)
def test_a_sweep_added_to_the_registry_joins_its_runner(monkeypatch, registry, runner) -> None:
    table = dict(getattr(sweep_table, registry))
    first = next(iter(table.values()))
    extra = Sweep(
        "extra",
        first.kind,
        lambda using: using,
        "nothing",
        lambda store, n, arguments: 0,
        lambda store, n, arguments: 7,
        first.arguments,
    )
    table["extra"] = extra
    monkeypatch.setattr(sweep_table, registry, table)
    monkeypatch.setitem(vars(maintenance.sweeps), registry, table)
    report = runner(dry_run=True, sweeps=["extra"])
    assert [result.sweep for result in report.results] == ["extra"]
    assert report.results[0].count == 7
