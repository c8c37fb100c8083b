"""The load simulation's CPU model, on cases with answers by hand.

A closed loop of N users with no think time over one FIFO CPU server of demand D per request and a delay Z
(the overlappable rest) has, with deterministic times, latency ``max(D + Z, N D)``: once ``N D`` exceeds
``D + Z`` the server is never idle and each request waits for the N - 1 others' demand.
"""

from __future__ import annotations

import re
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from spanfactory import Trace, write

from analyzer.build import build_graphs
from analyzer.graph import CausalGraph, Node, NodeKind, dump_graphs, load_graphs
from analyzer.distribution import compile_dag
from analyzer.errors import GraphError
from analyzer.loadsim import (
    BACKGROUND_KEY,
    CLIENT_KEY,
    CPU_SCALE_KEY,
    LEVELS_KEY,
    OTHERS_KEY,
    OTHERS_LEVELS_KEY,
    WAIT_SCALE_KEY,
    WAKE_COST_KEY,
    MeasuredLevels,
    Queueing,
    _background,
    _WakeCost,
    _scaled_wait,
    background_demand,
    calibrate,
    fit_wait_scale,
    fit_wake_cost,
    simulate_scenario,
    with_background,
    with_wake_cost,
)
from analyzer.predict import _with_observed_pools, node_durations, predict
from analyzer.scenario import parse_scenario
from analyzer.spans import read_spans


def rng() -> np.random.Generator:
    return np.random.default_rng(7)


def chain(route: str, *nodes: Node, count: int = 20) -> CausalGraph:
    ids = ["start", *(n.id for n in nodes), "end"]
    everything = [Node("start", NodeKind.START, (0.0,) * count), *nodes, Node("end", NodeKind.END, (0.0,) * count)]
    return CausalGraph(route, everything, list(pairwise(ids)), latency_ms=[1.0] * count)


def compute(node_id: str, ms: float, count: int = 20) -> Node:
    return Node(node_id, NodeKind.COMPUTE, (ms,) * count, cpu_ms=(ms,) * count)


def wake(node_id: str, ms: float, count: int = 20) -> Node:
    """A wake-up: a task's wait on a future another task sets (no CPU, no other process)."""
    return Node(node_id, NodeKind.WAIT, (ms,) * count)


def io(node_id: str, ms: float, cpu: float = 0.0, before: float | None = None, count: int = 20) -> Node:
    extra = {"cpu_before_ms": [before] * count} if before is not None else {}
    return Node(node_id, NodeKind.IO, (ms,) * count, api="redis GET", resource="redis://h:1/0", system="redis",
                cpu_ms=(cpu,) * count if cpu else (), round_trips=(1,) * count, extra=extra)


def mean_latency(graphs: list[CausalGraph], spec: str) -> float:
    (p,) = predict(graphs, spec, samples=600, rng=rng())
    return p.predicted.mean


def simulated_mean(graphs: list[CausalGraph], spec: str) -> float:
    """The simulated loop's own mean latency under ``spec``: the simulation's mechanics, without the change
    taken against the recording that :func:`predict` makes at the recorded load (one user)."""
    scenario, _ = _with_observed_pools(parse_scenario(spec), graphs)
    r = rng()
    models = [node_durations(g, scenario, graphs, None, 600, r) for g in graphs]
    latencies, _ = simulate_scenario(graphs, models, scenario, None, 600, r)
    return float(np.mean(np.concatenate(latencies)))


