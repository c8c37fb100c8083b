"""CPU-work probes under a noisy neighbour: the profiles :mod:`analyzer.interference` reads.

``perfcast profile --cpu 50`` runs, for each neighbour level ``P`` and each work size ``W``, probes that do
what an event loop's step does: sleep (the loop idle until an answer arrives), wake up, run ``W`` ms of
pure-Python CPU work. A sample is the time from when the probe asked to wake up to when the work is done, so
the scheduler's wake-up latency is in it. The sleeps come in classes (:data:`GAP_CLASSES_MS`), each work size
probed in each class and stored as a profile of its own: what a neighbour adds to a short step depends on how
long the loop slept before it (``analyzer.interference``). The number of loop iterations that makes ``W`` ms is
calibrated first, with no neighbour running (the fastest of several tries).

The probe runs on one core and the neighbour (``neighbour(P, cores)``, a context manager:
:class:`replayer.hog.CpuHog` from the CLI) takes ``P`` % of that same core: the scenario
``interference:cpu=P`` is "a neighbour takes P % of the CPU the event loop runs on". The neighbour is paused
and resumed in short alternating blocks, and the samples taken while it is paused are the ``cpu_pct=0``
reference: measured at the same moments, they see the same drift of a shared machine's speed. Each point is
stored as soon as it is measured, under the api ``cpu <W>ms gap <G>ms``, parameterised by ``cpu_pct``.
"""

from __future__ import annotations

import itertools
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np
import numpy.typing as npt

from analyzer.interference import cpu_api
from analyzer.profiles import ProfileKey, ProfileStore
from analyzer.profiling import Measurement, Progress, ProfilingError, StopRule, relative_standard_error

__all__ = ["DEFAULT_WORK_MS", "GAP_CLASSES_MS", "Neighbour", "Pausable", "calibrate", "iterations_per_ms",
           "profile_cpu"]

FloatArray = npt.NDArray[np.float64]

class Pausable(Protocol):
    """A running neighbour that can stop taking CPU for a while (:class:`replayer.hog.CpuHog`)."""

    def pause(self) -> None: ...
    def resume(self) -> None: ...


Neighbour = Callable[[float, frozenset[int]], AbstractContextManager[Pausable]]
"""``neighbour(percent, cores)``: keeps ``percent`` % of each of ``cores`` busy while entered."""

DEFAULT_WORK_MS = (0.05, 0.2, 1.0, 5.0)
"""Work sizes probed by default: an event loop's steps are mostly 0.05-1 ms of CPU."""

GAP_CLASSES_MS: tuple[tuple[float, float], ...] = ((0.02, 0.18), (0.2, 1.0), (1.0, 5.0))
"""The ranges a probe's sleep is drawn from (uniformly), one profile per range, named by its mean (0.1, 0.6 and 3
ms): an event loop's waits between steps, from a cache's or a database's answer a few tenths of a millisecond
away to a slow service's. Under a 50% neighbour a 0.05 ms probe gained 0.04, 0.21 and 0.41 ms on average after
the three classes' sleeps, a 0.2 ms probe 0.20, 0.21 and 0.51, a 1 ms probe 0.70, 0.64 and 0.61, a 5 ms probe
3.3, 3.2 and 2.4 (``docs/accuracy.md``, runs 125-128)."""

_START_S = 0.5
"""Time for a neighbour's processes to start before probing."""

_BLOCK_S = 0.2
"""Probing time with the neighbour running, then paused, in turn."""


def _spin(n: int) -> int:
    x = 0
    for _ in range(n):
        x += 1
    return x


def iterations_per_ms(tries: int = 25) -> float:
    """How many turns of the probe's loop take 1 ms of CPU here, with nothing else running.

    The fastest of ``tries`` timings of a 2 ms run sets the rate: slower ones were interrupted.
    """
    n = 20_000
    while _timed(n) <= 2e-3 and n <= 1 << 30:  # grow the run until it takes about 2 ms
        n *= 2
    return n / (min(_timed(n) for _ in range(tries)) * 1e3)


def calibrate(work_ms: float, per_ms: float | None = None) -> int:
    """Iterations of the probe's loop that take ``work_ms`` of CPU here (at the rate ``per_ms``, measured by
    :func:`iterations_per_ms` when not given)."""
    if work_ms <= 0:
        raise ProfilingError(f"--work {work_ms:g}: a work size must be positive (ms)")
    return max(1, round((per_ms if per_ms is not None else iterations_per_ms()) * work_ms))


def _timed(n: int) -> float:
    t0 = time.perf_counter()
    _spin(n)
    return time.perf_counter() - t0


def _probe(iterations: int, rng: np.random.Generator, gaps: tuple[float, float]) -> float:
    """One sample (ms): from the wake-up asked for, after a sleep drawn from ``gaps`` (ms), to the end of the
    work."""
    gap = rng.uniform(*gaps) / 1e3
    due = time.perf_counter() + gap
    time.sleep(gap)
    _spin(iterations)
    return (time.perf_counter() - due) * 1e3


