"""MVASD prediction accuracy on a real measurement: the forum example app backed by PostgreSQL (and Redis).

1. Starts ``python -m examples.forum --port 0 --postgres ... [--redis ...]`` and load-tests ``GET /`` with
   ``perfcast loadtest`` at several concurrency levels (think time chosen so that the levels span light load
   to saturation of the app's event loop), ``--rounds`` times over; the merged file keeps per-level medians.
   The stations are the CPU of the app process (one server: one Python process, one event loop), of the
   PostgreSQL backends serving the app's pool (not those of other clients) and of Redis (one server), measured
   with psutil. Whole-host CPU is not modelled: the machine is shared with the load generator and other work.
2. Fits MVASD (multi-server exact MVA with demands interpolated by a not-a-knot cubic spline over users, held
   constant outside the measured range; Kattepur and Nambiar 2015, Algorithm 2; :mod:`analyzer.mvasd`) on a
   few levels and predicts the others: with the paper's stations only, with a delay station for the latency
   that queues nowhere, with that latency calibrated at each fitted level, with demands against throughput
   (the paper's section VII), and constant-demand exact MVA ("MVA i" in the paper) for contrast.
3. Prints the mean % deviation of eq. 13 of the paper for throughput, cycle time R + Z (what the paper's
   tables report) and response time R alone; for the chosen fit set and as the median over every fit set of
   the same size that includes the lowest and highest level.

The measurement is written to ``benchmarks/results/`` so the figures can be re-derived without measuring again:
``python benchmarks/mvasd_accuracy.py --from benchmarks/results/mvasd_forum_loadtest.json``.

Usage::

    python benchmarks/mvasd_accuracy.py [--users 1,5,10,20,30,40,60] [--fit 1,10,30,60] [--think 0.2s]
        [--duration 12s] [--warmup 3s] [--rounds 3] [--nice -10] [--postgres URL] [--redis URL | --no-redis]
        [--output FILE] [--from FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import psutil
from scipy.optimize import brentq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analyzer.mva import exact_throughput_at, solve_exact
from analyzer.mvasd import interpolate_demands, percent_deviation, solve_mvasd
from analyzer.queueing import ClosedModel, DemandAxis, MeasuredDemands, Station, StationKind
from replayer.monitor import pid_listening_on

RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_OUT = RESULTS / "mvasd_forum_loadtest.json"
MODELLED = ("app-cpu", "postgres-cpu", "redis-cpu")
"""Stations of the model: the process CPU stations (see the module docstring)."""


def _niced(cmd: list[str], nice: int) -> list[str]:
    return ["nice", "-n", str(nice), *cmd] if nice else cmd


def _spawn(cmd: list[str], nice: int, **kwargs: Any) -> subprocess.Popen[str]:
    """Start ``cmd`` in a session of its own at the given nice value.

    With the Linux scheduler's autogroups, CPU is shared fairly between sessions first and by nice value only
    inside one, so the process gets its own session and that session's autogroup gets the nice value too.
    """
    if not nice:
        return subprocess.Popen(cmd, cwd=ROOT, text=True, **kwargs)
    proc = subprocess.Popen(_niced(cmd, nice), cwd=ROOT, text=True, start_new_session=True, **kwargs)
    try:
        Path(f"/proc/{proc.pid}/autogroup").write_text(f"{nice}\n")
    except OSError as exc:  # no autogroups (not Linux, or disabled): the plain nice value is all there is
        print(f"note: cannot set the autogroup nice value of {proc.pid}: {exc}", file=sys.stderr)
    return proc


def _start_forum(postgres: str, redis: str | None, nice: int) -> tuple[subprocess.Popen[str], str]:
    cmd = [sys.executable, "-m", "examples.forum", "--port", "0", "--postgres", postgres]
    if redis:
        cmd += ["--redis", redis]
    proc = _spawn(cmd, nice, stdout=subprocess.PIPE)
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


def _backends_of(app_pid: int, url: str, db_port: int) -> list[int]:
    """PIDs of the database backends connected to the app (concurrent cache misses first, to open its pool)."""

    def get(page: int) -> None:
        with urllib.request.urlopen(f"{url}/?page={page}", timeout=30) as response:
            response.read()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(get, range(16)))
    app_ports = {c.laddr.port for c in psutil.Process(app_pid).net_connections("tcp") if c.raddr and c.raddr.port == db_port}
    backends = set()
    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == db_port and conn.raddr and conn.raddr.port in app_ports and conn.pid:
            backends.add(conn.pid)
    return sorted(backends)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Load-test the forum app with ``perfcast loadtest``, ``args.rounds`` times; return the merged document."""
    redis = None if args.no_redis else args.redis
    load_at_start = list(os.getloadavg())
    forum, url = _start_forum(args.postgres, redis, args.nice)
    rounds: list[dict[str, Any]] = []
    try:
        pids = [f"app={forum.pid}:1"]
        backends = _backends_of(forum.pid, url, _port(args.postgres, 5432))
        if not backends:
            raise SystemExit("cannot find the PostgreSQL backends serving the app (is the server local?)")
        # the backends of the app's pool, not the whole server: other programs may use it too
        pids.append(f"postgres={','.join(map(str, backends))}:{min(len(backends), os.cpu_count() or 1)}")
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
            if _spawn(cmd, args.nice, stdout=subprocess.DEVNULL).wait() != 0:
                raise SystemExit(f"perfcast loadtest failed in round {r + 1}")
            rounds.append(json.loads(out.read_text()))
    finally:
        forum.send_signal(signal.SIGINT)
        try:
            forum.wait(20)
        except subprocess.TimeoutExpired:
            forum.kill()
    merged = merge_rounds(rounds)
    merged["benchmark"] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "nice": args.nice,
        "load_average_at_start": load_at_start,
        "load_average_at_end": list(os.getloadavg()),
        "cpus": os.cpu_count(),
        "stations_modelled": list(MODELLED),
    }
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
    time are kept under ``rounds``. Only the modelled stations are kept (the rounds' files have them all).
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
        stations = {}  # only the modelled ones, so that `perfcast mva --from` models the same network
        for name, st in level["stations"].items():
            if name not in MODELLED:
                continue
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


def _demands(level: dict[str, Any], occupancy: bool) -> dict[str, float]:
    """Demand per modelled station at one level: CPU time per request, or for the app (``occupancy``), CPU
    time plus run-queue wait, at most one server's worth.

    On a host shared with other programs an event loop is held not only while it computes but also while it
    is ready and waiting for a core: that is the service time the requests queued behind it see. (The wait
    of several threads can overlap, so it is capped at one busy server.)
    """
    out = {}
    x = level["throughput_per_s"]
    for name in MODELLED:
        station = level["stations"].get(name)
        if station is None:
            continue
        out[name] = station["demand_s"]
        if occupancy and name == "app-cpu":
            proc = level["processes"]["app"]
            busy = min(float(station["servers"]), proc["busy_servers"] + (proc.get("runqueue_wait_servers") or 0.0))
            out[name] = busy / x
    return out


def _model(
    doc: dict[str, Any], fit: Sequence[int], *, occupancy: bool, delay: bool, axis: DemandAxis = DemandAxis.USERS
) -> ClosedModel:
    levels = {level["users"]: level for level in doc["levels"]}
    fit = sorted(fit)
    fitted = [levels[u] for u in fit]
    demands = [_demands(level, occupancy) for level in fitted]
    at = tuple(float(u) for u in fit) if axis is DemandAxis.USERS else tuple(lv["throughput_per_s"] for lv in fitted)
    stations = [
        Station(name, None, int(fitted[0]["stations"][name]["servers"]), 1.0, StationKind.QUEUE,
                MeasuredDemands(axis, at, tuple(d[name] for d in demands)))
        for name in demands[0]
    ]
    if delay:
        # latency that queues nowhere (network hops, the ad call's timeout, replica races), from the lowest
        # fitted level, where a request meets few others: R = sum of demands + delay
        pure = fitted[0]["response_time_s"] - sum(demands[0].values())
        stations.append(Station("latency", max(pure, 0.0), 1, 1.0, StationKind.DELAY))
    return ClosedModel(tuple(stations), float(doc["think_time_s"]))


def _calibrated_latency(doc: dict[str, Any], fit: Sequence[int]) -> ClosedModel:
    """CPU demands, and a delay station whose demand is calibrated at each fitted level and interpolated.

    At fitted level n the delay d(n) is the one for which exact MVA with that level's CPU demands reproduces
    the measured response time R(n), i.e. the throughput n / (R(n) + Z) (Little's law with the nominal think
    time: the measured throughput at light load carries the sampling noise of the random think times). d(n) is the latency the CPU
    stations do not explain (I/O waits, timeouts, and the cache's hit ratio, which grows with the load); it is
    interpolated like the other demands (MVASD's spline over users).
    """
    levels = {level["users"]: level for level in doc["levels"]}
    z = float(doc["think_time_s"])
    base = _model(doc, fit, occupancy=False, delay=False)
    servers = np.array([s.servers for s in base.stations], dtype=np.int64)
    delays = []
    for u in sorted(fit):
        d = np.array([_demands(levels[u], occupancy=False)[s.name] for s in base.stations])
        target = u / (levels[u]["response_time_s"] + z)

        def gap(delay: float, d: Any = d, u: int = u, target: float = target) -> float:
            return exact_throughput_at(d, servers, z + delay, u) - target

        delays.append(brentq(gap, 0.0, 10.0 * (z + 1.0)) if gap(0.0) > 0 else 0.0)
    latency = Station("latency", None, 1, 1.0, StationKind.DELAY,
                      MeasuredDemands(DemandAxis.USERS, tuple(float(u) for u in sorted(fit)), tuple(delays)))
    return ClosedModel((*base.stations, latency), z)


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


def report(doc: dict[str, Any], fit: Sequence[int]) -> dict[str, dict[str, float]]:
    """Print the measurement, then eq. 13 deviations of the held-out levels for each model; return them."""
    levels = doc["levels"]
    z = float(doc["think_time_s"])
    print(f"\nmeasured ({doc.get('rounds', 1)} rounds, medians): think time {z:g} s "
          f"({doc.get('think_distribution', '?')}); per station: utilisation and CPU demand per request"
          " [app: CPU + run-queue wait]")
    print(f"{'users':>6} {'X/s':>8} {'R ms':>8} {'errors':>6} {'gen CPU':>7}  " + "  ".join(f"{s:>28}" for s in MODELLED))
    for level in levels:
        occ = _demands(level, occupancy=True)
        cells = []
        for name in MODELLED:
            st = level["stations"].get(name)
            if st is None:
                cells.append("-")
                continue
            extra = f" [{occ[name] * 1e3:5.2f}]" if name == "app-cpu" else ""
            cells.append(f"{st['utilization']:4.0%} D={st['demand_s'] * 1e3:5.2f}{extra}ms")
        print(f"{level['users']:>6} {level['throughput_per_s']:8.2f} {level['response_time_s'] * 1e3:8.2f} "
              f"{level['errors']:>6} {level['generator_busy_cpus']:7.2f}  " + "  ".join(f"{c:>28}" for c in cells))
    measured = {level["users"]: level for level in levels}
    held = [u for u in sorted(measured) if u not in set(fit)]
    if not held:
        print("no held-out levels: nothing to predict")
        return {}
    mx = np.array([measured[u]["throughput_per_s"] for u in held])
    mr = np.array([measured[u]["response_time_s"] for u in held])
    idx = np.array(held) - 1
    n_max = max(held)
    print(f"\nfitted on users = {sorted(fit)}; predicting users = {held}; eq. 13 mean % deviation")
    print(f"{'model':<60} {'X %':>6} {'R+Z %':>6} {'R %':>6}   per held-out level: X pred/meas, R pred/meas (ms)")
    rows: list[tuple[str, Any]] = []
    cpu_delay = _model(doc, fit, occupancy=False, delay=True)
    rows.append(("MVASD: CPU demands (the paper's stations)", solve_mvasd(_model(doc, fit, occupancy=False,
                                                                                  delay=False), n_max)))
    rows.append(("MVASD: CPU demands + latency delay station", solve_mvasd(cpu_delay, n_max)))
    rows.append(("MVASD: app CPU + run-queue wait, + latency delay", solve_mvasd(
        _model(doc, fit, occupancy=True, delay=True), n_max)))
    rows.append(("MVASD: CPU demands + latency calibrated per fitted level", solve_mvasd(
        _calibrated_latency(doc, fit), n_max)))
    fitted_x = [measured[u]["throughput_per_s"] for u in sorted(fit)]
    if all(b > a for a, b in itertools.pairwise(fitted_x)):
        rows.append(("MVASD vs throughput (sec. VII): CPU + latency delay", solve_mvasd(
            _model(doc, fit, occupancy=False, delay=True, axis=DemandAxis.THROUGHPUT), n_max)))
    rows += [(f"  exact MVA, CPU demands of users={u} + delay (MVA {u})", solve_exact(_constant(cpu_delay, u), n_max))
             for u in sorted(fit)]
    out: dict[str, dict[str, float]] = {}
    for name, result in rows:
        px, pr = result.throughput_per_s[idx], result.response_time_s[idx]
        dev = {"throughput": percent_deviation(px, mx), "cycle_time": percent_deviation(pr + z, mr + z),
               "response_time": percent_deviation(pr, mr)}
        out[name.strip()] = dev
        per_level = ", ".join(
            f"{u}: {a:.1f}/{b:.1f} {c * 1e3:.0f}/{d * 1e3:.0f}" for u, a, b, c, d in zip(held, px, mx, pr, mr)
        )
        print(f"{name:<60} {dev['throughput']:6.2f} {dev['cycle_time']:6.2f} {dev['response_time']:6.2f}   {per_level}")
    return out


def fit_set_summary(doc: dict[str, Any], size: int = 4) -> None:
    """Median eq. 13 deviations over every fit set of ``size`` levels that includes the lowest and highest.

    One fit set can be lucky or unlucky with the noise of a shared machine; the median over all of them is
    the figure to quote.
    """
    users = sorted(level["users"] for level in doc["levels"])
    inner = users[1:-1]
    sets = [[users[0], *mid, users[-1]] for mid in itertools.combinations(inner, size - 2)]
    results: dict[str, list[dict[str, float]]] = {}
    for fit in sets:
        with contextlib.redirect_stdout(io.StringIO()):
            for name, dev in report(doc, fit).items():
                if name.startswith("MVASD"):  # "MVA i" rows change with the fit set
                    results.setdefault(name, []).append(dev)
    print(f"\nmedian over the {len(sets)} fit sets of {size} levels including users={users[0]} and {users[-1]}"
          " (each predicting the other levels)")
    print(f"{'model':<60} {'X %':>6} {'R+Z %':>6} {'R %':>6}")
    for name, devs in results.items():
        med = {key: float(np.median([d[key] for d in devs])) for key in ("throughput", "cycle_time", "response_time")}
        print(f"{name:<60} {med['throughput']:6.2f} {med['cycle_time']:6.2f} {med['response_time']:6.2f}"
              + ("" if len(devs) == len(sets) else f"   ({len(devs)} sets: needs increasing throughput)"))


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
    parser.add_argument("--nice", type=int, default=0,
                        help="run the app and the load generator at this nice value, each in its own session "
                             "(e.g. -10 on a host shared with other work; needs root below 0)")
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
    fit_set_summary(doc, len(args.fit.split(",")))


if __name__ == "__main__":
    main()
