"""A noisy neighbour for real: processes that keep a share of every core busy.

Applies the ``interference:cpu=PCT`` scenario for ground-truth measurements: one process per core, each busy
for ``percent`` of every ``period_ms`` window and asleep for the rest, so the cores are ``percent`` % taken
on average, the way a co-located tenant's steady load takes them.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType

__all__ = ["CpuHog"]


def _burn(percent: float, period_s: float, stop: EventType) -> None:
    busy = period_s * percent / 100.0
    x = 0
    while not stop.is_set():
        start = time.perf_counter()
        while time.perf_counter() - start < busy:
            x += 1
        rest = period_s - (time.perf_counter() - start)
        if rest > 0:
            time.sleep(rest)


@dataclass
class CpuHog:
    """Keep ``percent`` % of each of ``cores`` cores busy until stopped (a context manager)."""

    percent: float
    cores: int = 0
    """Busy processes, one per core (0: one per core of ``cpus``, or of the machine)."""
    period_ms: float = 10.0
    cpus: frozenset[int] = frozenset()
    """Keep the processes on these cores (empty: wherever the scheduler puts them)."""
    _stop: EventType | None = None
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
        self._stop = ctx.Event()
        if self.percent > 0:
            for _ in range(cores):
                proc = ctx.Process(target=_burn, args=(self.percent, self.period_ms / 1000.0, self._stop), daemon=True)
                proc.start()
                self._procs.append(proc)
                if self.cpus:
                    assert proc.pid is not None
                    os.sched_setaffinity(proc.pid, self.cpus)
        return self

    def pause(self) -> None:
        """Stop taking CPU until :meth:`resume` (the processes are stopped, not ended)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        for proc in self._procs:
            if proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, sig)

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()
        self.resume()  # a paused process cannot see the stop event
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self._procs.clear()

    def __enter__(self) -> CpuHog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
