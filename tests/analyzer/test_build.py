"""Building causal graphs from hand-written requests: node ids, edges, wait modes, variants, durations."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
from spanfactory import Trace, cache_hit_request, gather_request, race_request, write

from analyzer.build import build_graphs, request_graph
from analyzer.errors import GraphError
from analyzer.graph import CausalGraph, NodeKind, WaitMode, dump_graphs, load_graphs
from analyzer.selfcheck import self_check
from analyzer.spans import read_spans
from collector import attributes as A


def graphs_of(tmp_path: Path, *traces: Trace) -> list[CausalGraph]:
    got = read_spans(write(tmp_path / "spans.jsonl", *traces))
    assert got.problems == ()
    return build_graphs(got)


def preds(graph: CausalGraph, node_id: str) -> set[str]:
    return set(graph.predecessors(node_id))


def test_gather_graph_structure_and_durations(tmp_path: Path) -> None:
    [g] = graphs_of(tmp_path, gather_request(), gather_request(shift=20, sql_ms=4.0, base=100))
    assert g.route == "GET /" and g.count == 2 and g.latency_ms == pytest.approx((7.0, 7.5))
    io = g.node("root/io0")
    assert (io.kind, io.api, io.resource, io.system) == (NodeKind.IO, "redis GET", "redis://127.0.0.1:6379/0", "redis")
    assert io.samples_ms == pytest.approx((1.8, 1.8)) and io.round_trips == (1, 1)
    assert preds(g, "root/c0") == {"start"} and preds(g, "root/io0") == {"root/c0"}
    # both children are created during the step of root/c1, and the gather waits for both and for root/c1
    assert preds(g, "root/gather#0[0]/c0") == {"root/c1"} and preds(g, "root/gather#0[1]/c0") == {"root/c1"}
    assert preds(g, "root/gather#0") == {"root/c1", "root/gather#0[0]/c1", "root/gather#0[1]/c1"}
    sync = g.node("root/gather#0")
    assert sync.kind is NodeKind.SYNC and sync.wait is WaitMode.ALL
    assert sync.samples_ms == pytest.approx((0.1, 0.1))  # resume - the last child's finish
    sql = g.node("root/gather#0[0]/io0")
    assert sql.api == "postgresql SELECT posts" and sql.samples_ms == pytest.approx((3.5, 4.0))
    # the blob task first ran 0.2 ms after it could have (the loop ran the SQL task first)
    assert g.node("root/gather#0[1]/c0").extra["ready_ms"] == pytest.approx([0.2, 0.2])
    assert g.node("root/gather#0[1]/c0").samples_ms == pytest.approx((0.25, 0.25))
    assert preds(g, "end") == {"root/c2"}
    assert g.trace_ids[1] != g.trace_ids[0]
    assert self_check(g).max() < 0.01


@pytest.mark.parametrize("idle", [None, []])
def test_io_nodes_count_the_calls_in_flight_to_their_resource(
        tmp_path: Path, idle: list[tuple[float, float]] | None) -> None:
    # a gather of two redis calls that overlap ([0.6, 3.0] then [0.75, 2.0]), then one more call alone. With the
    # loop's sleeps recorded and none during the request, the bound on A's wait for the loop spans A from its
    # start: A still counts when B starts, its answer expected halfway through that bound
    t = Trace("GET /fan")
    t.request(-0.1, 4.4, 1, idle=idle)
    t.task(1, [(0, 0.5, "sync:10"), (3.2, 0.2, "io"), (4.1, 0.2, "done")], coro="fan")
    t.task(2, [(0.55, 0.1, "io"), (3.0, 0.1, "done")], parent=1, spawn_step=0, created=0.2)
    t.io(2, 0, 0.6, 3.0)
    t.task(3, [(0.7, 0.1, "io"), (2.0, 0.1, "done")], parent=1, spawn_step=0, created=0.3)
    t.io(3, 0, 0.75, 2.0)
    t.io(1, 1, 3.3, 4.0)
    t.sync(10, "gather", "all", [2, 3], task=1, step=0, start=0.45, end=3.15, resume_step=1)
    [g] = graphs_of(tmp_path, t)
    inflight = {n.id: n.extra["inflight"] for n in g.nodes if n.kind is NodeKind.IO}
    assert inflight == {"root/gather#0[0]/io0": [1], "root/gather#0[1]/io0": [2], "root/io0": [1]}


@pytest.mark.parametrize(("answer", "expected"), [(None, 2), (1.2, 1)])
def test_a_call_whose_answer_waits_for_the_loop_no_longer_counts_as_in_flight(
        tmp_path: Path, answer: float | None, expected: int) -> None:
    # call A [0.6, 3.05]; tasks 3 and 4 hold the loop back to back over [1.0, 2.95], so A's answer came somewhere
    # in [1.15, 3.05] and waited for them (queued, a bound: 1.9); call B started at 1.95 inside that run.
    # Without the answer's time, A counts until the middle of its bound (2.1): B met it outstanding. Read at 1.2,
    # A's answer had come before B started.
    t = Trace("GET /fan")
    t.request(-0.1, 3.6, 1)
    t.task(1, [(0, 0.5, "sync:10"), (3.35, 0.1, "done")], coro="fan")
    t.task(2, [(0.55, 0.05, "io"), (3.0, 0.05, "done")], parent=1, spawn_step=0, created=0.2)
    t.io(2, 0, 0.6, 3.05, answer=answer)
    t.task(3, [(1.0, 1.0, "io"), (3.1, 0.05, "done")], parent=1, spawn_step=0, created=0.3)
    t.io(3, 0, 1.95, 3.15)
    t.task(4, [(2.05, 0.9, "done")], parent=1, spawn_step=0, created=0.4)
    t.sync(10, "gather", "all", [2, 3, 4], task=1, step=0, start=0.45, end=3.3, resume_step=1)
    [g] = graphs_of(tmp_path, t)
    a = g.node("root/gather#0[0]/io0")
    # with the answer read at 1.2: 1.8 known to follow it (A's own last step, 0.05, is its CPU), 0.2 of the
    # busy spell before it
    assert a.extra["queued_ms"] == pytest.approx([1.9 if answer is None else 2.0])
    assert a.extra["answered_ms"] == pytest.approx([0.0 if answer is None else 1.8])
    inflight = {n.id: n.extra["inflight"] for n in g.nodes if n.kind is NodeKind.IO}
    assert inflight == {"root/gather#0[0]/io0": [1], "root/gather#0[1]/io0": [expected]}
    # A's span was open when B started either way: B's place in the fan-out if answers came no sooner
    opened = {n.id: n.extra["open_calls"] for n in g.nodes if n.kind is NodeKind.IO}
    assert opened == {"root/gather#0[0]/io0": [1], "root/gather#0[1]/io0": [2]}


def queued_request(busy_until: float, idle: list[tuple[float, float]] | None = None,
                   answer: float | None = None, read: float = 0.0) -> Trace:
    """A gather: task 2 queries PostgreSQL [0.6, 2.95] while task 3 runs two steps from 0.65 (1 ms each, 0.05 apart)
    then ends at ``busy_until``; task 2 resumes at 2.9."""
    t = Trace("GET /q")
    t.request(-0.1, 3.6, 1, idle=idle)
    t.task(1, [(0, 0.5, "sync:10"), (3.2, 0.2, "done")], coro="fan")
    t.task(2, [(0.55, 0.05, "io"), (2.9, 0.1, "done")], parent=1, spawn_step=0, created=0.2)
    t.io(2, 0, 0.6, 2.95, "postgresql", "SELECT", "postgresql://127.0.0.1:5432/test", answer=answer, read=read)
    t.task(3, [(0.65, 1.0, "future"), (1.7, busy_until - 1.7, "done")], parent=1, spawn_step=0, created=0.3)
    t.sync(10, "gather", "all", [2, 3], task=1, step=0, start=0.45, end=3.05, resume_step=1)
    return t


def test_io_nodes_say_how_long_their_answer_waited_for_the_loop(tmp_path: Path) -> None:
    [g] = graphs_of(tmp_path, queued_request(busy_until=2.75))
    # task 3 ran [0.65, 1.65] and [1.7, 2.75] back to back, 0.15 ms before the call's task resumed: the answer
    # waited for them (2.05 ms); the calling task's own steps are the call's CPU, not queueing
    assert g.node("root/gather#0[0]/io0").extra["queued_ms"] == pytest.approx([2.05])
    # the loop was idle for 1.2 ms before the call returned: the answer came then, after no queueing
    [g] = graphs_of(tmp_path, queued_request(busy_until=1.75))
    assert g.node("root/gather#0[0]/io0").extra["queued_ms"] == pytest.approx([0.0])


def test_the_loops_sleeps_and_the_answers_read_time_say_more(tmp_path: Path) -> None:
    call = "root/gather#0[0]/io0"
    # the loop slept [1.8, 2.5], then ran callbacks outside any step until task 2 resumed at 2.9, among them the
    # answer's own read [2.5, 2.6]: it waited 0.3 ms for the loop after it was in (2.95 - 2.6, less task 2's own
    # 0.05 ms), which the gap between steps alone hides
    [g] = graphs_of(tmp_path, queued_request(1.75, idle=[(1.8, 2.5)], answer=2.6, read=0.1))
    node = g.node(call)
    assert node.extra["queued_ms"] == pytest.approx([0.3]) and node.extra["answered_ms"] == pytest.approx([0.3])
    # woken at 2.0 instead: the answer came somewhere in [2.0, 2.5], another 0.5 ms of bound (its read excluded)
    [g] = graphs_of(tmp_path, queued_request(1.75, idle=[(1.8, 2.0)], answer=2.6, read=0.1))
    node = g.node(call)
    assert node.extra["queued_ms"] == pytest.approx([0.8]) and node.extra["answered_ms"] == pytest.approx([0.3])
    # the read not timed: the whole spell since the sleep, less the task's own step, bounds the wait
    [g] = graphs_of(tmp_path, queued_request(1.75, idle=[(1.8, 2.0)]))
    node = g.node(call)
    assert node.extra["queued_ms"] == pytest.approx([0.9]) and node.extra["answered_ms"] == pytest.approx([0.0])
    # the loop slept until the task resumed: no wait at all
    [g] = graphs_of(tmp_path, queued_request(1.75, idle=[(1.8, 2.9)]))
    assert g.node(call).extra["queued_ms"] == pytest.approx([0.0])


def test_io_nodes_carry_the_loops_work_that_no_step_holds(tmp_path: Path) -> None:
    call = "root/gather#0[0]/io0"

    def held(g: CausalGraph) -> float:
        ready = [n.samples_ms[0] - (n.extra.get("ready_ms") or [0.0])[0] for n in g.nodes if n.kind is NodeKind.COMPUTE]
        return sum(ready) + sum(n.cpu_ms[0] for n in g.nodes if n.kind is NodeKind.IO)

    # busy 3.7 - 0.7 ms asleep: what the steps and the call's own CPU do not hold is the call's, its read included
    [g] = graphs_of(tmp_path, queued_request(1.75, idle=[(1.8, 2.5)], answer=2.6, read=0.1))
    hidden = g.node(call).extra["hidden_ms"][0]
    assert hidden == pytest.approx(3.0 - held(g), abs=1e-6) and hidden > 0.1
    # the loop slept 0.2 ms longer: 0.2 ms less of it
    [g] = graphs_of(tmp_path, queued_request(1.75, idle=[(1.8, 2.7)], answer=2.75, read=0.1))
    assert g.node(call).extra["hidden_ms"][0] == pytest.approx(hidden - 0.2, abs=1e-6)
    # no sleeps recorded: the answer's read callback alone; nothing recorded at all: nothing
    [g] = graphs_of(tmp_path, queued_request(1.75, answer=2.6, read=0.1))
    assert g.node(call).extra["hidden_ms"] == pytest.approx([0.1])
    [g] = graphs_of(tmp_path, queued_request(1.75))
    assert g.node(call).extra["hidden_ms"] == pytest.approx([0.0])


def test_sync_nodes_say_how_long_their_wake_up_waited_for_the_loop(tmp_path: Path) -> None:
    # a gather of tasks 2 and 3, done at 0.8; task 4 (spawned beside them, not joined) holds the loop over
    # [0.85, 1.45], and the root resumes at 1.5: of the 0.7 ms wake-up, 0.6 was queueing behind task 4
    t = Trace("GET /g")
    t.request(-0.1, 2.0, 1)
    t.task(1, [(0, 0.5, "sync:10"), (1.5, 0.2, "done")], coro="fan")
    t.task(2, [(0.55, 0.1, "done")], parent=1, spawn_step=0, created=0.2)
    t.task(3, [(0.7, 0.1, "done")], parent=1, spawn_step=0, created=0.3)
    t.task(4, [(0.85, 0.6, "done")], parent=1, spawn_step=0, created=0.4)
    t.sync(10, "gather", "all", [2, 3], task=1, step=0, start=0.45, end=1.52, resume_step=1)
    [g] = graphs_of(tmp_path, t)
    sync = g.node("root/gather#0")
    assert sync.samples_ms == pytest.approx((0.7,))
    assert sync.extra["queued_ms"] == pytest.approx([0.6])
    # the loop never slept in between: still only task 4's steps, not the loop's own turns between tasks
    t.spans_[0] = dataclasses.replace(t.spans_[0], attributes={**t.spans_[0].attributes, A.LOOP_IDLE_NS: ()})
    [g] = graphs_of(tmp_path, t)
    assert g.node("root/gather#0").extra["queued_ms"] == pytest.approx([0.6])


def test_compute_cpu_is_pro_rated(tmp_path: Path) -> None:
    t = Trace("GET /cpu")
    t.request(0, 3, 1)
    t.task(1, [(0, 1.0, "io"), (2.0, 0.9, "done")], cpu=0.5)
    t.io(1, 0, 0.4, 2.1)
    [g] = graphs_of(tmp_path, t)
    assert [n.id for n in g.nodes if n.kind is NodeKind.COMPUTE] == ["root/c0", "root/c1"]
    assert g.node("root/c0").samples_ms == pytest.approx((0.4,)) and g.node("root/c0").cpu_ms == pytest.approx((0.2,))
    assert g.node("root/c1").samples_ms == pytest.approx((0.8,)) and g.node("root/c1").cpu_ms == pytest.approx((0.4,))


def test_control_flow_variants_are_separate_with_counts(tmp_path: Path) -> None:
    graphs = graphs_of(tmp_path, gather_request(), cache_hit_request(shift=10), gather_request(shift=20),
                       gather_request(shift=40, base=7), cache_hit_request("GET /other", shift=60))
    assert [(g.route, g.variant, g.count) for g in graphs] == [("GET /", 0, 3), ("GET /", 1, 1), ("GET /other", 0, 1)]
    assert "root/gather#0" not in graphs[1].dag and "root/gather#0" in graphs[0].dag
    for g in graphs:
        assert self_check(g).max() < 0.01


def test_race_is_an_any_wait_and_the_winner_decides(tmp_path: Path) -> None:
    first, second = graphs_of(tmp_path, race_request(), race_request(shift=10, win=4.0, lose=2.5),
                              race_request(shift=20, win=2.0, lose=9.0))
    # a race won by the other replica is another variant
    assert (first.count, second.count) == (2, 1)
    assert second.node("root/wait#0").extra["won_by"] == "root/wait#0[1]/c1"
    g = first
    sync = g.node("root/wait#0")
    assert sync.wait is WaitMode.ANY and sync.k == 1
    # children are named by creation order (asyncio.wait takes a set), not by the order the set listed them
    assert preds(g, "root/wait#0") == {"root/wait#0[0]/c1", "root/wait#0[1]/c1"}
    assert g.node("root/wait#0[0]/io0").resource == "postgresql://replica-a:5432/test"
    assert "root/c0" not in preds(g, "root/wait#0")  # min() over the awaiting task would be wrong
    assert self_check(g).max() < 0.01
    assert g.latency_ms == pytest.approx((3.7, 2.7))
    assert sync.extra["won_by"] == "root/wait#0[0]/c1"


def wait_for_timed_out(second_label: str = "sync:30", call_at: float = 0.29) -> Trace:
    """3.11 asyncio.wait_for(coro, 2 ms): the coroutine runs in task 2, the timer fires at 2.29 ms; ``call_at``
    is when the collector read the clock at the call."""
    t = Trace("GET /slow")
    t.request(0, 3.0, 1)
    t.task(1, [(0, 0.3, "sync:30"), (2.32, 0.02, second_label), (2.5, 0.4, "done")], coro="slow")
    t.task(2, [(0.35, 0.1, "io"), (2.36, 0.1, "done")], parent=1, spawn_step=0, created=0.2)
    t.io(2, 0, 0.4, 2.42, "http", "GET /blob/{id}", "http://127.0.0.1:8081")
    t.sync(30, "wait_for", "any", [2], task=1, step=0, start=call_at, end=2.3, timeout=2.0, timed_out=True,
           resume_step=1)
    return t


@pytest.mark.parametrize("second_label", ["sync:30", "future"])
def test_wait_for_timeout_races_a_timer(tmp_path: Path, second_label: str) -> None:
    [g] = graphs_of(tmp_path, wait_for_timed_out(second_label))
    timer = g.node("root/wait_for#0/timer")
    assert timer.kind is NodeKind.TIMER and timer.timeout_ms == pytest.approx(2.0)
    assert timer.samples_ms == pytest.approx((2.0,))  # the configured timeout
    assert preds(g, "root/wait_for#0/timer") == {"root/c0"}  # c0 ends at the call, c1 at the suspension
    assert g.node("root/c0").samples_ms == pytest.approx((0.29,)) and preds(g, "root/c1") == {"root/c0"}
    assert preds(g, "root/wait_for#0") == {"root/wait_for#0[0]/c1", "root/wait_for#0/timer"}
    assert g.node("root/wait_for#0").wait is WaitMode.ANY
    assert self_check(g).max() < 0.01


def test_inline_timeout_body_races_the_timer(tmp_path: Path) -> None:
    t = Trace("GET /timeout")
    t.request(0, 1.7, 1)
    t.task(1, [(0, 0.5, "io"), (1.25, 0.35, "done")], coro="timeout")
    t.io(1, 0, 0.3, 1.35)  # cancelled when the timer fired at 1.2
    t.sync(40, "timeout", "any", [], task=1, step=0, start=0.2, end=1.4, timeout=1.0, timed_out=True,
           resume_step=1, body_first_step=0)
    [g] = graphs_of(tmp_path, t)
    assert [n.id for n in g.nodes if n.task == "root"] == [
        "root/c0", "root/c1", "root/io0", "root/c2", "root/timeout#0", "root/c3", "root/timeout#0/timer"]
    assert preds(g, "root/timeout#0/timer") == {"root/c0"}  # the timer starts where the body starts
    assert preds(g, "root/timeout#0") == {"root/c2", "root/timeout#0/timer"}
    assert g.node("root/timeout#0/timer").samples_ms == pytest.approx((1.0,))
    assert self_check(g).max() < 0.01


def taskgroup_request() -> Trace:
    t = Trace("GET /tg")
    t.request(0, 3.6, 1)
    t.task(1, [(0, 0.4, "io"), (1.5, 0.2, "sync:50"), (2.15, 0.05, "sync:50"), (3.15, 0.35, "done")], coro="tg")
    t.io(1, 0, 0.39, 1.55)
    t.task(2, [(0.4, 0.1, "io"), (2.0, 0.1, "done")], parent=1, spawn_step=0, created=0.2)
    t.io(2, 0, 0.45, 2.0)
    t.task(3, [(0.5, 0.1, "io"), (3.0, 0.1, "done")], parent=1, spawn_step=0, created=0.3)
    t.io(3, 0, 0.55, 3.0)
    t.sync(50, "taskgroup", "all", [2, 3], task=1, step=0, start=0.1, end=3.12, resume_step=3, body_first_step=0)
    return t


def test_taskgroup_waits_for_children_and_body(tmp_path: Path) -> None:
    [g] = graphs_of(tmp_path, taskgroup_request())
    assert preds(g, "root/taskgroup#0") == {"root/c1", "root/taskgroup#0[0]/c1", "root/taskgroup#0[1]/c1"}
    # the two suspensions of __aexit__ are one node
    assert [n.id for n in g.nodes if n.kind is NodeKind.SYNC] == ["root/taskgroup#0"]
    assert g.node("root/taskgroup#0").samples_ms == pytest.approx((0.05,))  # resume - the last child's finish
    assert preds(g, "root/taskgroup#0[0]/c0") == {"root/c0"}
    assert self_check(g).max() < 0.01


def test_fire_and_forget_task_does_not_lead_to_end(tmp_path: Path) -> None:
    t = Trace("POST /post")
    t.request(0, 1.3, 1)
    t.task(1, [(0, 0.3, "io"), (1.0, 0.2, "done")])
    t.io(1, 0, 0.2, 1.0)
    t.task(2, [(0.3, 0.1, "io"), (5.0, 0.1, "done")], parent=1, spawn_step=0, created=0.1, coro="notify")
    t.io(2, 0, 0.35, 5.0, "redis", "PUBLISH")
    [g] = graphs_of(tmp_path, t)
    assert preds(g, "root/spawn#0/c0") == {"root/c0"}
    assert g.node("root/spawn#0/io0").samples_ms == pytest.approx((4.65,))
    assert "root/spawn#0/c1" not in nx.ancestors(g.dag, "end")
    assert self_check(g).max() < 0.01


def test_task_await_sleep_and_unattributed_wait(tmp_path: Path) -> None:
    t = Trace("GET /misc")
    t.request(0, 2.8, 1)
    t.task(1, [(0, 0.3, "task:2"), (1.55, 0.25, "future"), (2.5, 0.2, "done")])
    t.task(2, [(0.3, 0.1, "sleep:1000000"), (1.45, 0.05, "done")], parent=1, spawn_step=0, created=0.1)
    [g] = graphs_of(tmp_path, t)
    join = g.node("root/join#0")
    assert join.kind is NodeKind.SYNC and preds(g, "root/join#0") == {"root/c0", "root/spawn#0/c1"}
    assert join.samples_ms == pytest.approx((0.05,))
    assert g.node("root/spawn#0/t0").kind is NodeKind.TIMER
    assert g.node("root/spawn#0/t0").samples_ms == pytest.approx((1.05,))
    assert g.node("root/w0").kind is NodeKind.WAIT and g.node("root/w0").samples_ms == pytest.approx((0.7,))
    assert self_check(g).max() < 0.01


def test_keep_alive_root_task_is_clipped_to_the_request(tmp_path: Path) -> None:
    t = Trace("GET /k")
    t.request(10.2, 12.0, 1)
    # steps before and after the request window belong to the connection, not to this request
    t.task(1, [(9.0, 0.5, "future"), (10.0, 0.6, "io"), (11.5, 0.4, "future"), (13.0, 1.0, "future")], first=40)
    t.io(1, 41, 10.4, 11.6)
    [g] = graphs_of(tmp_path, t)
    assert g.node("root/c0").samples_ms == pytest.approx((0.2,))
    assert g.node("start").samples_ms == pytest.approx((0.0,))
    # the request span ended while the task waited (writing the response): that wait is clipped to the window
    assert g.node("root/w0").samples_ms == pytest.approx((0.1,))
    assert [n.id for n in g.nodes if n.task == "root"] == ["root/c0", "root/io0", "root/c1", "root/w0", "root/c2"]
    assert g.node("root/c2").samples_ms == (0.0,) and preds(g, "end") == {"root/c2"}
    assert self_check(g).max() < 0.01


def test_graphs_round_trip_through_the_file(tmp_path: Path) -> None:
    graphs = graphs_of(tmp_path, gather_request(), race_request(), taskgroup_request())
    dump_graphs(graphs, tmp_path / "g.json")
    back = load_graphs(tmp_path / "g.json")
    assert [g.to_json() for g in back] == [g.to_json() for g in graphs]
    assert back[0].node("root/gather#0[1]/c0").extra["ready_ms"] == pytest.approx([0.2])
    for g in back:
        assert np.all(self_check(g) < 0.01)


def test_build_from_spans_directly() -> None:
    spans = gather_request().spans() + race_request(shift=10).spans()
    assert [(g.route, g.count) for g in build_graphs(spans)] == [("GET /", 1), ("GET /race", 1)]


def test_request_graph_shape_ignores_durations() -> None:
    from analyzer import spans

    reqs = spans.assemble_requests(gather_request().spans() + gather_request(shift=9, sql_ms=1.0, base=50).spans())
    a, b = (request_graph(r) for r in reqs)
    assert a.shape() == b.shape()
    assert a.nodes["root/gather#0[0]/io0"].samples_ms != b.nodes["root/gather#0[0]/io0"].samples_ms


def test_as_completed_ranks_and_the_awaiting_task_arrival(tmp_path: Path) -> None:
    t = Trace("GET /ac")
    t.request(0, 3.5, 1)
    t.task(1, [(0, 0.3, "sync:60"), (2.15, 0.35, "sync:61"), (3.15, 0.25, "done")])
    t.task(2, [(0.3, 0.1, "io"), (2.0, 0.1, "done")], parent=1, spawn_step=0, created=0.1)
    t.io(2, 0, 0.35, 2.0)
    t.task(3, [(0.4, 0.1, "io"), (3.0, 0.1, "done")], parent=1, spawn_step=0, created=0.2)
    t.io(3, 0, 0.45, 3.0)
    t.sync(60, "as_completed", "any", [2, 3], k=1, task=1, step=0, start=0.25, end=2.12, resume_step=1)
    t.sync(61, "as_completed", "any", [2, 3], k=2, task=1, step=1, start=2.45, end=3.12, resume_step=2)
    [g] = graphs_of(tmp_path, t)
    first, second = g.node("root/as_completed#0"), g.node("root/as_completed#1")
    assert (first.wait, first.k, second.wait, second.k) == (WaitMode.ANY, 1, WaitMode.ANY, 2)
    assert preds(g, second.id) == {"root/as_completed#0[0]/c1", "root/as_completed#0[1]/c1"}
    # the task that waits for the second result also had to finish handling the first one
    assert preds(g, "root/c2") == {second.id, "root/c1"}
    assert self_check(g).max() < 0.01


def test_wait_all_with_a_timeout_races_an_all_node_against_the_timer(tmp_path: Path) -> None:
    t = Trace("GET /wt")
    t.request(0, 1.6, 1)
    t.task(1, [(0, 0.3, "sync:70"), (1.3, 0.2, "done")])
    t.task(2, [(0.3, 0.1, "io"), (0.8, 0.1, "done")], parent=1, spawn_step=0, created=0.1)
    t.io(2, 0, 0.35, 0.8)
    t.task(3, [(0.4, 0.1, "io"), (3.0, 0.1, "done")], parent=1, spawn_step=0, created=0.2)  # outlives the wait
    t.io(3, 0, 0.45, 3.0)
    t.sync(70, "wait", "all", [2, 3], task=1, step=0, start=0.29, end=1.3, timeout=1.0, timed_out=True,
           resume_step=1)
    [g] = graphs_of(tmp_path, t)
    assert preds(g, "root/wait#0/all") == {"root/c1", "root/wait#0[0]/c1", "root/wait#0[1]/c1"}
    assert preds(g, "root/wait#0/timer") == {"root/c0"}  # the timer starts at the call, 0.29 ms
    assert preds(g, "root/wait#0") == {"root/wait#0/all", "root/wait#0/timer"}
    assert g.node("root/wait#0").wait is WaitMode.ANY
    assert self_check(g).max() < 0.01
    # were the timer forgotten, the request would wait for the slow task
    broken = CausalGraph(g.route, g.nodes, [e for e in g.dag.edges if e != ("root/wait#0/timer", "root/wait#0")],
                         latency_ms=g.latency_ms)
    assert self_check(broken).max() > 0.5


def lock_wait_request(shift: float, waits: bool) -> Trace:
    """A request whose task waits for a connection pool in some requests only."""
    t = Trace("GET /pool")
    t.request(shift, shift + 3.0, 1)
    steps = [(shift, 0.2, "future"), (shift + 1.0, 0.3, "io"), (shift + 2.5, 0.4, "done")] if waits else \
        [(shift, 0.5, "io"), (shift + 2.5, 0.4, "done")]
    t.task(1, steps)
    t.io(1, 1 if waits else 0, shift + 1.2 if waits else shift + 0.4, shift + 2.6)
    return t


def test_unattributed_waits_make_variants_unless_folded(tmp_path: Path) -> None:
    traces = [lock_wait_request(0, True), lock_wait_request(10, False), lock_wait_request(20, True)]
    plain = graphs_of(tmp_path, *traces)
    assert [(g.variant, g.count) for g in plain] == [(0, 2), (1, 1)]
    assert plain[0].node("root/w0").samples_ms == pytest.approx((0.8, 0.8))
    folded = build_graphs(read_spans(tmp_path / "spans.jsonl"), fold_waits=True)
    [g] = folded
    assert g.count == 3 and not any(n.kind is NodeKind.WAIT for n in g.nodes)
    c0 = g.node("root/c0")
    assert c0.samples_ms == pytest.approx((1.2, 0.4, 1.2)) and c0.extra["wait_ms"] == pytest.approx([0.8, 0, 0.8])
    assert c0.cpu_ms == pytest.approx((0.4, 0.4, 0.4))
    assert self_check(g).max() < 1e-9 and all(self_check(v).max() < 1e-9 for v in plain)


def test_contradictory_spans_are_left_out_not_crashed_on(tmp_path: Path) -> None:
    bad = gather_request(shift=30)
    # task 3 claims to be created after the gather that joined it completed: spawn edge and join make a cycle
    bad.spans_[:] = [s for s in bad.spans() if not (s.perfcast_kind == "task" and s.attributes[A.TASK_ID] == 3)]
    bad.task(3, [(32.6, 0.1, "io"), (34.0, 0.1, "done")], parent=1, spawn_step=2, created=36.7, coro="blob")
    got = read_spans(write(tmp_path / "s.jsonl", gather_request(), bad))
    problems: list[str] = []
    graphs = build_graphs(got, problems=problems)
    assert [g.count for g in graphs] == [1]
    assert len(problems) == 1 and bad.trace_id in problems[0] and "cycle" in problems[0]
    with pytest.raises(GraphError, match="cycle"):
        build_graphs(got)


# --- spans from the real collector -------------------------------------------------------------------------


async def test_real_collector_spans_pass_the_self_check(tmp_path: Path, redis_url: str) -> None:
    """An aiohttp app with every asyncio shape, under collector.instrument(): graphs reproduce the latencies."""
    import asyncio
    import contextlib

    import redis.asyncio as aioredis
    from aiohttp import ClientSession, web

    import collector

    spans_path = tmp_path / "spans.jsonl"
    collector.instrument(output=spans_path, quiet=True)
    try:
        background: set[asyncio.Task[None]] = set()

        async def slow(request: web.Request) -> web.Response:
            await asyncio.sleep(float(request.query.get("s", "0.002")))
            return web.Response(text="ok")

        backend = web.Application()
        backend.router.add_get("/slow", slow)
        backend_runner = web.AppRunner(backend)
        await backend_runner.setup()
        await web.TCPSite(backend_runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{backend_runner.addresses[0][1]}"
        session = ClientSession()
        cache = aioredis.from_url(redis_url)

        async def fetch(seconds: float) -> str:
            async with session.get(f"{base}/slow", params={"s": str(seconds)}) as resp:
                return await resp.text()

        async def index(request: web.Request) -> web.Response:
            await cache.get("perfcast:test:index")
            await asyncio.gather(fetch(0.004), fetch(0.008))
            async with asyncio.TaskGroup() as tg:
                tg.create_task(fetch(0.003))
                tg.create_task(fetch(0.005))
            racers = [asyncio.create_task(fetch(0.002)), asyncio.create_task(fetch(0.030))]
            _, pending = await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
            for loser in pending:
                loser.cancel()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fetch(0.100 if request.query.get("slow") else 0.001), timeout=0.030)
            sum(i * i for i in range(20_000))  # compute between awaits
            task = asyncio.create_task(cache.incr("perfcast:test:views"))  # fire and forget
            background.add(task)
            task.add_done_callback(background.discard)
            return web.Response(text="index")

        app = web.Application()
        app.router.add_get("/", index)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        async with ClientSession() as client:
            for i in range(8):
                async with client.get(url, params={"slow": "1"} if i % 4 == 3 else {}) as resp:
                    assert resp.status == 200
        await asyncio.sleep(0.05)
        await session.close()
        await cache.aclose()
        await runner.cleanup()
        await backend_runner.cleanup()
    finally:
        collector.uninstrument()

    got = read_spans(spans_path)
    graphs = [g for g in build_graphs(got) if g.route == "GET /"]
    assert sum(g.count for g in graphs) == 8
    errors = np.concatenate([self_check(g) for g in graphs])
    assert np.median(errors) < 0.05, errors
    g = max(graphs, key=lambda g: g.count)
    kinds = {n.label for n in g.nodes if n.kind is NodeKind.SYNC}
    assert {"gather", "taskgroup", "wait", "wait_for"} <= kinds, kinds
    assert g.node("root/io0").api == "redis GET"
    assert any(n.wait is WaitMode.ANY for n in g.nodes)
    # the fire-and-forget INCR is in the graph but does not lead to end
    incr = [n.id for n in g.nodes if n.api.startswith("redis INCR")]
    assert incr and not set(incr) & nx.ancestors(g.dag, "end")
    # the requests whose timeout fired (as the collector saw it) are a variant of their own
    timed_out = sum(1 for r in got.requests for s in r.syncs.values() if s.op == "wait_for" and s.timed_out)
    fired = [v for v in graphs if v.node("root/wait_for#3").extra["won_by"] == "root/wait_for#3/timer"]
    assert timed_out >= 2 and [v.count for v in fired] == [timed_out]
    assert all(v.node("root/wait#2").extra["won_by"] == "root/wait#2[0]/c1" for v in graphs)  # the fast replica


def test_task_created_as_its_parent_suspends_comes_from_the_compute_before_the_sync(tmp_path: Path) -> None:
    # shield() wraps the coroutine in a task in the step that then suspends on the sync point; the creation
    # clock may read a little after that step's end: the graph must still come from the compute before the
    # sync point (an edge from the sync point itself would make a cycle).
    t = Trace("GET /shield")
    t.request(0, 6, 1)
    t.task(1, [(0, 1.0, "sync:7"), (5.0, 0.5, "done")])
    t.sync(7, "shield", "all", [2], task=1, step=0, start=0.9, end=5.0, resume_step=1)
    t.task(2, [(1.2, 0.3, "io"), (4.5, 0.3, "done")], parent=1, spawn_step=0, created=1.04)
    t.io(2, 0, 1.3, 4.6)
    [g] = graphs_of(tmp_path, t)
    assert nx.is_directed_acyclic_graph(g.dag)
    assert preds(g, "root/shield#0[0]/c0") == {"root/c0"}
    assert "root/shield#0[0]/c1" in preds(g, "root/shield#0")
    assert self_check(g).max() < 0.05


def _pool_request(*, waited: bool) -> Trace:
    # three tasks query PostgreSQL; two run at once, the third waits for a connection (a `future`) first
    pg = "postgresql://127.0.0.1:5432/test"
    t = Trace("GET /pool")
    t.request(0, 12, 1)
    t.task(1, [(0, 0.5, "sync:9"), (11.0, 0.5, "done")])
    t.sync(9, "gather", "all", [2, 3, 4], task=1, step=0, start=0.4, end=11.0, resume_step=1)
    for tid, begin in ((2, 0.6), (3, 0.7)):
        t.task(tid, [(begin, 0.1, "io"), (5.0, 0.1, "done")], parent=1, spawn_step=0)
        t.io(tid, 0, begin + 0.05, 5.0, system="postgresql", op="SELECT t", resource=pg)
    t.task(4, [(0.8, 0.1, "future" if waited else "sleep:0"), (5.2, 0.1, "io"), (10.5, 0.1, "done")],
           parent=1, spawn_step=0)
    t.io(4, 1, 5.25, 10.5, system="postgresql", op="SELECT t", resource=pg)
    return t


def test_pools_are_seen_where_callers_waited_for_a_slot(tmp_path: Path) -> None:
    from analyzer.build import POOLS_KEY, observed_pools

    got = read_spans(write(tmp_path / "spans.jsonl", _pool_request(waited=True)))
    assert observed_pools(got.requests) == {"postgresql://127.0.0.1:5432/test": 2}
    [g] = build_graphs(got)
    assert g.meta[POOLS_KEY] == {"postgresql://127.0.0.1:5432/test": 2}
    # the same overlap without anyone waiting shows no limit
    got = read_spans(write(tmp_path / "other.jsonl", _pool_request(waited=False)))
    assert observed_pools(got.requests) == {}
    [g] = build_graphs(got)
    assert POOLS_KEY not in g.meta


@pytest.mark.parametrize("second_label", ["sync:30", "future"])
def test_a_wall_clock_step_before_a_timeout_call_makes_no_cycle(tmp_path: Path, second_label: str) -> None:
    # time_ns stepped back between the call's reading (0.45 ms) and the end of the step that made it (0.3 ms):
    # the timer still starts in that step, and the request has the shape of any other
    got = read_spans(write(tmp_path / "spans.jsonl", wait_for_timed_out(second_label, call_at=0.45),
                           wait_for_timed_out(second_label)))
    problems: list[str] = []
    [g] = build_graphs(got, problems=problems)
    assert problems == [] and g.count == 2
    assert preds(g, "root/wait_for#0/timer") == {"root/c0"}
    assert sorted(g.node("root/c0").samples_ms) == pytest.approx([0.29, 0.3], abs=1e-5)