def _one_core() -> frozenset[int]:
    """The core to probe on (the first this process may use), or empty where affinity cannot be set."""
    if not hasattr(os, "sched_getaffinity"):
        return frozenset()
    return frozenset({min(os.sched_getaffinity(0))})


def _paired(iterations: int, neighbour: Pausable, rule: StopRule, rng: np.random.Generator,
            progress: Progress | None, gaps: tuple[float, float]) -> tuple[FloatArray, FloatArray, str]:
    """(samples with the neighbour running, samples with it paused, why it stopped), in alternating blocks.

    A shared machine's speed drifts by up to 2x within seconds; blocks of ``_BLOCK_S`` with and without the
    neighbour, interleaved, see the same drift, so their difference is the neighbour's alone.
    """
    on: list[float] = []
    off: list[float] = []
    began = time.monotonic()
    why = "budget"
    while time.monotonic() - began < rule.budget_s:
        for running, bucket in ((True, on), (False, off)):
            if running:
                neighbour.resume()
            else:
                neighbour.pause()
            end = time.monotonic() + _BLOCK_S
            while time.monotonic() < end and len(bucket) < rule.max_count:
                bucket.append(_probe(iterations, rng, gaps))
        worst = max(relative_standard_error(on), relative_standard_error(off))
        if progress is not None:
            progress(min(len(on), len(off)), worst, time.monotonic() - began)
        if min(len(on), len(off)) >= rule.max_count:
            why = "max count"
            break
        if min(len(on), len(off)) >= rule.min_count and worst < rule.rse:
            why = "stable"
            break
    neighbour.resume()
    return np.asarray(on, dtype=np.float64), np.asarray(off, dtype=np.float64), why


def profile_cpu(
    levels: Sequence[float],
    neighbour: Neighbour,
    *,
    work_ms: Sequence[float] = DEFAULT_WORK_MS,
    gap_classes: Sequence[tuple[float, float]] = GAP_CLASSES_MS,
    labels: Mapping[str, str] | None = None,
    rule: StopRule = StopRule(),
    store: ProfileStore | None = None,
    progress: Callable[[ProfileKey], Progress] | None = None,
    note: str = "",
    seed: int | None = None,
) -> list[Measurement]:
    """Probe every work size after sleeps of every class at every neighbour level; store each point as soon as
    it is measured (api ``cpu <W>ms gap <G>ms``, ``G`` the class's mean sleep).

    Each level's samples are paired with samples taken with the neighbour paused, in alternating blocks
    (:func:`_paired`), stored under ``cpu_pct=0``. ``rule.budget_s`` applies to each (level, work size, gap
    class). Returns the measurements: per level, work size and gap class, the loaded one then the idle one.
    """
    if not work_ms:
        raise ProfilingError("--work: give at least one work size")
    if not gap_classes or any(not 0 <= lo < hi for lo, hi in gap_classes):
        raise ProfilingError(f"gap classes must be ranges 0 <= low < high (ms), got {list(gap_classes)}")
    if not levels:
        raise ProfilingError("--cpu: give at least one neighbour level")
    for p in levels:
        if not 0 < p < 100:
            raise ProfilingError(f"--cpu {p:g}: a neighbour's share must be in (0, 100) %")
    rng = np.random.default_rng(seed)
    resource = f"cpu://{socket.gethostname()}"
    core = _one_core()
    before = os.sched_getaffinity(0) if core else None
    results: list[Measurement] = []
    try:
        if core:
            os.sched_setaffinity(0, core)
        per_ms = iterations_per_ms()  # one rate for every size: the loop's cost per turn does not depend on it
        iterations = {w: calibrate(w, per_ms) for w in sorted(set(work_ms))}
        for level in sorted(set(map(float, levels))):
            with neighbour(level, core) as busy:
                time.sleep(_START_S)
                for (w, n), (lo, hi) in itertools.product(iterations.items(), gap_classes):
                    api = cpu_api(w, round((lo + hi) / 2, 6))
                    key = ProfileKey.make(api, resource, labels or {}, "cpu_pct", level)
                    idle = ProfileKey.make(api, resource, labels or {}, "cpu_pct", 0.0)
                    began = time.monotonic()
                    on, off, why = _paired(n, busy, rule, rng, progress(key) if progress else None, (lo, hi))
                    elapsed = time.monotonic() - began
                    for k, samples in ((key, on), (idle, off)):
                        if store is not None:
                            store.add(k, samples, round_trips=0.0,
                                      note=note or f"perfcast profile --cpu {level:g} ({why}, {n} iterations)")
                        results.append(Measurement(k, samples, 0.0, why, elapsed))
    finally:
        if before is not None:
            os.sched_setaffinity(0, before)
    return results