class TestCpuModel:
    def test_pure_compute_queues(self) -> None:
        g = chain("GET /", compute("c", 2.0))
        assert mean_latency([g], "load:1") == pytest.approx(2.0)
        assert mean_latency([g], "load:8") == pytest.approx(16.0, rel=0.01)

    def test_pure_io_without_cpu_overlaps(self) -> None:
        g = chain("GET /", io("a", 10.0))
        assert mean_latency([g], "load:16") == pytest.approx(10.0)

    def test_mixed_compute_and_io(self) -> None:
        g = chain("GET /", compute("c", 1.0), io("a", 5.0))
        assert mean_latency([g], "load:3") == pytest.approx(6.0, rel=0.01)  # 3 x 1 < 6: no wait in steady state
        assert mean_latency([g], "load:12") == pytest.approx(12.0, rel=0.01)  # 12 x 1 > 6: the loop saturates

    def test_a_sync_nodes_recorded_queueing_is_not_queued_again(self) -> None:
        # two branches of 1 ms compute joined by a gather whose recorded 1.1 ms wake-up was 1 ms behind the other
        # branch: the simulated loop serves the branches one after the other and the join costs its 0.1 ms
        def graph(extra: dict[str, list[float]]) -> CausalGraph:
            nodes = [Node("start", NodeKind.START, (0.0,) * 20), compute("a", 1.0), compute("b", 1.0),
                     Node("join", NodeKind.SYNC, (1.1,) * 20, extra=extra), Node("end", NodeKind.END, (0.0,) * 20)]
            edges = [("start", "a"), ("start", "b"), ("a", "join"), ("b", "join"), ("join", "end")]
            return CausalGraph("GET /", nodes, edges, latency_ms=[2.1] * 20)

        assert simulated_mean([graph({"queued_ms": [1.0] * 20})], "load:1") == pytest.approx(2.1)
        assert simulated_mean([graph({})], "load:1") == pytest.approx(3.1)  # kept, the queueing counts twice

    def test_at_one_user_the_change_is_taken_against_the_recording(self) -> None:
        # two calls in parallel, each followed by a 1 ms step: the recording says 2 ms (its steps overlap, which
        # no single loop does), the simulated loop serves the steps one after the other (3 ms). At the recorded
        # load the prediction is the recording plus what the scenario adds to the simulated recording
        nodes = [Node("start", NodeKind.START, (0.0,) * 20), io("a", 1.0), compute("c1", 1.0), io("b", 1.0),
                 compute("c2", 1.0), Node("end", NodeKind.END, (0.0,) * 20)]
        edges = [("start", "a"), ("a", "c1"), ("c1", "end"), ("start", "b"), ("b", "c2"), ("c2", "end")]
        g = CausalGraph("GET /", nodes, edges, latency_ms=[2.0] * 20)
        assert simulated_mean([g], "load:1") == pytest.approx(3.0)
        assert mean_latency([g], "load:1") == pytest.approx(2.0)  # nothing changed: the recording
        assert simulated_mean([g], "load:1; location:redis=+5ms") == pytest.approx(8.0)
        assert mean_latency([g], "load:1; location:redis=+5ms") == pytest.approx(7.0)
        (p,) = predict([g], "load:1", samples=50, rng=rng())
        assert any("simulated recording came out +1.000 ms from" in note for note in p.notes)
        # under load the simulation is the prediction: no recording was made at that load
        assert mean_latency([g], "load:2") == pytest.approx(simulated_mean([g], "load:2"))

    def test_half_an_answers_recorded_wait_for_the_loop_is_taken_out(self) -> None:
        # a call of 1 ms when its answer found the loop free, 3 ms when the loop ran 2 ms of other steps before
        # it resumed: the answer came at some point of those 2 ms, 1 ms before the end expected; the simulated
        # loop (free here) queues it again as it finds it, so the call takes 2 ms
        a = Node("a", NodeKind.IO, (1.0, 3.0) * 10, api="redis GET", resource="redis://h:1/0", system="redis",
                 round_trips=(1,) * 20, extra={"queued_ms": [0.0, 2.0] * 10})
        g = chain("GET /", a)
        assert simulated_mean([g], "load:1") == pytest.approx(1.5, rel=0.05)
        # a farther resource's answer comes 10 ms later, after that work: the rest of the wait absorbs the first
        # 1 ms of the delay, and the call takes 11 ms either way
        assert simulated_mean([g], "location:redis=+10ms") == pytest.approx(11.0, rel=0.01)
        # predicted as a change to the recording: nothing added, nothing changes
        assert mean_latency([g], "location:redis=+0ms") == pytest.approx(2.0, rel=0.02)
        # calibrated to a light run, whose wait scale holds it: kept
        g.meta[WAIT_SCALE_KEY] = 1.0
        assert simulated_mean([g], "load:1") == pytest.approx(2.0, rel=0.05)

    def test_an_answers_known_wait_for_the_loop_is_taken_out_whole(self) -> None:
        # as above, but the collector timed the answer's read: 1 ms of the 2 came after it, for certain, and the
        # answer came in the middle of the 1 ms before (expected 0.5): 1.5 ms taken out of the 3 ms call
        def mean_with(answered: list[float]) -> float:
            a = Node("a", NodeKind.IO, (1.0, 3.0) * 10, api="redis GET", resource="redis://h:1/0", system="redis",
                     round_trips=(1,) * 20, extra={"queued_ms": [0.0, 2.0] * 10, "answered_ms": answered * 10})
            return simulated_mean([chain("GET /", a)], "load:1")

        assert mean_with([0.0, 1.0]) == pytest.approx((1.0 + 1.5) / 2, rel=0.05)
        assert mean_with([0.0, 2.0]) == pytest.approx(1.0, rel=0.05)  # all of it after the read

    def test_io_cpu_holds_the_loop(self) -> None:
        # a 10 ms call of which 2 ms are the client library's CPU on the loop: D = 2, Z = 8
        g = chain("GET /", io("a", 10.0, cpu=2.0, before=0.5))
        assert mean_latency([g], "load:1") == pytest.approx(10.0)  # unloaded: as recorded
        assert mean_latency([g], "load:10") == pytest.approx(20.0, rel=0.01)
        assert mean_latency([chain("GET /", io("a", 10.0))], "load:10") == pytest.approx(10.0)

    def test_a_calls_cpu_runs_with_the_steps_of_its_task(self) -> None:
        # a gather of two tasks: t1's first step (0.1 ms) makes a 10 ms call whose client spends 0.5 ms before its
        # wait and 0.5 after, and its next step (0.2 ms) takes in the answer; t2's first step takes 2 ms. The
        # call's write is part of t1's first step, so its wait starts at 0.6 ms, not behind t2's step (at 2.6)
        def graph(same_task: bool) -> CausalGraph:
            t = "t1" if same_task else "other"
            nodes = [Node("start", NodeKind.START, (0.0,) * 20), replace(compute("s1", 0.1), task="t1"),
                     replace(io("q", 10.0, cpu=1.0, before=0.5), task=t), replace(compute("c1", 0.2), task="t1"),
                     replace(compute("s2", 2.0), task="t2"), Node("end", NodeKind.END, (0.0,) * 20)]
            edges = [("start", "s1"), ("s1", "q"), ("q", "c1"), ("c1", "end"), ("start", "s2"), ("s2", "end")]
            return CausalGraph("GET /", nodes, edges, latency_ms=[10.3] * 20)

        # 0.6 + 9 ms of wait + 0.5 + 0.2
        assert simulated_mean([graph(True)], "load:1") == pytest.approx(10.3)
        # a call the graph does not tie to the task's steps queues its CPU on its own: 2.6 + 9 + 0.5 + 0.2
        assert simulated_mean([graph(False)], "load:1") == pytest.approx(12.3)
        (p,) = predict([graph(True)], "load:1", samples=50, rng=rng())
        assert any("1 io calls' CPU before or after their wait runs in one turn" in n for n in p.notes)

    def test_the_read_callbacks_hold_the_loop_when_the_answer_comes(self) -> None:
        # two parallel 2 ms calls whose answers each took 1 ms of the loop's read callbacks (hidden_ms) and a
        # 0.1 ms step after them: at one user the answers come at 1 ms, the second's callbacks wait for the
        # first's, and its call ends at 3 ms; the steps follow (3.2). Left inside the waits, both calls ended at 2
        def call(node_id: str, task: str) -> Node:
            return replace(io(node_id, 2.0), task=task, extra={"hidden_ms": [1.0] * 20})

        nodes = [Node("start", NodeKind.START, (0.0,) * 20), call("a", "ta"), replace(compute("ca", 0.1), task="ta"),
                 call("b", "tb"), replace(compute("cb", 0.1), task="tb"), Node("end", NodeKind.END, (0.0,) * 20)]
        edges = [("start", "a"), ("a", "ca"), ("ca", "end"), ("start", "b"), ("b", "cb"), ("cb", "end")]
        g = CausalGraph("GET /", nodes, edges, latency_ms=[2.2] * 20)
        assert simulated_mean([g], "load:1") == pytest.approx(3.2)
        (p,) = predict([g], "load:1", samples=50, rng=rng())
        assert any("hidden_ms) holds the loop when their answer comes in" in n for n in p.notes)
        # under load too: two users' requests each hold the loop for 2.2 ms, so it is never idle and a request
        # takes at least both users' demand (inside the waits, the callbacks would let the requests overlap: 2.2)
        assert simulated_mean([g], "load:2") >= 2 * 2.2
        # they are the process's CPU on the loop, not its background: 1 + 1 ms a request, of the 3 measured
        assert background_demand([g], [g], 3.0).background_ms == pytest.approx(3.0 - 2.2)

    def test_read_callbacks_are_not_background_but_queue_with_it_under_a_neighbour(self) -> None:
        # 1 ms of read callbacks on the one call, 2 ms of background beside them: under load the simulation
        # serves the callbacks on the loop, so the background is queued as given
        g = with_background([chain("GET /", replace(io("a", 5.0), extra={"hidden_ms": [1.0] * 20}))], 2.0)
        plans = [compile_dag(x) for x in g]
        call = plans[0].ids.index("a")
        served, _ = _background(g, plans, [1.0], 2, served_hidden=True)
        assert served[0][call] == pytest.approx(2.0)
        # under a CPU neighbour they stay in the waits: the background's stretch is of them too (1 + 2 ms)
        stretched, _ = _background(g, plans, [1.0], 1, 1.5)
        assert stretched[0][call] == pytest.approx(3.0 * 0.5)
        # graphs without a background queue nothing for them
        bare = [chain("GET /", replace(io("a", 5.0), extra={"hidden_ms": [1.0] * 20}))]
        none, _ = _background(bare, plans, [1.0], 2, 1.5)
        assert none[0][call] == 0.0
        # a light run's calibration and a collected run's process spans split the process's CPU alike: the
        # callbacks are recorded loop work, not background
        calibrated = with_background(g, background_demand(g, g, 4.0))
        assert calibrated[0].meta[BACKGROUND_KEY] == pytest.approx(4.0 - 1.0)

    def test_io_cpu_split_defaults_to_halves(self) -> None:
        g = chain("GET /", io("a", 10.0, cpu=2.0))
        assert mean_latency([g], "load:1") == pytest.approx(10.0)
        assert mean_latency([g], "load:10") == pytest.approx(20.0, rel=0.01)

    def test_io_cpu_never_exceeds_the_call(self) -> None:
        g = chain("GET /", io("a", 1.0, cpu=3.0))  # inconsistent record: the CPU is capped at the call's time
        assert mean_latency([g], "load:1") == pytest.approx(1.0)
        assert mean_latency([g], "load:4") == pytest.approx(4.0, rel=0.01)

    def test_background_cpu_contends_but_is_off_the_path(self) -> None:
        # 2 ms of unrecorded CPU per request, on one 10 ms call: unloaded latency unchanged, saturated N x 2
        graphs = with_background([chain("GET /", io("a", 10.0))], 2.0)
        assert mean_latency(graphs, "load:1") == pytest.approx(10.0)
        assert mean_latency(graphs, "load:10") == pytest.approx(20.0, rel=0.01)
        (p,) = predict(graphs, "load:10", samples=100, rng=rng())
        assert any("background CPU 2 ms per request" in n for n in p.notes)

    def test_background_adds_to_recorded_compute(self) -> None:
        # D = 1 (compute) + 1 (background) with Z = 5: saturated at 12 users, 24 ms
        graphs = with_background([chain("GET /", compute("c", 1.0), io("a", 5.0))], 1.0)
        assert mean_latency(graphs, "load:12") == pytest.approx(24.0, rel=0.01)

    def test_background_without_io_follows_the_request(self) -> None:
        graphs = with_background([chain("GET /", compute("c", 1.0))], 1.0)
        # held when the request ends: the next request finds the loop busy (6 users: D = 2, 12 ms)
        assert mean_latency(graphs, "load:2") == pytest.approx(4.0, rel=0.01)
        assert mean_latency(graphs, "load:6") == pytest.approx(12.0, rel=0.01)

    def test_background_is_not_queued_again_at_the_recorded_load(self) -> None:
        # three parallel 1 ms calls after 1 ms of compute, 3 ms of background per request (1 ms per call): queued,
        # the calls could not end before their shares were served, at 2, 3 and 4 ms. One user is the load the
        # durations were recorded at, which holds the background's effect already: 2 ms as recorded
        g = CausalGraph("GET /", [Node("start", NodeKind.START, (0.0,) * 20), compute("c", 1.0), io("a", 1.0),
                                  io("b", 1.0), io("d", 1.0), Node("end", NodeKind.END, (0.0,) * 20)],
                        [("start", "c"), ("c", "a"), ("c", "b"), ("c", "d"), ("a", "end"), ("b", "end"),
                         ("d", "end")], latency_ms=[2.0] * 20)
        graphs = with_background([g], 3.0)
        assert mean_latency(graphs, "load:1") == pytest.approx(2.0)
        (p,) = predict(graphs, "load:1", samples=100, rng=rng())
        assert any("not queued at one user" in n for n in p.notes)
        # two users: 1 + 3 ms of loop per request, and the calls wait for their shares (saturated: 2 x 4 ms)
        assert mean_latency(graphs, "load:2") == pytest.approx(8.0, rel=0.01)

    def test_a_fire_and_forget_tasks_work_is_not_queued_again_at_the_recorded_load(self) -> None:
        # GET / answers after 1 ms of compute and leaves a task behind: a 0.2 ms call, then 2 ms of compute,
        # which runs while the next request (GET /x, 1 ms of compute) runs. The next request's recorded 1 ms
        # holds what that cost it when recorded: one user does not queue it again
        count = 20
        g = CausalGraph("GET /", [Node("start", NodeKind.START, (0.0,) * count), compute("c", 1.0),
                                  io("t1", 0.2), compute("t2", 2.0), Node("end", NodeKind.END, (0.0,) * count)],
                        [("start", "c"), ("c", "end"), ("c", "t1"), ("t1", "t2")], latency_ms=[1.0] * count)
        other = chain("GET /x", compute("x", 1.0))
        preds = {p.route: p for p in predict([g, other], "load:1", samples=2000, rng=rng())}
        np.testing.assert_allclose(preds["GET /x"].predicted.samples_ms, 1.0)
        np.testing.assert_allclose(preds["GET /"].predicted.samples_ms, 1.0)
        # two users: the task's 2 ms hold the loop as the other user's work does (2 + 1 + 1 ms per pair of
        # requests on average, where without it 1 + 1)
        preds = {p.route: p for p in predict([g, other], "load:2", samples=2000, rng=rng())}
        assert preds["GET /x"].predicted.mean > 2.2

    def test_background_spread_over_calls_of_each_route(self) -> None:
        # one route with 3 calls, one with 1, equal shares: 2 calls per request on average, 1 ms per call
        three = chain("GET /a", io("x", 10.0), io("y", 10.0), io("z", 10.0))
        one = chain("GET /b", io("x", 10.0))
        graphs = with_background([three, one], 2.0)
        (a, b) = predict(graphs, "load:40", samples=2000, rng=rng())
        # saturated: throughput 1 / 2 ms; /a holds 3 of every 4 ms of demand
        assert a.predicted.mean > b.predicted.mean
        assert 40 / (0.5 * a.predicted.mean + 0.5 * b.predicted.mean) == pytest.approx(0.5, rel=0.03)


    def test_pooled_connection_returns_after_the_callers_next_step(self) -> None:
        # a 10 ms call through a pool of one connection, then 5 ms of compute in the same task, 2 users: the
        # connection goes back when that step ends (15 ms held per request), so a request takes 2 x 15 ms; were
        # it returned with the answer, 10 ms held per request would give 2 x 10 ms
        g = chain("GET /", io("a", 10.0), compute("c", 5.0))
        assert mean_latency([g], "load:2?pool.redis=1") == pytest.approx(30.0, rel=0.01)
        (p,) = predict([g], "load:2?pool.redis=1", samples=100, rng=rng())
        assert any("next step ends" in n for n in p.notes)

    def test_the_note_says_where_the_requests_waited(self) -> None:
        # as above: each request holds the one connection 15 ms and waits 15 ms for the other's; the loop serves
        # the two 5 ms steps one after the other without a wait, busy 5 ms in every 15
        g = chain("GET /", io("a", 10.0), compute("c", 5.0))
        (p,) = predict([g], "load:2?pool.redis=1", samples=400, rng=rng())
        (note,) = [n for n in p.notes if n.startswith("queueing per request")]
        found = re.search(r"GET / \(mean ([\d.]+) ms\) ([\d.e-]+) ms for the loop, ([\d.]+) ms for a pooled "
                          r"connection over 1 call; the loop (\d+)% busy", note)
        assert found is not None, note
        mean, loop, pool, busy = (float(x) for x in found.groups())
        assert mean == pytest.approx(30.0, rel=0.01)
        assert loop == pytest.approx(0.0, abs=0.01)
        assert pool == pytest.approx(15.0, rel=0.01)
        assert busy == pytest.approx(33.0, abs=1.0)
        # a saturated loop instead: three users of 2 ms of compute each wait for the two others' 4 ms
        (q,) = predict([chain("GET /", compute("c", 2.0))], "load:3", samples=400, rng=rng())
        (note,) = [n for n in q.notes if n.startswith("queueing per request")]
        assert "pooled" not in note and "the loop 100% busy" in note
        assert re.search(r"\(mean 6 ms\) 4 ms for the loop", note), note
        # at one user nothing queues: no note
        (one,) = predict([g], "load:1", samples=100, rng=rng())
        assert not any(n.startswith("queueing per request") for n in one.notes)

    def test_another_tasks_step_does_not_hold_the_connection(self) -> None:
        g = chain("GET /", io("a", 10.0), Node("c", NodeKind.COMPUTE, (5.0,) * 20, task="other", cpu_ms=(5.0,) * 20))
        assert mean_latency([g], "load:2?pool.redis=1") == pytest.approx(20.0, rel=0.01)

    def test_a_woken_waiter_can_be_overtaken(self) -> None:
        # One request, a pool of one connection (redis), three tasks after c0 (1 ms):
        #   t1: pooled call 3 ms [1, 4], then a1 (2 ms) holds the connection until 6
        #   t2: http 1 ms, b1 1 ms [2, 3], asks at 3 and waits
        #   t3: http 3.5 ms, d1 1 ms queued behind a1 [6, 7], then asks
        # At 6 the connection goes back and t2 is woken, but its step runs after the loop's queued work, at 7;
        # d1 ends at 7 first and t3 takes the connection (asyncio.Queue: asyncpg's pool). t2 queues again and
        # gets it at 8, when t3's 1 ms call and its 0 ms step are done: the request ends at 9. Handed over to
        # t2 at 6 (first come, first served), it would have ended at 8.
        def node(node_id: str, kind: NodeKind, ms: float, task: str, pooled: bool = False) -> Node:
            extra = {"api": "redis GET", "resource": "redis://h:1/0", "system": "redis"} if pooled else {
                "api": "http GET /x", "resource": "http://h:2", "system": "http"} if kind is NodeKind.IO else {}
            return Node(node_id, kind, (ms,) * 20, task=task, cpu_ms=(ms,) * 20 if kind is NodeKind.COMPUTE else (),
                        **extra)

        nodes = [Node("start", NodeKind.START, (0.0,) * 20), node("c0", NodeKind.COMPUTE, 1.0, "root"),
                 node("p1", NodeKind.IO, 3.0, "t1", True), node("a1", NodeKind.COMPUTE, 2.0, "t1"),
                 node("h2", NodeKind.IO, 1.0, "t2"), node("b1", NodeKind.COMPUTE, 1.0, "t2"),
                 node("p2", NodeKind.IO, 1.0, "t2", True), node("b2", NodeKind.COMPUTE, 0.0, "t2"),
                 node("h3", NodeKind.IO, 3.5, "t3"), node("d1", NodeKind.COMPUTE, 1.0, "t3"),
                 node("p3", NodeKind.IO, 1.0, "t3", True), node("d2", NodeKind.COMPUTE, 0.0, "t3"),
                 Node("end", NodeKind.END, (0.0,) * 20)]
        edges = [("start", "c0"), ("c0", "p1"), ("p1", "a1"), ("a1", "end"), ("c0", "h2"), ("h2", "b1"),
                 ("b1", "p2"), ("p2", "b2"), ("b2", "end"), ("c0", "h3"), ("h3", "d1"), ("d1", "p3"),
                 ("p3", "d2"), ("d2", "end")]
        g = CausalGraph("GET /", nodes, edges, latency_ms=[9.0] * 20)
        assert simulated_mean([g], "load:1?pool.redis=1") == pytest.approx(9.0)
        # two connections: t2 gets one at 3 (b2 waits behind a1, to 6), t3 the other at 7: p3 [7, 8], end at 8
        assert simulated_mean([g], "load:1?pool.redis=2") == pytest.approx(8.0)

    def test_a_shielded_release_keeps_the_connection_and_its_reset_takes_none(self) -> None:
        # asyncpg's pool.fetch: the query (p1, 2 ms), the caller's step (c1, 1 ms) then, shielded, the release
        # resetting the connection with a query of its own (s0 0.5, reset 1 ms, s1 0.5), awaited by the caller
        # (sync). Another task (h 2.5 ms, t1 0.5) wants the one connection at 4.5. The connection is held from 1
        # to the end of the release at 6.5 and the reset uses it; the other task gets it at 6.5, its call ends
        # at 7.5 with c2: the request ends at 7.5. (Returned at c1's end, the other task would have taken it at
        # 4.5 and the reset would have waited for it until 5.5: 8 ms.)
        def node(node_id: str, kind: NodeKind, ms: float, task: str, pooled: bool = False) -> Node:
            extra = {"api": "postgresql SELECT", "resource": "postgresql://h:1/db", "system": "postgresql"} \
                if pooled else {"api": "http GET /x", "resource": "http://h:2", "system": "http"} \
                if kind is NodeKind.IO else {}
            return Node(node_id, kind, (ms,) * 20, task=task, cpu_ms=(ms,) * 20 if kind is NodeKind.COMPUTE else (),
                        **extra)

        nodes = [Node("start", NodeKind.START, (0.0,) * 20), node("c0", NodeKind.COMPUTE, 1.0, "root"),
                 node("p1", NodeKind.IO, 2.0, "root", True), node("c1", NodeKind.COMPUTE, 1.0, "root"),
                 node("s0", NodeKind.COMPUTE, 0.5, "root/shield"), node("reset", NodeKind.IO, 1.0, "root/shield", True),
                 node("s1", NodeKind.COMPUTE, 0.5, "root/shield"), node("sync", NodeKind.SYNC, 0.0, "root"),
                 node("c2", NodeKind.COMPUTE, 1.0, "root"),
                 node("h", NodeKind.IO, 2.5, "other"), node("t1", NodeKind.COMPUTE, 0.5, "other"),
                 node("p2", NodeKind.IO, 1.0, "other", True), node("t2", NodeKind.COMPUTE, 0.0, "other"),
                 Node("end", NodeKind.END, (0.0,) * 20)]
        edges = [("start", "c0"), ("c0", "p1"), ("p1", "c1"), ("c1", "s0"), ("s0", "reset"), ("reset", "s1"),
                 ("s1", "sync"), ("c1", "sync"), ("sync", "c2"), ("c2", "end"),
                 ("c0", "h"), ("h", "t1"), ("t1", "p2"), ("p2", "t2"), ("t2", "end")]
        g = CausalGraph("GET /", nodes, edges, latency_ms=[7.5] * 20)
        assert simulated_mean([g], "load:1?pool.postgresql=1") == pytest.approx(7.5)

        # The caller wakes up 0.5 ms after the release (sync 0.5 ms) and has nothing left to do (c2 0 ms). The
        # connection went back in the release itself, at 6.5: the other task's call runs [6.5, 7.5], the request
        # ends at 7.5. Returned when the caller woke, at 7, it would end at 8.
        late = [replace(n, samples_ms=(0.5,) * 20) if n.id == "sync" else
                replace(n, samples_ms=(0.0,) * 20, cpu_ms=(0.0,) * 20) if n.id == "c2" else n for n in nodes]
        g = CausalGraph("GET /", late, edges, latency_ms=[7.5] * 20)
        assert simulated_mean([g], "load:1?pool.postgresql=1") == pytest.approx(7.5)

    def test_a_recorded_wait_for_a_connection_gives_way_to_the_simulated_pool(self) -> None:
        # Task a holds the one connection for its 1 ms call [1, 2]; task b recorded a 3 ms wait on a future
        # right before its own call (waiting for that connection at collection). With the pool simulated the
        # wait is the pool's: b's call runs [2, 4]. Kept as a delay besides, b would call at 4 and end at 6,
        # which is also what happens when no pool is simulated (the recorded wait is all there is).
        def node(node_id: str, kind: NodeKind, ms: float, task: str) -> Node:
            extra = {"api": "redis GET", "resource": "redis://h:1/0", "system": "redis"} \
                if kind is NodeKind.IO else {"label": "future"} if kind is NodeKind.WAIT else {}
            return Node(node_id, kind, (ms,) * 20, task=task, cpu_ms=(ms,) * 20 if kind is NodeKind.COMPUTE else (),
                        **extra)

        nodes = [Node("start", NodeKind.START, (0.0,) * 20), node("c0", NodeKind.COMPUTE, 1.0, "root"),
                 node("pa", NodeKind.IO, 1.0, "a"), node("a1", NodeKind.COMPUTE, 0.0, "a"),
                 node("b0", NodeKind.COMPUTE, 0.0, "b"), node("w", NodeKind.WAIT, 3.0, "b"),
                 node("b1", NodeKind.COMPUTE, 0.0, "b"), node("pb", NodeKind.IO, 2.0, "b"),
                 node("b2", NodeKind.COMPUTE, 0.0, "b"), Node("end", NodeKind.END, (0.0,) * 20)]
        edges = [("start", "c0"), ("c0", "pa"), ("pa", "a1"), ("a1", "end"), ("c0", "b0"), ("b0", "w"),
                 ("w", "b1"), ("b1", "pb"), ("pb", "b2"), ("b2", "end")]
        g = CausalGraph("GET /", nodes, edges, latency_ms=[6.0] * 20)
        assert simulated_mean([g], "load:1?pool.redis=1") == pytest.approx(4.0)
        assert simulated_mean([g], "load:1") == pytest.approx(6.0)
        (p,) = predict([g], "load:1?pool.redis=1", samples=100, rng=rng())
        assert any("1 recorded waits for a pooled connection left out" in n for n in p.notes)

    def test_calibrated_cpu_replaces_wall_time(self) -> None:
        # compute of 4 ms wall, 2 ms CPU (the rest was contention at collection); the process without the
        # collector used 1.5 ms per request in all: scale 0.75, so the loop holds 1.5 ms per request
        c = Node("c", NodeKind.COMPUTE, (4.0,) * 20, cpu_ms=(2.0,) * 20)
        g = chain("GET /", c, io("a", 6.0))
        demand = background_demand([g], [g], process_cpu_ms=1.5)
        assert demand.cpu_scale == pytest.approx(0.75) and demand.background_ms == 0.0
        graphs = with_background([g], demand)
        assert mean_latency(graphs, "load:1") == pytest.approx(7.5)
        assert mean_latency(graphs, "load:10") == pytest.approx(15.0, rel=0.01)
        assert mean_latency([g], "load:10") == pytest.approx(40.0, rel=0.01)  # uncalibrated: wall time


    def test_calibrated_waits_scale_what_the_process_serves_itself(self) -> None:
        # waits x 0.5: a 6 ms wake-up and a 10 ms SQLite call (a thread of the process; 2 ms of loop CPU) are
        # scaled; a 10 ms Redis call (another process) and a 30 ms timeout racing nothing keep their length
        timer = Node("t", NodeKind.TIMER, (30.0,) * 20, timeout_ms=30.0)
        woken = wake("w", 6.0)
        lite = replace(io("q", 10.0, cpu=2.0, before=1.0), api="sqlite SELECT", resource="sqlite:///f",
                       system="sqlite")
        g = chain("GET /", io("a", 10.0, cpu=2.0, before=1.0), woken, lite, timer)
        graphs = with_background([g], 0.0, wait_scale=0.5)
        assert graphs[0].meta[WAIT_SCALE_KEY] == 0.5
        assert mean_latency(graphs, "load:1") == pytest.approx(10.0 + 6.0 * 0.5 + 2.0 + 8.0 * 0.5 + 30.0)
        assert mean_latency([g], "load:1") == pytest.approx(10.0 + 6.0 + 10.0 + 30.0)
        (p,) = predict(graphs, "load:2", samples=50, rng=rng())
        assert any("calibrated waits" in n and "another process serves keeps its wait" in n for n in p.notes)

    def test_a_nested_call_is_served_by_the_process_and_its_wait_scaled(self) -> None:
        # the rule per node: an HTTP call to another process keeps its wait, the same call to a route the
        # simulation serves (nested) is the process's own; CPU and timeouts are never waits
        call = io("h", 5.0)
        assert not _scaled_wait(call, -1) and _scaled_wait(call, 0)
        assert _scaled_wait(Node("s", NodeKind.SYNC, (1.0,) * 20), -1)
        assert not _scaled_wait(compute("c", 1.0), -1)
        assert not _scaled_wait(Node("t", NodeKind.TIMER, (30.0,) * 20, timeout_ms=30.0), -1)
        assert _scaled_wait(Node("t", NodeKind.TIMER, (30.0,) * 20), -1)

    def test_the_wait_scale_makes_one_user_take_the_measured_time(self) -> None:
        # 2 ms of CPU (scale 0.5 without the collector: 1 ms), an 8 ms wake-up, a 3 ms call to another process:
        # 1 + 8 s + 3. A light run without the collector measured 8 ms: s = 0.5. 13 ms would need s > 1: 1 (the
        # rest is the client's side). 3.5 ms needs s < 0: the floor
        g = chain("GET /", compute("c", 2.0), wake("w", 8.0), io("x", 3.0))
        demand = background_demand([g], [g], process_cpu_ms=1.0)
        assert fit_wait_scale([g], demand, 8.0) == pytest.approx(0.5, abs=1e-3)
        assert fit_wait_scale([g], demand, 13.0) == 1.0
        assert fit_wait_scale([g], demand, 3.5, floor=0.05) == 0.05
        with pytest.raises(ValueError, match="target_ms must be positive"):
            fit_wait_scale([g], demand, 0.0)
        with pytest.raises(ValueError, match="wait_scale must be positive"):
            with_background([chain("GET /", io("a", 1.0))], 0.0, wait_scale=0.0)


