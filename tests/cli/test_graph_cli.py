"""``perfcast graph``: argument parsing, output files and shape, exit codes."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from perfcast.cli import main


def _factory():  # the span factory shared with the analyzer tests
    path = Path(__file__).parents[1] / "analyzer" / "spanfactory.py"
    spec = importlib.util.spec_from_file_location("spanfactory", path)
    assert spec and spec.loader
    module = sys.modules.get("spanfactory") or importlib.util.module_from_spec(spec)
    if "spanfactory" not in sys.modules:
        sys.modules["spanfactory"] = module
        spec.loader.exec_module(module)
    return module


@pytest.fixture
def spans_file(tmp_path: Path) -> Path:
    f = _factory()
    return f.write(tmp_path / "spans.jsonl", f.gather_request(), f.gather_request(shift=20, base=5),
                   f.cache_hit_request(shift=40), f.race_request(shift=60))


def test_graph_writes_graphs_dot_and_table(tmp_path: Path, spans_file: Path) -> None:
    out, dot = tmp_path / "g.json", tmp_path / "g.dot"
    result = CliRunner().invoke(main, ["graph", str(spans_file), "-o", str(out), "--dot", str(dot), "--check"])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["format"] == "perfcast-graphs/1"
    assert [(g["route"], g["variant"], g["count"]) for g in doc["graphs"]] == [
        ("GET /", 0, 2), ("GET /", 1, 1), ("GET /race", 0, 1)]
    assert dot.read_text().startswith("digraph perfcast {")
    assert "GET /race" in result.output and "self-check" in result.output
    assert "root/gather#0" in result.output and "redis GET" in result.output


def test_the_hosts_cpu_goes_from_the_spans_to_a_load_prediction(tmp_path: Path) -> None:
    # the collector's process span read the host busy 200 ms over the window of 4 user requests: 50 ms each, at
    # which a load of 8 users would need more than the host's two cores, and the prediction says it is weak there
    f = _factory()
    spans = f.write(tmp_path / "spans.jsonl", f.gather_request(), f.gather_request(shift=20, base=5),
                    f.cache_hit_request(shift=40), f.race_request(shift=60),
                    f.Trace(route="process").process(-0.1, 63.7, 20.0, 15.0, host_ms=200.0, cpus=2))
    graphs = tmp_path / "g.json"
    result = CliRunner().invoke(main, ["graph", str(spans), "-o", str(graphs), "--no-nodes"])
    assert result.exit_code == 0, result.output
    assert "the host's CPU per request 50.00 ms over its 2 CPUs" in result.output
    metas = [g.get("meta", {}) for g in json.loads(graphs.read_text())["graphs"]]
    assert all(m["host_cpu_ms"] == pytest.approx(50.0, rel=0.06) and m["host_cpus"] == 2 for m in metas)
    result = CliRunner().invoke(main, ["whatif", str(graphs), "-s", "load:8"], terminal_width=400)
    assert result.exit_code == 0, result.output
    assert "host: 50 ms of CPU per request" in result.output and "less certain" in result.output


def test_truncated_file_warns_and_strict_fails(tmp_path: Path, spans_file: Path) -> None:
    with spans_file.open("a") as fh:
        fh.write('{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "ab')
    lines = len(spans_file.read_text().splitlines())
    result = CliRunner().invoke(main, ["graph", str(spans_file), "-o", str(tmp_path / "g.json"), "--no-nodes"])
    assert result.exit_code == 0
    assert f"spans.jsonl:{lines}:" in result.output and "truncated" in result.output
    result = CliRunner().invoke(main, ["graph", str(spans_file), "-o", str(tmp_path / "g.json"), "--strict"])
    assert result.exit_code == 1
    assert result.output.startswith("SpanFileError: ") and f":{lines}:" in result.output


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["graph", str(tmp_path / "nope.jsonl"), "-o", str(tmp_path / "g.json")])
    assert result.exit_code == 1 and "SpanFileError" in result.output and "nope.jsonl" in result.output


def test_check_fails_without_requests(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = CliRunner().invoke(main, ["graph", str(empty), "-o", str(tmp_path / "g.json"), "--check"])
    assert result.exit_code == 2 and "self-check failed" in result.output
