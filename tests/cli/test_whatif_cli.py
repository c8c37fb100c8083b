"""``perfcast whatif``: parsing, output shape and exit codes (the engine itself is tested in tests/analyzer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from analyzer.graph import CausalGraph, Node, NodeKind, dump_graphs
from analyzer.profiles import ProfileKey, ProfileStore
from perfcast.cli import main

REDIS = "redis://127.0.0.1:6379/0"


@pytest.fixture
def graphs_file(tmp_path: Path) -> Path:
    n = 20
    nodes = [
        Node("start", NodeKind.START, (0.0,) * n),
        Node("a", NodeKind.IO, tuple(1.0 + i % 3 for i in range(n)), api="redis GET", resource=REDIS,
             system="redis", round_trips=(1,) * n),
        Node("c", NodeKind.COMPUTE, (1.0,) * n),
        Node("end", NodeKind.END, (0.0,) * n),
    ]
    path = tmp_path / "graphs.json"
    dump_graphs([CausalGraph("GET /post/{id}", nodes, [("start", "a"), ("a", "c"), ("c", "end")],
                             latency_ms=[3.0] * n)], path)
    return path


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["whatif", *args])
    return result.exit_code, result.output


def test_table(graphs_file: Path) -> None:
    code, out = run(str(graphs_file), "-s", "location:redis=+20ms", "--seed", "1", "--samples", "500")
    assert code == 0, out
    assert "location:redis=+20ms" in out and "GET /post/{id}" in out
    assert "predicted" in out and "baseline" in out


def test_json_has_full_distributions(graphs_file: Path) -> None:
    code, out = run(str(graphs_file), "-s", "location:redis=+20ms", "-s", "load:3", "--json",
                    "--samples", "300", "--seed", "2")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["format"] == "perfcast-whatif/1"
    assert [s["name"] for s in doc["scenarios"]] == ["location:redis=+20ms", "load:3"]
    (pred,) = doc["scenarios"][0]["predictions"]
    assert len(pred["predicted"]["samples_ms"]) == 300
    assert pred["predicted"]["p50"] > pred["baseline"]["p50"]
    assert {n["node"] for n in pred["sources"][0]["nodes"]} == {"start", "a", "c", "end"}


def test_scenarios_file_explain_and_plot(graphs_file: Path, tmp_path: Path) -> None:
    toml = tmp_path / "s.toml"
    toml.write_text('[scenario.far]\nchanges = "location:redis=+5ms"\n[scenario.busy]\nchanges = ["load:4"]\n')
    png = tmp_path / "cdf.png"
    code, out = run(str(graphs_file), "--scenarios", str(toml), "--explain", "--plot", str(png),
                    "--samples", "200")
    assert code == 0, out
    assert "scenario: far" in out and "scenario: busy" in out
    assert "round trips" in out  # --explain says where node a's durations came from
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_explain_names_the_api_filter(graphs_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    with ProfileStore(db) as store:
        store.add(ProfileKey.make("redis GET", REDIS, param="size_bytes", value=1e6), [5.0] * 10)
    code, out = run(str(graphs_file), "-s", "size:redis[GET]=1MB", "--profiles", str(db), "--explain",
                    "--samples", "200")
    assert code == 0, out
    assert "size:redis[GET]=1000000B: profile redis GET" in out
    code, out = run(str(graphs_file), "-s", "location:redis[GET]=+5ms", "--explain", "--samples", "200")
    assert code == 0, out
    assert "location:redis[GET]=+5ms: + 5 ms x round trips" in out


def test_profiles(graphs_file: Path, tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    with ProfileStore(db) as store:
        store.add(ProfileKey.make("redis GET", REDIS, {"tier": "C2"}), [0.5] * 10)
    code, out = run(str(graphs_file), "-s", "tier:redis=C2", "--profiles", str(db), "--json", "--samples", "100")
    assert code == 0, out
    assert json.loads(out)["scenarios"][0]["predictions"][0]["predicted"]["p50"] == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-s", "location:mongo=+1ms"], "ScenarioError: scenario 'location:mongo=+1ms': unknown resource 'mongo'"),
        (["-s", "weather:redis=rain"], "ScenarioError: scenario 'weather:redis=rain': unknown kind"),
        (["-s", "size:redis[SET]=1MB"], "ScenarioError: scenario 'size:redis[SET]=1MB': size:redis[SET]: no call to "
                                        "resource 'redis' has an api matching 'SET'; its apis are: redis GET"),
        (["-s", "size:redis[SET=1MB"], "ScenarioError: scenario 'size:redis[SET=1MB': unclosed '['"),
        (["-s", "tier:redis=C2"], "ProfileError: "),
        (["-s", "tier:redis=C2", "--profiles", "missing.db"], "ProfileError: profile store missing.db does not exist"),
    ],
)
def test_errors(graphs_file: Path, args: list[str], message: str) -> None:
    code, out = run(str(graphs_file), *args)
    assert code == 1
    assert message in out


def test_route_filter(graphs_file: Path) -> None:
    code, out = run(str(graphs_file), "-s", "load:2", "--route", "GET /post/{id}", "--json", "--samples", "50")
    assert code == 0, out
    assert [p["route"] for p in json.loads(out)["scenarios"][0]["predictions"]] == ["GET /post/{id}"]
    code, out = run(str(graphs_file), "-s", "load:2", "--route", "GET /nope")
    assert code == 1 and "ScenarioError: unknown route 'GET /nope'; the graphs have: GET /post/{id}" in out


def test_bad_graphs_file(tmp_path: Path) -> None:
    bad = tmp_path / "g.json"
    bad.write_text('{"format": "perfcast-graphs/1", "graphs": [{"route": "x"}]}')
    code, out = run(str(bad), "-s", "load:2")
    assert code == 1 and "GraphFileError" in out and "graphs[0]" in out


@pytest.mark.parametrize(("key", "value"), [("wake_cost_ms", -0.2), ("cpu_scale", "fast"),
                                            ("others_levels", [{"users": 1}])])
def test_a_bad_calibration_in_the_graphs_file_is_named(graphs_file: Path, tmp_path: Path, key: str,
                                                       value: object) -> None:
    # a hand-edited calibration value is an error naming the file, the graph and the key, not a silent default
    doc = json.loads(graphs_file.read_text())
    doc["graphs"][0].setdefault("meta", {})[key] = value
    bad = tmp_path / "g.json"
    bad.write_text(json.dumps(doc))
    code, out = run(str(bad), "-s", "load:2")
    assert code == 1 and f"{bad}: field 'graphs[0].meta'" in out and f"meta '{key}'" in out, out


def test_needs_a_scenario(graphs_file: Path) -> None:
    code, out = run(str(graphs_file))
    assert code == 2 and "--scenario" in out
