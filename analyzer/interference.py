"""CPU interference: how much longer the event loop's CPU work takes while a neighbour shares its core.

WebPerf keys some profiles by CPU interference (Jiang et al., SIGCOMM 2016, section 4.1) and perfcast does
the same for the loop's own work. ``perfcast profile --cpu 50`` measures, on the host, *probes*: a sleep
(the loop idle in ``epoll_wait`` between two steps) then a fixed amount of pure CPU work of ``work_ms``
(calibrated with nobody else running), timed from when the probe asked to wake up to when the work is done.
Each work size is a profile of api ``cpu <work_ms>ms`` parameterised by ``cpu_pct``: the neighbour's share of
that core, 0 included. A probe is what the event loop does from the moment an answer wakes it until it idles
again, so what a neighbour adds to such a spell of ``c`` ms of loop work is read off the profiles:

    extra(c, u) = Q_P,W(u) - Q_0,W(u)

for the quantile ``u`` of an independent uniform draw (the neighbour's phase is unrelated to the request), at
the work size ``W`` nearest ``c``: linear between the two measured sizes around ``c``, proportional to ``c``
above the largest (a long spell averages over the neighbour's periods), and the smallest size's extra below it
(a short spell still has to be woken up). The load simulation charges each spell of its loop's work that way
(``analyzer.loadsim``). The profiles hold what a model cannot: the scheduler's wake-up
latency and the bimodal fate of short steps (a step that starts while the neighbour sleeps runs at full speed,
one that starts while it runs waits for it or shares the core), which on a 6.x kernel's EEVDF scheduler are
not the fair share of :func:`cpu_slowdown`.

The spells of one request do not draw their quantiles independently: the neighbour has a rhythm (the probes'
neighbour is busy ``P`` % of every :data:`PERIOD_MS`), and spells a few microseconds apart meet it in the same
phase. Each request draws a phase ``phi`` and a spell that starts ``t`` ms into the request takes the quantile
``u = frac(phi - t / T)`` (:func:`phase_quantiles`): the same for spells at the same time, uniform for each
on its own, as the probes measured it. ``t`` is when the spell starts as predicted, after what the neighbour
added to the work before it: a spell that waited out the neighbour's busy time is followed by spells that
meet its idle time.

How long the loop slept before a spell matters too. Under a 50% neighbour a 0.05 ms probe gained 0.04 ms on
average after sleeps of 0.02-0.18 ms and 0.41 ms after sleeps of 1-5 ms, a 0.2 ms probe 0.20 and 0.51 ms (on the
machine of runs 125-128, ``docs/accuracy.md``): a task that slept briefly wakes with its claim on the core intact
and preempts the neighbour, one that slept long finds the neighbour's slice under way (longer work meets the
neighbour's slice either way: a 1 ms probe gained 0.70 and 0.61 ms). An event loop's
gaps between steps are mostly the short ones (a database's answer a few tenths of a millisecond away), where
probes that slept 0.5-5 ms charged every spell the long gaps' extra. So the probes sleep in classes of gap
(:data:`analyzer.cpuprobe.GAP_CLASSES_MS`), each class a profile of its own (api ``cpu <W>ms gap <G>ms``, ``G``
the class's mean sleep), and a spell takes the extra at the loop's idle gap before it, linear between the
classes' means and the nearest class's outside them (:meth:`StretchProfile.at`). A store probed before the
classes (api ``cpu <W>ms``, sleeps of 0.5-5 ms) still gives one profile for every gap.

A work size is what the probes' work took with the neighbour paused, not its calibration: a shared machine's
speed drifts by a fifth from one half second to the next (the probes' CPU time with it), and a neighbour's
extra is time shared, so a probe run while the machine was slow measures, for a nominal ``W``, the extra of a
longer spell. The paused probes are measured at the same moments as the loaded ones; the slope of their medians
over the nominal sizes (:func:`probe_speed`) rescales the sizes to the wall time the work took then, the unit
the app's recorded spells are in. (One benchmark run's probes took 1.58 ms per calibrated ms, another's 1.06:
read at the nominal sizes, the first predicted the index page's extra 27 ms where 18 were measured.)

Without profiles the engine falls back to :func:`cpu_slowdown`, and says so.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from analyzer.errors import ScenarioError

__all__ = ["CPU_SYSTEM", "PERIOD_MS", "StretchProfile", "cpu_api", "cpu_slowdown", "extra_ms", "gap_of",
           "phase_quantiles", "probe_speed", "stretch_profile", "work_of"]

FloatArray = npt.NDArray[np.float64]

CPU_SYSTEM = "cpu"
"""The system of CPU-work probes (their resource is ``cpu://HOST``)."""

_GRID = 200
"""Quantiles kept per work size (u = (i + 0.5) / 200)."""

PERIOD_MS = 10.0
"""The neighbour's rhythm: :class:`replayer.hog.CpuHog` (the probes' neighbour) is busy ``P`` % of every 10 ms."""

_API = re.compile(r"^cpu (\d+(?:\.\d+)?)ms(?: gap (\d+(?:\.\d+)?)ms)?$")


def cpu_api(work_ms: float, gap_ms: float | None = None) -> str:
    """The api of a probe of ``work_ms`` of CPU work after sleeps of mean ``gap_ms`` (None: the one mix of
    sleeps of stores probed before gap classes).

    >>> cpu_api(0.25), work_of(cpu_api(0.25)), cpu_api(0.2, 0.6), gap_of(cpu_api(0.2, 0.6)), gap_of("cpu 1ms")
    ('cpu 0.25ms', 0.25, 'cpu 0.2ms gap 0.6ms', 0.6, None)
    """
    return f"{CPU_SYSTEM} {work_ms:g}ms" + (f" gap {gap_ms:g}ms" if gap_ms is not None else "")


def work_of(api: str) -> float | None:
    """The work size of a probe's api, or None for any other api."""
    m = _API.match(api)
    return float(m.group(1)) if m else None


def gap_of(api: str) -> float | None:
    """The mean sleep before the work of a probe's api, or None (no gap class, or not a probe's api)."""
    m = _API.match(api)
    return float(m.group(2)) if m and m.group(2) else None


def cpu_slowdown(cpu_pct: float) -> float:
    """How much longer CPU work takes on a core a neighbour keeps busy ``cpu_pct`` % of the time (fair share).

    Linux's CFS gives runnable tasks of equal weight equal shares: while the neighbour is busy (a fraction
    p of the time) the event loop's thread gets half the core, otherwise all of it, so it progresses at
    ``1 - p/2`` on average and CPU work takes ``1 / (1 - p/2)`` as long. (Reserving the share for the
    neighbour, ``1 / (1 - p)``, overstates the slowdown a time-shared neighbour causes.) The fallback when
    the store has no CPU profile: it knows nothing of wake-up latency or of the spread.

    Examples
    --------
    >>> cpu_slowdown(0), cpu_slowdown(50), round(cpu_slowdown(75), 3)
    (1.0, 1.3333333333333333, 1.6)
    """
    if not 0 <= cpu_pct < 100:
        raise ScenarioError(f"interference: cpu_pct must be in [0, 100), got {cpu_pct}")
    return 1.0 / (1.0 - cpu_pct / 200.0)


@dataclass(frozen=True, slots=True)
class StretchProfile:
    """What a neighbour at one ``cpu_pct`` adds to CPU work, per measured work size (and gap class)."""

    cpu_pct: float
    work_ms: FloatArray
    """``(m,)`` increasing work sizes."""
    extra_ms: FloatArray
    """``(m, 200)``: ``Q_P(u) - Q_0(u)`` at each work size, on the grid ``u = (i + 0.5) / 200``; ``(k, m, 200)``
    with gap classes, one ``(m, 200)`` block per class."""
    how: str
    """Which profiles, for ``--explain``."""
    gap_ms: FloatArray = field(default_factory=lambda: np.zeros(0))
    """``(k,)`` increasing mean sleeps of the probes' gap classes; empty: one mix of sleeps for every gap."""

    _blocks: list[list[list[float]]] = field(init=False, repr=False, compare=False)
    _gaps: list[float] = field(init=False, repr=False, compare=False)
    _sizes: list[float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        blocks = self.extra_ms if self.gap_ms.size else self.extra_ms[None]
        if blocks.shape[0] != max(self.gap_ms.size, 1) or blocks.shape[1] != self.work_ms.size:
            raise ValueError(f"extra_ms of shape {self.extra_ms.shape} for {self.work_ms.size} work sizes and "
                             f"{self.gap_ms.size} gap classes")
        object.__setattr__(self, "_blocks", blocks.tolist())
        object.__setattr__(self, "_gaps", self.gap_ms.tolist())
        object.__setattr__(self, "_sizes", self.work_ms.tolist())

    def at(self, work_ms: float, u: float, gap_ms: float | None = None) -> float:
        """:func:`extra_ms` for one piece of work after a sleep of ``gap_ms`` (linear between the gap classes'
        means, the nearest class's outside them; None or no classes: the first block), in plain Python: the
        load simulation asks once per piece, where a NumPy call's overhead would be most of the cost.

        >>> p = StretchProfile(50.0, np.array([1.0, 4.0]), np.vstack([np.full(200, 0.5), np.full(200, 2.0)]), "")
        >>> sizes = [0.2, 1.0, 2.5, 4.0, 8.0]
        >>> [p.at(c, 0.5) for c in sizes] == extra_ms(p, sizes, [0.5] * 5).tolist()
        True
        >>> g = StretchProfile(50.0, np.array([1.0]), np.full((2, 1, 200), [[[0.1]], [[0.5]]]), "",
        ...                    np.array([0.1, 3.0]))
        >>> [round(g.at(1.0, 0.5, gap), 3) for gap in (0.0, 0.1, 1.55, 3.0, 9.0)]
        [0.1, 0.1, 0.3, 0.5, 0.5]
        """
        gaps = self._gaps
        if len(gaps) < 2 or gap_ms is None or gap_ms <= gaps[0]:
            return self._at(self._blocks[0], work_ms, u)
        if gap_ms >= gaps[-1]:
            return self._at(self._blocks[-1], work_ms, u)
        hi = bisect_left(gaps, gap_ms)
        t = (gap_ms - gaps[hi - 1]) / (gaps[hi] - gaps[hi - 1])
        return (1.0 - t) * self._at(self._blocks[hi - 1], work_ms, u) + t * self._at(self._blocks[hi], work_ms, u)

    def _at(self, rows: list[list[float]], work_ms: float, u: float) -> float:
        sizes = self._sizes
        k = min(max(int(u * _GRID), 0), _GRID - 1)
        if len(sizes) == 1:
            return rows[0][k] * max(work_ms / sizes[0], 1.0)
        if work_ms > sizes[-1]:
            return rows[-1][k] * work_ms / sizes[-1]
        hi = min(max(bisect_left(sizes, work_ms), 1), len(sizes) - 1)
        t = min(max((work_ms - sizes[hi - 1]) / (sizes[hi] - sizes[hi - 1]), 0.0), 1.0)
        return (1.0 - t) * rows[hi - 1][k] + t * rows[hi][k]


def probe_speed(work_ms: npt.ArrayLike, idle_median_ms: npt.ArrayLike) -> float:
    """Wall ms per calibrated ms of the probes' work while they ran: the least-squares slope of the paused
    probes' medians over the work sizes (the intercept is the wake-up every probe pays). 1.0 with fewer than
    two sizes, or where the slope is not positive (nothing to read a speed from).

    >>> round(probe_speed([0.05, 0.2, 1.0, 5.0], [0.2 + 1.5 * w for w in (0.05, 0.2, 1.0, 5.0)]), 9)
    1.5
    >>> probe_speed([1.0], [1.3])
    1.0
    """
    w = np.asarray(work_ms, dtype=np.float64)
    m = np.asarray(idle_median_ms, dtype=np.float64)
    if w.size < 2 or np.ptp(w) == 0:
        return 1.0
    slope = float(np.polyfit(w, m, 1)[0])
    return slope if slope > 0 else 1.0


def stretch_profile(store: Any, cpu_pct: float) -> StretchProfile | None:
    """The CPU profiles of ``store`` at ``cpu_pct`` (interpolated between measured levels), or None.

    ``store`` is a :class:`~analyzer.profiles.ProfileStore` (anything with ``keys()`` and ``select``). A work
    size counts when it was measured with no neighbour (``cpu_pct=0``) and at some level. Where the store holds
    gap classes (api ``cpu <W>ms gap <G>ms``), the work sizes probed in every class make one block per class
    and the profiles without a class are left out. The sizes are rescaled by :func:`probe_speed` to the time the
    work took when the probes ran (module docstring), from the paused probes of every class.
    """
    keys = getattr(store, "keys", None)
    if keys is None:
        return None
    by_api: dict[str, set[float]] = {}
    for key in keys():
        if work_of(key.api) is not None and key.param == "cpu_pct":
            by_api.setdefault(key.api, set()).add(key.value)
    # (gap class or None, work size) -> the api probed so, for each api measured paused and at some level
    apis = {(gap_of(api), work_of(api)): api for api, levels in by_api.items() if 0.0 in levels and len(levels) >= 2}
    classes = sorted({g for g, _ in apis if g is not None})
    # the sizes every class (or, without classes, the one mix) was probed at
    per_class = [{w for g2, w in apis if g2 == g} for g in (classes or [None])]
    sizes = sorted(set.intersection(*per_class)) if per_class else []
    if not sizes:
        return None
    grid = (np.arange(_GRID) + 0.5) / _GRID
    blocks, hows = [], []
    idle_medians: list[list[float]] = [[] for _ in sizes]  # per size, one per class
    for g in classes or [None]:
        rows = []
        for i, w in enumerate(sizes):
            api = apis[(g, w)]
            loaded = store.select(api, "", {}, "cpu_pct", cpu_pct)
            idle = store.select(api, "", {}, "cpu_pct", 0.0)
            idle_medians[i].append(float(np.median(idle.samples_ms)))
            rows.append(np.quantile(loaded.samples_ms, grid) - np.quantile(idle.samples_ms, grid))
            hows.append(f"{api}: {loaded.how}")
        blocks.append(np.vstack(rows))
    speed = probe_speed(sizes, [float(np.median(m)) for m in idle_medians])
    gaps = f" in {len(classes)} classes of the sleep before the work" if classes else ""
    return StretchProfile(cpu_pct, speed * np.asarray(sizes, dtype=np.float64),
                          np.stack(blocks) if classes else blocks[0],
                          f"{len(hows)} CPU profiles{gaps} ({', '.join(hows)}), their work taking {speed:.3g} ms "
                          f"per calibrated ms when probed", np.asarray(classes, dtype=np.float64))


def extra_ms(profile: StretchProfile, cpu_ms: npt.ArrayLike, u: npt.ArrayLike) -> FloatArray:
    """What the neighbour adds to steps of CPU time ``cpu_ms``, at independent uniform quantiles ``u`` (with gap
    classes, after the shortest class's sleeps).

    Linear in the work size between the two measured sizes around it, proportional above the largest, the
    smallest's below it (module docstring).

    >>> p = StretchProfile(50.0, np.array([1.0, 4.0]), np.vstack([np.full(200, 0.5), np.full(200, 2.0)]), "")
    >>> extra_ms(p, [0.2, 1.0, 2.5, 4.0, 8.0], [0.5] * 5).tolist()
    [0.5, 0.5, 1.25, 2.0, 4.0]
    """
    c = np.asarray(cpu_ms, dtype=np.float64)
    k = np.clip((np.asarray(u, dtype=np.float64) * _GRID).astype(np.intp), 0, _GRID - 1)
    w, d = profile.work_ms, profile.extra_ms if not profile.gap_ms.size else profile.extra_ms[0]
    if w.size == 1:
        out = d[0, k] * np.maximum(c / w[0], 1.0)
    else:
        hi = np.clip(np.searchsorted(w, c), 1, w.size - 1)
        lo = hi - 1
        t = np.clip((c - w[lo]) / (w[hi] - w[lo]), 0.0, 1.0)
        out = np.where(c > w[-1], d[-1, k] * c / w[-1], (1.0 - t) * d[lo, k] + t * d[hi, k])
    return np.asarray(out, dtype=np.float64)


def phase_quantiles(start_ms: npt.ArrayLike, phase: npt.ArrayLike, period_ms: float = PERIOD_MS) -> FloatArray:
    """The quantile each step draws its extra at: ``frac(phase - start_ms / period_ms)``.

    ``start_ms``: when the step starts in its request; ``phase``: the request's uniform draw. Steps at the same
    time share a quantile, steps half a period apart are half the range apart; for a uniform ``phase`` each
    step's quantile is uniform. Time runs *down* the quantiles: a step woken early in the neighbour's busy spell
    waits longest (a high quantile), one woken later waits less, so a step delayed by ``Q(u)`` ms leaves the
    spell behind, as it does on the core.

    >>> phase_quantiles([0.0, 0.0, 5.0, 12.5], [0.25] * 4).tolist()
    [0.25, 0.25, 0.75, 0.0]
    """
    if not period_ms > 0:
        raise ValueError(f"period_ms must be positive, got {period_ms}")
    t = np.asarray(phase, dtype=np.float64) - np.asarray(start_ms, dtype=np.float64) / period_ms
    return np.asarray(t - np.floor(t), dtype=np.float64)
