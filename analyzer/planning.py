"""Optimal profiling: how many measurements of each API call a time budget buys.

WebPerf (Jiang et al., SIGCOMM 2016, section 5.2) spends a profiling budget ``T`` where it reduces the
modelling error most: an API with a high variance and a short call time gets more measurements. Given per API
its mean call time ``t_i`` and standard deviation ``s_i``, it chooses counts ``n_i`` minimising the summed
standard error of the means::

    minimise  sum_i w_i s_i / sqrt(n_i)   subject to   sum_i n_i t_i <= T,   n_i >= k

(WebPerf has ``w_i = 1``; the weights generalise it to requests with several API calls, see
:func:`api_weights`). The Lagrange solution is ``n_i = c (w_i s_i / t_i)^(2/3)`` with ``c`` filling the
budget; with the lower bound, KKT gives ``n_i = max(k, c a_i)``, found by fixing the calls that fall
below ``k`` at ``k`` and re-solving for the rest. Counts are then rounded to integers within the budget.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from analyzer.errors import AnalyzerError
from analyzer.graph import CausalGraph, NodeKind
from analyzer.profiles import baseline_profiles

__all__ = [
    "Allocation",
    "ProfilingPlan",
    "allocate",
    "api_weights",
    "optimal_counts",
    "plan_profiling",
    "summed_standard_error",
]


class PlanningError(AnalyzerError, ValueError):
    """The budget cannot buy ``k`` measurements of every call, or a call has no usable mean time."""


@dataclass(frozen=True, slots=True)
class Allocation:
    """How many times to measure one API, and why."""

    api: str
    count: int
    """n_i: measurements to make."""
    mean_ms: float
    """t_i: mean time of one call (from the baseline samples)."""
    std_ms: float
    """s_i: standard deviation of one call's time."""
    weight: float
    """w_i: expected occurrences of the call per request, summed over the request kinds."""
    at_minimum: bool
    """True when the bound n_i >= k decided the count (the Lagrange share was below k)."""

    @property
    def time_s(self) -> float:
        return self.count * self.mean_ms / 1000.0


@dataclass(frozen=True, slots=True)
class ProfilingPlan:
    """An allocation of a profiling budget over APIs."""

    allocations: tuple[Allocation, ...]
    budget_s: float
    min_count: int

    @property
    def used_s(self) -> float:
        return sum(a.time_s for a in self.allocations)

    @property
    def summed_standard_error_ms(self) -> float:
        return sum(a.weight * a.std_ms / math.sqrt(a.count) for a in self.allocations)


def summed_standard_error(
    counts: npt.ArrayLike, stds: npt.ArrayLike, weights: npt.ArrayLike | None = None
) -> float:
    """The objective ``sum_i w_i s_i / sqrt(n_i)``."""
    n = np.asarray(counts, dtype=np.float64)
    w = np.ones_like(n) if weights is None else np.asarray(weights, dtype=np.float64)
    return float(np.sum(w * np.asarray(stds, dtype=np.float64) / np.sqrt(n)))


