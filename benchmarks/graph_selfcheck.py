"""The graph self-check on the example app: how well do the causal graphs reproduce observed latencies?

For each configuration (the embedded defaults, and real Redis + PostgreSQL when both are reachable): run the
forum app under ``perfcast collect`` (``python -m collector`` when the CLI command is not installed), send
requests at light load (closed loop, few users, think time) from another process, stop the app with SIGINT so
the spans are flushed, read the spans, build the graphs and print the distribution of
``|evaluated - observed| / observed`` per route/variant (median, p90, max) and overall.

It also checks that the self-check can fail on these graphs: each variant is corrupted in the three ways the
check exists to catch (every any-wait made an all-wait; the edge from each sync point's slowest joined task
removed; parallel children chained one after the other) and the median error of the corrupted graphs is printed
beside the true one. Finally the same requests are built with ``fold_waits=True`` (waits for locks and
connection pools folded into compute) to show how many variants contention alone creates.

Usage::

    python benchmarks/graph_selfcheck.py                      # 20 s per configuration
    python benchmarks/graph_selfcheck.py --duration 5 --users 1 --no-real    # quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from importlib.util import find_spec
from itertools import pairwise
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from analyzer.build import build_graphs
from analyzer.graph import CausalGraph, NodeKind, WaitMode, evaluate
from analyzer.selfcheck import CheckSummary, self_check
from analyzer.spans import read_spans
from examples.forum.load import run_load_subprocess
from replayer.groundtruth import reachable

REDIS_URL = os.environ.get("PERFCAST_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_URL = os.environ.get("PERFCAST_BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
_LISTENING = re.compile(r"listening on (http://\S+)")
PATHS = ("/?page={n}", "/post/{n}")


def collect(spans: Path, app_args: list[str], users: int, duration_s: float, think_ms: float) -> int:
    """Run the app under the collector, load it, stop it; return the number of requests the client measured."""
    runner = (["perfcast", "collect"] if find_spec("perfcast._collect") else [sys.executable, "-m", "collector"])
    argv = [*runner, "-o", str(spans), "--", sys.executable, "-m", "examples.forum", "--port", "0", *app_args]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        deadline = time.monotonic() + 60
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if m := _LISTENING.search(line):
                url = m.group(1)
                break
        if url is None:
            raise RuntimeError(f"the app did not start: {proc.stderr.read() if proc.stderr else ''}")
        result = run_load_subprocess(url, users=users, duration_s=duration_s, warmup_s=1.0, think_ms=think_ms,
                                     paths=list(PATHS), n_max=20, seed=1)
        return len(result.latencies_ms)
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=60)
            summary = [line for line in err.splitlines() if line.startswith("perfcast:")]
            if summary:
                print("   collector:", summary[-1].removeprefix("perfcast: "))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


# --- corruptions the self-check must catch -------------------------------------------------------------------


def _rebuild(graph: CausalGraph, nodes: dict[str, object] | None = None,
             edges: list[tuple[str, str]] | None = None) -> CausalGraph:
    nodes = nodes or {}
    return CausalGraph(graph.route, [nodes.get(n.id, n) for n in graph.nodes],  # type: ignore[misc]
                       edges if edges is not None else list(graph.dag.edges),
                       latency_ms=graph.latency_ms, trace_ids=graph.trace_ids)


def race_as_all(graph: CausalGraph) -> CausalGraph | None:
    anys = {n.id: dataclasses.replace(n, wait=WaitMode.ALL, k=1) for n in graph.nodes if n.wait is WaitMode.ANY}
    return _rebuild(graph, nodes=anys) if anys else None  # type: ignore[arg-type]


def missing_edge(graph: CausalGraph) -> CausalGraph | None:
    """Remove, at each all-wait sync node, the edge from the predecessor that finishes last (median)."""
    finish = evaluate(graph, graph.durations())
    drop = set()
    for node in graph.nodes:
        preds = graph.predecessors(node.id)
        if node.kind is NodeKind.SYNC and node.wait is WaitMode.ALL and len(preds) > 1:
            drop.add((max(preds, key=lambda p: float(np.median(finish[p]))), node.id))
    return _rebuild(graph, edges=[e for e in graph.dag.edges if e not in drop]) if drop else None


def parallel_as_serial(graph: CausalGraph) -> CausalGraph | None:
    """Chain the joined tasks of each all-wait sync node: each child's first node after the previous child."""
    edges = list(graph.dag.edges)
    changed = False
    for node in graph.nodes:
        if node.kind is not NodeKind.SYNC or node.wait is not WaitMode.ALL:
            continue
        tasks = sorted({graph.node(p).task for p in graph.predecessors(node.id)} - {node.task})
        firsts = {t: next(n.id for n in graph.nodes if n.task == t) for t in tasks}
        lasts = {t: [n.id for n in graph.nodes if n.task == t][-1] for t in tasks}
        for a, b in pairwise(tasks):
            edges = [e for e in edges if e[1] != firsts[b]] + [(lasts[a], firsts[b])]
            changed = True
    return _rebuild(graph, edges=edges) if changed else None


