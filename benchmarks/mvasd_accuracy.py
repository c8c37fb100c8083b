"""MVASD prediction accuracy on a real measurement: the forum example app backed by PostgreSQL (and Redis).

1. Starts ``python -m examples.forum --port 0 --postgres ... [--redis ...]`` and load-tests ``GET /`` with
   ``perfcast loadtest`` at several concurrency levels (think time chosen so that the levels span light load
   to saturation of the app's event loop). The stations are the CPU of three process trees, measured with
   psutil: the app (one server: one Python process, one event loop), PostgreSQL (the postmaster and its
   backends) and Redis (one server). Whole-host CPU is recorded too but not modelled: the machine is shared
   with the load generator and other work, so process CPU time is the cleaner demand.
2. Fits MVASD (multi-server exact MVA with demands interpolated by a not-a-knot cubic spline over users,
   held constant outside the measured range; Kattepur and Nambiar 2015, Algorithm 2) on a few levels and
   predicts the others (:mod:`analyzer.mvasd`).
3. Prints the mean % deviation of eq. 13 of the paper, per held-out level and overall, for throughput, cycle
   time R + Z (what the paper's tables report) and response time R alone; and the same for constant-demand
   exact MVA fed with one level's demands ("MVA i" in the paper), for contrast.

The measured load test is written to ``benchmarks/results/`` so the figures can be re-derived without
measuring again: ``python benchmarks/mvasd_accuracy.py --from benchmarks/results/mvasd_forum_loadtest.json``.

Usage::

    python benchmarks/mvasd_accuracy.py [--users 1,5,10,20,30,40,50,60] [--fit 1,10,30,60] [--think 0.2s]
        [--duration 20s] [--warmup 5s] [--postgres URL] [--redis URL | --no-redis] [--from FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.mva import solve_exact
from analyzer.mvasd import interpolate_demands, percent_deviation, solve_mvasd
from analyzer.queueing import ClosedModel, DemandAxis, MeasuredDemands, Station, StationKind
from replayer.monitor import pid_listening_on

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_OUT = RESULTS / "mvasd_forum_loadtest.json"
MODELLED = ("app-cpu", "postgres-cpu", "redis-cpu")
"""Stations of the model: the process-tree CPU stations (see the module docstring)."""


def _start_forum(postgres: str, redis: str | None) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "examples.forum", "--port", "0", "--postgres", postgres]
    if redis:
        cmd += ["--redis", redis]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("listening on "):
            return proc, line.split()[-1]
    proc.kill()
    raise SystemExit(f"the forum app did not start: {' '.join(cmd)}")


def _port(url: str, default: int) -> int:
    return urlsplit(url).port or default


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Load-test the forum app with ``perfcast loadtest``, ``args.rounds`` times; return the merged document."""
    redis = None if args.no_redis else args.redis
    forum, url = _start_forum(args.postgres, redis)
    rounds: list[dict[str, Any]] = []
    try:
        pids = [f"app={forum.pid}:1"]
        pg = pid_listening_on(_port(args.postgres, 5432))
        if pg is None:
            raise SystemExit("cannot find the PostgreSQL server's process (is it local?)")
        pids.append(f"postgres={pg}")
        if redis:
            rd = pid_listening_on(_port(redis, 6379))
            if rd is None:
                raise SystemExit("cannot find the Redis server's process (is it local?)")
            pids.append(f"redis={rd}:1")
        for r in range(args.rounds):
            out = args.output.with_name(f"{args.output.stem}.round{r + 1}.json")
            cmd = [sys.executable, "-m", "perfcast.cli", "loadtest", "--url", f"{url}/", "--users", args.users,
                   "--think", args.think, "--duration", args.duration, "--warmup", args.warmup,
                   "--seed", str(r + 1), "-o", str(out)]
            for p in pids:
                cmd += ["--pid", p]
            print(f"round {r + 1} of {args.rounds}: $", " ".join(cmd), flush=True)
            subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
            rounds.append(json.loads(out.read_text()))
    finally:
        forum.send_signal(signal.SIGINT)
        try:
            forum.wait(20)
        except subprocess.TimeoutExpired:
            forum.kill()
    merged = merge_rounds(rounds)
    args.output.write_text(json.dumps(merged, indent=2) + "\n")
    print(f"wrote {args.output} (median of {len(rounds)} rounds)")
    return merged


