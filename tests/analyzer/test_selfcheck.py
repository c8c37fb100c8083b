"""The self-check passes on correct graphs and fails on each kind of wrong causality."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from spanfactory import gather_request, race_request, write

from analyzer.build import build_graphs
from analyzer.graph import CausalGraph, Node, NodeKind, WaitMode
from analyzer.selfcheck import CheckSummary, evaluated_latency, self_check, summarize
from analyzer.spans import read_spans


def rebuild(graph: CausalGraph, *, drop: set[tuple[str, str]] = frozenset(), add: set[tuple[str, str]] = frozenset(),
            nodes: dict[str, Node] | None = None) -> CausalGraph:
    nodes = nodes or {}
    edges = [e for e in graph.dag.edges if e not in drop] + sorted(add)
    return CausalGraph(graph.route, [nodes.get(n.id, n) for n in graph.nodes], edges,
                       latency_ms=graph.latency_ms, trace_ids=graph.trace_ids)


@pytest.fixture
def gather_graph(tmp_path: Path) -> CausalGraph:
    traces = [gather_request(shift=20 * i, sql_ms=2.0 + i, base=10 * i) for i in range(5)]
    [graph] = build_graphs(read_spans(write(tmp_path / "g.jsonl", *traces)))
    return graph


@pytest.fixture
def race_graph(tmp_path: Path) -> CausalGraph:
    traces = [race_request(shift=20 * i, win=2.0 + i, lose=9.0) for i in range(5)]
    [graph] = build_graphs(read_spans(write(tmp_path / "r.jsonl", *traces)))
    return graph


def test_a_hand_checkable_graph() -> None:
    # start -> a (2 ms) and b (5 ms) in parallel -> join -> end: 5 ms, not 7
    nodes = [Node("start", NodeKind.START, (0.0,)), Node("a", NodeKind.IO, (2.0,)), Node("b", NodeKind.IO, (5.0,)),
             Node("join", NodeKind.SYNC, (0.0,)), Node("end", NodeKind.END, (0.0,))]
    edges = [("start", "a"), ("start", "b"), ("a", "join"), ("b", "join"), ("join", "end")]
    graph = CausalGraph("GET /", nodes, edges, latency_ms=[5.0])
    assert evaluated_latency(graph) == pytest.approx([5.0])
    assert self_check(graph) == pytest.approx([0.0])
    serial = CausalGraph("GET /", nodes, [("start", "a"), ("a", "b"), ("b", "join"), ("join", "end")],
                         latency_ms=[5.0])
    assert self_check(serial) == pytest.approx([0.4])


def test_correct_graphs_pass(gather_graph: CausalGraph, race_graph: CausalGraph) -> None:
    assert gather_graph.count == 5 and race_graph.count == 5
    assert self_check(gather_graph).max() < 0.01
    assert self_check(race_graph).max() < 0.01


def test_a_missing_edge_shows(gather_graph: CausalGraph) -> None:
    # forget that the gather waits for the SQL task
    broken = rebuild(gather_graph, drop={("root/gather#0[0]/c1", "root/gather#0")})
    err = self_check(broken)
    assert np.all(err > 0.1), err


def test_parallel_calls_recorded_as_serial_show(gather_graph: CausalGraph) -> None:
    # the blob fetch made to wait for the SQL query instead of running beside it
    broken = rebuild(gather_graph, drop={("root/c1", "root/gather#0[1]/c0")},
                     add={("root/gather#0[0]/c1", "root/gather#0[1]/c0")})
    err = self_check(broken)
    assert np.all(err > 0.1), err
    assert np.all(evaluated_latency(broken) > np.asarray(broken.latency_ms))


def test_a_race_recorded_as_all_of_shows(race_graph: CausalGraph) -> None:
    sync = race_graph.node("root/wait#0")
    broken = rebuild(race_graph, nodes={sync.id: dataclasses.replace(sync, wait=WaitMode.ALL)})
    err = self_check(broken)
    assert np.median(err) > 0.3, err


def test_an_all_of_recorded_as_a_race_shows(gather_graph: CausalGraph) -> None:
    # the gather made to resume on the first child: it finishes too early
    sync = gather_graph.node("root/gather#0")
    broken = rebuild(gather_graph, nodes={sync.id: dataclasses.replace(sync, wait=WaitMode.ANY, k=1)})
    assert np.all(self_check(broken) > 0.05)


def test_summaries(gather_graph: CausalGraph, race_graph: CausalGraph) -> None:
    per, overall = summarize([gather_graph, race_graph])
    assert set(per) == {("GET /", 0), ("GET /race", 0)}
    assert overall.count == 10 and overall.max < 0.01
    s = CheckSummary.of([0.0, 0.1, 0.2, 0.3, 1.0])
    assert (s.count, s.median, s.max) == (5, pytest.approx(0.2), 1.0)
    assert CheckSummary.of([]).count == 0


def test_a_race_the_collector_recorded_as_all_of_shows(tmp_path: Path) -> None:
    # Durations come from what the point reported done (the winner), edges from its children and wait mode:
    # a wrong wait mode in the spans cannot make the check pass.
    traces = [race_request(shift=20 * i, win=2.0 + i, lose=9.0, wait="all") for i in range(3)]
    [graph] = build_graphs(read_spans(write(tmp_path / "r.jsonl", *traces)))
    assert graph.node("root/wait#0").wait is WaitMode.ALL
    assert np.all(self_check(graph) > 0.5)
