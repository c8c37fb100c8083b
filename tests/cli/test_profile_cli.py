"""CLI shape and exit codes of profile, plan, compare and e2e (the maths is tested in tests/analyzer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from analyzer.graph import CausalGraph, Node, NodeKind, dump_graphs
from analyzer.profiles import ProfileStore
from perfcast.cli import main

HAR = Path(__file__).resolve().parents[2] / "examples" / "har" / "forum.har"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.output


@pytest.fixture
def graphs_file(tmp_path: Path) -> Path:
    rng = np.random.default_rng(0)
    n = 50
    get = tuple(rng.lognormal(-1.0, 0.3, n).tolist())
    sql = tuple(rng.lognormal(1.0, 0.6, n).tolist())
    nodes = [
        Node("start", NodeKind.START, (0.0,) * n),
        Node("r", NodeKind.IO, get, api="redis GET", resource="redis://127.0.0.1:6379/0", system="redis"),
        Node("q", NodeKind.IO, sql, api="postgresql SELECT posts", resource="postgresql://127.0.0.1:5432/test",
             system="postgresql"),
        Node("end", NodeKind.END, (0.0,) * n),
    ]
    latency = [a + b + 5.0 for a, b in zip(get, sql, strict=True)]
    g = CausalGraph("GET /", nodes, [("start", "r"), ("r", "q"), ("q", "end")], latency_ms=latency)
    path = tmp_path / "graphs.json"
    dump_graphs([g], path)
    return path


def test_plan_prints_allocation(graphs_file: Path) -> None:
    code, out = run("plan", str(graphs_file), "--budget", "10s", "--min", "20")
    assert code == 0, out
    assert "redis GET" in out and "postgresql SELECT posts" in out and "summed standard error" in out


def test_plan_budget_too_small(graphs_file: Path) -> None:
    code, out = run("plan", str(graphs_file), "--budget", "1ms")
    assert code == 1 and out.startswith("PlanningError:") and "raise the budget" in out


def test_plan_bad_graphs_file(tmp_path: Path) -> None:
    bad = tmp_path / "g.json"
    bad.write_text("{}")
    code, out = run("plan", str(bad), "--budget", "1m")
    assert code == 1 and "GraphFileError" in out and "format" in out


def test_profile_redis_into_store(redis_url: str, tmp_path: Path) -> None:
    store = tmp_path / "p.db"
    code, out = run("profile", "--redis", redis_url, "--op", "GET", "--label", "tier=local", "--budget", "2s",
                    "--rse", "0.05", "--min", "20", "--store", str(store))
    assert code == 0, out
    assert "redis GET" in out and "tier=local" in out
    with ProfileStore(store) as s:
        (key,) = s.keys()
        assert key.api == "redis GET" and key.labels == (("tier", "local"),)
        assert s.samples(key).size >= 20
        cpu = s.cpu_ms(key)
        assert cpu is not None and cpu > 0  # the client's CPU per call, shown in the table's cpu/call column
    assert "cpu/call" in out


def test_profile_grid_takes_turns_within_its_budget(redis_url: str, tmp_path: Path) -> None:
    """Two sizes at one and two callers are four points sharing --budget; each is measured in --rounds spells."""
    store = tmp_path / "p.db"
    code, out = run("profile", "--redis", redis_url, "--op", "SET", "--size", "64,4k", "--concurrency", "2",
                    "--budget", "2s", "--rounds", "2", "--rse", "1e-9", "--min", "20", "--store", str(store))
    assert code == 0, out
    with ProfileStore(store) as s:
        points = sorted((k.value, k.concurrency) for k in s.keys() if k.param == "size_bytes")
        assert points == [(64.0, 1), (64.0, 2), (4096.0, 1), (4096.0, 2)]
    # an rse nobody reaches: every spell of every point runs out its share of the budget
    assert out.count("budget") >= 4
    code, out = run("profile", "--redis", redis_url, "--rounds", "0", "--store", str(store))
    assert code == 2 and "--rounds" in out


def test_profile_usage_errors(tmp_path: Path) -> None:
    code, out = run("profile", "--store", str(tmp_path / "p.db"))
    assert code == 2 and "exactly one of" in out
    code, out = run("profile", "--rtt", "localhost:1", "--label", "oops", "--store", str(tmp_path / "p.db"))
    assert code == 1 and "ProfileError" in out and "NAME=VALUE" in out
    code, out = run("profile", "--redis", "redis://x", "--size", "12q", "--store", str(tmp_path / "p.db"))
    assert code == 1 and "size '12q'" in out


def test_profile_cpu_into_store(tmp_path: Path) -> None:
    store = tmp_path / "p.db"
    code, out = run("profile", "--cpu", "40", "--work", "0.1", "--budget", "1s", "--rse", "0.5", "--min", "20",
                    "--label", "host=here", "--store", str(store))
    assert code == 0, out
    assert "cpu 0.1ms gap 0.1ms" in out and "neighbour %" in out
    with ProfileStore(store) as s:  # the work after each class of sleep before it
        assert {(k.api, k.param, k.value, k.labels) for k in s.keys()} == {
            (f"cpu 0.1ms gap {g}ms", "cpu_pct", v, (("host", "here"),)) for g in ("0.1", "0.6", "3")
            for v in (0.0, 40.0)}


def test_profile_cpu_usage_errors(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    code, out = run("profile", "--cpu", "50", "--size", "1k", "--store", db)
    assert code == 2 and "--cpu takes no" in out
    code, out = run("profile", "--redis", "redis://x", "--work", "1", "--store", db)
    assert code == 2 and "--work goes with --cpu" in out
    code, out = run("profile", "--cpu", "fifty", "--store", db)
    assert code == 2 and "expected numbers" in out
    code, out = run("profile", "--cpu", "150", "--store", db)
    assert code == 1 and "--cpu 150: a neighbour's share must be in (0, 100) %" in out


def test_compare_prints_three_figures(tmp_path: Path) -> None:
    a, b = tmp_path / "a.txt", tmp_path / "b.json"
    a.write_text("\n".join(str(x) for x in range(1, 101)))
    b.write_text(json.dumps(list(range(11, 111))))
    code, out = run("compare", str(a), str(b))
    assert code == 0, out
    assert "max (KS D) 0.1000" in out and "mean" in out and "median" in out
    code, out = run("compare", str(a), str(b), "--json")
    assert json.loads(out)["max"] == pytest.approx(0.1)


def test_compare_pools_rounds_and_says_how_far_apart_they_are(tmp_path: Path) -> None:
    pred, r1, r2 = tmp_path / "pred.txt", tmp_path / "r1.txt", tmp_path / "r2.txt"
    pred.write_text("\n".join(str(x) for x in range(1, 201)))
    r1.write_text("\n".join(str(x) for x in range(1, 101)))
    r2.write_text("\n".join(str(x) for x in range(101, 201)))
    code, out = run("compare", str(pred), str(r1), str(r2), "--json")
    assert code == 0, out
    doc = json.loads(out)
    # pooled, the two rounds are the prediction exactly; each against the other, they do not overlap at all
    assert doc["max"] == 0.0 and doc["n_measured"] == 200
    assert doc["repeatability"]["ks_d"] == 1.0 and doc["repeatability"]["rounds"] == 2
    assert doc["repeatability"]["sampling_ks_d"] < 0.3
    code, out = run("compare", str(pred), str(r1), str(r2))
    assert code == 0 and "round 2" in out and "rounds apart" in out and "KS D 1.0000" in out
    code, out = run("compare", str(pred), str(r1))
    assert code == 0 and "rounds apart" not in out


def test_compare_bad_file_names_line(tmp_path: Path) -> None:
    a = tmp_path / "a.txt"
    a.write_text("1\n2\nx\n")
    code, out = run("compare", str(a), str(a))
    assert code == 1 and "a.txt:3" in out


def test_e2e_with_graphs(graphs_file: Path) -> None:
    code, out = run("e2e", "--har", str(HAR), "--graphs", str(graphs_file), "--route", "GET /", "--rtt", "40ms",
                    "--percentile", "90", "--ci", "2%", "--seed", "1")
    assert code == 0, out
    assert "page load time" in out and "p90" in out and "cloud GET / + rtt" in out
    code, out = run("e2e", "--har", str(HAR), "--graphs", str(graphs_file), "--route", "GET /", "--json",
                    "--seed", "1")
    doc = json.loads(out)
    assert doc["converged"] and doc["frontend"][0]["route"] == "GET /" and len(doc["samples_ms"]) >= 1000


def test_e2e_errors(graphs_file: Path, tmp_path: Path) -> None:
    code, out = run("e2e", "--har", str(HAR), "--graphs", str(graphs_file), "--route", "GET /nope")
    assert code == 1 and "'GET /nope' is not in the graphs" in out
    bad = tmp_path / "bad.har"
    doc = json.loads(HAR.read_text())
    del doc["log"]["entries"][3]["request"]["method"]
    bad.write_text(json.dumps(doc))
    code, out = run("e2e", "--har", str(bad), "--graphs", str(graphs_file), "--route", "GET /")
    assert code == 1 and "HarFileError" in out and "log.entries[3].request.method" in out
    code, out = run("e2e", "--har", str(HAR), "--route", "GET /")
    assert code == 2 and "--graphs" in out


def test_profile_idle_usage_errors(tmp_path: Path) -> None:
    db = str(tmp_path / "p.db")
    code, out = run("profile", "--redis", "redis://x", "--idle", "10", "--store", db)
    assert code == 2 and "--idle goes with --http" in out
    code, out = run("profile", "--http", "http://127.0.0.1:1/post/1", "--idle", "10", "--size", "1k", "--store", db)
    assert code == 2 and "--idle goes without --size" in out
    code, out = run("profile", "--http", "http://127.0.0.1:1/post/1", "--idle", "ten", "--store", db)
    assert code == 2 and "expected numbers" in out
