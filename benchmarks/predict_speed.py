"""How fast the what-if engine predicts, and how it scales with graph size.

Goals: a 200-node graph with 60 sync points and 10,000 samples per node in under 20 ms; a
10,000-node graph in under 1 s. Synthetic graphs shaped like WebPerf's (section 6: 182 nodes, 62 sync points
on average): a chain of fork/join blocks, each fanning out to 2-4 branches of io and compute nodes and
joining with gather (all), wait(FIRST_COMPLETED) (any) or as_completed (k-th).

Prints medians of several runs and ratios measured in the same run:

- ``engine``: :func:`analyzer.distribution.evaluate_plan` alone (the Monte Carlo over the DAG);
- ``predict``: :func:`analyzer.predict.predict` end to end on an already loaded graph (scenario parsing,
  node durations, the baseline and the predicted evaluation, summaries), for a deterministic change
  (location, ``+20 ms`` per round trip) and a profile change (tier: 10 % of the nodes drawn from a profile);
- ``worst``: every node drawn per sample (S columns everywhere);
- ``reference``: :func:`analyzer.graph.evaluate` on the same sample matrix (the straightforward loop);
- the load simulation's cost per node visited (``load:30``).

Run: ``python benchmarks/predict_speed.py [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from analyzer.distribution import compile_dag, evaluate_plan
from analyzer.graph import CausalGraph, Node, NodeKind, WaitMode, evaluate
from analyzer.predict import predict
from analyzer.profiles import ProfileKey, ProfileStore

REDIS = "redis://127.0.0.1:6379/0"
PG = "postgresql://127.0.0.1:5432/test"


def synthetic(nodes: int, syncs: int, requests: int, seed: int = 0) -> CausalGraph:
    """A start -> [fork -> branches -> join] x syncs -> end graph with about ``nodes`` nodes."""
    rng = np.random.default_rng(seed)
    work = nodes - 2 - syncs  # io and compute nodes, spread over the blocks
    out = [Node("start", NodeKind.START, (0.0,) * requests), Node("end", NodeKind.END, (0.0,) * requests)]
    edges: list[tuple[str, str]] = []
    prev = "start"
    for b in range(syncs):
        per_block = max(work // syncs + (b < work % syncs), 2)
        width = min(int(rng.integers(2, 5)), per_block)
        lengths = np.full(width, per_block // width)
        lengths[: per_block % width] += 1
        tails = []
        for w, length in enumerate(lengths):
            last = prev
            for i in range(int(length)):
                node_id = f"b{b}/w{w}/n{i}"
                if (i + w) % 2:
                    node = Node(node_id, NodeKind.COMPUTE, tuple(rng.gamma(2.0, 0.1, requests)))
                else:
                    redis = rng.random() < 0.5
                    node = Node(node_id, NodeKind.IO, tuple(rng.lognormal(0.0 if redis else 1.0, 0.4, requests)),
                                api="redis GET" if redis else "postgresql SELECT posts",
                                resource=REDIS if redis else PG, system="redis" if redis else "postgresql",
                                round_trips=tuple(rng.integers(1, 3, requests).tolist()))
                out.append(node)
                edges.append((last, node_id))
                last = node_id
            tails.append(last)
        kind = b % 5
        wait, k = (WaitMode.ANY, 1) if kind == 3 else (WaitMode.ANY, 2) if kind == 4 and width > 2 else (WaitMode.ALL, 1)
        join = f"b{b}/join"
        out.append(Node(join, NodeKind.SYNC, tuple(rng.exponential(0.01, requests)), wait=wait, k=k))
        edges += [(t, join) for t in tails]
        prev = join
    edges.append((prev, "end"))
    return CausalGraph("GET /synthetic", out, edges, latency_ms=[1.0] * requests)


CLOCK = time.process_time
"""CPU time of this process: on a machine shared with other jobs, wall time measures the neighbours too
(``--wall`` switches to ``time.perf_counter``). numpy runs single-threaded here, so the two agree when idle."""


def median_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        t0 = CLOCK()
        fn()
        times.append((CLOCK() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    parser.add_argument("--wall", action="store_true", help="measure wall time instead of CPU time")
    args = parser.parse_args()
    global CLOCK
    if args.wall:
        CLOCK = time.perf_counter
    repeat = 3 if args.quick else 7
    samples = 10_000
    cases = [(200, 60, 10_000)] if args.quick else [(50, 15, 10_000), (200, 60, 10_000), (1_000, 300, 2_000)]
    cases.append((10_000, 3_000, 200))
    with tempfile.TemporaryDirectory() as tmp:
        store = ProfileStore(Path(tmp) / "p.db")
        store.add(ProfileKey.make("postgresql SELECT posts", PG, {"tier": "large"}),
                  np.random.default_rng(1).lognormal(0.5, 0.3, 2000))
        print(f"{samples} Monte Carlo samples per prediction; medians of {repeat} runs, "
              f"{'wall' if args.wall else 'CPU'} time (ms)")
        header = (f"{'nodes':>6} {'syncs':>5} {'recorded':>8} | {'engine':>8} {'predict':>8} {'predict':>8} "
                  f"{'worst':>8} {'reference':>9} | {'ref/worst':>9} {'us/node':>7}")
        print(f"{'':>22} | {'(base)':>8} {'(+20ms)':>8} {'(tier)':>8} {'(all S)':>8} {'evaluate':>9} |")
        print(header)
        rows = []
        for nodes, syncs, requests in cases:
            g = synthetic(nodes, syncs, requests)
            plan = compile_dag(g)
            base = np.stack([np.asarray(g.node(i).samples_ms) for i in plan.ids])
            rng = np.random.default_rng(0)
            idx = rng.integers(0, requests, samples)
            full = base[:, idx]
            every = {j: full[j] for j in range(plan.size)}
            engine = median_ms(partial(evaluate_plan, plan, base, idx), repeat)
            loc = median_ms(partial(predict, [g], "location:redis=+20ms", None, samples, rng), repeat)
            tier = median_ms(partial(predict, [g], "tier:postgresql=large", store, samples, rng), repeat)
            worst = median_ms(partial(evaluate_plan, plan, base, idx, every), repeat)
            durations = {node_id: full[j] for j, node_id in enumerate(plan.ids)}
            ref = median_ms(partial(evaluate, g, durations), max(repeat // 2, 1))
            print(f"{plan.size:>6} {syncs:>5} {requests:>8} | {engine:>8.2f} {loc:>8.2f} {tier:>8.2f} "
                  f"{worst:>8.2f} {ref:>9.2f} | {ref / worst:>9.2f} {worst * 1e3 / plan.size:>7.2f}")
            rows.append((plan.size, loc, tier, worst))
        g = synthetic(200, 60, 1_000)
        sim_requests = 2_000
        sim = median_ms(partial(predict, [g], "load:30", None, sim_requests, np.random.default_rng(0)),
                        max(repeat // 2, 1))
        print(f"load:30 simulation (analyzer.loadsim), 200-node graph, {sim_requests} simulated requests: "
              f"{sim:.0f} ms, {sim * 1e3 / (sim_requests * 200):.2f} us per node visited")
        store.close()
    print()
    for size, loc, tier, worst in rows:
        goal = 20.0 if size <= 250 else 1000.0 if size >= 5000 else None
        if goal is not None:
            verdict = "meets" if max(loc, tier, worst) < goal else "MISSES"
            print(f"{size} nodes: slowest of predict(+20ms) / predict(tier) / all-S engine = "
                  f"{max(loc, tier, worst):.1f} ms, {verdict} the {goal:g} ms goal")
    if len(rows) >= 2:
        (s0, _, _, w0), (s1, _, _, w1) = rows[0], rows[-1]
        print(f"scaling of the all-S engine from {s0} to {s1} nodes: x{w1 / w0:.1f} time for x{s1 / s0:.0f} nodes")


if __name__ == "__main__":
    sys.exit(main())
