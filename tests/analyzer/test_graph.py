"""The graph data model: evaluation, validation, a stable JSON round trip, readable file errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analyzer.errors import GraphError, GraphFileError
from analyzer.graph import CausalGraph, Node, NodeKind, WaitMode, dump_graphs, evaluate, load_graphs, to_dot


def race(k: int = 1, wait: WaitMode = WaitMode.ANY) -> CausalGraph:
    nodes = [Node("start", NodeKind.START, (0.0, 0.0)), Node("a", NodeKind.IO, (2.0, 9.0), api="redis GET"),
             Node("b", NodeKind.IO, (5.0, 1.0)), Node("c", NodeKind.IO, (7.0, 4.0)),
             Node("pick", NodeKind.SYNC, (0.5, 0.5), wait=wait, k=k), Node("end", NodeKind.END, (0.0, 0.0))]
    # inserted in an order that is not topological: the output order must not depend on it
    edges = [("pick", "end"), ("c", "pick"), ("start", "c"), ("a", "pick"), ("start", "a"), ("b", "pick"),
             ("start", "b")]
    return CausalGraph("GET /r", nodes, edges, latency_ms=[2.5, 1.5], trace_ids=["t1", "t2"])


def test_evaluate_any_all_and_kth() -> None:
    assert evaluate(race(), race().durations())["end"] == pytest.approx([2.5, 1.5])
    assert evaluate(race(k=2), race().durations())["end"] == pytest.approx([5.5, 4.5])
    g = race(wait=WaitMode.ALL)
    assert evaluate(g, g.durations())["end"] == pytest.approx([7.5, 9.5])
    # scalar durations broadcast
    assert float(evaluate(g, {"a": 1.0, "b": 2.0, "c": 3.0})["end"]) == 3.0


def test_json_round_trip_is_stable(tmp_path: Path) -> None:
    g = race(k=2)
    dump_graphs([g], tmp_path / "g.json", source="test")
    back = load_graphs(tmp_path / "g.json")[0]
    assert back.to_json() == g.to_json()
    dump_graphs([back], tmp_path / "h.json", source="test")
    assert (tmp_path / "g.json").read_text() == (tmp_path / "h.json").read_text()
    doc = json.loads((tmp_path / "g.json").read_text())["graphs"][0]
    assert doc["nodes"][0]["id"] == "start" and doc["nodes"][-1]["id"] == "end"
    assert doc["edges"][0][0] == "start" and doc["edges"][-1] == ["pick", "end"]
    assert back.node("pick").k == 2 and back.node("pick").wait is WaitMode.ANY
    assert np.allclose(back.durations()["a"], [2.0, 9.0])
    assert "redis GET" in to_dot([back]) and "diamond" in to_dot([back])


def test_validation_errors_name_the_problem() -> None:
    with pytest.raises(GraphError, match="cycle: "):
        CausalGraph("GET /", [Node("start", NodeKind.START), Node("a", NodeKind.IO), Node("end", NodeKind.END)],
                    [("start", "a"), ("a", "end"), ("end", "a")]).validate()
    with pytest.raises(GraphError, match="unknown node 'x'"):
        CausalGraph("GET /", [Node("start", NodeKind.START)], [("start", "x")])
    with pytest.raises(GraphError, match="waits for 3 of 2"):
        CausalGraph("GET /", [Node("start", NodeKind.START), Node("a", NodeKind.IO), Node("j", NodeKind.SYNC,
                    wait=WaitMode.ANY, k=3), Node("end", NodeKind.END)],
                    [("start", "a"), ("start", "j"), ("a", "j"), ("j", "end")]).validate()


def test_bad_graphs_file(tmp_path: Path) -> None:
    path = tmp_path / "g.json"
    path.write_text('{"format": "perfcast-graphs/1", "graphs": [{"route": "GET /", "nodes": '
                    '[{"id": "start", "kind": "begin"}], "edges": []}]}')
    with pytest.raises(GraphFileError, match=r"graphs\[0\].*'kind' must be one of"):
        load_graphs(path)
    path.write_text('{"format": "perfcast-graphs/1",\n "graphs": [\n')
    with pytest.raises(GraphFileError, match=r"g.json:3: not valid JSON"):
        load_graphs(path)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("queued_ms", [0.5], r"node 'io0' field 'queued_ms' has 1 values for 2 requests"),
        ("ready_ms", "fast", r"node 'io0' field 'ready_ms' must be a list of numbers, one per request, got str"),
        ("inflight", [1, None], r"field 'inflight': value #1 is None, expected a finite number >= 0"),
        ("cpu_before_ms", [0.1, -0.2], r"field 'cpu_before_ms': value #1 is -0.2"),
    ],
)
def test_per_request_extras_are_checked_where_they_are_read(tmp_path: Path, field: str, value: object,
                                                             message: str) -> None:
    # the engine reads these per request, aligned with samples_ms: a hand-edited one of the wrong length would
    # otherwise be ignored without a word (or misread)
    g = CausalGraph("GET /", [Node("start", NodeKind.START, (0.0, 0.0)),
                              Node("io0", NodeKind.IO, (1.0, 2.0), api="redis GET", extra={field: [0.1, 0.2]}),
                              Node("end", NodeKind.END, (0.0, 0.0))],
                    [("start", "io0"), ("io0", "end")], latency_ms=[1.0, 2.0])
    path = tmp_path / "g.json"
    dump_graphs([g], path)
    assert load_graphs(path)[0].node("io0").extra[field] == [0.1, 0.2]
    doc = json.loads(path.read_text())
    doc["graphs"][0]["nodes"][1][field] = value
    path.write_text(json.dumps(doc))
    with pytest.raises(GraphFileError, match=rf"g.json.*graphs\[0\].*{message}"):
        load_graphs(path)