class TestBackgroundDemand:
    def test_split_of_process_cpu(self) -> None:
        g = chain("GET /", compute("c", 1.0, count=4), io("a", 5.0, cpu=0.5, count=4), count=4)
        svc = chain("GET /blob", compute("s", 0.25, count=8), count=8)  # an in-process service, 2 calls each
        d = background_demand([g, svc], [g], process_cpu_ms=3.0)
        assert d.traced_ms == pytest.approx(1.0 + 0.5 + 2 * 0.25)
        assert d.background_ms == pytest.approx(1.0)
        assert background_demand([g], [g], 1.0).background_ms == 0.0  # never negative

    def test_traced_work_is_taken_at_the_mix_the_process_cpu_was_measured_on(self) -> None:
        # recorded: 30 index pages of 10 ms of loop work and 10 post pages of 2 ms (8 ms per request), and an
        # in-process service of 0.5 ms per call, 40 calls (0.5 ms per user request, whatever the mix)
        index = chain("GET /", compute("c", 10.0, count=30), count=30)
        post = chain("GET /post", compute("c", 2.0, count=10), count=10)
        svc = chain("GET /blob", compute("s", 0.5, count=40), count=40)
        users = [index, post]
        assert background_demand([index, post, svc], users, 6.0).traced_ms == pytest.approx(8.5)
        # measured over half and half: 0.5 * 10 + 0.5 * 2 + 0.5 = 6.5 per request, so 6 ms is a scale of 6 / 6.5,
        # where against the recording's mix it would read 6 / 8.5
        half = background_demand([index, post, svc], users, 6.0, {"GET /": 50, "GET /post": 50})
        assert half.traced_ms == pytest.approx(6.5) and half.cpu_scale == pytest.approx(6.0 / 6.5)
        # shares as well as counts; a mix naming a route the graphs lack, or leaving one out, is not comparable
        assert background_demand(users, users, 6.0, {"GET /": 0.25, "GET /post": 0.75}).traced_ms == pytest.approx(4.0)
        assert background_demand(users, users, 6.0, {"GET /": 1, "GET /x": 1}).traced_ms == pytest.approx(8.0)
        assert background_demand(users, users, 6.0, {"GET /": 1}).traced_ms == pytest.approx(8.0)

    def test_calibrate_takes_the_light_runs_own_mix(self) -> None:
        # the same graphs, the app without the collector at 4.0 ms of CPU per request over a light run of one
        # index page in four: the recorded work at that mix is 0.25 * 10 + 0.75 * 2 = 4.0, a scale of 1
        index = chain("GET /", compute("c", 10.0, count=30), count=30)
        post = chain("GET /post", compute("c", 2.0, count=10), count=10)
        _, calibration = calibrate([index, post], ["GET /", "GET /post"], 4.0,
                                   {"GET /": [11.0] * 5, "GET /post": [3.0] * 15}, samples=200)
        assert calibration.demand.traced_ms == pytest.approx(4.0)
        assert calibration.demand.cpu_scale == pytest.approx(1.0)

    def test_kept_through_json(self, tmp_path: Path) -> None:
        graphs = with_background([chain("GET /", io("a", 1.0))], 1.5)
        dump_graphs(graphs, tmp_path / "g.json")
        (back,) = load_graphs(tmp_path / "g.json")
        assert back.meta[BACKGROUND_KEY] == 1.5

    def test_rejects_bad_input(self) -> None:
        with pytest.raises(ValueError, match="background_ms"):
            with_background([chain("GET /", io("a", 1.0))], -1.0)
        with pytest.raises(ValueError, match="no request"):
            background_demand([], [], 1.0)