_LEVEL_MEDIANS = ("throughput_per_s", "response_time_s", "response_time_p50_s", "response_time_p90_s",
                  "response_time_p99_s", "think_time_measured_s", "generator_busy_cpus")


def merge_rounds(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One load-test document whose levels hold, per figure, the median over the rounds.

    Other programs share this machine and come and go; running all levels several times, one round after the
    other, spreads their interference over all levels, and the median keeps a burst in one round from
    deciding a level. Counts (completed, errors, duration) are summed; each round's throughput and response
    time are kept under ``rounds``.
    """
    first = rounds[0]
    levels = []
    for i, level in enumerate(first["levels"]):
        same = [r["levels"][i] for r in rounds]
        assert all(s["users"] == level["users"] for s in same)
        merged: dict[str, Any] = {"users": level["users"]}
        for key in ("duration_s", "completed", "errors"):
            merged[key] = sum(s[key] for s in same)
        for key in _LEVEL_MEDIANS:
            merged[key] = float(np.median([s[key] for s in same]))
        x = merged["throughput_per_s"]
        stations = {}
        for name, st in level["stations"].items():
            demand = float(np.median([s["stations"][name]["demand_s"] for s in same]))
            busy = min(demand * x, float(st["servers"]))
            stations[name] = dict(st, demand_s=demand, busy_servers=busy, utilization=busy / st["servers"])
        merged["stations"] = stations
        merged["processes"] = {
            label: {
                key: float(np.median([s["processes"][label][key] or 0.0 for s in same]))
                for key in ("busy_servers", "runqueue_wait_servers")
            }
            | {"servers": proc["servers"]}
            for label, proc in level["processes"].items()
        }
        merged["rounds"] = [
            {"throughput_per_s": s["throughput_per_s"], "response_time_s": s["response_time_s"]} for s in same
        ]
        levels.append(merged)
    return {key: value for key, value in first.items() if key != "levels"} | {"rounds": len(rounds),
                                                                                "levels": levels}


def _occupancy_demands(level: dict[str, Any]) -> dict[str, float]:
    """Per modelled station: (CPU + run-queue wait) busy servers / X, at most its servers.

    On a host shared with other programs a process's event loop is held not only while it computes but also
    while it is ready and waiting for a core: that is the service time the requests queued behind it see.
    """
    out = {}
    for name in MODELLED:
        station = level["stations"].get(name)
        proc = level["processes"].get(name.removesuffix("-cpu"))
        if station is None or proc is None:
            continue
        wait = proc.get("runqueue_wait_servers") or 0.0
        busy = min(float(station["servers"]), proc["busy_servers"] + wait)
        out[name] = busy / level["throughput_per_s"]
    return out


def _model(doc: dict[str, Any], fit: Sequence[int], *, occupancy: bool, delay: bool) -> ClosedModel:
    levels = {level["users"]: level for level in doc["levels"]}
    fitted = [levels[u] for u in sorted(fit)]
    names = [n for n in MODELLED if all(n in level["stations"] for level in fitted)]
    demands = {
        u: (_occupancy_demands(level) if occupancy else {n: level["stations"][n]["demand_s"] for n in names})
        for u, level in zip(sorted(fit), fitted)
    }
    stations = [
        Station(
            name, None, int(fitted[0]["stations"][name]["servers"]), 1.0, StationKind.QUEUE,
            MeasuredDemands(DemandAxis.USERS, tuple(float(u) for u in sorted(fit)),
                            tuple(demands[u][name] for u in sorted(fit))),
        )
        for name in names
    ]
    if delay:
        # latency that queues nowhere (network hops, the ad call's timeout, replica races), from the lowest
        # fitted level, where a request meets no other: R(1) = sum of demands + delay
        low = fitted[0]
        pure = low["response_time_s"] - sum(demands[low["users"]].values())
        stations.append(Station("latency", max(pure, 0.0), 1, 1.0, StationKind.DELAY))
    return ClosedModel(tuple(stations), float(doc["think_time_s"]))


def _constant(model: ClosedModel, at_users: int) -> ClosedModel:
    """``model`` with each measured demand fixed at its value at ``at_users`` ("MVA i" in the paper)."""
    stations = []
    for s in model.stations:
        if s.measured is not None:
            d = float(interpolate_demands(s.measured, [at_users])[0])
            stations.append(Station(s.name, d, s.servers, s.visits, s.kind))
        else:
            stations.append(s)
    return ClosedModel(tuple(stations), model.think_time_s)


def report(doc: dict[str, Any], fit: Sequence[int]) -> None:
    """Print the measurement, then eq. 13 deviations of the held-out levels for each model variant."""
    levels = doc["levels"]
    z = float(doc["think_time_s"])
    print(f"\nmeasured: think time {z:g} s ({doc.get('think_distribution', '?')}), stations: CPU busy"
          " [CPU + run-queue wait] and demand per request")
    print(f"{'users':>6} {'X/s':>8} {'R ms':>8} {'errors':>6} {'gen CPU':>7}  "
          + "  ".join(f"{s:>30}" for s in MODELLED))
    for level in levels:
        occ = _occupancy_demands(level)
        cells = []
        for name in MODELLED:
            st = level["stations"].get(name)
            if st is None:
                cells.append("-")
                continue
            cells.append(f"{st['utilization']:4.0%} [{occ[name] * level['throughput_per_s'] / st['servers']:4.0%}]"
                          f" D={st['demand_s'] * 1e3:5.2f} [{occ[name] * 1e3:5.2f}]ms")
        print(f"{level['users']:>6} {level['throughput_per_s']:8.2f} {level['response_time_s'] * 1e3:8.2f} "
              f"{level['errors']:>6} {level['generator_busy_cpus']:7.2f}  " + "  ".join(f"{c:>30}" for c in cells))
    measured = {level["users"]: level for level in levels}
    held = [u for u in sorted(measured) if u not in set(fit)]
    if not held:
        print("no held-out levels: nothing to predict")
        return
    mx = np.array([measured[u]["throughput_per_s"] for u in held])
    mr = np.array([measured[u]["response_time_s"] for u in held])
    idx = np.array(held) - 1
    print(f"\nfitted on users = {sorted(fit)}; predicting users = {held}; eq. 13 mean % deviation")
    header = f"{'model':<44} {'X %':>6} {'R+Z %':>6} {'R %':>6}   per held-out level: X pred/meas, R pred/meas (ms)"
    print(header)
    variants = [
        ("MVASD, CPU-time demands", {"occupancy": False, "delay": False}),
        ("MVASD, CPU + run-queue wait demands", {"occupancy": True, "delay": False}),
        ("MVASD, CPU + run-queue wait, + delay station", {"occupancy": True, "delay": True}),
    ]
    n_max = max(held)
    for title, options in variants:
        model = _model(doc, fit, **options)
        rows = [(title, solve_mvasd(model, n_max))]
        if options["occupancy"] and options["delay"]:
            rows += [(f"  exact MVA, demands of users={u} (MVA {u})", solve_exact(_constant(model, u), n_max))
                     for u in sorted(fit)]
        for name, result in rows:
            px, pr = result.throughput_per_s[idx], result.response_time_s[idx]
            per_level = ", ".join(
                f"{u}: {a:.1f}/{b:.1f} {c * 1e3:.0f}/{d * 1e3:.0f}" for u, a, b, c, d in zip(held, px, mx, pr, mr)
            )
            print(f"{name:<44} {percent_deviation(px, mx):6.2f} {percent_deviation(pr + z, mr + z):6.2f} "
                  f"{percent_deviation(pr, mr):6.2f}   {per_level}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", default="1,5,10,20,30,40,60")
    parser.add_argument("--fit", default="1,10,30,60", help="levels whose demands MVASD interpolates")
    parser.add_argument("--think", default="0.2s")
    parser.add_argument("--duration", default="12s", help="measured window of each level, each round")
    parser.add_argument("--warmup", default="3s")
    parser.add_argument("--rounds", type=int, default=3, help="times to run all levels (medians are kept)")
    parser.add_argument("--postgres", default=os.environ.get("PERFCAST_TEST_POSTGRES_URL",
                                                             "postgresql://postgres@127.0.0.1:5432/test"))
    parser.add_argument("--redis", default=os.environ.get("PERFCAST_TEST_REDIS_URL", "redis://127.0.0.1:6379/0"))
    parser.add_argument("--no-redis", action="store_true", help="cache pages in the blob service instead")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--from", dest="from_file", type=Path, help="re-derive from a saved load test")
    args = parser.parse_args(argv)
    if args.from_file:
        doc = json.loads(args.from_file.read_text())
    else:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        doc = measure(args)
    report(doc, [int(u) for u in args.fit.split(",")])


if __name__ == "__main__":
    main()
