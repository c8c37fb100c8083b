"""Scenario specs, scenario TOML files and resource matching."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.errors import ScenarioError, ScenarioFileError
from analyzer.graph import CausalGraph, Node, NodeKind
from analyzer.scenario import (
    Failure,
    Interference,
    Load,
    Location,
    Size,
    Tier,
    check_resources,
    known_resources,
    load_scenarios,
    matches,
    parse_scenario,
)

REDIS = Node("r", NodeKind.IO, (1.0,), api="redis GET", resource="redis://10.0.0.5:6380/0", system="redis",
             extra={"resource_name": "cache"})
PG = Node("p", NodeKind.IO, (1.0,), api="postgresql SELECT posts", resource="postgresql://db:5432/test",
          system="postgresql")


def _graphs() -> list[CausalGraph]:
    nodes = [Node("start", NodeKind.START, (0.0,)), REDIS, PG, Node("end", NodeKind.END, (0.0,))]
    edges = [("start", "r"), ("r", "p"), ("p", "end")]
    return [CausalGraph("GET /", nodes, edges, latency_ms=[2.0])]


class TestParse:
    @pytest.mark.parametrize(
        ("spec", "change"),
        [
            ("location:redis=+20ms", Location("redis", added_ms=20.0)),
            ("location:redis=-5ms", Location("redis", added_ms=-5.0)),
            ("location:redis=0.5s", Location("redis", added_ms=500.0)),
            ("location:cache=eu-west", Location("cache", label="eu-west")),
            ("tier:redis=C2", Tier("redis", "C2")),
            ("size:blob=6MB", Size("blob", 6e6)),
            ("size:blob=512KiB", Size("blob", 512 * 1024)),
            ("size:blob=6e6", Size("blob", 6e6)),
            ("interference:cpu=50", Interference(50.0)),
            ("interference:cpu=30%", Interference(30.0)),
            ("load:60", Load(60)),
            ("load:60?think=100ms&replicas=2&pool.postgresql=10", Load(60, 100.0, 2, (("postgresql", 10),))),
            ("load:5?nested=off", Load(5, nested="off")),
            ("failure:app", Failure("app")),
            ("failure:db:5432?replicas=3", Failure("db:5432", 3)),
        ],
    )
    def test_kinds(self, spec: str, change: object) -> None:
        assert parse_scenario(spec).changes == (change,)

    def test_changes_combine_with_semicolons(self) -> None:
        sc = parse_scenario("location:redis=+20ms; load:30", name="busy far")
        assert sc.name == "busy far"
        assert sc.load == Load(30)
        assert sc.needs_simulation
        assert not parse_scenario("tier:redis=C2").needs_simulation

    def test_unknown_kind_lists_the_kinds(self) -> None:
        with pytest.raises(ScenarioError, match="unknown kind 'latency'.*location, tier, size, load"):
            parse_scenario("latency:redis=+20ms")

    @pytest.mark.parametrize(
        ("spec", "message"),
        [
            ("location:redis=+20", "expected a duration"),
            ("size:blob=six", "expected a size"),
            ("size:blob=0", "BYTES must be positive"),
            ("interference:cpu=100", r"\[0, 100\)"),
            ("interference:memory=50", "only interference:cpu"),
            ("load:0", "integer >= 1"),
            ("load:10?threads=3", "unknown option 'threads'"),
            ("load:10?pool.=3", "needs a resource"),
            ("load:10?nested=maybe", "nested must be one of shared, separate, off"),
            ("failure:app?replicas=1", "integer >= 2"),
            ("tier:redis", "expected tier:RESOURCE=VALUE"),
            ("load:1; load:2", "more than one load"),
            ("  ", "empty scenario"),
        ],
    )
    def test_bad_values(self, spec: str, message: str) -> None:
        with pytest.raises(ScenarioError, match=message):
            parse_scenario(spec)


class TestResources:
    @pytest.mark.parametrize("selector", ["redis", "10.0.0.5:6380", "redis://10.0.0.5:6380/0", "cache"])
    def test_matches(self, selector: str) -> None:
        assert matches(selector, REDIS)
        assert not matches(selector, PG)

    def test_compute_nodes_never_match(self) -> None:
        assert not matches("redis", Node("c", NodeKind.COMPUTE, system="redis"))

    def test_unknown_resource_lists_what_the_graphs_have(self) -> None:
        graphs = _graphs()
        assert "db:5432" in known_resources(graphs)
        check_resources(parse_scenario("tier:cache=C2; load:3?pool.postgresql=2"), graphs)
        with pytest.raises(ScenarioError, match="unknown resource 'mongo'.*cache.*postgresql"):
            check_resources(parse_scenario("location:mongo=+1ms"), graphs)
        with pytest.raises(ScenarioError, match="unknown resource 'mysql'"):
            check_resources(parse_scenario("load:3?pool.mysql=2"), graphs)
        check_resources(parse_scenario("failure:app"), graphs)


class TestFile:
    def test_reads_several(self, tmp_path: Path) -> None:
        f = tmp_path / "s.toml"
        f.write_text('[scenario.far]\nchanges = "location:redis=+20ms"\n\n'
                     '[scenario.peak]\ndescription = "Monday 9am"\nchanges = ["load:60", "interference:cpu=30"]\n')
        far, peak = load_scenarios(f)
        assert far.name == "far" and far.changes == (Location("redis", added_ms=20.0),)
        assert peak.changes == (Load(60), Interference(30.0))

    def test_bad_spec_names_file_line_and_field(self, tmp_path: Path) -> None:
        f = tmp_path / "s.toml"
        f.write_text('[scenario.ok]\nchanges = "load:2"\n\n[scenario.bad]\nchanges = ["load:2", "tier:x"]\n')
        with pytest.raises(ScenarioFileError, match=r"s\.toml:4: field 'scenario\.bad\.changes': .*tier:RESOURCE"):
            load_scenarios(f)

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("[scenario.x\n", r"s\.toml:1: not valid TOML"),
            ("[other]\na = 1\n", "field 'other': unknown table"),
            ("title = 'x'\n", "field 'title'"),
            ("[scenario.x]\nchange = 'load:1'\n", r"s\.toml:1: field 'scenario\.x\.changes': missing"),
            ("[scenario.x]\nchanges = []\n", "non-empty list"),
            ("[scenario.x]\nchanges = 'load:1'\nspeed = 2\n", r"scenario\.x\.speed': unknown field"),
        ],
    )
    def test_malformed(self, tmp_path: Path, text: str, message: str) -> None:
        f = tmp_path / "s.toml"
        f.write_text(text)
        with pytest.raises(ScenarioFileError, match=message):
            load_scenarios(f)

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(ScenarioFileError, match="cannot read"):
            load_scenarios(tmp_path / "none.toml")