def _validate(
    budget: float, means: npt.ArrayLike, stds: npt.ArrayLike, weights: npt.ArrayLike | None, min_count: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    t = np.asarray(means, dtype=np.float64).ravel()
    s = np.asarray(stds, dtype=np.float64).ravel()
    w = np.ones_like(t) if weights is None else np.asarray(weights, dtype=np.float64).ravel()
    if not (t.size == s.size == w.size) or t.size == 0:
        raise ValueError("`means`, `stds` and `weights` must be non-empty and of one length")
    if np.any(~np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("`means` must be positive: a call that takes no time cannot be budgeted")
    if np.any(s < 0) or np.any(w < 0):
        raise ValueError("`stds` and `weights` must be non-negative")
    if min_count < 1:
        raise ValueError("`min_count` must be at least 1")
    if min_count * t.sum() > budget * (1 + 1e-12):
        raise PlanningError(
            f"a budget of {budget:g} cannot buy {min_count} measurements of each of {t.size} calls: "
            f"that needs {min_count * t.sum():g} (raise the budget or lower the minimum)"
        )
    return t, s, w


def optimal_counts(
    budget: float,
    means: npt.ArrayLike,
    stds: npt.ArrayLike,
    weights: npt.ArrayLike | None = None,
    min_count: int = 10,
) -> npt.NDArray[np.float64]:
    """The real-valued optimum ``n_i = max(k, c (w_i s_i / t_i)^(2/3))``, with ``sum n_i t_i = budget``.

    Lagrange: setting the derivative of ``sum w_i s_i n_i^(-1/2) + lambda (sum n_i t_i - T)`` to zero gives
    ``n_i = (w_i s_i / (2 lambda t_i))^(2/3)``, proportional to ``(w_i s_i / t_i)^(2/3)``; with the budget
    spent, ``n_i = T a_i / sum_j a_j t_j`` where ``a_i = (w_i s_i / t_i)^(2/3)``. The KKT conditions of the
    bound ``n_i >= k`` make the calls whose share falls below ``k`` take exactly ``k``: they are fixed and the
    remaining budget is re-solved over the others until no share falls below ``k`` (each round only lowers
    the shares, so at most one round per call).

    ``means`` and ``budget`` share one time unit; ``stds`` any unit.

    References
    ----------
    .. [1] J. Jiang, L. Ravindranath Sivalingam, S. Nath, R. Govindan, "WebPerf: Evaluating What-If Scenarios
       for Cloud-hosted Web Applications", SIGCOMM 2016, section 5.2. doi:10.1145/2934872.2934882
    .. [2] S. Boyd, L. Vandenberghe, *Convex Optimization*, Cambridge UP, 2004, section 5.5.3 (KKT conditions).

    Examples
    --------
    >>> optimal_counts(100.0, [1.0, 1.0], [1.0, 8.0], min_count=1).round(6).tolist()
    [20.0, 80.0]
    """
    t, s, w = _validate(budget, means, stds, weights, min_count)
    a = (w * s / t) ** (2.0 / 3.0)
    fixed = a <= 0
    while True:
        free = ~fixed
        remaining = budget - min_count * t[fixed].sum()
        denom = float(np.sum(a[free] * t[free]))
        n = np.full_like(t, float(min_count))
        if denom > 0:
            n[free] = remaining * a[free] / denom
        low = free & (n < min_count)
        if not low.any():
            return n
        fixed |= low


def allocate(
    budget: float,
    means: npt.ArrayLike,
    stds: npt.ArrayLike,
    weights: npt.ArrayLike | None = None,
    min_count: int = 10,
) -> npt.NDArray[np.int64]:
    """Integer counts: :func:`optimal_counts` rounded to the nearest integers, then repaired to fit.

    Rounding to the nearest integer (WebPerf's step) can overspend the budget by up to half a call per API;
    the repair removes measurements where that costs the least standard error per second saved, then spends
    what is left, one measurement at a time, where it buys the most standard error per second.

    Examples
    --------
    >>> allocate(100.0, [1.0, 1.0], [1.0, 8.0], min_count=1).tolist()
    [20, 80]
    """
    t, s, w = _validate(budget, means, stds, weights, min_count)
    n = np.maximum(np.rint(optimal_counts(budget, t, s, w, min_count)), min_count).astype(np.int64)
    ws = w * s
    while float(np.dot(n, t)) > budget:
        # Loss of removing one measurement, per unit of time saved; never below the minimum.
        loss = ws * (1.0 / np.sqrt(np.maximum(n - 1, 1)) - 1.0 / np.sqrt(n)) / t
        loss[n <= min_count] = np.inf
        n[int(np.argmin(loss))] -= 1
    while True:
        left = budget - float(np.dot(n, t))
        gain = ws * (1.0 / np.sqrt(n) - 1.0 / np.sqrt(n + 1)) / t
        gain[t > left] = -np.inf
        best = int(np.argmax(gain))
        if not np.isfinite(gain[best]) or gain[best] <= 0:
            return n
        n[best] += 1


def api_weights(graphs: Iterable[CausalGraph]) -> dict[str, float]:
    """Expected number of calls of each API per request, summed over the request kinds (routes).

    This is how optimal profiling generalises to requests with several API calls (WebPerf, section 5.2,
    "a request can contain multiple I/O calls and an I/O call can appear in multiple requests"). Every call
    of API ``i`` in a request is modelled from the same profile, so an error ``e_i`` in that profile's mean
    moves the predicted mean of a request that makes ``m_ri`` such calls by ``m_ri e_i``; summing the standard
    errors over the requests of interest gives ``sum_r sum_i m_ri s_i / sqrt(n_i) = sum_i w_i s_i / sqrt(n_i)``
    with ``w_i = sum_r m_ri``. A route with several variants (shapes) counts as one request: its ``m_ri`` is
    the count in each variant averaged with the variants' request counts as weights.
    """
    by_route: dict[str, list[CausalGraph]] = {}
    for graph in graphs:
        by_route.setdefault(graph.route, []).append(graph)
    weights: dict[str, float] = {}
    for variants in by_route.values():
        counts = np.array([max(g.count, 1) for g in variants], dtype=np.float64)
        shares = counts / counts.sum()
        for share, graph in zip(shares, variants, strict=True):
            for node in graph.nodes:
                if node.kind is NodeKind.IO and node.api:
                    weights[node.api] = weights.get(node.api, 0.0) + float(share)
    return dict(sorted(weights.items()))


def plan_profiling(
    graphs: Sequence[CausalGraph],
    budget_s: float,
    min_count: int = 10,
    baseline: Mapping[str, npt.NDArray[np.float64]] | None = None,
) -> ProfilingPlan:
    """Allocate ``budget_s`` of profiling over the APIs the graphs call, from their baseline samples.

    ``t_i`` and ``s_i`` are the mean and standard deviation of the baseline samples (the io nodes'
    ``samples_ms``, :func:`analyzer.profiles.baseline_profiles`); ``w_i`` comes from :func:`api_weights`.
    """
    if budget_s <= 0:
        raise PlanningError(f"the budget must be positive, got {budget_s:g} s")
    base = dict(baseline_profiles(graphs) if baseline is None else baseline)
    weights = api_weights(graphs)
    apis = [api for api in weights if api in base and base[api].size]
    if not apis:
        raise PlanningError("the graphs have no io node with samples: nothing to profile")
    means = np.array([float(np.mean(base[a])) for a in apis])
    if np.any(means <= 0):
        zero = [a for a, m in zip(apis, means, strict=True) if m <= 0]
        raise PlanningError(f"api {zero[0]!r} has a mean time of 0 ms in the baseline samples: cannot budget it")
    stds = np.array([float(np.std(base[a], ddof=1)) if base[a].size > 1 else 0.0 for a in apis])
    w = np.array([weights[a] for a in apis])
    budget_ms = budget_s * 1000.0
    counts = allocate(budget_ms, means, stds, w, min_count)
    share = optimal_counts(budget_ms, means, stds, w, min_count)
    return ProfilingPlan(
        allocations=tuple(
            Allocation(api, int(n), float(m), float(sd), float(wt), bool(x <= min_count + 1e-9))
            for api, n, m, sd, wt, x in zip(apis, counts, means, stds, w, share, strict=True)
        ),
        budget_s=budget_s,
        min_count=min_count,
    )