def test_a_bigger_answer_holds_the_loop_for_the_callers_extra_cpu(tmp_path: Path) -> None:
    # two blob calls at once (the second started while the first was open), 1 ms each as recorded; at 1 MB the
    # profiles say a lone call takes 3 ms and each of two callers' 4 ms, the caller's CPU 0.1 -> 2.1 ms a call.
    # The second call, last of a queue of two answers, gains 2 x 2 / 3 of the pair's +3: 4 ms. The profile's
    # answers came 2 x (4 - 3) / 3 = 0.67 ms apart at 1 MB and its client took 2.1 ms of CPU on each: the second
    # waited 1.43 ms for the first's (0.1 at 4 KB, answers 0 ms apart), 1.33 more, which the simulated loop
    # makes itself. The first answer arrives 1 ms in and holds the loop 2 ms, the second arrives at 1.67 and
    # holds it from 3 to 5: the request ends at 5 ms. The DAG's estimate, with no loop, keeps the profiled
    # durations: max(1 + 2, 1 + 4).
    from analyzer.profiles import ProfileKey, ProfileStore

    blobs = "http://127.0.0.1:8101"
    with ProfileStore(tmp_path / "p.db") as store:
        for size, c, ms, cpu in ((4096, 1, 1.0, 0.1), (1e6, 1, 3.0, 2.1), (4096, 2, 1.0, 0.1), (1e6, 2, 4.0, 2.1)):
            store.add(ProfileKey.make("http GET /blob/{id}", blobs, {}, "size_bytes", size, c), [ms] * 5, cpu_ms=cpu)

        def call(node_id: str, level: int) -> Node:
            return Node(node_id, NodeKind.IO, (1.0,) * 20, api="http GET /blob/{id}", resource=blobs, system="http",
                        round_trips=(1,) * 20, response_bytes=(4096,) * 20, extra={"inflight": [level] * 20})

        nodes = [Node("start", NodeKind.START, (0.0,) * 20), call("a", 1), call("b", 2),
                 Node("end", NodeKind.END, (0.0,) * 20)]
        g = CausalGraph("GET /", nodes, [("start", "a"), ("start", "b"), ("a", "end"), ("b", "end")],
                        latency_ms=[1.0] * 20)
        spec = "size:127.0.0.1:8101[GET /blob/{id}]=1MB"
        (dag,) = predict([g], spec, store, samples=200, rng=rng())
        assert dag.predicted.mean == pytest.approx(5.0)
        (sim,) = predict([g], f"load:1; {spec}", store, samples=200, rng=rng())
        assert sim.predicted.mean == pytest.approx(5.0)
        assert any("hold the loop for the caller's CPU the scenario adds" in n for n in sim.notes)
        how = {s.node: s.how for s in sim.sources[0][1]}
        assert "the caller's CPU +2 ms a call on the loop after the wait, of which the profile's callers queued " \
               "1.33 ms" in how["b"]


