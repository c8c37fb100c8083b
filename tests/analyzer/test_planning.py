"""Optimal profiling: Lagrange allocation against scipy and brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import optimize

from analyzer.errors import AnalyzerError
from analyzer.graph import CausalGraph, Node, NodeKind
from analyzer.planning import (
    allocate,
    api_weights,
    optimal_counts,
    plan_profiling,
    summed_standard_error,
)


def _scipy_optimum(budget, t, s, w, k):  # type: ignore[no-untyped-def]
    t, s, w = map(np.asarray, (t, s, w))
    res = optimize.minimize(
        lambda n: float(np.sum(w * s / np.sqrt(n))),
        x0=np.full(t.size, budget / t.sum() / 2),
        jac=lambda n: -0.5 * w * s * n ** -1.5,
        bounds=[(k, None)] * t.size,
        constraints=[{"type": "ineq", "fun": lambda n: budget - n @ t, "jac": lambda n: -t}],
        method="SLSQP",
        options={"ftol": 1e-11, "maxiter": 500},
    )
    assert res.success, res.message
    return res.x


@pytest.mark.parametrize("seed", range(6))
def test_continuous_solution_matches_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = 2 + seed
    t = rng.uniform(0.5, 20.0, m)
    s = rng.uniform(0.0, 10.0, m) * (rng.random(m) > 0.15)
    w = rng.integers(1, 4, m).astype(float)
    k = 5
    budget = float(k * t.sum() * rng.uniform(1.5, 20))
    ours = optimal_counts(budget, t, s, w, k)
    ref = _scipy_optimum(budget, t, s, w, k)
    assert ours @ t == pytest.approx(budget)
    assert np.all(ours >= k - 1e-9)
    assert summed_standard_error(ours, s, w) <= summed_standard_error(ref, s, w) * (1 + 1e-6)
    np.testing.assert_allclose(ours, ref, rtol=2e-3, atol=2e-2)


def test_proportional_to_two_thirds_power_when_unconstrained() -> None:
    t = np.array([1.0, 2.0, 4.0])
    s = np.array([3.0, 1.0, 8.0])
    n = optimal_counts(1000.0, t, s, min_count=1)
    ratio = n / (s / t) ** (2 / 3)
    np.testing.assert_allclose(ratio, ratio[0])


def test_minimum_is_enforced_and_resolved() -> None:
    # The quiet call's share (s = 0.01) would be far below k: it gets k and the rest goes to the others.
    t = np.array([1.0, 1.0, 1.0])
    s = np.array([0.01, 5.0, 5.0])
    n = optimal_counts(200.0, t, s, min_count=20)
    assert n[0] == 20
    assert n[1] == pytest.approx(90) and n[2] == pytest.approx(90)


def _brute_force(budget, t, s, w, k, top):  # type: ignore[no-untyped-def]
    best, arg = np.inf, None
    for combo in itertools.product(range(k, top + 1), repeat=len(t)):
        n = np.array(combo)
        if n @ t <= budget:
            obj = summed_standard_error(n, s, w)
            if obj < best:
                best, arg = obj, n
    return best, arg


@pytest.mark.parametrize("seed", range(5))
def test_integer_allocation_near_brute_force(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    t = rng.integers(1, 6, 3).astype(float)
    s = rng.uniform(0.5, 10.0, 3)
    w = rng.integers(1, 3, 3).astype(float)
    k = 2
    budget = float(rng.integers(int(k * t.sum()) + 5, 60))
    n = allocate(budget, t, s, w, k)
    assert n.dtype.kind == "i" and np.all(n >= k) and n @ t <= budget
    best, _ = _brute_force(budget, t, s, w, k, int(budget))
    assert summed_standard_error(n, s, w) <= best * 1.01


def test_infeasible_budget_names_the_need() -> None:
    with pytest.raises(AnalyzerError, match="needs 30"):
        allocate(10.0, [1.0, 2.0], [1.0, 1.0], min_count=10)
    with pytest.raises(ValueError, match="positive"):
        optimal_counts(10.0, [0.0], [1.0], min_count=1)


def _graph(route: str, apis: list[str], samples: dict[str, list[float]], count: int = 4) -> CausalGraph:
    nodes = [Node("start", NodeKind.START, (0.0,) * count)]
    edges = []
    prev = "start"
    for i, api in enumerate(apis):
        nid = f"io#{i}"
        nodes.append(Node(nid, NodeKind.IO, tuple(samples[api]), api=api, system=api.split()[0]))
        edges.append((prev, nid))
        prev = nid
    nodes.append(Node("end", NodeKind.END, (0.0,) * count))
    edges.append((prev, "end"))
    return CausalGraph(route, nodes, edges, latency_ms=[1.0] * count)


def test_weights_and_plan_from_graphs() -> None:
    samples = {"redis GET": [1.0, 1.2, 0.8, 1.0], "postgresql SELECT posts": [5.0, 9.0, 4.0, 6.0]}
    a = _graph("GET /", ["redis GET", "redis GET", "postgresql SELECT posts"], samples)
    b = _graph("GET /post/{id}", ["redis GET"], samples)
    # Two variants of one route: counted once, by request share (3:1).
    c1 = _graph("GET /x", ["postgresql SELECT posts"], samples)
    c2 = CausalGraph("GET /x", [Node("start", NodeKind.START), Node("end", NodeKind.END)], [("start", "end")],
                     variant=1, latency_ms=[1.0] * 4)
    weights = api_weights([a, b, c1, c2])
    assert weights == {"postgresql SELECT posts": 1.5, "redis GET": 3.0}
    plan = plan_profiling([a, b, c1, c2], budget_s=2.0, min_count=10)
    assert plan.used_s <= 2.0
    by_api = {x.api: x for x in plan.allocations}
    assert by_api["redis GET"].weight == 3.0
    assert all(x.count >= 10 for x in plan.allocations)
    # Better than spending the budget evenly over the calls.
    t = np.array([x.mean_ms for x in plan.allocations])
    even = np.floor(2000.0 / len(t) / t)
    s = np.array([x.std_ms for x in plan.allocations])
    w = np.array([x.weight for x in plan.allocations])
    assert plan.summed_standard_error_ms <= summed_standard_error(even, s, w)
