"""Accuracy of ``load:N`` predictions on the example forum app in its CPU-bound form (embedded defaults).

The forum with its embedded defaults runs the blob / cache / ad services and two recommendation replicas on a
second event-loop thread of the same process, and SQLite through aiosqlite worker threads: one process, one
GIL, so CPU that no compute segment of a request records (client libraries inside io calls, the other
threads, the kernel's share of the process) runs out first under load.

Steps:

1. baseline under the collector: ``--base-users`` closed-loop users (light load) for ``--base-seconds``;
   graphs of the requests of the measured window;
2. the same light load on the app *without* the collector, its process CPU measured with psutil: the CPU per
   user request minus the CPU the spans attribute to requests is the background demand
   (:func:`analyzer.loadsim.background_demand`), the collector's own CPU left out by construction;
3. per N: ``predict(load:N)``, then ground truth: the app without the collector under N closed-loop users of
   the example's load client (``examples.forum.load.run_load``, in its own process), client-side latencies.

Printed per N: predicted vs measured p50 / p90 / mean and throughput, the CDF deviations (median, KS D) and
the CPU the load client took (in cores). Raw results: ``benchmarks/results/load_accuracy.json``. Run::

    python benchmarks/load_accuracy.py [--users 4,8,16] [--seconds 8] [--base-seconds 12]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import resource
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from analyzer.accuracy import cdf_deviation
from analyzer.build import build_graphs
from analyzer.graph import CausalGraph
from analyzer.loadsim import background_demand, with_background
from analyzer.predict import predict, select_routes
from analyzer.spans import read_spans
from examples.forum.load import LoadResult, run_load_subprocess

RESULTS = Path(__file__).with_name("results")
PATHS = ("/?page={n}", "/post/{n}")
ROUTES = ("GET /", "GET /post/{id}")


@contextlib.contextmanager
def _app(spans: Path | None, log: Path) -> Iterator[tuple[str, psutil.Process]]:
    """The forum (embedded defaults), under the collector when ``spans`` is given: (url, the app's process)."""
    app = [sys.executable, "-m", "examples.forum", "--port", "0", "--seed", "1"]
    env = dict(os.environ)
    if spans is not None:
        from collector._launcher import child_environment

        env = child_environment(str(spans), service_name="forum")
        env["PERFCAST_QUIET"] = "1"
        argv = [sys.executable, "-m", "collector", "-o", str(spans), "--", *app]
    else:
        argv = app
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env, start_new_session=True)
    try:
        url = _listening(proc)
        me = psutil.Process(proc.pid)
        # under the collector the launcher is the parent and the app its one child
        target = me if spans is None else next(p for p in me.children(recursive=True) if "examples.forum" in
                                               " ".join(p.cmdline()))
        yield url, target
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        assert proc.stdout is not None
        proc.stdout.close()


def _listening(proc: subprocess.Popen[bytes], timeout_s: float = 60.0) -> str:
    assert proc.stdout is not None
    buffer = b""
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(1.0):
                continue
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buffer += chunk
            if m := re.search(rb"listening on (http://\S+)", buffer):
                return m.group(1).decode()
    raise RuntimeError(f"the app did not start: {buffer.decode(errors='replace')}")


