"""Accuracy of ``load:N`` predictions on the example forum app in its CPU-bound form (embedded defaults).

The forum with its embedded defaults runs the blob / cache / ad services and two recommendation replicas on a
second event-loop thread of the same process, and SQLite through aiosqlite worker threads: one process, one
GIL, so CPU that no compute segment of a request records (client libraries inside io calls, the other
threads, the kernel's share of the process) runs out first under load.

Steps:

1. baseline under the collector: ``--base-users`` closed-loop users (light load, default 2) for
   ``--base-seconds``;
   graphs of the requests of the measured window;
2. the same light load on the app *without* the collector, its process CPU measured with psutil: its user-mode
   CPU per user request (the GIL's demand) against the CPU the spans attribute to requests gives the
   background demand or the factor that takes the collector's cost out of the recorded CPU
   (:func:`analyzer.loadsim.background_demand`), and its latencies the factor for the recorded waits
   (:func:`analyzer.loadsim.fit_wait_scale`: the calibrated model at that load takes that long);
3. per N: ``predict(load:N)``, then ground truth: the app without the collector under N closed-loop users of
   the example's load client (``examples.forum.load.run_load``, in its own process), client-side latencies.

Printed per N: predicted vs measured p50 / p90 / mean and throughput, the CDF deviations (median, KS D) and
the CPU the load client took (in cores). Raw results: ``benchmarks/results/load_accuracy.json``. Run::

    python benchmarks/load_accuracy.py [--users 4,8,16] [--seconds 8] [--base-seconds 12] [--repeats 3]
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
import psutil  # type: ignore[import-untyped]

from analyzer.accuracy import cdf_deviation
from analyzer.build import build_graphs
from analyzer.loadsim import calibrate
from analyzer.predict import predict
from analyzer.spans import process_cpu, process_cpu_within, read_spans
from examples.forum.load import LoadResult, run_load_subprocess
from replayer.groundtruth import cpu_s, route_of

RESULTS = Path(__file__).with_name("results")
PATHS = ("/?page={n}", "/post/{n}")
ROUTES = ("GET /", "GET /post/{id}")


@contextlib.contextmanager
def _app(spans: Path | None, log: Path) -> Iterator[tuple[str, psutil.Process]]:
    """The forum (embedded defaults), under the collector when ``spans`` is given: (url, the app's process)."""
    app = [sys.executable, "-m", "examples.forum", "--port", "0", "--seed", "1"]
    env = dict(os.environ)
    if spans is not None:
        env["PERFCAST_QUIET"] = "1"  # the launcher sets up the app's environment itself
        env["PERFCAST_SERVICE_NAME"] = "forum"
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


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load(url: str, users: int, seconds: float, app: psutil.Process,
          seed: int) -> tuple[LoadResult, tuple[float, ...], float]:
    """(result, the app's (user, system, loop) CPU s per measured request, load client CPU in cores) of one run."""
    run_load_subprocess(url, users=users, requests=max(20, 4 * users), paths=PATHS, seed=seed)  # warm-up
    cpu0, kids0, t0 = cpu_s([app.pid]), _children_cpu_s(), time.monotonic()
    result = run_load_subprocess(url, users=users, duration_s=seconds, paths=PATHS, seed=seed + 1)
    cpu1, kids1, t1 = cpu_s([app.pid]), _children_cpu_s(), time.monotonic()
    n = max(len(result.latencies_ms), 1)
    per = tuple((b - a) / n for a, b in zip(cpu0, cpu1, strict=True))
    return result, per, (kids1 - kids0) / (t1 - t0)


def _summary(x: np.ndarray) -> dict[str, float]:
    return {"p50": float(np.median(x)), "p90": float(np.quantile(x, 0.9)), "mean": float(x.mean())}


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", default="4,8,16")
    ap.add_argument("--seconds", type=float, default=8.0, help="measured seconds per ground-truth run")
    ap.add_argument("--base-users", type=int, default=2)
    ap.add_argument("--base-seconds", type=float, default=12.0)
    ap.add_argument("--samples", type=int, default=3000)
    ap.add_argument("--base-repeats", type=int, default=2, help="light-load runs with and without the collector")
    ap.add_argument("--repeats", type=int, default=3, help="ground-truth runs per N (fresh app each)")
    ap.add_argument("--keep", type=Path, help="keep the spans and graphs in this directory")
    ns = ap.parse_args(argv)
    levels = [int(x) for x in ns.users.split(",")]
    work = Path(ns.keep or tempfile.mkdtemp(prefix="perfcast-load-"))
    work.mkdir(parents=True, exist_ok=True)

    # 1. and 2., alternated --base-repeats times (the machine is shared): baseline spans at light load under the
    # collector, and the same light load without it (process CPU, latencies)
    reqs: list[Any] = []
    light_ms: list[float] = []
    splits: list[dict[str, float]] = []
    light_paths: list[str] = []
    user_s = sys_s = loop_s = 0.0
    base_client = 0.0
    for rep in range(ns.base_repeats):
        spans = work / f"baseline-{rep}.jsonl"
        with _app(spans, work / f"app-collected-{rep}.log") as (url, proc):
            begin = time.time_ns()
            base, _, base_client = _load(url, ns.base_users, ns.base_seconds, proc, seed=10 + rep)
            end = time.time_ns()
        got = read_spans(spans)
        reqs += [r for r in got.requests if begin <= r.start_ns and r.end_ns <= end]
        # the collector's own figures over the measured window (one process span per second, summed)
        p = process_cpu_within(process_cpu(got.spans), begin, end)
        if p is not None:
            n = max(sum(1 for r in got.requests if r.route in ROUTES and begin <= r.start_ns <= end), 1)
            splits.append({"loop_thread_ms": p.loop_thread_ms / n, "other_threads_ms": p.other_threads_ms / n,
                           "export_ms": p.export_ms / n, "user_ms": p.user_ms / n, "system_ms": p.system_ms / n})
            print(f"collected run {rep + 1}: per user request, loop thread {p.loop_thread_ms / n:.2f} ms, other "
                  f"threads and kernel {p.other_threads_ms / n:.2f} ms, collector's export {p.export_ms / n:.2f} ms "
                  "CPU (process span)", flush=True)
        with _app(None, work / f"app-light-{rep}.log") as (url, proc):
            light, (u, sy, lp), _ = _load(url, ns.base_users, ns.base_seconds, proc, seed=10 + rep)
        light_ms += light.latencies_ms
        light_paths += light.paths
        user_s += u * len(light.latencies_ms)
        sys_s += sy * len(light.latencies_ms)
        loop_s += lp * len(light.latencies_ms)
        print(f"light load {rep + 1}/{ns.base_repeats}: collected {base.throughput_rps:.1f} req/s, p50 "
              f"{base.percentile_ms(50):.2f} ms; without the collector {light.throughput_rps:.1f} req/s, p50 "
              f"{light.percentile_ms(50):.2f} ms, {u * 1e3:.2f} ms user + {sy * 1e3:.2f} ms system CPU per request",
              flush=True)
    user_s /= len(light_ms)
    sys_s /= len(light_ms)
    loop_s /= len(light_ms)
    problems: list[str] = []
    graphs = build_graphs(reqs, problems=problems)
    print(f"baseline: {len(reqs)} requests (all routes) -> {len(graphs)} graph variants"
          f"{f'; {len(problems)} left out: {problems[0]}' if problems else ''}")
    # The loop is held for every thread's user time (the GIL) and its own thread's system time; other threads'
    # system time (aiosqlite's worker in its syscalls) runs beside it (replayer.groundtruth.cpu_s).
    def by_route(ms: list[float], paths: list[str]) -> dict[str, list[float]]:
        return {r: [x for x, q in zip(ms, paths, strict=True) if route_of(q) == r] for r in ROUTES}

    model, calibration = calibrate(graphs, ROUTES, loop_s * 1e3, by_route(light_ms, light_paths),
                                   users=ns.base_users)
    demand, scale = calibration.demand, calibration.wait_scale
    print(f"process CPU {user_s * 1e3:.2f} ms user + {sys_s * 1e3:.2f} ms system per request, the loop held "
          f"{loop_s * 1e3:.2f} ms; "
          f"{calibration.describe()}")

    # the light load itself: only its mean latency was used (the wait scale's fit), so the shape is still a check
    (light_pred,) = [np.concatenate([p.predicted.samples_ms for p in predict(
        model, f"load:{ns.base_users}", samples=ns.samples, rng=np.random.default_rng(1)) if p.route in ROUTES])]
    light_dev = cdf_deviation(light_pred, light_ms)
    print(f"load:{ns.base_users} (the light runs) measured p50 {np.median(light_ms):.2f} mean "
          f"{np.mean(light_ms):.2f} ms | predicted p50 {np.median(light_pred):.2f} mean "
          f"{light_pred.mean():.2f} ms | median dev {light_dev.median:.3f} KS D {light_dev.max:.3f}")
    rows: list[dict[str, Any]] = []
    for users in levels:
        t_pred = time.perf_counter()
        preds = [p for p in predict(model, f"load:{users}", samples=ns.samples, rng=np.random.default_rng(users))
                 if p.route in ROUTES]
        plain = [p for p in predict(graphs, f"load:{users}", samples=ns.samples, rng=np.random.default_rng(users))
                 if p.route in ROUTES]
        t_pred = time.perf_counter() - t_pred
        predicted = np.concatenate([p.predicted.samples_ms for p in preds])
        without = np.concatenate([p.predicted.samples_ms for p in plain])
        for rep in range(ns.repeats):  # the machine is shared: repeat the ground truth, quote medians
            with _app(None, work / f"app-{users}-{rep}.log") as (url, proc):
                truth, (app_user, app_sys, _), client_cores = _load(url, users, ns.seconds, proc,
                                                                 seed=100 * rep + users)
            measured = np.asarray(truth.latencies_ms)
            dev, dev0 = cdf_deviation(predicted, measured), cdf_deviation(without, measured)
            row: dict[str, Any] = {
                "users": users, "repeat": rep, "measured": _summary(measured), "predicted": _summary(predicted),
                "predicted_uncalibrated": _summary(without),
                "throughput_measured_rps": truth.throughput_rps,
                # closed loop, think 0: throughput = users / mean latency (Little's law)
                "throughput_predicted_rps": users / float(predicted.mean()) * 1e3,
                "median_deviation": dev.median, "ks_d": dev.max,
                "median_deviation_uncalibrated": dev0.median, "ks_d_uncalibrated": dev0.max,
                "app_user_cpu_ms_per_request": app_user * 1e3, "app_system_cpu_ms_per_request": app_sys * 1e3,
                "client_cores": client_cores,
                "requests": int(measured.size), "errors": truth.errors, "predict_s": t_pred,
            }
            rows.append(row)
            m, p = row["measured"], row["predicted"]
            print(f"load:{users:<3} measured p50 {m['p50']:7.2f} p90 {m['p90']:7.2f} mean {m['mean']:7.2f} ms "
                  f"{truth.throughput_rps:6.1f} req/s | predicted p50 {p['p50']:7.2f} p90 {p['p90']:7.2f} mean "
                  f"{p['mean']:7.2f} ms {row['throughput_predicted_rps']:6.1f} req/s | median dev "
                  f"{dev.median:.3f} KS D {dev.max:.3f} (uncalibrated: {dev0.median:.3f} / {dev0.max:.3f}) | "
                  f"client {client_cores:.2f} cores, app {app_user * 1e3:.2f} + {app_sys * 1e3:.2f} ms CPU/req",
                  flush=True)
        mine = [r for r in rows if r["users"] == users]
        med = {k: float(np.median([r[k] for r in mine])) for k in (
            "median_deviation", "ks_d", "median_deviation_uncalibrated", "ks_d_uncalibrated",
            "throughput_measured_rps", "client_cores")}
        print(f"load:{users:<3} median of {len(mine)}: median dev {med['median_deviation']:.3f} KS D "
              f"{med['ks_d']:.3f} (uncalibrated {med['median_deviation_uncalibrated']:.3f} / "
              f"{med['ks_d_uncalibrated']:.3f}); measured {med['throughput_measured_rps']:.1f} req/s, "
              f"client {med['client_cores']:.2f} cores", flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = {"baseline_requests": len(reqs), "base_users": ns.base_users,
           "light": {"median_deviation": light_dev.median, "ks_d": light_dev.max},
           "background": demand.to_json(), "wait_scale": scale, "wait_scale_by_route": dict(calibration.by_route),
           "process_span_per_request": splits,
           "light_load_cpu_ms_per_request": {"user": user_s * 1e3, "system": sys_s * 1e3, "loop": loop_s * 1e3},
           "base_client_cores": base_client,
           "load_average": os.getloadavg(), "rows": rows}
    (RESULTS / "load_accuracy.json").write_text(json.dumps(out, indent=1))
    print(f"results: {RESULTS / 'load_accuracy.json'}")


if __name__ == "__main__":
    main()
