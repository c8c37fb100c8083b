"""A noisy neighbour for real: processes that keep a share of every core busy.

Applies the ``interference:cpu=PCT`` scenario for ground-truth measurements: one process per core, each busy
for ``percent`` of every ``period_ms`` window and asleep for the rest, so the cores are ``percent`` % taken
on average, the way a co-located tenant's steady load takes them.

Each process keeps its own rhythm: a busy spell starts when the process gets the core, and it sleeps out the
rest of the window after it. :meth:`CpuHog.pause` and :meth:`CpuHog.resume` switch the neighbour off and on
through shared events (a paused process waits on one and takes no CPU). A resumed process enters its window
at a random point, as a neighbour who had been there all along would be met: a ground truth that switches it
around each request (``replayer.groundtruth.measure_paired``) would otherwise meet the start of a busy spell
at the start of every request.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import time
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType

__all__ = ["CpuHog"]


def _burn(percent: float, period_s: float, seed: int | None, stop: EventType, on: EventType,
          off: EventType) -> None:
    busy = period_s * percent / 100.0
    rng = random.Random(seed)
    x = 0
    while not stop.is_set():
        phase = 0.0
        if not on.is_set():
            on.wait()
            phase = rng.uniform(0.0, period_s)  # resumed: met anywhere in its window
        start = time.perf_counter() - phase
        while time.perf_counter() - start < busy and on.is_set():
            x += 1
        rest = period_s - (time.perf_counter() - start)
        if rest > 0:
            off.wait(rest)  # the rest of the window, cut short by a pause


@dataclass
class CpuHog:
    """Keep ``percent`` % of each of ``cores`` cores busy until stopped (a context manager)."""

    percent: float
    cores: int = 0
    """Busy processes, one per core (0: one per core of ``cpus``, or of the machine)."""
    period_ms: float = 10.0
    cpus: frozenset[int] = frozenset()
    """Keep the processes on these cores (empty: wherever the scheduler puts them)."""
    seed: int | None = None
    """Seeds where in its window each resumed process starts (``None``: not reproducible)."""
    _stop: EventType | None = None
    _on: EventType | None = None
    _off: EventType | None = None
    _procs: list[mp.process.BaseProcess] = field(default_factory=list)

    def start(self) -> CpuHog:
        if not 0 <= self.percent <= 100:
            raise ValueError(f"percent must be within 0..100, got {self.percent}")
        if self.cores < 0:
            raise ValueError(f"cores must be non-negative (0: one per core), got {self.cores}")
        if self.cpus and not hasattr(os, "sched_setaffinity"):
            raise ValueError("cpus: this platform cannot pin processes to cores")
        cores = self.cores or len(self.cpus) or os.cpu_count() or 1
        ctx = mp.get_context("spawn")
        self._stop, self._on, self._off = ctx.Event(), ctx.Event(), ctx.Event()
        self._on.set()
        if self.percent > 0:
            for k in range(cores):
                seed = None if self.seed is None else self.seed + k
                proc = ctx.Process(target=_burn, args=(self.percent, self.period_ms / 1000.0, seed, self._stop,
                                                       self._on, self._off), daemon=True)
                proc.start()
                self._procs.append(proc)
                if self.cpus:
                    assert proc.pid is not None
                    os.sched_setaffinity(proc.pid, self.cpus)
        return self

    def pause(self) -> None:
        """Stop taking CPU until :meth:`resume` (the processes wait, they are not ended)."""
        if self._on is not None and self._off is not None:
            self._on.clear()
            self._off.set()

    def resume(self) -> None:
        if self._on is not None and self._off is not None:
            self._off.clear()
            self._on.set()

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self.resume()  # a paused process waits for this event before it sees the stop
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self._procs.clear()

    def __enter__(self) -> CpuHog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