def test_io_nodes_carry_their_loop_cpu(tmp_path: Path) -> None:
    # the call spans 0.4..2.1 ms; the task's steps inside it: 0.6 ms of step 0, 0.1 ms of step 1, CPU = wall / 2
    t = Trace("GET /cpu")
    t.request(0, 3, 1)
    t.task(1, [(0, 1.0, "io"), (2.0, 0.9, "done")], cpu=0.5)
    t.io(1, 0, 0.4, 2.1)
    got = read_spans(write(tmp_path / "spans.jsonl", t))
    [g] = build_graphs(got)
    call = g.node("root/io0")
    assert call.cpu_ms == pytest.approx((0.35,))
    assert call.extra["cpu_before_ms"] == pytest.approx([0.3])
    assert g.node("root/c0").cpu_ms == pytest.approx((0.2,))  # compute unchanged
    dump_graphs([g], tmp_path / "g.json")
    (back,) = load_graphs(tmp_path / "g.json")
    assert back.node("root/io0").cpu_ms == pytest.approx((0.35,))


def test_background_from_spans_takes_the_window_and_subtracts_what_the_graphs_record() -> None:
    from types import SimpleNamespace

    from analyzer.graph import CausalGraph, Node, NodeKind
    from analyzer.loadsim import BACKGROUND_KEY, background_from_spans
    from analyzer.spans import ProcessCpu

    ms = 1_000_000
    # two requests, each 2 ms of recorded compute; the process spent 10 ms per request in the window
    graph = CausalGraph("GET /", [Node("start", NodeKind.START, (0.0, 0.0)),
                                  Node("c", NodeKind.COMPUTE, (2.0, 2.0), cpu_ms=(2.0, 2.0)),
                                  Node("end", NodeKind.END, (0.0, 0.0))],
                        [("start", "c"), ("c", "end")], latency_ms=(2.0, 2.0))
    requests = [SimpleNamespace(trace_id="a", start_ns=100 * ms, end_ns=110 * ms),
                SimpleNamespace(trace_id="b", start_ns=150 * ms, end_ns=200 * ms)]
    process = [ProcessCpu(0, 100 * ms, 500.0, 0.0, 400.0, 0.0, 2),       # start-up: outside the window
               ProcessCpu(100 * ms, 200 * ms, 20.0, 2.0, 15.0, 2.0, 2)]  # 22 ms, 2 of them the exporter's
    (out,), demand = background_from_spans([graph], requests, process)
    assert demand is not None
    assert demand.process_ms == pytest.approx(10.0)
    assert demand.traced_ms == pytest.approx(2.0)
    assert out.meta[BACKGROUND_KEY] == pytest.approx(8.0)
    assert demand.host_ms is None and "host_cpu_ms" not in out.meta  # spans without the host's CPU
    # with the host's busy CPU read: per user request, carried to the graphs' meta
    hosted = [replace(p, host_busy_ms=60.0, host_cpus=2) for p in process]
    (out,), demand = background_from_spans([graph], requests, hosted)
    assert demand is not None and demand.host_ms == pytest.approx(30.0) and demand.host_cpus == 2
    assert out.meta["host_cpu_ms"] == pytest.approx(30.0) and out.meta["host_cpus"] == 2
    # an io call's read callbacks (hidden_ms) are the loop's work the requests record, as in background_demand
    called = CausalGraph("GET /", [Node("start", NodeKind.START, (0.0, 0.0)),
                                   Node("c", NodeKind.COMPUTE, (2.0, 2.0), cpu_ms=(2.0, 2.0)),
                                   Node("q", NodeKind.IO, (3.0, 3.0), cpu_ms=(0.5, 0.5),
                                        extra={"hidden_ms": [1.0, 1.0]}),
                                   Node("end", NodeKind.END, (0.0, 0.0))],
                         [("start", "c"), ("c", "q"), ("q", "end")], latency_ms=(5.0, 5.0))
    (out,), demand = background_from_spans([called], requests, process)
    assert demand is not None and demand.traced_ms == pytest.approx(2.0 + 0.5 + 1.0)
    assert out.meta[BACKGROUND_KEY] == pytest.approx(10.0 - 3.5)
    # no process span: unchanged, and said so
    same, none = background_from_spans([graph], requests, [])
    assert none is None and BACKGROUND_KEY not in same[0].meta