def report(name: str, graphs: list[CausalGraph]) -> None:
    print(f"\n== {name}: {sum(g.count for g in graphs)} requests, {len(graphs)} variants")
    print(f"   {'route':16s} {'var':>3s} {'n':>4s} {'nodes':>5s} {'p50 ms':>8s} | {'median':>7s} {'p90':>7s} "
          f"{'max':>7s} | corrupted medians: {'any->all':>8s} {'-edge':>8s} {'serial':>8s}")
    every = []
    for g in graphs:
        err = self_check(g)
        every.append(err)
        s = CheckSummary.of(err)
        bad = []
        for corrupt in (race_as_all, missing_edge, parallel_as_serial):
            broken = corrupt(g)
            bad.append(f"{np.median(self_check(broken)):8.1%}" if broken is not None else f"{'-':>8s}")
        print(f"   {g.route:16s} {g.variant:3d} {g.count:4d} {len(g.nodes):5d} {np.median(g.latency_ms):8.2f} | "
              f"{s.median:7.2%} {s.p90:7.2%} {s.max:7.2%} | {'':19s}{' '.join(bad)}")
    s = CheckSummary.of(np.concatenate(every) if every else [])
    print(f"   overall: n={s.count} median {s.median:.3%} p90 {s.p90:.3%} max {s.max:.3%}")
    for route in sorted({g.route for g in graphs}):
        e = np.concatenate([self_check(g) for g in graphs if g.route == route])
        r = CheckSummary.of(e)
        print(f"   {route:16s} n={r.count:4d} median {r.median:.3%} p90 {r.p90:.3%} max {r.max:.3%}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=20.0, help="seconds of measured load per configuration")
    p.add_argument("--users", type=int, default=2, help="closed-loop users (light load)")
    p.add_argument("--think-ms", type=float, default=50.0, help="pause between a user's requests")
    p.add_argument("--no-real", action="store_true", help="only the embedded defaults")
    p.add_argument("--keep", type=Path, help="keep the spans files in this directory")
    ns = p.parse_args()
    configs = [("embedded (SQLite, in-process blob/cache service)", [])]
    if not ns.no_real:
        if reachable("127.0.0.1", 6379) and reachable("127.0.0.1", 5432):
            configs.append(("real Redis + PostgreSQL", ["--redis", REDIS_URL, "--postgres", POSTGRES_URL]))
        else:
            print("Redis or PostgreSQL not reachable on 127.0.0.1: embedded configuration only")
    with tempfile.TemporaryDirectory() as tmp:
        out = ns.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for i, (name, args) in enumerate(configs):
            spans = out / f"selfcheck-{i}.jsonl"
            print(f"-- {name}: {ns.users} users, think {ns.think_ms:g} ms, {ns.duration:g} s")
            spans.unlink(missing_ok=True)  # the collector appends to an existing file
            measured = collect(spans, args, ns.users, ns.duration, ns.think_ms)
            t0 = time.perf_counter()
            sf = read_spans(spans)
            graphs = build_graphs(sf)
            took = time.perf_counter() - t0
            print(f"   client measured {measured} requests; spans file {spans.stat().st_size / 1e6:.1f} MB, "
                  f"{len(sf.spans)} spans, {len(sf.requests)} complete requests (incl. the embedded services'), "
                  f"{len(sf.problems)} problems; read + build {took:.2f} s")
            report(name, graphs)
            folded = build_graphs(sf, fold_waits=True)
            e = CheckSummary.of(np.concatenate([self_check(g) for g in folded]))
            routes = sorted({g.route for g in graphs})
            counts = ", ".join(f"{r} {sum(g.route == r for g in graphs)}->{sum(g.route == r for g in folded)}"
                               for r in routes)
            print(f"   with fold_waits: variants per route {counts}; self-check n={e.count} median {e.median:.3%} "
                  f"p90 {e.p90:.3%} max {e.max:.3%}")


if __name__ == "__main__":
    main()
