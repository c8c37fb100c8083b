"""The load-mechanics benchmark's own parts: the measured waits for a pooled connection and the simulated ones."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from analyzer.graph import CausalGraph, Node, NodeKind

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "load_mechanics.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("load_mechanics", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _node(node_id: str, kind: NodeKind, samples: tuple[float, ...], task: str, system: str = "") -> Node:
    io = {"api": f"{system} SELECT", "resource": f"{system}://h:1/db", "system": system} if system else {}
    return Node(node_id, kind, samples, task=task, **io)


def test_pool_waits_are_the_waits_right_before_a_step_that_queries_the_database(bench: ModuleType) -> None:
    # root waits (w0) for a connection, then its step c1 queries PostgreSQL; a child task waits (w1) before a
    # step that calls Redis: not a pooled connection of the database, so not counted
    nodes = [Node("start", NodeKind.START, (0.0, 0.0)), _node("c0", NodeKind.COMPUTE, (0.1, 0.1), "root"),
             _node("w0", NodeKind.WAIT, (5.0, 7.0), "root"), _node("c1", NodeKind.COMPUTE, (0.1, 0.1), "root"),
             _node("q", NodeKind.IO, (1.0, 1.0), "root", "postgresql"),
             _node("w1", NodeKind.WAIT, (3.0, 3.0), "t1"), _node("c2", NodeKind.COMPUTE, (0.1, 0.1), "t1"),
             _node("r", NodeKind.IO, (1.0, 1.0), "t1", "redis"), Node("end", NodeKind.END, (0.0, 0.0))]
    edges = [("start", "c0"), ("c0", "w0"), ("w0", "c1"), ("c1", "q"), ("q", "end"), ("c0", "w1"), ("w1", "c2"),
             ("c2", "r"), ("r", "end")]
    g = CausalGraph("GET /", nodes, edges, latency_ms=[7.0, 9.0])
    assert bench.pool_wait_ms(g).tolist() == [5.0, 7.0]


def test_the_simulated_waits_are_read_off_the_queueing_note(bench: ModuleType) -> None:
    note = ("queueing per request, summed over its steps and calls (parallel ones each counted): GET / (mean 308 ms) "
            "180 ms for the loop, 929 ms for a pooled connection over 13 calls; GET /post/{id} (mean 57.9 ms) 9.78 "
            "ms for the loop, 45.2 ms for a pooled connection over 1 call; the loop 99% busy")
    assert bench.simulated_waits(("other", note)) == {"GET /": (180.0, 929.0), "GET /post/{id}": (9.78, 45.2)}
    assert bench.simulated_waits(("no queueing here",)) == {}
    # past 999 ms the note's three significant digits print in e-notation, still read whole
    big = note.replace("(mean 308 ms) 180 ms for the loop, 929 ms",
                       "(mean 1.43e+03 ms) 180 ms for the loop, 1.15e+03 ms")
    assert bench.simulated_waits((big,))["GET /"] == (180.0, 1150.0)


@pytest.mark.parametrize(("args", "named"), [(["--users", "1"], "--users"), (["--rounds", "0"], "--rounds"),
                                             (["--requests", "0"], "--requests")])
def test_bad_arguments_are_refused_by_name(bench: ModuleType, args: list[str], named: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(args)
    assert exc.value.code == 2
    assert f"{named} must be at least" in capsys.readouterr().err
