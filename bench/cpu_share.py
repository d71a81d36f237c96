"""The CPU time a drain spends, by who spends it: the worker processes, PgBouncer and the
database's server processes, read from ``/proc`` (Linux) at the start and the end of the
drain. The PgBouncer benchmark prints it per task beside each arm's rate, so a pooled
arm that drains slower shows where the extra time went (the pooler, the server planning
statements it may not keep prepared, or the workers), and whether the machine's cores
were all busy (then the drain is bound by CPU, not by waiting)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

_PROC = Path("/proc")

#: The groups a drain's processes fall in, in the order they are printed.
GROUPS = ("workers", "pgbouncer", "server")


def available() -> bool:
    """Whether this machine has ``/proc`` to read (Linux)."""
    return (_PROC / "stat").exists()


def process_seconds(pid: int) -> float | None:
    """User and system CPU seconds process ``pid`` has used (its threads included), or
    ``None`` once it is gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (2nd field) is in parentheses and may hold spaces: the fields
    # are counted after its closing one. utime and stime are the 14th and 15th fields.
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_seconds() -> tuple[float, float]:
    """The machine's busy and total CPU seconds since boot, over all its cores."""
    with (_PROC / "stat").open() as stat:
        ticks = [int(value) for value in stat.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest time is inside user).
    idle = ticks[3] + ticks[4]
    total = sum(ticks[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


@dataclass
class CpuShare:
    """CPU seconds each group spent during one drain, and the machine's."""

    seconds: dict[str, float] = field(default_factory=dict)
    machine_busy: float = 0.0
    machine_total: float = 0.0

    def per_task_ms(self, group: str, tasks: int) -> float:
        return 1000 * self.seconds.get(group, 0.0) / tasks if tasks else float("nan")

    @property
    def busy_share(self) -> float:
        """How busy the machine's cores were, 1.0 meaning every core all the time."""
        return self.machine_busy / self.machine_total if self.machine_total else float("nan")

    def summary(self, tasks: int) -> str:
        parts = ", ".join(f"{group} {self.per_task_ms(group, tasks):.2f}" for group in GROUPS)
        return f"CPU ms per task: {parts}; cores busy {self.busy_share:.0%}"


class CpuMeter:
    """Measures the CPU the processes ``groups()`` names spend between :meth:`start`
    and :meth:`stop`. ``groups()`` is asked at both ends: a process that appears in
    between counts from zero; one that is gone at the end (a killed PgBouncer and the
    server connections it held) is left out, with what it spent."""

    def __init__(self, groups: Callable[[], Mapping[str, list[int]]]) -> None:
        self._groups = groups
        self._start: dict[int, float] = {}
        self._machine: tuple[float, float] = (0.0, 0.0)

    def start(self) -> None:
        self._start = {
            pid: seconds
            for pids in self._groups().values()
            for pid in pids
            if (seconds := process_seconds(pid)) is not None
        }
        self._machine = machine_seconds()

    def stop(self) -> CpuShare:
        share = CpuShare()
        for group, pids in self._groups().items():
            spent = 0.0
            for pid in pids:
                now = process_seconds(pid)
                if now is not None:
                    spent += now - self._start.get(pid, 0.0)
            share.seconds[group] = spent
        busy, total = machine_seconds()
        share.machine_busy = busy - self._machine[0]
        share.machine_total = total - self._machine[1]
        return share