@pytest.mark.parametrize(("host_ms", "warned"), [(12.0, False), (20.0, True)])
def test_a_load_prediction_says_how_busy_the_host_would_be(host_ms: float, warned: bool) -> None:
    # 8 users of 10 ms of pure loop work: 100 requests/s; at host_ms of the host's CPU a request over two cores,
    # its cores are 60% or 100% busy, and past 85% the prediction says it is less certain
    g = chain("GET /", compute("c", 10.0))
    graphs = [CausalGraph(g.route, g.nodes, list(g.dag.edges), latency_ms=g.latency_ms,
                          meta={"host_cpu_ms": host_ms, "host_cpus": 2.0})]
    (p,) = predict(graphs, "load:8", samples=600, rng=rng())
    (note,) = [n for n in p.notes if n.startswith("host:")]
    assert "requests/s" in note
    busy = float(note.split("would be ")[1].split("%")[0])
    assert busy == pytest.approx(host_ms * 100 / 1000 / 2 * 100, rel=0.05)
    assert ("less certain" in note) is warned
    # at the recorded load the host is as it was: nothing to say
    (alone,) = predict(graphs, "load:1", samples=200, rng=rng())
    assert not [n for n in alone.notes if n.startswith("host:")]


def test_calibrate_fits_each_user_routes_waits_to_its_latency_without_the_collector() -> None:
    a = chain("GET /a", compute("c", 2.0), wake("w", 8.0))  # 2 ms of CPU recorded
    b = chain("GET /b", compute("c", 2.0), wake("w", 8.0))
    inner = chain("GET /inner", compute("c", 1.0))  # an in-process service the users do not call directly
    # 40 + 40 + 20 ms of CPU over 40 user requests (20 each): 2.5 ms traced per request against 1.5 measured,
    # CPU scale 0.6: the compute holds the loop 1.2 ms, so 5 ms is 1.2 + 8 s (s = 0.475), 9 ms s = 0.975
    graphs, cal = calibrate([a, b, inner], ["GET /a", "GET /b"], 1.5, {"GET /a": [5.0, 5.0], "GET /b": [9.0]})
    scales = {g.route: g.meta[WAIT_SCALE_KEY] for g in graphs}
    assert scales["GET /a"] == pytest.approx(0.475, abs=1e-3) and scales["GET /b"] == pytest.approx(0.975, abs=1e-3)
    assert scales["GET /inner"] == pytest.approx(0.725, abs=1e-3)  # the user routes' scales, by requests
    assert cal.demand.traced_ms == pytest.approx(2.5) and cal.demand.cpu_scale == pytest.approx(0.6)
    assert all(g.meta[CPU_SCALE_KEY] == pytest.approx(0.6) for g in graphs)
    assert "wait scale GET /a 0.475, GET /b 0.975" in cal.describe()
    assert mean_latency([g for g in graphs if g.route == "GET /a"], "load:1") == pytest.approx(5.0, abs=0.01)
    with pytest.raises(ValueError, match="latencies without the collector"):
        calibrate([a], ["GET /a"], 1.5, {})
    # the host's reading goes to every graph's meta; a reading without CPUs is named
    hosted, _ = calibrate([a], ["GET /a"], 1.5, {"GET /a": [5.0]}, host=(12.0, 2))
    assert hosted[0].meta["host_cpu_ms"] == pytest.approx(12.0) and hosted[0].meta["host_cpus"] == 2
    with pytest.raises(ValueError, match=r"host must be .*got \(12.0, 0\)"):
        calibrate([a], ["GET /a"], 1.5, {"GET /a": [5.0]}, host=(12.0, 0))


def test_calibrate_starts_each_request_with_its_time_outside_the_server_span() -> None:
    # 1 ms of CPU and a 4 ms wake-up recorded server-side; the client measured 5.5 ms without the collector,
    # 1 ms of it outside the server span: the waits are fitted to the rest, 1 + 4 s = 4.5 (s = 0.875)
    g = chain("GET /", compute("c", 1.0), wake("w", 4.0))
    graphs, cal = calibrate([g], ["GET /"], 1.0, {"GET /": [5.5]}, client_ms={"GET /": 1.0})
    assert graphs[0].meta[CLIENT_KEY] == 1.0 and cal.by_route["GET /"] == pytest.approx(0.875, abs=1e-3)
    (p,) = predict(graphs, "load:1", samples=200, rng=rng())
    assert p.predicted.mean == pytest.approx(5.5, abs=0.01)
    assert any(n.startswith("client side: each request starts with its time outside") for n in p.notes)
    # without it the waits would have to cover it and cannot: the scale stops at 1, 0.5 ms short
    plain, short = calibrate([g], ["GET /"], 1.0, {"GET /": [5.5]})
    assert short.by_route["GET /"] == pytest.approx(1.0) and CLIENT_KEY not in plain[0].meta
    assert mean_latency(plain, "load:1") == pytest.approx(5.0, abs=0.01)
    # under load it is a delay, not loop work: 4 users of 1 ms of CPU each do not queue (4 < 1 + 1 + 3.5)
    assert mean_latency(graphs, "load:4") == pytest.approx(5.5, rel=0.01)
    with pytest.raises(ValueError, match="client_ms must be finite and non-negative"):
        calibrate([g], ["GET /"], 1.0, {"GET /": [5.5]}, client_ms={"GET /": -0.5})


def test_calibrate_counts_the_loops_preempted_time_as_demand() -> None:
    # 2 ms of CPU recorded, 1 ms measured without the collector, and 0.5 ms during which the loop's thread was
    # ready but preempted: the loop is unavailable 1.5 ms per request (scale 0.75), and 10 users of a 1 ms call
    # after it saturate it at 10 x 1.5 ms
    g = chain("GET /", compute("c", 2.0), io("x", 1.0))
    graphs, cal = calibrate([g], ["GET /"], 1.0, {"GET /": [2.5]}, preempted_ms=0.5)
    assert cal.demand.process_ms == pytest.approx(1.5) and cal.demand.cpu_scale == pytest.approx(0.75)
    assert mean_latency(graphs, "load:10") == pytest.approx(15.0, rel=0.01)
    plain, _ = calibrate([g], ["GET /"], 1.0, {"GET /": [2.5]})
    assert mean_latency(plain, "load:10") == pytest.approx(10.0, rel=0.01)
    with pytest.raises(ValueError, match="preempted_ms must be non-negative"):
        calibrate([g], ["GET /"], 1.0, {"GET /": [2.5]}, preempted_ms=-1.0)