def _cpu_s(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load(url: str, users: int, seconds: float, app: psutil.Process, seed: int) -> tuple[LoadResult, float, float]:
    """(result, app CPU s per measured request, load client CPU in cores) of one closed-loop run."""
    run_load_subprocess(url, users=users, requests=max(20, 4 * users), paths=PATHS, seed=seed)  # warm-up
    cpu0, kids0, t0 = _cpu_s(app), _children_cpu_s(), time.monotonic()
    result = run_load_subprocess(url, users=users, duration_s=seconds, paths=PATHS, seed=seed + 1)
    cpu1, kids1, t1 = _cpu_s(app), _children_cpu_s(), time.monotonic()
    n = max(len(result.latencies_ms), 1)
    return result, (cpu1 - cpu0) / n, (kids1 - kids0) / (t1 - t0)


def _summary(x: np.ndarray) -> dict[str, float]:
    return {"p50": float(np.median(x)), "p90": float(np.quantile(x, 0.9)), "mean": float(x.mean())}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", default="4,8,16")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per ground-truth run")
    ap.add_argument("--base-users", type=int, default=1)
    ap.add_argument("--base-seconds", type=float, default=12.0)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--keep", type=Path, help="keep the spans and graphs in this directory")
    ns = ap.parse_args(argv)
    levels = [int(x) for x in ns.users.split(",")]
    work = Path(ns.keep or tempfile.mkdtemp(prefix="perfcast-load-"))
    work.mkdir(parents=True, exist_ok=True)
    spans = work / "baseline.jsonl"

    # 1. baseline spans at light load
    with _app(spans, work / "app-collected.log") as (url, proc):
        begin = time.time_ns()
        base, _, base_client = _load(url, ns.base_users, ns.base_seconds, proc, seed=10)
        end = time.time_ns()
    reqs = [r for r in read_spans(spans).requests if begin <= r.start_ns and r.end_ns <= end]
    graphs = build_graphs(reqs)
    print(f"baseline: {len(reqs)} requests (all routes) -> {len(graphs)} graph variants; "
          f"{base.throughput_rps:.1f} req/s, p50 {base.percentile_ms(50):.2f} ms (client side, collected)")

    # 2. background CPU: the app without the collector at the same light load
    with _app(None, work / "app-light.log") as (url, proc):
        light, cpu_per_req, _ = _load(url, ns.base_users, ns.base_seconds, proc, seed=10)
    user_graphs = select_routes(graphs, ROUTES)
    demand = background_demand(graphs, user_graphs, cpu_per_req * 1e3)
    print(f"light load without the collector: {light.throughput_rps:.1f} req/s, p50 "
          f"{light.percentile_ms(50):.2f} ms; process CPU {cpu_per_req * 1e3:.2f} ms per request; traced "
          f"{demand.traced_ms:.2f} ms -> background {demand.background_ms:.2f} ms, CPU scale {demand.cpu_scale:.3f}")
    # every route: the in-process services' requests are simulated as sub-requests on the same CPU (GIL)
    model = with_background(graphs, demand)

    rows: list[dict[str, Any]] = []
    for users in levels:
        t_pred = time.perf_counter()
        preds = [p for p in predict(model, f"load:{users}", samples=ns.samples, rng=np.random.default_rng(users))
                 if p.route in ROUTES]
        plain = [p for p in predict(graphs, f"load:{users}", samples=ns.samples, rng=np.random.default_rng(users))
                 if p.route in ROUTES]
        t_pred = time.perf_counter() - t_pred
        with _app(None, work / f"app-{users}.log") as (url, proc):
            truth, app_cpu, client_cores = _load(url, users, ns.seconds, proc, seed=100 + users)
        measured = np.asarray(truth.latencies_ms)
        predicted = np.concatenate([p.predicted.samples_ms for p in preds])
        without = np.concatenate([p.predicted.samples_ms for p in plain])
        # closed loop, think 0: throughput = users / mean latency (Little's law), for the prediction too
        dev, dev0 = cdf_deviation(predicted, measured), cdf_deviation(without, measured)
        row = {
            "users": users, "measured": _summary(measured), "predicted": _summary(predicted),
            "predicted_without_background": _summary(without),
            "throughput_measured_rps": truth.throughput_rps,
            "throughput_predicted_rps": users / float(predicted.mean()) * 1e3,
            "median_deviation": dev.median, "ks_d": dev.max,
            "median_deviation_without_background": dev0.median, "ks_d_without_background": dev0.max,
            "app_cpu_ms_per_request": app_cpu * 1e3, "client_cores": client_cores,
            "requests": int(measured.size), "errors": truth.errors, "predict_s": t_pred,
        }
        rows.append(row)
        m, p = row["measured"], row["predicted"]
        print(f"load:{users:<3} measured p50 {m['p50']:7.2f} p90 {m['p90']:7.2f} mean {m['mean']:7.2f} ms "
              f"{truth.throughput_rps:6.1f} req/s | predicted p50 {p['p50']:7.2f} p90 {p['p90']:7.2f} mean "
              f"{p['mean']:7.2f} ms {row['throughput_predicted_rps']:6.1f} req/s | median dev "
              f"{dev.median:.3f} KS D {dev.max:.3f} (uncalibrated: {dev0.median:.3f} / {dev0.max:.3f}) | "
              f"client {client_cores:.2f} cores, app {app_cpu * 1e3:.2f} ms CPU/req")
    RESULTS.mkdir(exist_ok=True)
    out = {"baseline_requests": len(reqs), "background": demand.to_json(),
           "light_load_cpu_ms_per_request": cpu_per_req * 1e3, "base_client_cores": base_client,
           "load_average": os.getloadavg(), "rows": rows}
    (RESULTS / "load_accuracy.json").write_text(json.dumps(out, indent=1))
    print(f"results: {RESULTS / 'load_accuracy.json'}")


if __name__ == "__main__":
    main()
