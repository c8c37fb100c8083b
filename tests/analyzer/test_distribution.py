"""Distribution and the joint Monte Carlo over causal DAGs, on graphs whose answers can be checked by hand."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from analyzer.distribution import (
    Distribution,
    compile_dag,
    evaluate_plan,
    prob_add,
    prob_kth,
    prob_max,
    prob_min,
)
from analyzer.errors import GraphError
from analyzer.graph import CausalGraph, Node, NodeKind, WaitMode, evaluate


def _graph(durations: dict[str, list[float]], edges: list[tuple[str, str]], **waits: tuple[WaitMode, int]) -> CausalGraph:
    n = len(next(iter(durations.values())))
    nodes = [Node("start", NodeKind.START, (0.0,) * n), Node("end", NodeKind.END, (0.0,) * n)]
    for node_id, samples in durations.items():
        wait, k = waits.get(node_id, (WaitMode.ALL, 1))
        nodes.append(Node(node_id, NodeKind.IO, tuple(samples), wait=wait, k=k))
    return CausalGraph("r", nodes, edges, latency_ms=[0.0] * n)


def _matrix(graph: CausalGraph) -> np.ndarray:
    plan = compile_dag(graph)
    return np.stack([np.asarray(graph.node(i).samples_ms) for i in plan.ids])


class TestDistribution:
    def test_summaries(self) -> None:
        d = Distribution.of([4.0, 1.0, 3.0, 2.0])
        assert list(d.samples_ms) == [1.0, 2.0, 3.0, 4.0]
        assert d.p50 == 2.5
        assert d.mean == 2.5
        assert list(d.cdf([0.5, 2.0, 10.0])) == [0.0, 0.5, 1.0]
        assert set(d.to_json()) == {"p50", "p90", "p99", "mean", "count", "samples_ms"}
        assert "samples_ms" not in d.to_json(samples=False)

    def test_quantiles_match_numpy(self) -> None:
        x = np.random.default_rng(5).lognormal(0, 1, 777)
        d = Distribution.of(x)
        for q in (0.0, 0.01, 0.5, 0.9, 0.99, 1.0):
            assert d.quantile(q) == pytest.approx(float(np.quantile(x, q)))
        with pytest.raises(ValueError, match="q must be in"):
            d.quantile(1.5)

    def test_read_only(self) -> None:
        d = Distribution.of([1.0, 2.0])
        with pytest.raises(ValueError):
            d.samples_ms[0] = 5.0

    @pytest.mark.parametrize("bad", [[], [1.0, float("nan")], [float("inf")]])
    def test_rejects(self, bad: list[float]) -> None:
        with pytest.raises(ValueError):
            Distribution.of(bad)


class TestIndependentAlgebra:
    def test_add_of_constants(self) -> None:
        rng = np.random.default_rng(0)
        out = prob_add([Distribution.of([2.0]), Distribution.of([3.0, 3.0])], rng, 100)
        assert np.all(out.samples_ms == 5.0)

    def test_max_never_below_inputs_min_never_above(self) -> None:
        rng = np.random.default_rng(1)
        a, b = Distribution.of(rng.exponential(1, 500)), Distribution.of(rng.normal(2, 0.1, 500))
        hi, lo = prob_max([a, b], rng), prob_min([a, b], rng)
        for q in (0.1, 0.5, 0.9):
            assert hi.quantile(q) >= max(a.quantile(q), b.quantile(q)) - 0.05
            assert lo.quantile(q) <= min(a.quantile(q), b.quantile(q)) + 0.05

    def test_kth(self) -> None:
        rng = np.random.default_rng(2)
        ds = [Distribution.of([1.0]), Distribution.of([2.0]), Distribution.of([3.0])]
        assert prob_kth(ds, 2, rng, 10).p50 == 2.0
        with pytest.raises(ValueError, match="k must be"):
            prob_kth(ds, 4, rng)


class TestEvaluatePlan:
    def test_two_node_gather_is_a_max(self) -> None:
        g = _graph({"a": [1.0, 5.0], "b": [3.0, 2.0], "j": [0.5, 0.5]},
                   [("start", "a"), ("start", "b"), ("a", "j"), ("b", "j"), ("j", "end")])
        idx = np.array([0, 1, 1, 0])
        out = evaluate_plan(compile_dag(g), _matrix(g), idx)
        assert list(out) == [3.5, 5.5, 5.5, 3.5]

    def test_race_is_a_min_and_kth_of_three(self) -> None:
        g = _graph({"a": [1.0, 6.0], "b": [4.0, 2.0], "c": [3.0, 3.0], "j": [0.0, 0.0]},
                   [("start", x) for x in "abc"] + [(x, "j") for x in "abc"] + [("j", "end")],
                   j=(WaitMode.ANY, 1))
        assert list(evaluate_plan(compile_dag(g), _matrix(g), np.array([0, 1]))) == [1.0, 2.0]
        g2 = _graph({"a": [1.0, 6.0], "b": [4.0, 2.0], "c": [3.0, 3.0], "j": [0.0, 0.0]},
                    [("start", x) for x in "abc"] + [(x, "j") for x in "abc"] + [("j", "end")],
                    j=(WaitMode.ANY, 2))
        assert list(evaluate_plan(compile_dag(g2), _matrix(g2), np.array([0, 1]))) == [3.0, 3.0]

    def test_timeout_race(self) -> None:
        # work (io 80 ms) raced against a 50 ms timer: the request ends at the timer
        g = _graph({"work": [80.0, 20.0], "timer": [50.0, 50.0], "race": [0.0, 0.0]},
                   [("start", "work"), ("start", "timer"), ("work", "race"), ("timer", "race"), ("race", "end")],
                   race=(WaitMode.ANY, 1))
        assert list(evaluate_plan(compile_dag(g), _matrix(g), np.array([0, 1]))) == [50.0, 20.0]

    def test_shared_node_is_drawn_once(self) -> None:
        # x feeds both branches: latency = x + max(y, z), never x1 + x2 from independent draws
        g = _graph({"x": [10.0], "y": [1.0], "z": [2.0]},
                   [("start", "x"), ("x", "y"), ("x", "z"), ("y", "end"), ("z", "end")])
        plan = compile_dag(g)
        rng = np.random.default_rng(3)
        draws = rng.uniform(0, 100, 1000)
        out = evaluate_plan(plan, _matrix(g), np.zeros(1000, dtype=np.intp), {plan.position("x"): draws})
        np.testing.assert_allclose(out, draws + 2.0)

    def test_matches_reference_evaluate_on_random_dags(self) -> None:
        rng = np.random.default_rng(4)
        for seed in range(5):
            dag = nx.gnp_random_graph(40, 0.08, seed=seed, directed=True)
            durations, edges, waits = {}, [], {}
            for v in range(40):
                preds = [u for u in dag.predecessors(v) if u < v]
                durations[f"n{v}"] = list(rng.exponential(1.0, 30))
                edges += [(f"n{u}", f"n{v}") for u in preds] or [("start", f"n{v}")]
                edges.append((f"n{v}", "end"))
                if len(preds) >= 2 and v % 2:
                    waits[f"n{v}"] = (WaitMode.ANY, 1 + v % len(preds))
            g = _graph(durations, edges, **waits)
            plan = compile_dag(g)
            base = _matrix(g)
            before = base.copy()
            idx = rng.integers(0, 30, 500)
            override = {plan.position("n7"): rng.exponential(3.0, 500), plan.position("n20"): rng.uniform(0, 1, 500)}
            got = evaluate_plan(plan, base, idx, override)
            ref_durations = {node_id: base[j][idx] for j, node_id in enumerate(plan.ids)}
            ref_durations.update({plan.ids[j]: row for j, row in override.items()})
            ref = evaluate(g, ref_durations)
            np.testing.assert_allclose(got, ref["end"] - ref["start"])
            np.testing.assert_array_equal(base, before)  # inputs untouched

    def test_cycle_is_a_graph_error(self) -> None:
        g = _graph({"a": [1.0], "b": [1.0]}, [("start", "a"), ("a", "b"), ("b", "a"), ("b", "end")])
        with pytest.raises(GraphError, match="cycle"):
            compile_dag(g)
