"""The worker processes of a torture run: released together once all are set up,
killed with SIGKILL, paused with SIGSTOP, restarted, and finally stopped gracefully.

Each slot keeps its shared phase integer across restarts; each incarnation gets a new
worker id (``torture-w<slot>-<incarnation>``), which is its ``worker_id`` in claims,
its ``triggered_by`` in runs and the name of its database sessions.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from typing import Any

from reliability._torture_config import ProcessConfig
from reliability._torture_worker import IDLE, reaper_main, worker_main


@dataclass
class Slot:
    index: int
    phase: Any
    process: SpawnProcess
    worker_id: str
    incarnation: int = 0
    paused_until: float | None = None

    @property
    def busy(self) -> bool:
        return self.phase.value != IDLE


class PoolError(RuntimeError):
    """The workers could not be started."""


@dataclass(frozen=True)
class ProcessFailure:
    """A process that exited on its own with a non-zero status."""

    name: str
    exitcode: int


class WorkerPool:
    def __init__(self, context: SpawnContext, config: ProcessConfig, count: int) -> None:
        self.context = context
        self.config = config
        self.stop_event = context.Event()
        self.ready = context.Value("i", 0)
        self.go = context.Event()
        self.slots: list[Slot] = []
        self.restarts = 0
        self._count = count

    # --- start and restart ------------------------------------------------------------

    def start(self, ready_timeout: float) -> None:
        """Start every worker and release them together once all are set up. Raises
        :class:`PoolError` if one exits or they are not ready within ``ready_timeout``."""
        for index in range(self._count):
            phase = self.context.Value("i", IDLE, lock=False)
            worker_id = _worker_id(index, 0)
            self.slots.append(Slot(index, phase, self._spawn(worker_id, phase), worker_id))
        deadline = time.monotonic() + ready_timeout
        while self.ready.value < self._count:
            dead = [
                f"{s.worker_id} (exit {s.process.exitcode})"
                for s in self.slots
                if s.process.exitcode is not None
            ]
            if dead:
                raise PoolError(f"workers exited while setting up: {', '.join(dead)}")
            if time.monotonic() > deadline:
                raise PoolError(f"workers not ready after {ready_timeout:g} s")
            time.sleep(0.05)
        self.go.set()

    def restart(self, slot: Slot) -> None:
        """Start the next incarnation of ``slot`` (its previous process has exited)."""
        slot.incarnation += 1
        slot.worker_id = _worker_id(slot.index, slot.incarnation)
        slot.phase.value = IDLE
        slot.paused_until = None
        slot.process = self._spawn(slot.worker_id, slot.phase)
        self.restarts += 1

    def _spawn(self, worker_id: str, phase: Any) -> SpawnProcess:
        process = self.context.Process(
            target=worker_main,
            args=(self.config, worker_id, phase, self.stop_event, self.ready, self.go),
            name=worker_id,
            daemon=True,
        )
        process.start()
        return process

    # --- faults -------------------------------------------------------------------------

    def candidates(self) -> tuple[list[Slot], list[Slot]]:
        """Running, unpaused slots: those holding a job or a run, and all of them."""
        live = [s for s in self.slots if s.paused_until is None and s.process.is_alive()]
        return [s for s in live if s.busy], live

    def kill(self, slot: Slot) -> None:
        """SIGKILL the slot's process and wait until it is gone."""
        slot.process.kill()
        slot.process.join()

    def pause(self, slot: Slot, seconds: float) -> None:
        assert slot.process.pid is not None
        os.kill(slot.process.pid, signal.SIGSTOP)
        slot.paused_until = time.monotonic() + seconds

    def resume_due(self, everything: bool = False) -> int:
        """SIGCONT the paused workers whose pause is over (or all of them)."""
        now = time.monotonic()
        resumed = 0
        for slot in self.slots:
            if slot.paused_until is not None and (everything or slot.paused_until <= now):
                assert slot.process.pid is not None
                os.kill(slot.process.pid, signal.SIGCONT)
                slot.paused_until = None
                resumed += 1
        return resumed

    def failures(self) -> list[tuple[Slot, ProcessFailure]]:
        """Slots whose process exited by itself (every exit is unexpected before the
        stop: the controller joins the processes it kills before it looks again)."""
        failed = []
        for slot in self.slots:
            code = slot.process.exitcode
            if code is not None:
                failed.append((slot, ProcessFailure(slot.worker_id, code)))
        return failed

    # --- stop ---------------------------------------------------------------------------

    def stop(self, timeout: float) -> tuple[list[str], list[ProcessFailure]]:
        """Ask every worker to finish what it is doing and exit. Returns the worker ids
        that had to be killed after ``timeout``, and the workers that exited non-zero."""
        self.resume_due(everything=True)
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for slot in self.slots:
            slot.process.join(max(0.0, deadline - time.monotonic()))
        killed = []
        failed = []
        for slot in self.slots:
            if slot.process.is_alive():
                self.kill(slot)
                killed.append(slot.worker_id)
            elif slot.process.exitcode:
                failed.append(ProcessFailure(slot.worker_id, slot.process.exitcode))
        return killed, failed

    def abandon(self) -> None:
        """Wake and kill every worker still alive (after an error or a finished stop,
        where it finds none)."""
        self.resume_due(everything=True)
        for slot in self.slots:
            if slot.process.is_alive():
                self.kill(slot)


class Reaper:
    """The reaper process, with its own stop event (it outlives the workers)."""

    def __init__(self, context: SpawnContext, config: ProcessConfig) -> None:
        self.context = context
        self.config = config
        self.stop_event = context.Event()
        self.process = self._spawn()
        self.restarts = 0

    def _spawn(self) -> SpawnProcess:
        process = self.context.Process(
            target=reaper_main,
            args=(self.config, self.stop_event),
            name="torture-reaper",
            daemon=True,
        )
        process.start()
        return process

    def failure(self) -> ProcessFailure | None:
        """The reaper's exit, if it exited by itself; it is restarted at once."""
        code = self.process.exitcode
        if code is None:
            return None
        self.process = self._spawn()
        self.restarts += 1
        return ProcessFailure("torture-reaper", code)

    def abandon(self) -> None:
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def stop(self, timeout: float) -> ProcessFailure | None:
        self.stop_event.set()
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
            return ProcessFailure("torture-reaper (did not stop)", -signal.SIGKILL)
        if self.process.exitcode:
            return ProcessFailure("torture-reaper", self.process.exitcode)
        return None


def _worker_id(index: int, incarnation: int) -> str:
    return f"torture-w{index}-{incarnation}"
