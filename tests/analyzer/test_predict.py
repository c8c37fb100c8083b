"""The what-if engine on hand-built graphs whose answers can be worked out by hand, with a real profile store."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from analyzer.errors import GraphError, ProfileError, ScenarioError
from analyzer.graph import CausalGraph, Node, NodeKind, WaitMode
from analyzer.predict import cpu_slowdown, predict
from analyzer.profiles import ProfileKey, ProfileStore
from analyzer.scenario import parse_scenario

REDIS = "redis://127.0.0.1:6379/0"
PG = "postgresql://127.0.0.1:5432/test"


def io(node_id: str, samples: list[float], *, trips: int | list[int] = 1, system: str = "redis",
       api: str = "redis GET", payload: list[int] | None = None) -> Node:
    n = len(samples)
    rt = [trips] * n if isinstance(trips, int) else trips
    return Node(node_id, NodeKind.IO, tuple(samples), api=api, resource=REDIS if system == "redis" else PG,
                system=system, round_trips=tuple(rt), response_bytes=tuple(payload or ()))


def compute(node_id: str, samples: list[float], cpu: list[float] | None = None) -> Node:
    return Node(node_id, NodeKind.COMPUTE, tuple(samples), cpu_ms=tuple(cpu or ()))


def graph(route: str, nodes: list[Node], edges: list[tuple[str, str]], *, variant: int = 0) -> CausalGraph:
    n = len(nodes[0].samples_ms)
    ends = [Node("start", NodeKind.START, (0.0,) * n), Node("end", NodeKind.END, (0.0,) * n)]
    return CausalGraph(route, ends + nodes, edges, variant=variant, latency_ms=[1.0] * n)


def gather() -> CausalGraph:
    """start -> {a: redis (1 or 2 ms, 1 round trip), b: postgresql 3 ms, 2 round trips} -> j -> c (1 ms) -> end."""
    return graph("GET /", [
        io("a", [1.0, 2.0] * 50), io("b", [3.0] * 100, trips=2, system="postgresql", api="postgresql SELECT posts"),
        Node("j", NodeKind.SYNC, (0.0,) * 100), compute("c", [1.0] * 100, cpu=[0.4] * 100),
    ], [("start", "a"), ("start", "b"), ("a", "j"), ("b", "j"), ("j", "c"), ("c", "end")])


def values(dist: object) -> set[float]:
    return {round(float(x), 9) for x in dist.samples_ms}  # type: ignore[attr-defined]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ProfileStore]:
    with ProfileStore(tmp_path / "profiles.db") as s:
        yield s


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


class TestBaselineAndLocation:
    def test_untouched_is_the_baseline(self) -> None:
        (p,) = predict([gather()], "interference:cpu=0", samples=2000, rng=rng())
        assert values(p.baseline) == {4.0}  # max(a, b) + c = 3 + 1 whatever a is
        np.testing.assert_array_equal(p.predicted.samples_ms, p.baseline.samples_ms)
        assert p.requests == 100 and p.observed is not None

    def test_added_rtt_times_round_trips(self) -> None:
        # postgresql makes 2 round trips: +5 ms each -> b = 13, latency = 13 + 1
        (p,) = predict([gather()], "location:postgresql=+5ms", samples=2000, rng=rng())
        assert values(p.predicted) == {14.0}
        # redis: 1 round trip, +20 -> a = 21 or 22 > b, latency 22 or 23, both drawn
        (p,) = predict([gather()], "location:redis=+20ms", samples=2000, rng=rng())
        assert values(p.predicted) == {22.0, 23.0}
        sources = {s.node: s for s in p.sources[0][1]}
        assert sources["a"].source == "model" and "round trips" in sources["a"].how
        assert sources["b"].source == "baseline"

    def test_how_soon_an_answer_can_come_is_the_resources_not_the_apis(self) -> None:
        # b is only ever called beside other work: half its calls show no wait behind a task step yet took 3 ms
        # (the loop was busy outside any step), half waited 2 ms. The resource answers a in 1 ms, so b's
        # waiting half can have waited the whole 2 ms, which the +10 ms absorbs; floored at b's own 3 ms,
        # none would be
        qa = replace(io("a", [1.0] * 100, system="postgresql", api="postgresql SELECT"),
                     extra={"queued_ms": [0.0] * 100})
        qb = replace(io("b", [3.0] * 100, system="postgresql", api="postgresql SELECT users"),
                     extra={"queued_ms": [0.0, 2.0] * 50})
        g = graph("GET /", [qa, qb], [("start", "a"), ("a", "b"), ("b", "end")])
        (p,) = predict([g], "location:postgresql=+10ms", samples=500, rng=rng())
        assert values(p.predicted) == {11.0 + 11.0, 11.0 + 13.0}
        how = {s.node: s.how for s in p.sources[0][1]}["b"]
        assert "at most what it took beyond 1 ms, the fastest tenth of the calls to its resource" in how

    def test_an_answer_that_waited_for_the_loop_comes_later_without_that_wait(self) -> None:
        # b's recorded 3 ms include 2 ms waiting for the loop (queued_ms); a: 1 ms of the same resource, alone
        qa = replace(io("a", [1.0] * 100, system="postgresql", api="postgresql SELECT"),
                     extra={"queued_ms": [0.0] * 100})
        qb = replace(io("b", [3.0] * 100, system="postgresql", api="postgresql SELECT posts"),
                     extra={"queued_ms": [2.0] * 100})
        g = graph("GET /", [qa, qb], [("start", "a"), ("a", "b"), ("b", "end")])
        (p,) = predict([g], "location:postgresql=+10ms", samples=500, rng=rng())
        # a: 1 + 10; b: 3 - 2 + 10 (the answer, 10 ms later, no longer waits behind the work it waited for)
        assert values(p.predicted) == {22.0}
        assert any("queued_ms" in s.how for s in p.sources[0][1] if s.node == "b")
        # never below the fastest tenth of the resource's calls that did not wait (a's 1 ms)
        slow = replace(qb, extra={"queued_ms": [2.8] * 100})
        (p,) = predict([graph("GET /", [qa, slow], [("start", "a"), ("a", "b"), ("b", "end")])],
                       "location:postgresql=+10ms", samples=500, rng=rng())
        assert values(p.predicted) == {22.0}
        # a scenario that leaves the call's timing alone keeps what was recorded, its wait included
        (p,) = predict([g], "interference:cpu=0", samples=500, rng=rng())
        assert values(p.predicted) == {4.0}
        # the wait absorbs a delay shorter than itself: +0 ms changes nothing, +1 ms only a's 1 ms, +3 ms b's 1
        for added, expected in ((0, 4.0), (1, 5.0), (3, 8.0)):
            (p,) = predict([g], f"location:postgresql=+{added}ms", samples=500, rng=rng())
            assert values(p.predicted) == {expected}

    def test_round_trips_vary_per_request(self) -> None:
        g = graph("GET /", [io("a", [1.0, 1.0], trips=[1, 3])], [("start", "a"), ("a", "end")])
        (p,) = predict([g], "location:redis=+10ms", samples=1000, rng=rng())
        assert values(p.predicted) == {11.0, 31.0}

    def test_moving_closer_never_goes_negative(self) -> None:
        (p,) = predict([gather()], "location:redis=-50ms", samples=500, rng=rng())
        assert values(p.predicted) == {4.0}

    def test_missing_round_trips_is_an_error(self) -> None:
        g = graph("GET /", [Node("a", NodeKind.IO, (1.0,), api="redis GET", resource=REDIS, system="redis")],
                  [("start", "a"), ("a", "end")])
        with pytest.raises(ScenarioError, match="'a'.*no round-trip counts"):
            predict([g], "location:redis=+1ms", rng=rng())

    def test_rtt_profile_per_round_trip(self, store: ProfileStore) -> None:
        store.add(ProfileKey.make("rtt", REDIS, {"location": "eu"}), [10.0] * 20)
        g = graph("GET /", [io("a", [1.0, 1.0], trips=[1, 3])], [("start", "a"), ("a", "end")])
        (p,) = predict([g], "location:redis=eu", store, samples=1000, rng=rng())
        assert values(p.predicted) == {11.0, 31.0}
        # with the baseline location's RTT known (1 ms), each round trip gains 10 - 1
        store.add(ProfileKey.make("rtt", REDIS), [1.0] * 20)
        (p,) = predict([g], "location:redis=eu", store, samples=1000, rng=rng())
        assert values(p.predicted) == {10.0, 28.0}
        with pytest.raises(ProfileError, match="rtt"):
            predict([g], "location:redis=asia", store, rng=rng())


class TestProfiles:
    def test_tier_takes_the_profile(self, store: ProfileStore) -> None:
        store.add(ProfileKey.make("redis GET", REDIS, {"tier": "C2"}), [0.5, 0.25])
        (p,) = predict([graph("GET /", [io("a", [4.0] * 10)], [("start", "a"), ("a", "end")])],
                       "tier:redis=C2", store, samples=1000, rng=rng())
        assert values(p.predicted) == {0.5, 0.25}
        (src,) = [s for s in p.sources[0][1] if s.node == "a"]
        assert src.source == "profile" and "tier=C2" in src.how

    def test_missing_tier_names_what_exists(self, store: ProfileStore) -> None:
        store.add(ProfileKey.make("redis GET", REDIS, {"tier": "C2"}), [0.5])
        with pytest.raises(ProfileError, match="tier=C6.*C2"):
            predict([gather()], "tier:redis=C6", store, rng=rng())
        with pytest.raises(ProfileError, match="needs a profile store"):
            predict([gather()], "tier:redis=C2", None, rng=rng())

    def test_size_interpolates_the_parameterised_profile(self, store: ProfileStore) -> None:
        for size, ms in ((1e6, 10.0), (1e7, 100.0)):
            store.add(ProfileKey.make("redis GET", REDIS, param="size_bytes", value=size), [ms] * 5)
        g = graph("GET /", [io("a", [1.0] * 10)], [("start", "a"), ("a", "end")])
        (p,) = predict([g], "size:redis=5.5MB", store, samples=500, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 55.0)

    def test_size_from_the_baseline_per_byte_cost(self) -> None:
        # recorded: 1 ms + 1 ms per MB, payloads 0.1..1 MB -> at 6 MB: 7 ms
        payload = [100_000 * (1 + i % 10) for i in range(50)]
        g = graph("GET /", [io("a", [1.0 + b / 1e6 for b in payload], payload=payload)],
                  [("start", "a"), ("a", "end")])
        (p,) = predict([g], "size:redis=6MB", samples=500, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 7.0)
        assert "Theil-Sen" in p.sources[0][1][[s.node for s in p.sources[0][1]].index("a")].how

    def test_size_without_profile_or_spread_says_what_to_do(self) -> None:
        g = graph("GET /", [io("a", [1.0] * 10, payload=[1000] * 10)], [("start", "a"), ("a", "end")])
        with pytest.raises(ProfileError, match="no size_bytes profile.*perfcast profile"):
            predict([g], "size:redis=6MB", rng=rng())


BLOBS = "http://127.0.0.1:8101"


def blob_service() -> CausalGraph:
    """start -> blob (2 ms, 4 KB) -> ad (1 or 3 ms) -> end: two apis of one service at one host:port."""
    def call(node_id: str, api: str, samples: list[float]) -> Node:
        return Node(node_id, NodeKind.IO, tuple(samples), api=api, resource=BLOBS, system="http",
                    round_trips=(1,) * len(samples), response_bytes=(4096,) * len(samples))

    nodes = [call("blob", "http GET /blob/{id}", [2.0] * 20), call("ad", "http GET /ad", [1.0, 3.0] * 10)]
    return graph("GET /", nodes, [("start", "blob"), ("blob", "ad"), ("ad", "end")])


class TestApiFilter:
    @pytest.fixture
    def sized(self, store: ProfileStore) -> ProfileStore:
        for size, ms in ((1e5, 10.0), (1e6, 100.0)):
            store.add(ProfileKey.make("http GET /blob/{id}", BLOBS, param="size_bytes", value=size), [ms] * 5)
        return store

    @pytest.mark.parametrize("spec", ["size:127.0.0.1:8101[GET /blob/{id}]=550KB",
                                      "size:127.0.0.1:8101[http GET /blob/*]=550KB"])
    def test_size_changes_only_the_filtered_api(self, sized: ProfileStore, spec: str) -> None:
        (p,) = predict([blob_service()], spec, sized, samples=1000, rng=rng())
        assert values(p.predicted) == {56.0, 58.0}  # blob from the profile at 550 KB (55 ms) + ad as recorded
        sources = {s.node: s for s in p.sources[0][1]}
        assert sources["ad"].source == "baseline"
        assert sources["blob"].source == "profile"
        assert sources["blob"].how.startswith("size:127.0.0.1:8101[")  # --explain names the filter
        assert "]=550000B: profile http GET /blob/{id}" in sources["blob"].how
        assert "outside the measured sizes" in sources["blob"].how  # 4 KB: no profile at today's payload

    def test_a_size_shifts_todays_calls_by_the_profiles_difference(self, sized: ProfileStore) -> None:
        # today's 4 KB measured too: the blob call keeps its recorded 2 ms plus what 550 KB adds to a 4 KB call
        # (55 - 1 ms), rather than taking the profile's 55 ms (the app's call and the profiled one differ)
        sized.add(ProfileKey.make("http GET /blob/{id}", BLOBS, param="size_bytes", value=4096), [1.0] * 5)
        (p,) = predict([blob_service()], "size:127.0.0.1:8101[GET /blob/{id}]=550KB", sized, samples=1000,
                       rng=rng())
        assert values(p.predicted) == {2.0 + 54.0 + 1.0, 2.0 + 54.0 + 3.0}
        how = {s.node: s.how for s in p.sources[0][1]}["blob"]
        assert "at today's payload 4096 B" in how and "median shift +54 ms" in how

    def test_the_shift_keeps_each_calls_rank(self, store: ProfileStore) -> None:
        # a slow call stays slow: recorded 1 or 3 ms, the profile 1 or 2 ms at 4 KB and 10 or 30 at 1 MB; the
        # call of rank u gains Q_1MB(u) - Q_4KB(u): 9 ms for the fast half, 28 for the slow one
        for size, ms in ((4096, [1.0, 2.0] * 50), (1e6, [10.0, 30.0] * 50)):
            store.add(ProfileKey.make("http GET /blob/{id}", BLOBS, param="size_bytes", value=size), ms)
        g = graph("GET /", [Node("blob", NodeKind.IO, (1.0, 3.0) * 10, api="http GET /blob/{id}", resource=BLOBS,
                                 system="http", round_trips=(1,) * 20, response_bytes=(4096,) * 20)],
                  [("start", "blob"), ("blob", "end")])
        (p,) = predict([g], "size:127.0.0.1:8101[GET /blob/{id}]=1MB", store, samples=2000, rng=rng())
        assert values(p.predicted) == {10.0, 31.0}

    def test_a_fan_outs_calls_shift_at_their_place_in_it(self, store: ProfileStore) -> None:
        # two blobs fetched at once, the second started while the first's span was open (open_calls 2), though
        # the first's answer had come (inflight 1); measured with one and with two callers, 1 MB adds 1 ms to one
        # caller's call and 4.5 ms to each of two callers' at the median: the two answers queue, the second
        # waiting for both extras, 2 x 2 / 3 of the mean. A bigger answer keeps the first unanswered: the first
        # call gains 1 ms, the second 6, and the request ends when the second does
        for size, c, ms in ((4096, 1, 1.0), (1e6, 1, 2.0), (4096, 2, 2.0), (1e6, 2, 6.5)):
            store.add(ProfileKey.make("http GET /blob/{id}", BLOBS, {}, "size_bytes", size, c), [ms] * 5)

        def call(node_id: str, level: int, payload: float = 4096) -> Node:
            return Node(node_id, NodeKind.IO, (2.0,) * 20, api="http GET /blob/{id}", resource=BLOBS,
                        system="http", round_trips=(1,) * 20, response_bytes=(payload,) * 20,
                        extra={"inflight": [1] * 20, "open_calls": [level] * 20})

        g = graph("GET /", [call("a", 1), call("b", 2)], [("start", "a"), ("start", "b"), ("a", "end"),
                                                            ("b", "end")])
        (p,) = predict([g], "size:127.0.0.1:8101[GET /blob/{id}]=1MB", store, samples=500, rng=rng())
        assert values(p.predicted) == {8.0}  # max(2 + 1, 2 + 6)
        how = {s.node: s.how for s in p.sources[0][1]}
        assert "at concurrency 2 (measured)" in how["b"] and "median shift +6 ms" in how["b"]
        assert "median shift +1 ms" in how["a"] and "place in its fan-out, 2," in how["b"]
        # a smaller answer may come sooner: the place is the calls still unanswered (inflight 1), one caller's
        # -1 ms; read at the open spans' place it would have been -6, the call cut to nothing
        small = graph("GET /", [call("b", 2, payload=1e6)], [("start", "b"), ("b", "end")])
        (p,) = predict([small], "size:127.0.0.1:8101[GET /blob/{id}]=4096", store, samples=500, rng=rng())
        assert values(p.predicted) == {1.0}

    def test_a_client_that_keeps_up_with_the_answers_queues_nothing(self, store: ProfileStore) -> None:
        # the profile's two answers came 2 x (6.5 - 2) / 3 = 3 ms apart at 1 MB, 0.67 at 4 KB, and its client took
        # 0.3 and 0.1 ms of CPU on each: it kept up, so none of the second call's shift was waiting for the
        # client's loop (the simulation's own loop queues the app's extra CPU)
        for size, c, ms, cpu in ((4096, 1, 1.0, 0.1), (1e6, 1, 2.0, 0.3), (4096, 2, 2.0, 0.1), (1e6, 2, 6.5, 0.3)):
            store.add(ProfileKey.make("http GET /blob/{id}", BLOBS, {}, "size_bytes", size, c), [ms] * 5, cpu_ms=cpu)
        b = Node("b", NodeKind.IO, (2.0,) * 20, api="http GET /blob/{id}", resource=BLOBS, system="http",
                 round_trips=(1,) * 20, response_bytes=(4096,) * 20, extra={"open_calls": [2] * 20})
        (p,) = predict([graph("GET /", [b], [("start", "b"), ("b", "end")])],
                       "size:127.0.0.1:8101[GET /blob/{id}]=1MB", store, samples=200, rng=rng())
        how = {s.node: s.how for s in p.sources[0][1]}["b"]
        assert "the caller's CPU +0.2 ms a call" in how and "the profile's callers queued 0 ms" in how

    def test_without_the_filter_every_api_changes(self, sized: ProfileStore) -> None:
        # the ads have no size profile and a constant payload: the unfiltered change cannot apply to them
        with pytest.raises(ProfileError, match="no size_bytes profile for 'http GET /ad'"):
            predict([blob_service()], "size:127.0.0.1:8101=550KB", sized, rng=rng())

    def test_location_and_tier_take_the_filter(self, store: ProfileStore) -> None:
        (p,) = predict([blob_service()], "location:127.0.0.1:8101[GET /ad]=+10ms", samples=1000, rng=rng())
        assert values(p.predicted) == {13.0, 15.0}  # the ad's round trip only: 2 + (1 or 3) + 10
        assert "location:127.0.0.1:8101[GET /ad]: 1 calls" in " ".join(p.notes)
        store.add(ProfileKey.make("http GET /ad", BLOBS, {"tier": "C2"}), [0.5])
        (p,) = predict([blob_service()], "tier:127.0.0.1:8101[GET /ad]=C2", store, samples=500, rng=rng())
        assert values(p.predicted) == {2.5}

    def test_filter_matching_no_call_is_an_error(self, sized: ProfileStore) -> None:
        with pytest.raises(ScenarioError, match=r"scenario 'big': size:127\.0\.0\.1:8101\[GET /blobs/\*\]: "
                                                r"no call to resource '127\.0\.0\.1:8101' has an api matching "
                                                r"'GET /blobs/\*'; its apis are: http GET /ad, http GET /blob/\{id\}"):
            predict([blob_service()], parse_scenario("size:127.0.0.1:8101[GET /blobs/*]=1MB", "big"), sized,
                    rng=rng())


class TestInterference:
    def test_cpu_part_stretches(self) -> None:
        # c: 1 ms of which 0.4 CPU; a neighbour busy 50 % of the time: 0.6 + 0.4 / 0.75; latency 3 + that
        (p,) = predict([gather()], "interference:cpu=50", samples=500, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 3.0 + 0.6 + 0.4 / 0.75)

    def test_an_io_calls_own_cpu_stretches_and_its_wait_does_not(self) -> None:
        # a 5 ms query of which 1.2 ms is the client library's work on the loop, then 1 ms of CPU: a neighbour
        # busy 50% of the time makes both CPU parts 1 / 0.75 as long; the 3.8 ms wait stays
        q = replace(io("q", [5.0] * 4, system="postgresql", api="postgresql SELECT posts"), cpu_ms=(1.2,) * 4)
        g = graph("GET /", [q, compute("c", [1.0] * 4, cpu=[1.0] * 4)],
                  [("start", "q"), ("q", "c"), ("c", "end")])
        (p,) = predict([g], "interference:cpu=50", samples=100, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 3.8 + 1.2 / 0.75 + 1.0 / 0.75)
        (source,) = [s for s in p.sources[0][1] if s.node == "q"]
        assert source.source == "model" and "client library's work, 1.2 ms) x 1.33" in source.how
        # 0.4 ms of it was the loop taking in the answer outside any step (hidden_ms): stretched as well
        q2 = replace(q, extra={"hidden_ms": [0.4] * 4})
        g2 = graph("GET /", [q2, compute("c", [1.0] * 4, cpu=[1.0] * 4)], [("start", "q"), ("q", "c"), ("c", "end")])
        (p2,) = predict([g2], "interference:cpu=50", samples=100, rng=rng())
        np.testing.assert_allclose(p2.predicted.samples_ms, 3.4 + 1.6 / 0.75 + 1.0 / 0.75)
        (source,) = [s for s in p2.sources[0][1] if s.node == "q"]
        assert "the loop's work inside its wait, 0.4 ms) x 1.33" in source.how

    def test_without_cpu_time_the_whole_segment_is_cpu(self) -> None:
        g = graph("GET /", [compute("c", [2.0] * 4)], [("start", "c"), ("c", "end")])
        (p,) = predict([g], "interference:cpu=75", samples=100, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 2.0 / (1 - 0.375))

    def test_slowdown_grows_with_the_neighbour(self) -> None:
        factors = [cpu_slowdown(pct) for pct in (0, 10, 50, 90, 99)]
        assert factors[0] == 1.0
        assert all(a < b for a, b in itertools.pairwise(factors))
        assert factors[-1] < 2.0  # a time-shared neighbour never takes more than half the core


def cpu_store(path: Path, extra: dict[float, float]) -> ProfileStore:
    """CPU profiles: per work size W, idle samples W..W+0.1 and loaded ones shifted by ``extra[W]``."""
    from analyzer.interference import cpu_api

    s = ProfileStore(path)
    base = np.linspace(0.0, 0.1, 201)
    for w, shift in extra.items():
        s.add(ProfileKey.make(cpu_api(w), "cpu://h", {}, "cpu_pct", 0.0), w + base)
        s.add(ProfileKey.make(cpu_api(w), "cpu://h", {}, "cpu_pct", 50.0), w + base + shift)
    return s


class TestInterferenceProfiles:
    def test_a_spell_of_work_after_a_call_gains_the_profiled_extra_for_all_of_it(self, tmp_path: Path) -> None:
        # io a (2 ms) -> c (1 ms, all CPU, the loop wakes up for it) -> d (0.5 ms, right after c): one spell of the
        # loop's work, 1.5 ms after a wake-up, which the profiles price at 0.8 + (0.5 / 3) x (2.0 - 0.8) = 1.0
        g = graph("GET /", [io("a", [2.0] * 4), compute("c", [1.0] * 4, [1.0] * 4), compute("d", [0.5] * 4, [0.5] * 4)],
                  [("start", "a"), ("a", "c"), ("c", "d"), ("d", "end")])
        with cpu_store(tmp_path / "p.db", {0.5: 0.3, 1.0: 0.8, 4.0: 2.0}) as s:
            (p,) = predict([g], "interference:cpu=50", s, samples=2000, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 2.0 + 1.5 + 1.0, atol=1e-9)
        how = dict((s.node, s.how) for s in p.sources[0][1])
        assert "each spell of the loop's work" in how["c"] and "each spell" in how["d"]
        assert any("each spell of the simulated loop's work" in n and "cpu 0.5ms" in n for n in p.notes)

    def test_the_loops_work_inside_a_calls_wait_joins_the_spell_that_takes_in_its_answer(self, tmp_path: Path) -> None:
        # as above, but 0.5 ms of a's 2 ms was the loop reading its answer outside any step (hidden_ms): the spell
        # after the wake-up is 0.5 + 1 ms of work, priced 1.0 as before; the read itself stays inside a's 2 ms,
        # so only what the neighbour adds to it is new
        a = replace(io("a", [2.0] * 4), extra={"hidden_ms": [0.5] * 4})
        g = graph("GET /", [a, compute("c", [1.0] * 4, [1.0] * 4)], [("start", "a"), ("a", "c"), ("c", "end")])
        plain = graph("GET /", [io("a", [2.0] * 4), compute("c", [1.0] * 4, [1.0] * 4)],
                      [("start", "a"), ("a", "c"), ("c", "end")])
        with cpu_store(tmp_path / "p.db", {0.5: 0.3, 1.0: 0.8, 4.0: 2.0}) as s:
            (p,) = predict([g], "interference:cpu=50", s, samples=500, rng=rng())
            (q,) = predict([plain], "interference:cpu=50", s, samples=500, rng=rng())
            (same,) = predict([g], "location:redis=+0ms", s, samples=500, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 2.0 + 1.0 + 1.0, atol=1e-9)
        np.testing.assert_allclose(q.predicted.samples_ms, 2.0 + 1.0 + 0.8, atol=1e-9)
        np.testing.assert_allclose(same.predicted.samples_ms, 3.0, atol=1e-9)  # no neighbour: nothing to add
        assert any("hidden_ms" in n for n in p.notes)

    def test_the_wake_up_for_the_requests_arrival_is_not_added(self, tmp_path: Path) -> None:
        # the first step runs when the request arrives: its wake-up came before the server span started, so it
        # gains what the profiles add to its work beyond a wake-up (0.8 - 0.3), though the loop was idle (after
        # the previous request's io call)
        g = graph("GET /", [compute("c", [1.0] * 4, [1.0] * 4), io("a", [2.0] * 4)],
                  [("start", "c"), ("c", "a"), ("a", "end")])
        with cpu_store(tmp_path / "p.db", {0.05: 0.3, 1.0: 0.8}) as s:
            (p,) = predict([g], "interference:cpu=50", s, samples=500, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 1.0 + 0.5 + 2.0, atol=1e-9)

    def test_extra_interpolates_between_work_sizes_and_scales_above(self, tmp_path: Path) -> None:
        def predicted(cpu_ms: float) -> float:
            g = graph("GET /", [io("a", [1.0] * 4), compute("c", [cpu_ms] * 4, [cpu_ms] * 4)],
                      [("start", "a"), ("a", "c"), ("c", "end")])
            with cpu_store(tmp_path / f"p{cpu_ms}.db", {1.0: 0.5, 3.0: 1.5}) as s:
                (p,) = predict([g], "interference:cpu=50", s, samples=500, rng=rng())
            return float(np.mean(p.predicted.samples_ms)) - 1.0 - cpu_ms

        assert predicted(0.2) == pytest.approx(0.5)  # below the smallest size: still woken up
        assert predicted(2.0) == pytest.approx(1.0)  # halfway
        assert predicted(6.0) == pytest.approx(3.0)  # above: in proportion

    def test_work_sizes_are_read_at_the_speed_the_probes_ran(self, tmp_path: Path) -> None:
        # The probes' calibrated 1 and 3 ms of work took 2 and 6 ms with the neighbour paused (a machine running at
        # half speed then): their extras belong to spells of 2 and 6 ms, and the nominal sizes would price a
        # 4 ms spell as 4/3 of the 3 ms extra (2.0 ms) where it lies halfway between the two (1.0)
        from analyzer.interference import cpu_api, stretch_profile

        def slow_store(path: Path) -> ProfileStore:
            s = ProfileStore(path)
            base = np.linspace(0.0, 0.1, 201)
            for w, shift in {1.0: 0.5, 3.0: 1.5}.items():
                s.add(ProfileKey.make(cpu_api(w), "cpu://h", {}, "cpu_pct", 0.0), 2.0 * w + base)
                s.add(ProfileKey.make(cpu_api(w), "cpu://h", {}, "cpu_pct", 50.0), 2.0 * w + base + shift)
            return s

        def predicted(cpu_ms: float) -> float:
            g = graph("GET /", [io("a", [1.0] * 4), compute("c", [cpu_ms] * 4, [cpu_ms] * 4)],
                      [("start", "a"), ("a", "c"), ("c", "end")])
            with slow_store(tmp_path / f"p{cpu_ms}.db") as s:
                (p,) = predict([g], "interference:cpu=50", s, samples=500, rng=rng())
            return float(np.mean(p.predicted.samples_ms)) - 1.0 - cpu_ms

        with slow_store(tmp_path / "s.db") as s:
            profile = stretch_profile(s, 50.0)
        assert profile is not None and profile.work_ms.tolist() == pytest.approx([2.0, 6.0])
        assert "2 ms per calibrated ms" in profile.how
        assert predicted(2.0) == pytest.approx(0.5)
        assert predicted(4.0) == pytest.approx(1.0)
        assert predicted(12.0) == pytest.approx(3.0)

    def test_the_neighbour_stretches_the_background_cpu_too(self, tmp_path: Path) -> None:
        # 3 ms of background CPU per request (other threads, under the GIL): at one user the recording holds what
        # it cost, and a neighbour at 50% adds 3 x (4/3 - 1) = 1 ms of it, queued on the loop with the request's
        # only call, which cannot end before it is served: a 0.5 ms call ends at 1 ms, a 2 ms call is not delayed
        from analyzer.loadsim import with_background

        def predicted(call_ms: float, background_ms: float) -> float:
            g = graph("GET /", [io("a", [call_ms] * 4)], [("start", "a"), ("a", "end")])
            with cpu_store(tmp_path / f"p{call_ms}-{background_ms}.db", {0.05: 0.3, 1.0: 0.8}) as s:
                (p,) = predict(with_background([g], background_ms), "interference:cpu=50", s, samples=200,
                               rng=rng())
            assert any("x 1.33 with the neighbour" in n for n in p.notes) == (background_ms > 0)
            return float(np.median(p.predicted.samples_ms))

        assert predicted(0.5, 0.0) == pytest.approx(0.5)
        assert predicted(0.5, 3.0) == pytest.approx(1.0)
        assert predicted(2.0, 3.0) == pytest.approx(2.0)

    def test_a_spell_takes_the_extra_of_the_sleep_before_it(self, tmp_path: Path) -> None:
        # Probes in two gap classes (mean sleeps 0.1 and 3 ms): the neighbour adds 0.1 ms to 1 ms of work after a
        # short sleep, 0.9 ms after a long one. A step after a 0.1 ms call pays the first, after a 3 ms call the
        # second, after a 1.55 ms call halfway; a store probed before the classes charges every step alike
        from analyzer.interference import cpu_api, stretch_profile

        def store(path: Path, classes: bool) -> ProfileStore:
            s = ProfileStore(path)
            for gap, shift in ({0.1: 0.1, 3.0: 0.9} if classes else {None: 0.5}).items():
                s.add(ProfileKey.make(cpu_api(1.0, gap), "cpu://h", {}, "cpu_pct", 0.0), [1.0] * 200)
                s.add(ProfileKey.make(cpu_api(1.0, gap), "cpu://h", {}, "cpu_pct", 50.0), [1.0 + shift] * 200)
            return s

        def predicted(call_ms: float, classes: bool) -> float:
            g = graph("GET /", [io("a", [call_ms] * 4), compute("c", [1.0] * 4, [1.0] * 4)],
                      [("start", "a"), ("a", "c"), ("c", "end")])
            with store(tmp_path / f"p{call_ms}-{classes}.db", classes) as s:
                (p,) = predict([g], "interference:cpu=50", s, samples=300, rng=rng())
            assert any("after the sleep before it" in n for n in p.notes) == classes
            return float(np.median(p.predicted.samples_ms)) - call_ms - 1.0

        with store(tmp_path / "s.db", True) as s:
            profile = stretch_profile(s, 50.0)
        assert profile is not None and profile.gap_ms.tolist() == [0.1, 3.0] and profile.extra_ms.shape == (2, 1, 200)
        assert predicted(0.1, True) == pytest.approx(0.1, abs=0.01)
        assert predicted(3.0, True) == pytest.approx(0.9, abs=0.01)
        assert predicted(1.55, True) == pytest.approx(0.5, abs=0.02)
        assert predicted(0.1, False) == pytest.approx(predicted(3.0, False), abs=0.01) == pytest.approx(0.5, abs=0.01)

    def test_a_level_between_profiled_levels_interpolates(self, tmp_path: Path) -> None:
        from analyzer.interference import stretch_profile

        with cpu_store(tmp_path / "p.db", {1.0: 0.8}) as s:
            half = stretch_profile(s, 25.0)
            none = stretch_profile(ProfileStore(tmp_path / "empty.db"), 50.0)
        assert half is not None and float(np.mean(half.extra_ms)) == pytest.approx(0.4, abs=0.01)
        assert none is None

    def test_steps_meet_the_neighbour_in_the_phase_of_when_they_start(self, tmp_path: Path) -> None:
        # A wake-up followed by 1 or 2 ms of work waits 2 ms more while the neighbour runs, half the time
        # (quantiles >= 0.5)
        from analyzer.interference import PERIOD_MS, cpu_api

        def bimodal(path: Path) -> ProfileStore:
            st = ProfileStore(path)
            for w in (1.0, 2.0):
                st.add(ProfileKey.make(cpu_api(w), "cpu://h", {}, "cpu_pct", 0.0), [w] * 200)
                st.add(ProfileKey.make(cpu_api(w), "cpu://h", {}, "cpu_pct", 50.0), [w] * 100 + [w + 2.0] * 100)
            return st

        # two steps woken at the same moment (1 ms into the request): one wake-up of the loop serves both, which
        # run one after the other, one spell of 2 ms: delayed together, by one wake-up, or not at all
        together = graph("GET /", [io("a", [1.0] * 4), compute("c1", [1.0] * 4, [1.0] * 4),
                                   io("b", [1.0] * 4), compute("c2", [1.0] * 4, [1.0] * 4)],
                         [("start", "a"), ("a", "c1"), ("c1", "end"), ("start", "b"), ("b", "c2"), ("c2", "end")])
        # two steps half the neighbour's period apart (1 and 6 ms in, recorded): the first meets it at u1 >= 0.5
        # and its 2 ms delay starts the second at 8 ms, 0.7 periods on, so the second meets it at
        # frac(u1 - 0.7): again only for u1 < 0.7; undelayed, the first leaves the second at frac(u1 - 0.5),
        # always in the busy half. Both: P = 0.2, exactly one: 0.8 (recorded start times said: always one)
        apart = graph("GET /", [io("a", [1.0] * 4), compute("c1", [1.0] * 4, [1.0] * 4),
                                io("b", [PERIOD_MS / 2 - 1.0] * 4), compute("c2", [1.0] * 4, [1.0] * 4)],
                      [("start", "a"), ("a", "c1"), ("c1", "b"), ("b", "c2"), ("c2", "end")])
        with bimodal(tmp_path / "p.db") as st:
            (same,) = predict([together], "interference:cpu=50", st, samples=4000, rng=rng())
            (half,) = predict([apart], "interference:cpu=50", st, samples=4000, rng=rng())
        # (the quantile grid's two cells at 0.5 interpolate between the modes: 0.005 ms either way). The change is
        # predicted from the recording (2 ms: its steps overlap, as no real loop runs them), not from the
        # simulated loop's 3 ms
        assert set(np.round(same.predicted.samples_ms, 1)) == {2.0, 4.0}
        slow = float(np.mean(same.predicted.samples_ms > 3.0))
        assert slow == pytest.approx(0.5, abs=0.03)  # a wake-up each, drawn independently: 0.75
        once = 1.0 + 1.0 + PERIOD_MS / 2 - 1.0 + 1.0 + 2.0
        both = half.predicted.samples_ms > once + 1.0
        assert float(np.mean(both)) == pytest.approx(0.2, abs=0.03)
        np.testing.assert_allclose(half.predicted.samples_ms[both], once + 2.0, atol=0.01)
        np.testing.assert_allclose(half.predicted.samples_ms[~both], once, atol=0.01)

    def test_without_cpu_profiles_the_note_says_how_to_make_them(self, tmp_path: Path) -> None:
        with ProfileStore(tmp_path / "p.db") as s:
            (p,) = predict([gather()], "interference:cpu=50", s, samples=100, rng=rng())
        assert any("perfcast profile --cpu" in src.how for src in p.sources[0][1])


class TestMixAndErrors:
    def test_variants_mix_by_request_count(self) -> None:
        fast = graph("GET /", [io("a", [1.0] * 300)], [("start", "a"), ("a", "end")], variant=0)
        slow = graph("GET /", [io("a", [10.0] * 100)], [("start", "a"), ("a", "end")], variant=1)
        (p,) = predict([fast, slow], "location:redis=+0ms", samples=8000, rng=rng())
        share = float(np.mean(p.predicted.samples_ms == 10.0))
        assert 0.22 < share < 0.28
        assert [v for v, _ in p.sources] == [0, 1]

    def test_one_prediction_per_route(self) -> None:
        other = graph("POST /", [io("a", [2.0] * 5)], [("start", "a"), ("a", "end")])
        preds = predict([gather(), other], "location:redis=+1ms", samples=100, rng=rng())
        assert [p.route for p in preds] == ["GET /", "POST /"]
        assert values(preds[1].predicted) == {3.0}

    def test_same_seed_same_answer(self) -> None:
        g = graph("GET /", [io("a", list(np.linspace(1, 9, 50)))], [("start", "a"), ("a", "end")])
        a, b = (predict([g], "location:redis=+1ms", samples=300, rng=rng(7))[0] for _ in range(2))
        np.testing.assert_array_equal(a.predicted.samples_ms, b.predicted.samples_ms)

    def test_unknown_resource(self) -> None:
        with pytest.raises(ScenarioError, match="unknown resource 'mongo'.*postgresql.*redis"):
            predict([gather()], "location:mongo=+1ms", rng=rng())

    def test_cycle(self) -> None:
        g = graph("GET /", [io("a", [1.0]), io("b", [1.0])],
                  [("start", "a"), ("a", "b"), ("b", "a"), ("b", "end")])
        with pytest.raises(GraphError, match="cycle"):
            predict([g], "load:2", rng=rng())

    def test_graph_without_latencies_and_misaligned_samples(self) -> None:
        nodes = [Node("start", NodeKind.START, (0.0,) * 3), io("a", [1.0, 2.0, 3.0]),
                 Node("end", NodeKind.END, (0.0,) * 3)]
        g = CausalGraph("GET /", nodes, [("start", "a"), ("a", "end")])  # no recorded latencies
        (p,) = predict([g], "location:redis=+1ms", samples=300, rng=rng())
        assert values(p.predicted) == {2.0, 3.0, 4.0} and p.observed is None
        bad = CausalGraph("GET /", [*nodes[:2], Node("end", NodeKind.END, (0.0,))], [("start", "a"), ("a", "end")])
        with pytest.raises(GraphError, match="'end' has 1 samples, other nodes 3"):
            predict([bad], "location:redis=+1ms", rng=rng())

    def test_timer_racing_work_takes_its_timeout(self) -> None:
        timer = Node("t", NodeKind.TIMER, (3.0,) * 10, timeout_ms=50.0)  # recorded: the work won after 3 ms
        race = Node("race", NodeKind.SYNC, (0.0,) * 10, wait=WaitMode.ANY)
        g = graph("GET /", [io("a", [3.0] * 10), timer, race],
                  [("start", "a"), ("start", "t"), ("a", "race"), ("t", "race"), ("race", "end")])
        (p,) = predict([g], "location:redis=+100ms", samples=200, rng=rng())
        assert values(p.baseline) == {3.0}
        assert values(p.predicted) == {50.0}


class TestLoad:
    def test_pure_compute_serialises_on_the_loop(self) -> None:
        g = graph("GET /", [compute("c", [2.0] * 10)], [("start", "c"), ("c", "end")])
        for users in (1, 3, 8):
            (p,) = predict([g], f"load:{users}", samples=500, rng=rng())
            np.testing.assert_allclose(p.predicted.samples_ms, 2.0 * users)

    def test_pure_io_is_unchanged(self) -> None:
        g = graph("GET /", [io("a", list(np.linspace(1, 5, 40)))], [("start", "a"), ("a", "end")])
        (p,) = predict([g], "load:50", samples=2000, rng=rng())
        assert values(p.predicted) <= values(p.baseline)
        assert abs(p.predicted.p50 - p.baseline.p50) < 0.3

    def test_pool_queues_calls(self) -> None:
        g = graph("GET /", [io("a", [1.0] * 10)], [("start", "a"), ("a", "end")])
        (p,) = predict([g], "load:4?pool.redis=1", samples=400, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 4.0)
        (p,) = predict([g], "load:4?pool.redis=2", samples=400, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 2.0)

    def test_other_changes_apply_under_load(self) -> None:
        g = graph("GET /", [compute("c", [2.0] * 10), io("a", [1.0] * 10)],
                  [("start", "c"), ("c", "a"), ("a", "end")])
        (p,) = predict([g], "load:1; interference:cpu=50; location:redis=+4ms", samples=200, rng=rng())
        np.testing.assert_allclose(p.predicted.samples_ms, 2.0 / 0.75 + 5.0)

    def test_think_time_lowers_contention(self) -> None:
        g = graph("GET /", [compute("c", [1.0] * 10)], [("start", "c"), ("c", "end")])
        (busy,) = predict([g], "load:4", samples=400, rng=rng())
        (idle,) = predict([g], "load:4?think=100ms", samples=400, rng=rng())
        assert idle.predicted.p50 < busy.predicted.p50

    def test_front_end_failure_doubles_the_load(self) -> None:
        g = graph("GET /", [compute("c", [1.0] * 10)], [("start", "c"), ("c", "end")])
        (two,) = predict([g], "load:6?replicas=2", samples=300, rng=rng())
        (one,) = predict([g], "load:6?replicas=2; failure:app", samples=300, rng=rng())
        np.testing.assert_allclose(two.predicted.samples_ms, 3.0)
        np.testing.assert_allclose(one.predicted.samples_ms, 6.0)
        assert any("1 of 2 front ends" in note for note in one.notes)
        (assumed,) = predict([g], "load:6; failure:app", samples=300, rng=rng())  # 2 replicas assumed
        np.testing.assert_allclose(assumed.predicted.samples_ms, 6.0)
        assert any("2 assumed" in note for note in assumed.notes)

    def test_concurrency_profile_under_load(self, store: ProfileStore) -> None:
        for level, ms in ((1, 1.0), (4, 4.0)):
            store.add(ProfileKey.make("redis GET", REDIS, param="concurrency", value=level), [ms] * 10)
        g = graph("GET /", [io("a", [1.0] * 10)], [("start", "a"), ("a", "end")])
        (alone,) = predict([g], "load:1", store, samples=300, rng=rng())
        (busy,) = predict([g], "load:4", store, samples=300, rng=rng())
        np.testing.assert_allclose(alone.predicted.samples_ms, 1.0)
        assert 1.5 < busy.predicted.mean <= 4.0 + 1e-9
        assert any("concurrency profile" in note for note in busy.notes)

    def test_a_fan_out_keeps_the_concurrency_it_was_recorded_at(self, store: ProfileStore) -> None:
        for level, ms in ((1, 1.0), (2, 2.0), (4, 4.0)):
            store.add(ProfileKey.make("redis GET", REDIS, param="concurrency", value=level), [ms] * 10)
        edges = [("start", "a"), ("start", "b"), ("a", "end"), ("b", "end")]
        # two parallel calls of 2 ms, each recorded with the other in flight: one user per loop is the load they
        # were recorded at, so they keep their durations (lone calls, without inflight, too)
        recorded = [replace(io(name, [2.0] * 10), extra={"inflight": [2] * 10}) for name in ("a", "b")]
        lone = [io(name, [2.0] * 10) for name in ("a", "b")]
        for calls in (recorded, lone):
            (alone,) = predict([graph("GET /", calls, edges)], "load:1", store, samples=300, rng=rng())
            np.testing.assert_allclose(alone.predicted.samples_ms, 2.0)
        # two users: up to 4 in flight, Q_4 - Q_2 = +2 ms for a call that meets them all
        (busy,) = predict([graph("GET /", recorded, edges)], "load:2", store, samples=300, rng=rng())
        assert 2.0 < busy.predicted.mean <= 4.0 + 1e-9
        # taken for lone calls (no inflight), the same calls are shifted from Q_1: further
        (shifted,) = predict([graph("GET /", lone, edges)], "load:2", store, samples=300, rng=rng())
        assert shifted.predicted.mean > busy.predicted.mean + 0.5

    def test_backend_failure_needs_a_concurrency_profile(self, store: ProfileStore) -> None:
        g = graph("GET /", [io("a", [1.0] * 10)], [("start", "a"), ("a", "end")])
        with pytest.raises(ProfileError, match="failure:redis changes nothing"):
            predict([g], "load:4; failure:redis", store, rng=rng())
        for level, ms in ((1, 1.0), (2, 2.0), (4, 4.0)):
            store.add(ProfileKey.make("redis GET", REDIS, param="concurrency", value=level), [ms] * 10)
        (healthy,) = predict([g], "load:4?think=1ms", store, samples=500, rng=rng())
        (failed,) = predict([g], "load:4?think=1ms; failure:redis?replicas=2", store, samples=500, rng=rng())
        # the survivor of two carries twice the calls: every level doubles
        assert failed.predicted.mean > healthy.predicted.mean
        assert any("1 of 2 replicas of 'redis'" in note for note in failed.notes)


class TestNested:
    """Route GET /a calls GET /b over HTTP; both were traced, so the graphs hold both routes."""

    @staticmethod
    def graphs() -> list[CausalGraph]:
        call = Node("call", NodeKind.IO, (3.0,) * 10, api="http GET /b", resource="http://127.0.0.1:8080",
                    system="http", round_trips=(1,) * 10)
        a = graph("GET /a", [compute("ca", [1.0] * 10), call], [("start", "ca"), ("ca", "call"), ("call", "end")])
        b = CausalGraph("GET /b", [Node("start", NodeKind.START, (0.0,) * 10), compute("cb", [2.0] * 10),
                                   Node("end", NodeKind.END, (0.0,) * 10)],
                        [("start", "cb"), ("cb", "end")], latency_ms=[2.0] * 10)
        return [a, b]

    def test_one_user_keeps_the_recorded_call(self) -> None:
        # the call = the sub-request (2 ms) + its client side (3 - 2 ms): GET /a takes 1 + 3 as recorded
        a, b = predict(self.graphs(), "load:1", samples=300, rng=rng())
        np.testing.assert_allclose(a.predicted.samples_ms, 4.0)
        np.testing.assert_allclose(b.predicted.samples_ms, 2.0)
        assert any("users issue GET /a" in note for note in a.notes)

    def test_sub_requests_share_the_loop(self) -> None:
        # one loop serves 1 + 2 ms per user request: 3 users saturate it, 3 x 3 ms each
        a, _ = predict(self.graphs(), "load:3", samples=600, rng=rng())
        assert 8.5 <= a.predicted.p50 <= 9.5
        # the called service on its own loop: its 2 ms is the bottleneck, 3 x 2 ms
        a, _ = predict(self.graphs(), "load:3?nested=separate", samples=600, rng=rng())
        assert 5.5 <= a.predicted.p50 <= 6.5

    def test_off_issues_every_route(self) -> None:
        a, b = predict(self.graphs(), "load:1?nested=off", samples=600, rng=rng())
        np.testing.assert_allclose(a.predicted.samples_ms, 4.0)
        assert not any("nested" in note for note in a.notes)
        assert b.predicted.count > 100  # users issue GET /b themselves


def test_load_mixes_variants_by_request_count() -> None:
    fast = graph("GET /", [compute("c", [1.0] * 300)], [("start", "c"), ("c", "end")], variant=0)
    slow = graph("GET /", [compute("c", [10.0] * 100)], [("start", "c"), ("c", "end")], variant=1)
    (p,) = predict([fast, slow], "load:1", samples=4000, rng=rng())
    for dist in (p.predicted, p.baseline):
        share = float(np.mean(dist.samples_ms == 10.0))
        assert 0.21 < share < 0.29


def test_observed_pool_makes_slower_calls_queue_for_connections() -> None:
    # four 10 ms queries in parallel through a pool of 2 seen in the spans: +10 ms per round trip costs each
    # wave 10 ms, and the two waves queue, so the request gains 20 ms, not the 10 ms of unlimited parallelism
    from analyzer.graph import CausalGraph, Node, NodeKind

    pg = "postgresql://127.0.0.1:5432/test"
    n = 50
    nodes = [Node("start", NodeKind.START, (0.0,) * n), Node("c0", NodeKind.COMPUTE, (0.01,) * n, cpu_ms=(0.01,) * n)]
    edges = [("start", "c0")]
    for i in range(4):
        nodes.append(Node(f"q{i}", NodeKind.IO, (10.0,) * n, api="postgresql SELECT t", resource=pg,
                          system="postgresql", round_trips=(1,) * n))
        edges += [("c0", f"q{i}"), (f"q{i}", "join")]
    nodes += [Node("join", NodeKind.SYNC, (0.0,) * n), Node("end", NodeKind.END, (0.0,) * n)]
    edges.append(("join", "end"))
    free = CausalGraph("GET /", nodes, edges, latency_ms=(20.0,) * n)
    pooled = CausalGraph("GET /", nodes, edges, latency_ms=(20.0,) * n, meta={"pools": {pg: 2}})
    [a] = predict([free], "location:postgresql=+10ms", samples=200, rng=np.random.default_rng(1))
    [b] = predict([pooled], "location:postgresql=+10ms", samples=200, rng=np.random.default_rng(1))
    # (the recording's four parallel queries took 10 ms even through the pool: the change is what counts)
    assert a.predicted.p50 - a.baseline.p50 == pytest.approx(10.0, abs=0.1)
    assert b.predicted.p50 - b.baseline.p50 == pytest.approx(20.0, abs=0.5)
    assert any("at most 2 calls in flight" in note for note in b.notes)
