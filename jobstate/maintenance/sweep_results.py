"""What the maintenance sweeps report: one :class:`SweepResult` per sweep call, a
:class:`SweepReport` per run of several, and the :data:`SweepProgress` callback."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SweepProgress", "SweepReport", "SweepResult"]

#: Called after every batch with the sweep's name and the rows it has moved so far
#: (for progress displays).
SweepProgress = Callable[[str, int], None]


@dataclass(frozen=True)
class SweepResult:
    """What one sweep call did.

    ``count`` is the rows this call moved or deleted (with ``dry_run``: the rows it
    would move now, nothing written); ``batches`` the statements it ran. ``complete`` is
    ``False`` when the call stopped at its time budget or ``limit`` and candidates may
    be left for the next call. ``detail`` splits ``count`` where a sweep has more than
    one outcome (expired leases: ``requeued`` / ``failed``).
    """

    sweep: str
    count: int
    batches: int = 0
    complete: bool = True
    dry_run: bool = False
    detail: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SweepReport:
    """The results of a run of several sweeps, in the order they ran."""

    results: tuple[SweepResult, ...]
    dry_run: bool = False

    def __getitem__(self, sweep: str) -> SweepResult:
        for result in self.results:
            if result.sweep == sweep:
                return result
        raise KeyError(sweep)

    @property
    def total(self) -> int:
        return sum(result.count for result in self.results)

    @property
    def complete(self) -> bool:
        return all(result.complete for result in self.results)

    @property
    def counts(self) -> dict[str, int]:
        """Every count, flat: ``{sweep: count, f"{sweep}_{outcome}": n, ...}``."""
        flat: dict[str, int] = {}
        for result in self.results:
            flat[result.sweep] = result.count
            for outcome, count in result.detail.items():
                flat[f"{result.sweep}_{outcome}"] = count
        return flat

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every count, plus ``dry_run`` and ``complete``."""
        return {**self.counts, "dry_run": self.dry_run, "complete": self.complete}