def test_calibrate_takes_the_loops_demand_at_more_users_from_measured_levels() -> None:
    # 1.5 ms of loop per request at one user (1 CPU + 0.5 preempted), 2.0 at 4 users (1.5 + 0.5): 10 users
    # saturate the loop at the 4-user demand (held past the last level), 2 users at the demand interpolated
    # between the levels, 1.5 + 0.5 / 3; one user keeps the one-user demand
    g = chain("GET /", compute("c", 2.0), io("x", 1.0))
    graphs, cal = calibrate([g], ["GET /"], 1.0, {"GET /": [2.5]}, preempted_ms=0.5, levels=[(4, 1.5, 0.5, None)])
    assert [(n, d.process_ms) for n, d in cal.levels] == [(4, pytest.approx(2.0))]
    assert graphs[0].meta[LEVELS_KEY] == [{"users": 1.0, "cpu_scale": 0.75, "background_ms": 0.0},
                                          {"users": 4.0, "cpu_scale": 1.0, "background_ms": 0.0}]
    assert "2.00 at 4 users" in cal.describe()
    assert mean_latency(graphs, "load:10") == pytest.approx(20.0, rel=0.01)
    assert mean_latency(graphs, "load:2") == pytest.approx(2 * (1.5 + 0.5 / 3), rel=0.01)
    assert mean_latency(graphs, "load:1") == pytest.approx(2.5, rel=0.01)
    (p,) = predict(graphs, "load:10", samples=200, rng=rng())
    assert any("demand at 10 users per loop from its measured levels (1, 4 users)" in n for n in p.notes)
    assert not any("cores serve" in n for n in p.notes)  # no host readings: the loop owns its core
    # a replica fails: its users move to the survivor's loop, 10 of them
    assert mean_latency(graphs, "load:10?replicas=2; failure:app") == pytest.approx(20.0, rel=0.01)
    with pytest.raises(ValueError, match="levels must be"):
        calibrate([g], ["GET /"], 1.0, {"GET /": [2.5]}, levels=[(1, 1.5, 0.0, None)])
    bad = CausalGraph(g.route, g.nodes, list(g.dag.edges), meta={LEVELS_KEY: [{"users": 1, "cpu_scale": 1,
                                                                               "background_ms": 0}, {"users": 0}]})
    with pytest.raises(ValueError, match="'GET /': meta 'loop_levels' must be a list of"):
        mean_latency([bad], "load:4")


def test_the_host_cores_queue_the_loop_and_the_other_processes() -> None:
    # 1 ms of loop and a 4 ms call per request; beside the app the host's other processes spend 3 ms of CPU per
    # request (4 ms busy per request, less the loop's 1) on its 2 cores. 10 users: the loop alone would serve a
    # request a millisecond (10 ms each), the cores only one every 2 ms (4 ms over 2 cores): 20 ms each
    g = chain("GET /", compute("c", 1.0), io("x", 4.0))
    levels = [(4, 1.0, 0.0, 4.0)]
    graphs, _ = calibrate([g], ["GET /"], 1.0, {"GET /": [5.0]}, host=(4.0, 2), levels=levels)
    assert [row[OTHERS_KEY] for row in graphs[0].meta[OTHERS_LEVELS_KEY]] == [3.0, 3.0]
    assert mean_latency(graphs, "load:10") == pytest.approx(20.0, rel=0.03)
    (p,) = predict(graphs, "load:10", samples=400, rng=rng())
    assert any("its 2 cores serve the loop's work and the other processes' 3 ms of CPU" in n for n in p.notes)
    busy = next(n for n in p.notes if n.startswith("host: its 2 cores") and "busy in the simulation" in n)
    assert int(busy.split("cores ")[1].split("%")[0]) >= 95
    # 2 users ask for 2 x 4 ms of CPU every 5 ms: the cores keep up, and their requests take 5 ms as at one user
    assert mean_latency(graphs, "load:2") == pytest.approx(5.0, rel=0.01)
    # a host of 8 cores does not bind: the loop does, as without the host's readings
    roomy, _ = calibrate([g], ["GET /"], 1.0, {"GET /": [5.0]}, host=(4.0, 8), levels=levels)
    plain, _ = calibrate([g], ["GET /"], 1.0, {"GET /": [5.0]}, levels=[(4, 1.0, 0.0, None)])
    assert mean_latency(roomy, "load:10") == pytest.approx(mean_latency(plain, "load:10"), rel=0.02)
    assert mean_latency(plain, "load:10") == pytest.approx(10.0, rel=0.02)


def test_the_host_cores_without_the_loops_demand_from_the_levels() -> None:
    # At 4 users the loop took 2 ms a request (1 at one user) and the host 5 ms, so the other processes 3 ms.
    # From the levels, 10 users saturate the loop at 2 ms a request (20 ms each) and the cores at (2 + 3) / 2
    # ms: 25 ms each. With the loop priced from one user (loop_levels=False: a wake-up's cost fitted to the
    # levels would say how much less it needs when busy), only the others come from the levels: (1 + 3) / 2 ms
    # a request on the cores, 20 ms each
    g = chain("GET /", compute("c", 1.0), io("x", 4.0))
    levels = [(4, 2.0, 0.0, 5.0)]
    both, _ = calibrate([g], ["GET /"], 1.0, {"GET /": [5.0]}, host=(4.0, 2), levels=levels)
    assert mean_latency(both, "load:10") == pytest.approx(25.0, rel=0.03)
    others, cal = calibrate([g], ["GET /"], 1.0, {"GET /": [5.0]}, host=(4.0, 2), levels=levels, loop_levels=False)
    assert LEVELS_KEY not in others[0].meta and [(n, d.process_ms) for n, d in cal.levels] == [(4, 2.0)]
    assert [row[OTHERS_KEY] for row in others[0].meta[OTHERS_LEVELS_KEY]] == [3.0, 3.0]
    assert mean_latency(others, "load:10") == pytest.approx(20.0, rel=0.03)
    (p,) = predict(others, "load:10", samples=200, rng=rng())
    assert not any("from its measured levels (1, 4 users)" in n for n in p.notes)
    assert any("other processes' 3 ms of CPU per request" in n for n in p.notes)
    bad = CausalGraph(g.route, g.nodes, list(g.dag.edges), meta={OTHERS_LEVELS_KEY: [{"users": 1}]})
    with pytest.raises(ValueError, match="'GET /': meta 'others_levels' must be a list of"):
        mean_latency([bad], "load:4")


@pytest.mark.parametrize("value", [-1.0, float("nan"), "0.2", True])
def test_a_calibration_value_that_makes_no_sense_is_an_error(value: object) -> None:
    g = chain("GET /", compute("c", 1.0), io("x", 4.0))
    bad = CausalGraph(g.route, g.nodes, list(g.dag.edges), meta={WAKE_COST_KEY: value})
    with pytest.raises(GraphError, match=r"graph 'GET /' \(variant 0\): meta 'wake_cost_ms' must be a finite number"):
        predict([bad], "load:4", samples=50, rng=rng())
    # 0 is a value a calibration writes: no cost
    zero = CausalGraph(g.route, g.nodes, list(g.dag.edges), meta={WAKE_COST_KEY: 0})
    assert mean_latency([zero], "load:4") == pytest.approx(mean_latency([g], "load:4"))


def sqlite_call(node_id: str, ms: float, count: int = 20) -> Node:
    return Node(node_id, NodeKind.IO, (ms,) * count, api="sqlite SELECT", resource="sqlite:////tmp/forum.db",
                system="sqlite", round_trips=(0,) * count)


