"""The load simulation's own mechanics against the forum app under load, with the collector on both sides.

The load rows of ``whatif_accuracy.py`` predict the app *without* the collector from a baseline collected under
it, through a calibration (the loop's CPU and the recorded waits scaled to the app without the collector).
Here the loaded runs are collected too, so the prediction is made from the one-user spans as recorded, without
calibration or profiles, and scored against the server spans of the same configuration at ``--users`` users.
What is left is the simulation's own: the loop's demand under load, and where the requests wait. The loaded
spans say where they did:

- the waits for a pooled connection (a task's wait right before the step that makes a PostgreSQL call, as
  ``analyzer.loadsim`` finds them), summed per request, beside the simulation's (its queueing note);
- the loop's CPU per request (its thread's CPU over the run), at one user and under load.

Printed per round and route: predicted and measured p50 and mean, the CDF deviations (median, KS D), and the
pooled-connection waits. Raw results: ``benchmarks/results/load_mechanics.json``. Run::

    python benchmarks/load_mechanics.py [--users 16] [--rounds 2] [--requests 800]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.accuracy import cdf_deviation
from analyzer.build import build_graphs
from analyzer.graph import CausalGraph, NodeKind
from analyzer.loadsim import _pool_waits
from analyzer.predict import predict
from analyzer.spans import Request, read_spans
from replayer.groundtruth import ForumSetup, GroundTruth, measure, measured_requests, reachable

RESULTS = Path(__file__).with_name("results")
ROUTES = ("GET /", "GET /post/{id}")
REDIS_URL = "redis://127.0.0.1:6379/13"
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
_NUMBER = r"[\d.]+(?:e[+-]?\d+)?"  # 3 significant digits, whole from 1000 ms on (e-notation in older notes)
_QUEUEING = re.compile(rf"(GET [^ ]+) \(mean {_NUMBER} ms\) ({_NUMBER}) ms for the loop"
                       rf"(?:, ({_NUMBER}) ms for a pooled connection)?")


def _requests(truth: GroundTruth) -> list[Request]:
    return [r for path in truth.spans for r in measured_requests(read_spans(path).requests, [truth])]


def pool_wait_ms(graph: CausalGraph) -> np.ndarray:
    """Per recorded request of ``graph``: its summed waits for a pooled connection (a wait node of a task right
    before that task's step that makes a PostgreSQL call), found as the simulation finds the waits it leaves out."""
    ids = [node.id for node in graph.nodes]
    pooled = [0 if node.kind is NodeKind.IO and node.system == "postgresql" else -1 for node in graph.nodes]
    total = np.zeros(len(graph.latency_ms))
    for j in _pool_waits(graph, ids, pooled):
        total += np.asarray(graph.nodes[j].samples_ms)
    return total


def simulated_waits(notes: tuple[str, ...]) -> dict[str, tuple[float, float]]:
    """route -> (the loop, a pooled connection) summed waits per request, from the simulation's queueing note."""
    for note in notes:
        if note.startswith("queueing per request"):
            return {m[1]: (float(m[2]), float(m[3] or 0.0)) for m in _QUEUEING.finditer(note)}
    return {}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--users", type=int, default=16, help="users of the loaded runs (default 16)")
    p.add_argument("--rounds", type=int, default=2, help="one-user then loaded runs (default 2)")
    p.add_argument("--requests", type=int, default=800, help="measured requests of a loaded run (default 800)")
    p.add_argument("--samples", type=int, default=4000, help="Monte Carlo samples per route")
    p.add_argument("--out", type=Path, default=RESULTS / "load_mechanics.json")
    ns = p.parse_args(argv)
    for name, value, least in (("--users", ns.users, 2), ("--rounds", ns.rounds, 1), ("--requests", ns.requests, 1),
                               ("--samples", ns.samples, 1)):
        if value < least:
            p.error(f"{name} must be at least {least}, got {value}")
    if not (reachable("127.0.0.1", 6379) and reachable("127.0.0.1", 5432)):
        print("load_mechanics: needs Redis on 127.0.0.1:6379 and PostgreSQL on 127.0.0.1:5432", file=sys.stderr)
        return 2
    setup = ForumSetup(redis_url=REDIS_URL, postgres_url=POSTGRES_URL, app_args=("--cache-ttl-ms", "0"))
    spec = f"load:{ns.users}?" + "&".join(f"mix.{r}=1" for r in ROUTES)
    work = Path(tempfile.mkdtemp(prefix="perfcast-load-mechanics-"))
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    for k in range(ns.rounds):
        base = measure(setup, users=1, requests=300, spans=work / f"base{k}.jsonl")
        loaded = measure(setup, users=ns.users, requests=ns.requests, spans=work / f"load{k}.jsonl")
        graphs = [g for g in build_graphs(_requests(base), problems=[]) if g.route in ROUTES]
        preds = predict(graphs, spec, None, ns.samples, np.random.default_rng(k))
        sim = simulated_waits(preds[0].notes) if preds else {}
        loaded_graphs = build_graphs(_requests(loaded), problems=[])
        print(f"round {k + 1}: the loop's CPU per request {base.loop_cpu_ms:.2f} ms at one user, "
              f"{loaded.loop_cpu_ms:.2f} at {ns.users} users; {loaded.throughput_rps:.1f} requests/s")
        for pred in preds:
            measured = np.asarray(loaded.server_ms[pred.route], dtype=np.float64)
            waits = np.concatenate([pool_wait_ms(g) for g in loaded_graphs if g.route == pred.route] or [np.zeros(0)])
            dev = cdf_deviation(pred.predicted.samples_ms, measured)
            loop_sim, pool_sim = sim.get(pred.route, (float("nan"), float("nan")))
            row = {"round": k + 1, "route": pred.route, "users": ns.users,
                   "predicted": pred.predicted.summary(),
                   "measured": {"p50": float(np.median(measured)), "mean": float(measured.mean())},
                   "median_deviation": dev.median, "ks_d": dev.max,
                   "pool_wait_ms": {"measured": float(waits.mean()) if waits.size else 0.0, "simulated": pool_sim},
                   "loop_wait_ms_simulated": loop_sim,
                   "loop_cpu_ms": {"one_user": base.loop_cpu_ms, "loaded": loaded.loop_cpu_ms}}
            rows.append(row)
            print(f"  {pred.route:15} p50 {row['predicted']['p50']:7.1f} predicted, {row['measured']['p50']:7.1f} "
                  f"measured; mean {row['predicted']['mean']:7.1f} / {row['measured']['mean']:7.1f}; "
                  f"{dev.median:.1%} / {dev.max:.3f}; pooled-connection waits per request "
                  f"{pool_sim:.1f} ms simulated, {row['pool_wait_ms']['measured']:.1f} measured")
    args = {"users": ns.users, "rounds": ns.rounds, "requests": ns.requests, "samples": ns.samples}
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps({"args": args, "rows": rows}, indent=1))
    print(f"total {time.monotonic() - began:.0f} s; spans in {work}; raw results: {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
