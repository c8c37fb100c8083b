"""Scenario specs, scenario TOML files and resource matching."""

from __future__ import annotations

import re

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
    api_matches,
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
BLOB = Node("b", NodeKind.IO, (1.0,), api="http GET /blob/{id}", resource="http://127.0.0.1:8101", system="http",
            extra={"resource_name": "blobs"})
AD = Node("a", NodeKind.IO, (1.0,), api="http GET /ad", resource="http://127.0.0.1:8101", system="http",
          extra={"resource_name": "blobs"})


def _graphs() -> list[CausalGraph]:
    nodes = [Node("start", NodeKind.START, (0.0,)), REDIS, PG, BLOB, AD, Node("end", NodeKind.END, (0.0,))]
    edges = [("start", "r"), ("r", "p"), ("p", "b"), ("b", "a"), ("a", "end")]
    return [CausalGraph("GET /", nodes, edges, latency_ms=[4.0])]


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
            ("load:16?mix.GET /=3&mix./post/{id}=1", Load(16, mix=(("GET /", 3.0), ("/post/{id}", 1.0)))),
            ("load:16?mix.GET /=0.5&mix.GET /ad=0", Load(16, mix=(("GET /", 0.5), ("GET /ad", 0.0)))),
            ("failure:app", Failure("app")),
            ("failure:db:5432?replicas=3", Failure("db:5432", 3)),
            ("size:blobs[GET /blob/{id}]=256KiB", Size("blobs", 256 * 1024, "GET /blob/{id}")),
            ("size:http://127.0.0.1:8101[ GET /blob/* ]=1MB", Size("http://127.0.0.1:8101", 1e6, "GET /blob/*")),
            ("tier:redis[redis GET]=C2", Tier("redis", "C2", "redis GET")),
            ("location:blobs[GET /ad]=+20ms", Location("blobs", added_ms=20.0, api="GET /ad")),
            ("location:blobs[GET /ad]=eu", Location("blobs", label="eu", api="GET /ad")),
            ("size:blobs[GET /blob/[0-9]*]=6MB", Size("blobs", 6e6, "GET /blob/[0-9]*")),
            # an IPv6 host is part of the resource, not a filter
            ("location:http://[::1]:8101=+1ms", Location("http://[::1]:8101", added_ms=1.0)),
            ("location:http://[::1]=+1ms", Location("http://[::1]", added_ms=1.0)),
            ("location:http://[::1]:8101[GET /ad]=+1ms", Location("http://[::1]:8101", added_ms=1.0, api="GET /ad")),
        ],
    )
    def test_kinds(self, spec: str, change: object) -> None:
        assert parse_scenario(spec).changes == (change,)

    def test_api_filter_may_hold_the_spec_separators(self) -> None:
        sc = parse_scenario("size:blobs[GET /a?x=1;y]=1MB; load:3")
        assert sc.changes == (Size("blobs", 1e6, "GET /a?x=1;y"), Load(3))
        assert sc.name == "size:blobs[GET /a?x=1;y]=1MB; load:3"

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
            ("load:10?mix.=3", "mix.ROUTE needs a route"),
            ("load:10?mix.GET /=lots", "option mix.GET /: expected a weight >= 0"),
            ("load:10?mix.GET /=-1", "expected a weight >= 0"),
            ("load:10?mix.GET /=nan", "expected a weight >= 0"),
            ("load:10?mix.GET /=0", "every route a weight of 0"),
            ("failure:app?replicas=1", "integer >= 2"),
            ("tier:redis", "expected tier:RESOURCE=VALUE"),
            ("load:1; load:2", "more than one load"),
            ("  ", "empty scenario"),
            ("size:blobs[GET /blob/{id}=6MB", r"'size:blobs\[GET /blob/\{id\}=6MB': unclosed '\['"),
            ("size:blobs[GET /ad=6MB; load:2", r"unclosed '\['"),
            ("size:blobsGET /ad]=6MB", r"unmatched '\]'"),
            ("size:blobs[]=6MB", "empty API filter"),
            ("size:blobs[  ]=6MB", "empty API filter"),
            ("size:[GET /ad]=6MB", r"resource before '\['"),
            ("failure:blobs[GET /ad]", "failure takes no API filter"),
            ("interference:cpu[x]=50", "interference takes no API filter"),
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

    @pytest.mark.parametrize(
        ("pattern", "hit"),
        [
            ("GET /blob/{id}", True),  # the operation, without the system
            ("http GET /blob/{id}", True),  # the whole api
            ("GET /blob/*", True),
            ("*blob*", True),
            ("GET /blob", False),  # a glob matches the whole api, not a prefix
            ("get /blob/{id}", False),  # case-sensitive
            ("GET /ad", False),
        ],
    )
    def test_api_matches_is_a_glob_on_api_or_operation(self, pattern: str, hit: bool) -> None:
        assert api_matches(pattern, BLOB) is hit

    def test_api_filter_that_matches_nothing_lists_the_apis(self) -> None:
        graphs = _graphs()
        check_resources(parse_scenario("size:blobs[GET /blob/*]=1MB; tier:blobs[http GET /ad]=C2"), graphs)
        with pytest.raises(ScenarioError) as info:
            check_resources(parse_scenario("size:blobs[GET /blobs/*]=1MB", name="big"), graphs)
        assert str(info.value) == (
            "scenario 'big': size:blobs[GET /blobs/*]: no call to resource 'blobs' has an api matching "
            "'GET /blobs/*'; its apis are: http GET /ad, http GET /blob/{id} (the filter is a case-sensitive "
            "glob on the api or on its operation, e.g. GET /blob/*)"
        )
        # an api of another resource does not count
        with pytest.raises(ScenarioError, match=r"location:redis\[SELECT posts\]: .*its apis are: redis GET \("):
            check_resources(parse_scenario("location:redis[SELECT posts]=+1ms"), graphs)
        # an unknown resource is still reported as such, before its filter
        with pytest.raises(ScenarioError, match="unknown resource 'mongo'"):
            check_resources(parse_scenario("size:mongo[GET /ad]=1MB"), graphs)

    def test_unknown_resource_lists_what_the_graphs_have(self) -> None:
        graphs = _graphs()
        assert "db:5432" in known_resources(graphs)
        check_resources(parse_scenario("tier:cache=C2; load:3?pool.postgresql=2"), graphs)
        with pytest.raises(ScenarioError, match="unknown resource 'mongo'.*cache.*postgresql"):
            check_resources(parse_scenario("location:mongo=+1ms"), graphs)
        with pytest.raises(ScenarioError, match="unknown resource 'mysql'"):
            check_resources(parse_scenario("load:3?pool.mysql=2"), graphs)
        routes = ", ".join(sorted({g.route for g in graphs}))
        with pytest.raises(ScenarioError, match=rf"option mix.GET /nope: no graph has that route; the routes are: "
                                                rf"{re.escape(routes)}"):
            check_resources(parse_scenario("load:3?mix.GET /nope=1"), graphs)
        route = graphs[0].route
        check_resources(parse_scenario(f"load:3?mix.{route}=1&mix.{route.partition(' ')[2]}=2"), graphs)
        check_resources(parse_scenario("failure:app"), graphs)