class TestThreadServedCalls:
    """aiosqlite serves each call on a thread of the app, which needs the GIL the loop's thread holds."""

    def test_the_thread_waits_for_the_loops_queued_work(self) -> None:
        # 2 ms of compute, then a 1 ms call, 2 users. On the network (redis) the loop saturates: 2 x 2 ms. On
        # a thread: A's call starts at 2 while B's step holds the loop until 4, so A's thread takes the job at 4
        # and is done at 5; B's call starts at 4 with the loop idle and is done at 5 too, then waits for A's
        # next step [5, 7] to hand its answer back. Each user's request takes 5 ms.
        threaded = chain("GET /", compute("c", 2.0), sqlite_call("q", 1.0))
        assert mean_latency([threaded], "load:2") == pytest.approx(5.0, rel=0.01)
        assert mean_latency([chain("GET /", compute("c", 2.0), io("q", 1.0))], "load:2") == pytest.approx(4.0)
        (p,) = predict([threaded], "load:2", samples=50, rng=rng())
        assert any("served by a thread of the app (sqlite)" in n for n in p.notes)

    def test_one_user_keeps_the_recorded_durations(self) -> None:
        # the recorded durations hold what waiting for the GIL cost at the load they were recorded at
        threaded = chain("GET /", compute("c", 2.0), sqlite_call("q", 1.0))
        assert mean_latency([threaded], "load:1") == pytest.approx(3.0)
        (p,) = predict([threaded], "load:1", samples=50, rng=rng())
        assert not any("served by a thread" in n for n in p.notes)

    def test_the_wait_is_bounded_by_the_switch_interval(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import analyzer.loadsim as loadsim

        monkeypatch.setattr(loadsim, "GIL_SWITCH_MS", 0.0)  # the holder gives the GIL up at once: no wait
        threaded = chain("GET /", compute("c", 2.0), sqlite_call("q", 1.0))
        assert mean_latency([threaded], "load:2") == pytest.approx(4.0)


class TestPoolHolders:
    def test_a_gather_after_a_pooled_call_takes_connections_of_its_own(self) -> None:
        # The caller's step after its pooled call (p1) starts a gather of two tasks that each make a pooled
        # call (q0, q1, 2 ms) on a pool of one: the connection went back when that step ended (aiosqlite's and
        # asyncpg's pools return it in the code after the answer), so q0 runs [4, 6] and q1 [6, 8]. Held until
        # the gather ended, as asyncpg's shielded release holds it, the children would share it: both [4, 6].
        def node(node_id: str, kind: NodeKind, ms: float, task: str) -> Node:
            pooled = {"api": "redis GET", "resource": "redis://h:1/0", "system": "redis"}
            return Node(node_id, kind, (ms,) * 20, task=task, cpu_ms=(ms,) * 20 if kind is NodeKind.COMPUTE else (),
                        **(pooled if kind is NodeKind.IO else {}))

        nodes = [Node("start", NodeKind.START, (0.0,) * 20), node("c0", NodeKind.COMPUTE, 1.0, "root"),
                 node("p1", NodeKind.IO, 2.0, "root"), node("c1", NodeKind.COMPUTE, 1.0, "root")]
        edges = [("start", "c0"), ("c0", "p1"), ("p1", "c1")]
        for k in (0, 1):
            task = f"root/gather#0[{k}]"
            nodes += [node(f"g{k}", NodeKind.COMPUTE, 0.0, task), node(f"q{k}", NodeKind.IO, 2.0, task),
                      node(f"h{k}", NodeKind.COMPUTE, 0.0, task)]
            edges += [("c1", f"g{k}"), (f"g{k}", f"q{k}"), (f"q{k}", f"h{k}"), (f"h{k}", "gather")]
        nodes += [node("gather", NodeKind.SYNC, 0.0, "root"), Node("end", NodeKind.END, (0.0,) * 20)]
        edges += [("c1", "gather"), ("gather", "end")]
        g = CausalGraph("GET /", nodes, edges, latency_ms=[6.0] * 20)
        assert simulated_mean([g], "load:1?pool.redis=1") == pytest.approx(8.0)
        assert simulated_mean([g], "load:1?pool.redis=2") == pytest.approx(6.0)


class TestMix:
    def test_the_scenarios_shares_replace_the_recorded_ones(self) -> None:
        # /a holds the loop 1 ms, /b 3 ms, recorded 30 times against 10. 40 users saturate the loop: throughput
        # 1 / D, D the mean demand per request: 1.5 ms as recorded, 2 ms half and half, 3 ms /b alone
        a = chain("GET /a", compute("c", 1.0, count=30), count=30)
        b = chain("GET /b", compute("c", 3.0, count=10), count=10)

        def throughput(spec: str) -> float:
            preds = predict([a, b], spec, samples=3000, rng=rng())
            shares = {"GET /a": 30, "GET /b": 10} if "mix" not in spec else (
                {"GET /a": 1, "GET /b": 1} if "mix./a" in spec else {"GET /b": 1})
            total = sum(shares.values())
            cycle = sum(shares[p.route] / total * p.predicted.mean for p in preds)
            return 40 / cycle

        assert throughput("load:40") == pytest.approx(1 / 1.5, rel=0.03)
        assert throughput("load:40?mix./a=1&mix.GET /b=1") == pytest.approx(1 / 2.0, rel=0.03)
        assert throughput("load:40?mix.GET /b=1") == pytest.approx(1 / 3.0, rel=0.03)
        preds = predict([a, b], "load:40?mix.GET /b=1", samples=100, rng=rng())
        assert [p.route for p in preds] == ["GET /b"]  # no user asks for /a
        assert any(n.startswith("mix: users request GET /b 100%") for n in preds[0].notes)


class TestWakeCost:
    def test_a_wake_up_is_charged_to_the_work_after_it_beyond_the_recordings(self) -> None:
        # without a wake-up profile what a wake-up costs falls on the first piece of work after the gap: 0.3 ms
        cost = _WakeCost(None, "the first loop work after them", 1, fixed_ms=0.3)
        recorded, scenario = cost.cost(recording=True), cost.cost(recording=False)
        assert recorded is not None and scenario is not None
        assert recorded(0, 2, 0, 0, 1.0, 0.2, 0) == 0.0  # recorded after a 1 ms gap: its durations hold it
        assert recorded(0, 3, 0, 0, 0.0, 1.5, 0) == 0.0  # and the piece after it, which owed nothing more
        # the same piece with no gap before it (a busier loop) saves it; after a gap it costs what it did
        assert scenario(0, 2, 0, 0, 0.0, 0.2, 0) == pytest.approx(-0.3)
        assert scenario(0, 2, 0, 0, 2.0, 0.2, 0) == pytest.approx(0.0)
        assert scenario(0, 3, 0, 0, 0.0, 1.5, 0) == pytest.approx(0.0)
        assert "0.3 ms of loop work per wake-up itself" in cost.describe()[0]
        assert _WakeCost(None, "", 1).cost(recording=False) is None  # neither a profile nor a cost: nothing

    def test_a_busier_loop_pays_fewer_wake_ups(self) -> None:
        # a (1 ms call) -> c (0.5 ms) -> end: at one user the loop wakes once a request, for c. Two users keep it
        # busy (each c waits for the other's), so the second's c finds it awake and saves the wake-up's 0.2 ms
        g = chain("GET /", io("a", 1.0), compute("c", 0.5))
        plain, priced = Queueing(), Queueing()
        predict([g], "load:2", samples=600, rng=rng(), queueing=plain)
        predict(with_wake_cost([g], 0.2), "load:2", samples=600, rng=rng(), queueing=priced)
        assert plain.loop_ms_per_request == pytest.approx(0.5, abs=1e-6)
        assert priced.loop_ms_per_request < plain.loop_ms_per_request - 0.05
        assert priced.loop_ms_per_request >= 0.5 - 0.2 - 1e-6
        # at the recorded load nothing changes
        alone = predict(with_wake_cost([g], 0.2), "load:1", samples=200, rng=rng())[0].predicted.samples_ms
        np.testing.assert_allclose(alone, predict([g], "load:1", samples=200, rng=rng())[0].predicted.samples_ms)
        assert with_wake_cost([g], 0.2)[0].meta[WAKE_COST_KEY] == 0.2
        with pytest.raises(ValueError, match="cost_ms must be finite and non-negative"):
            with_wake_cost([g], -0.1)

    def test_the_fit_finds_the_cost_the_levels_were_measured_at(self) -> None:
        # the "measured" demand at 2 and 3 users is the simulation's own at a cost of 0.15 ms: the fit finds it
        g = chain("GET /", io("a", 1.0), compute("c", 0.4), io("b", 0.6), compute("d", 0.3))

        def demand(users: int, cost: float) -> float:
            q = Queueing()
            predict(with_wake_cost([g], cost), f"load:{users}?mix.GET /=1", samples=400,
                    rng=np.random.default_rng(0), queueing=q)
            return q.loop_ms_per_request

        levels = [(2, demand(2, 0.15)), (3, demand(3, 0.15))]
        assert levels[1][1] < demand(3, 0.0) - 0.05  # the cost moves the demand: the fit has something to find
        run = MeasuredLevels([g], levels, {"GET /": 1.0})
        assert fit_wake_cost([run], samples=400) == pytest.approx(0.15, abs=0.01)
        # two runs fitted together: between what each says alone (0.15 and 0.05)
        other = MeasuredLevels([g], [(2, demand(2, 0.05)), (3, demand(3, 0.05))], {"GET /": 1.0})
        assert fit_wake_cost([other], samples=400) == pytest.approx(0.05, abs=0.01)
        assert 0.07 < fit_wake_cost([run, other], samples=400) < 0.13
        # a loop that saves nothing at more users costs nothing per wake-up
        flat = MeasuredLevels([g], [(2, demand(2, 0.0))], {"GET /": 1.0})
        assert fit_wake_cost([flat], samples=400) == pytest.approx(0.0, abs=0.01)
        with pytest.raises(ValueError, match="a measured level above one user"):
            fit_wake_cost([MeasuredLevels([g], [(1, 0.7)], {"GET /": 1.0})])

    def test_a_calibrated_calls_wait_loses_the_collectors_share_of_its_read_callbacks(self) -> None:
        # a 4 ms call with 1 ms of CPU and 2 ms of read callbacks, recorded under a collector that doubles the
        # loop's work (CPU scale 0.5): the call takes 4 - 0.5 (1 + 2) = 2.5 ms without it
        call = replace(io("a", 4.0, cpu=1.0, before=0.5), extra={"cpu_before_ms": [0.5] * 20, "hidden_ms": [2.0] * 20})
        g = chain("GET /", call)
        calibrated = [CausalGraph(g.route, g.nodes, list(g.dag.edges), latency_ms=g.latency_ms,
                                  meta={CPU_SCALE_KEY: 0.5})]
        assert simulated_mean(calibrated, "load:1") == pytest.approx(2.5)
        assert simulated_mean([g], "load:1") == pytest.approx(4.0)