class TestFile:
    def test_reads_several(self, tmp_path: Path) -> None:
        f = tmp_path / "s.toml"
        f.write_text('[scenario.far]\nchanges = "location:redis=+20ms"\n\n'
                     '[scenario.peak]\ndescription = "Monday 9am"\nchanges = ["load:60", "interference:cpu=30"]\n')
        far, peak = load_scenarios(f)
        assert far.name == "far" and far.changes == (Location("redis", added_ms=20.0),)
        assert peak.changes == (Load(60), Interference(30.0))

    def test_api_filter_in_a_spec_or_a_field(self, tmp_path: Path) -> None:
        f = tmp_path / "s.toml"
        f.write_text('[scenario.spec]\nchanges = "size:blobs[GET /blob/{id}]=256KiB; load:2"\n\n'
                     '[scenario.field]\nchanges = [{ spec = "size:blobs=256KiB", api = "GET /blob/{id}" }, "load:2"]\n'
                     '\n[scenario.odd]\nchanges = [{ spec = "tier:blobs=C2", api = "GET /x]y" }]\n')
        spec, fld, odd = load_scenarios(f)
        assert spec.changes == fld.changes == (Size("blobs", 256 * 1024, "GET /blob/{id}"), Load(2))
        assert odd.changes == (Tier("blobs", "C2", "GET /x]y"),)  # a field may hold what a spec cannot

    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ('[{ spec = "size:blobs=1MB" }]', r"field 'scenario\.x\.changes\[0\]\.api': missing"),
            ('[{ api = "GET /ad" }]', r"field 'scenario\.x\.changes\[0\]\.spec': missing"),
            ('["load:2", { spec = "size:blobs=1MB", api = "GET /ad", apis = "x" }]',
             r"field 'scenario\.x\.changes\[1\]\.apis': unknown field"),
            ('[{ spec = "size:blobs=1MB", api = " " }]', r"changes\[0\]': .*empty API filter"),
            ('[{ spec = "size:blobs[GET /ad]=1MB", api = "GET /ad" }]', "given twice"),
            ('[{ spec = "load:3", api = "GET /ad" }]', "only location, tier and size take an API filter"),
            ('[{ spec = "size:blobs=1MB; load:3", api = "GET /ad" }]', "exactly one change"),
            ('["size:blobs[GET /ad=1MB"]', r"field 'scenario\.x\.changes': .*unclosed"),
            ('["load:2", { spec = "tier:blobs=C2", api = "GET /ad" }, "load:3"]', "more than one load"),
        ],
    )
    def test_bad_change_tables(self, tmp_path: Path, changes: str, message: str) -> None:
        f = tmp_path / "s.toml"
        f.write_text(f"[scenario.x]\nchanges = {changes}\n")
        with pytest.raises(ScenarioFileError, match=rf"s\.toml:1: .*{message}"):
            load_scenarios(f)

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
