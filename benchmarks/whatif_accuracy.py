"""Accuracy of what-if predictions on the example forum app, against each scenario applied for real.

WebPerf's evaluation (Jiang et al., SIGCOMM 2016, section 6.2): for every scenario, predict the latency
distribution from today's spans and offline profiles, then deploy the scenario for real, measure, and score the
prediction by the vertical deviations |F1(x) - F2(x)| of the two CDFs (median, and the max: the KS D).
Goal: median deviation < 5 % and KS D < 0.15 for every scenario (WebPerf reports medians under 7 %).

Steps, per scenario (docs/demo.md and docs/accuracy.md say why each choice):
1. what can be switched in a running app (location, size, interference, and the first case, which changes
   nothing: its score is the floor under the others): one deployment of the forum app under the collector,
   one user, today's deployment and the scenario taking turns ``--run`` requests at a time, the first of each
   run not measured (``replayer.groundtruth.measure_paired``: the harness switches the proxy's delay, the CPU
   hog, the blob service's stored blobs before each request the load client asks it about), ``--requests``
   measured requests a side in ``--blocks`` runs of the client. Load and failure: ``--rounds`` baseline runs
   (the app under the collector, one user), then the light runs that calibrate the prediction (one user) and
   the loaded runs (users, one of two replicas sharing a port stopped) taking turns in one deployment without the
   collector (``measure_loaded``), each light run followed by short runs at a quarter and a half of the users
   per loop (``LOAD_LEVELS``): the ``(levels)`` rows take the loop's demand and the host's CPU for the load from
   them (``analyzer.loadsim.calibrate``'s ``levels``: MVASD's load-varying demands, and the host's cores
   simulated), the nominal rows price the loop's demand from the one-user run with what a wake-up costs,
   fitted to the levels' (``analyzer.loadsim.fit_wake_cost``), and simulate the host's cores from the levels'
   readings too, the ``(one user)`` rows from the one-user run alone. ``--separate`` measures the
   switchable cases in deployments of their own. The location cases (and the first) run with the app alone on
   the machine's first core and everything else started here on the others (``ForumSetup.pin``), as a front end
   whose dependencies live elsewhere does, interference too (its neighbour shares the app's core); ``--no-pin``:
   only interference, ``--pin``: every case;
2. graphs from the baseline's measured requests;
3. the profiles the engine needs: ``GET /blob/{id}`` at today's and the bigger payload size, with one caller
   and with up to the index page's ten at once (the size case's spec filters on that api), RTTs through the
   proxy at 0 ms and with the delay (the ``(rtt)`` rows of location), CPU probes for interference, and,
   before the cases, a wake-up profile of the app, once per pinning the other cases use (``analyzer.wakeup``:
   the post page's server-side latency after pauses of 0-40 ms taking turns; ``--no-wake`` leaves it out),
   measured again right before each location case,
   which is predicted from its own (the machine's wake-up changes within a run): the loop's longer idle gaps are
   charged what the profile says they cost in the nominal and ``(applied)`` rows; the ``(no wake-up)`` rows
   predict the nominal delay without it, and the ``(rtt)`` rows too (an RTT profile measured end to end by a
   client idle between calls holds the cold start already);
4. predict (``analyzer.predict``) and compare with the scenario's server-side latencies (client-side for load
   and failure); the location cases are also predicted for the delay the proxy really added (its threads wake
   late on a busy machine, although it learns how late: ``LatencyProxy.applied_delay_ms``), the ``(applied)``
   rows. Load and failure also print what bounds them: the loop's demand per request at one user and under
   load, 1 / throughput, and the host's CPU spent beside the app per request (its database, cache and blob
   service and the load client share the machine's cores with it: ``replayer.groundtruth.host_cpu_s``).

Real Redis and PostgreSQL are used when they answer on 127.0.0.1 (``--embedded`` forces the app's SQLite and
the blob service's cache). Raw results go to ``benchmarks/results/whatif_accuracy.json``. Run::

    python benchmarks/whatif_accuracy.py [--requests 900] [--rounds 3] [--blocks 10] [--run 6] [--separate]
                                         [--users 16] [--embedded] [--no-pin] [--only nothing,load,size]

Every run keeps its recordings (spans, runs, profiles) in a work directory, printed at the end;
``--recordings DIR`` predicts again from them without measuring, the wake-up profiles built again from their
data (``wake.pkl``, ``wake-pinned.pkl``, ``CASE.wake.pkl``), so that two versions of the engine are compared on
the same data (the machine's drift between runs is larger than most model changes).
"""

from __future__ import annotations

import argparse
import functools
import json
import pickle
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from analyzer.accuracy import Repeatability, cdf_deviation, repeatability
from analyzer.build import build_graphs
from analyzer.errors import AnalyzerError
from analyzer.graph import dump_graphs
from analyzer.loadsim import (
    MeasuredLevels,
    background_from_spans,
    calibrate,
    fit_wake_cost,
    with_background,
    with_wake_cost,
)
from analyzer.predict import predict
from analyzer.profiles import RTT_API, ProfileKey, ProfileStore
from analyzer.profiling import (
    HttpTarget,
    PostgresTarget,
    RedisTarget,
    StopRule,
    profile_target,
)
from analyzer.spans import process_cpu, read_spans
from analyzer.wakeup import SERVICE_WAKE_API, WAKE_API, WAKE_DECAY_API, add_wake_profiles
from replayer.groundtruth import (
    BLOB_NAME,
    Applied,
    Deployment,
    ForumSetup,
    IDLE_MS,
    GroundTruth,
    client_mix,
    client_side_ms,
    deploy,
    measure,
    measure_idle,
    measure_loaded,
    pooled_levels,
    measure_paired,
    measured_requests,
    pooled_host,
    pooled_light,
    reachable,
)

RESULTS = Path(__file__).with_name("results")
LOAD_LEVELS = (4, 2)
"""The short runs after each light run of load and failure: at the users per loop divided by these (16 users:
4 and 8; a failure leaving 8 on a loop: 2 and 4)."""
LEVEL_REQUESTS = 300
"""Measured requests of each level's run: at 100, a second at 4 users, one round of run 115 read the loop's CPU
per request at 6.20 ms there and 5.02 at 8 users."""
REQUESTS = 900
"""Measured requests of each side (``--requests``): 450 a route. Two samples of 150 a route drawn from one
distribution (run 119's case that changes nothing, both sides pooled), the first bootstrapped as a prediction
is, met the goal 84% of the time on either page; 14 rows at once, 9% of the time. At 300 a route 94-96% (a
half of all 14 rows), at 450 98% (three quarters): the goal is then a test of the model, not of the sample."""
LOAD_REQUESTS_PER_USER = 25
"""Measured requests per user and round of a scenario with N users (at least ``--requests / --rounds``)."""
WAKE_FIT_SAMPLES = 600
"""Simulated requests per level and step of fitting what a wake-up costs (about 10 s a round of a case)."""
REDIS_URL = "redis://127.0.0.1:6379/13"
"""Database 13: the page-cache keys of other forum apps on the same server (database 0) stay out of ours."""
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
ROUTES = ("GET /", "GET /post/{id}")
BLOB_API = "GET /blob/{id}"
"""The blob fetches: the only calls whose payload the app's ``--payload-bytes`` changes (not ``GET /ad``, not the
blob service's ``/kv`` cache calls)."""


@dataclass(frozen=True, slots=True)
class Case:
    """One scenario: the spec the engine predicts, and the same scenario applied for real."""

    name: str
    spec: str
    applied: Applied
    users: int = 1
    pin: bool = False
    """Give the app core 0 and everything else the other cores (``ForumSetup.pin``)."""
    selector: str = ""
    """location cases: the resource, also predicted as ``location:SELECTOR=NAME`` from RTT profiles measured
    through the proxy at 0 ms and at the added delay (what the proxy really adds, scheduling included)."""


def _cases(setup: ForumSetup, users: int, big: int) -> list[Case]:
    """The scenarios: the spec the engine predicts, and the same scenario applied for real.

    The first changes nothing (``+0ms``): both sides of its paired measurement are today's, so its score is the
    floor under every paired row's, what sampling and the engine's one-user simulation of the recording leave
    when the prediction has nothing to predict.

    The location cases, and the first, give the app the first core and everything else started here the others
    (``pin``): a database or a blob service in another region does not run on the app's core, but on this machine
    the proxies that delay it and the servers that answer would run there while the app waits (runs 135-138 in
    docs/accuracy.md). Size is not pinned: its ten 256 KiB answers through the proxy would all be copied on the
    one core the services share (run 137: the index page 5.1 ms slower than predicted pinned, 2.2 not). Load and
    failure are not either: two replicas would share one core.
    """
    cases = [Case("nothing", f"location:{BLOB_NAME}=+0ms", Applied(added_ms=(("blob", 0.0),)), pin=True),
             Case("location-blob", f"location:{BLOB_NAME}=+20ms", Applied(added_ms=(("blob", 20.0),)), pin=True,
                  selector=BLOB_NAME)]
    if setup.redis_url:
        cases.append(Case("location-redis", "location:redis=+10ms", Applied(added_ms=(("redis", 10.0),)), pin=True,
                          selector="redis"))
    if setup.postgres_url:
        cases.append(Case("location-postgres", "location:postgresql=+10ms",
                          Applied(added_ms=(("postgres", 10.0),)), pin=True, selector="postgresql"))
    cases.append(Case("size", f"size:{BLOB_NAME}[{BLOB_API}]={big}", Applied(payload_bytes=big)))
    cases += [
        # the users request what the load client does (half and half), not the baseline's recorded mix
        Case("load", f"load:{users}?{client_mix()}", Applied(), users),
        # The app and the hog share core 0, everything else has core 1: the neighbour slows the front end only.
        Case("interference", "interference:cpu=50", Applied(cpu_pct=50.0), pin=True),
        Case("failure", f"load:{users // 2}?replicas=2&{client_mix()}; failure:app",
             Applied(app_replicas=2, failed_replicas=1), users // 2),
    ]
    return cases


@functools.lru_cache(maxsize=4)
def _recorded(path: str) -> Any:
    """A spans file read once (the blocks of a paired run all name the same file)."""
    return read_spans(path)


def _window_requests(truth: GroundTruth) -> list[Any]:
    """The requests of a collected run's measured window (warm-up left out)."""
    return [r for path in truth.spans for r in measured_requests(_recorded(path).requests, [truth])]


def _pairable(case: Case) -> bool:
    """Whether the case can be switched on and off in one running deployment (``measure_paired``)."""
    return case.users == 1 and case.applied.app_replicas == 1


def _pooled(runs: list[GroundTruth]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for run in runs:
        for route in run.routes:
            out.setdefault(route, []).extend(run.latencies(route))
    return out


FAN_OUT = (2, 4, 7, 10)
"""Callers the size profile is also measured with: up to the index page's ten blob fetches at once."""


def _profile_sizes(setup: ForumSetup, store: ProfileStore, sizes: list[int], budget_s: float) -> None:
    """``http GET /blob/{id}`` of the blob service at each size, through the proxy the app uses, with one caller
    and with each of :data:`FAN_OUT` (the engine reads it at each call's place in its fan-out), the points taking
    turns in three rounds (the engine reads differences between them).

    The size case's spec filters on that api, so the ads and cache calls the blob service also answers keep
    their recorded latencies and need no size profile.
    """
    import asyncio

    rule = StopRule(rse=0.01, min_count=200, budget_s=budget_s)
    with deploy(setup) as d:
        asyncio.run(profile_target(HttpTarget(f"{d.blob_url}/blob/1?bytes={{size}}"), sizes=sizes,
                                   concurrencies=FAN_OUT, rule=rule, rounds=3, store=store,
                                   note="whatif_accuracy: blob sizes"))


def _profile_cpu(store: ProfileStore, cpu_pct: float, budget_s: float = 5.0) -> None:
    """CPU-work probes with a neighbour taking ``cpu_pct`` % of the probe's core (``perfcast profile --cpu``).

    The probe and the neighbour share this process's first core, the core the interference case gives the
    app and its neighbour (``ForumSetup.pin``).
    """
    from analyzer.cpuprobe import profile_cpu
    from replayer.hog import CpuHog

    profile_cpu([cpu_pct], lambda pct, cores: CpuHog(pct, cpus=cores), store=store, seed=1,
                rule=StopRule(rse=0.01, min_count=500, budget_s=budget_s), note="whatif_accuracy: cpu probes")




def _profile_wake(setup: ForumSetup, work: Path, status: Any, name: str) -> None:
    """The data of a wake-up profile of the app (:mod:`analyzer.wakeup`): its post page's server-side latency,
    one request at a time, after pauses of :data:`IDLE_MS`, from the spans of one collected run (server side
    only), kept in ``NAME.pkl`` (:class:`_WithWakeAgain` builds the profiles from it)."""
    got = measure_idle(setup, IDLE_MS, requests=200, rounds=2, spans=work / f"{name}.jsonl", on_step=status)
    with (work / f"{name}.pkl").open("wb") as f:
        pickle.dump(got, f)


def _shared_wake(pin: bool) -> str:
    """The name of the run-wide wake-up profile's data measured with or without pinning (``Case.pin``)."""
    return "wake-pinned" if pin else "wake"


def _wake_names(case: Case) -> list[str]:
    """The wake-up profiles' data a case is predicted from, the first found in the work directory: a location
    case's own, then the run-wide one measured with the case's pinning (``wake.pkl`` alone in runs before 137)."""
    shared = [_shared_wake(case.pin), "wake"]
    return [f"{case.name}.wake", *shared] if case.selector else shared


_WAKE_APIS = (WAKE_API, WAKE_DECAY_API, SERVICE_WAKE_API)
"""The apis of the wake-up profiles (the loop's and the services')."""


class _WithWakeAgain:
    """A profile store with its wake-up profiles built, by the current code, from the data in ``NAME.pkl``
    (:func:`_wake_names`), also when a recording is predicted again: how a profile is built is part of what a
    prediction made again judges. The store itself is left as it was.
    """

    def __init__(self, store: Any, work: Path, status: Any, name: str) -> None:
        self.store = store
        with (work / f"{name}.pkl").open("rb") as f:
            got = pickle.load(f)
        self._dir = tempfile.TemporaryDirectory(prefix="perfcast-wake-")
        self.wake = ProfileStore(Path(self._dir.name) / "wake.db")
        for line in add_wake_profiles(self.wake, "forum GET /post/{id}", got.requests, got.every,
                                      note=f"whatif_accuracy: built from {name}.pkl"):
            status(f"wake-up profile ({name}.pkl): {line}")

    def keys(self) -> list[ProfileKey]:
        return [k for k in self.store.keys() if k.api not in _WAKE_APIS] + self.wake.keys()

    def select(self, api: str, *args: Any, **kwargs: Any) -> Any:
        return (self.wake if api in _WAKE_APIS else self.store).select(api, *args, **kwargs)

    def drop(self) -> None:
        """Close the wake-up profiles built here, not the store."""
        self.wake.close()
        self._dir.cleanup()


class _WithoutWake:
    """The profile store without its wake-up profile (:mod:`analyzer.wakeup`)."""

    def __init__(self, store: ProfileStore) -> None:
        self.store = store

    def keys(self) -> list[ProfileKey]:
        return [k for k in self.store.keys() if k.api not in _WAKE_APIS]

    def select(self, *args: Any, **kwargs: Any) -> Any:
        return self.store.select(*args, **kwargs)


def _rtt_target(resource: str, d: Deployment, setup: ForumSetup) -> Any:
    """One network round trip through the resource's proxy: an HTTP GET /health, a Redis PING, a SELECT 1."""
    if resource == "blob":
        target = HttpTarget(f"{d.blob_url}/health", api=RTT_API)
        target.resource = BLOB_NAME  # the name the app's calls carry, so that the engine picks this profile
        return target
    if resource == "redis":
        return RedisTarget(f"redis://{d.resources['redis']}/{urlsplit(REDIS_URL).path.strip('/')}", "PING",
                           api=RTT_API)
    return PostgresTarget(f"postgresql://postgres@{d.resources['postgres']}/test", "SELECT 1", api=RTT_API)


def _profile_rtt(setup: ForumSetup, case: Case, store: ProfileStore, budget_s: float = 4.0) -> None:
    """RTT profiles of the case's resource through its proxy: today's (no label) and ``location=CASE``."""
    import asyncio

    resource = case.applied.added_ms[0][0]
    rule = StopRule(rse=0.005, min_count=300, budget_s=budget_s)
    for applied, labels in ((Applied(), {}), (case.applied, {"location": case.name})):
        with deploy(setup, applied) as d:
            asyncio.run(profile_target(_rtt_target(resource, d, setup), labels=labels, rule=rule, store=store,
                                       note="whatif_accuracy: rtt through the proxy"))


def _row(case: Case, route: str, pred: Any, latencies: list[float],
         repeat: Repeatability | None) -> dict[str, Any]:
    measured = np.asarray(latencies, dtype=np.float64)
    dev = cdf_deviation(pred.predicted.samples_ms, measured)
    return {
        "scenario": case.name, "spec": case.spec, "route": route, "requests": int(measured.size),
        "users": case.users,
        "baseline": pred.baseline.summary(),
        "predicted": pred.predicted.summary(),
        "measured": {"p50": float(np.median(measured)), "p90": float(np.quantile(measured, 0.9)),
                     "p99": float(np.quantile(measured, 0.99)), "mean": float(measured.mean())},
        "median_deviation": dev.median, "mean_deviation": dev.mean, "ks_d": dev.max,
        "repeatability": repeat.to_json() if repeat is not None else None,
        "notes": list(pred.notes),
        "measured_ms": measured.round(4).tolist(),
    }


def _apart(repeat: dict[str, Any] | None) -> str:
    """A row's repeatability for the table: the rounds' median deviation / KS D, sampling alone's in brackets."""
    if not repeat:
        return "-"
    return (f"{repeat['median']:.1%}/{repeat['ks_d']:.2f} "
            f"({repeat['sampling_median']:.1%}/{repeat['sampling_ks_d']:.2f})")


def _calibrated(graphs: list[Any], lights: list[GroundTruth], bases: list[GroundTruth], *,
                loop_levels: bool = True) -> tuple[list[Any], str]:
    """The graphs calibrated to the app without the collector (:func:`analyzer.loadsim.calibrate`).

    ``lights`` ran the baseline's light load without the collector: the CPU the app's loop was held for per
    request there (``GroundTruth.loop_cpu_ms``), the time it was preempted (``loop_preempted_ms``), and per
    route the client-side latencies; and the same loop demand at a few more users (``GroundTruth.levels``).
    ``bases``, the collected runs the graphs were built from, give the time a request spends outside its server
    span (the prediction is compared with client-side latencies). ``loop_levels`` False: the levels give the
    host's other processes' CPU only, the loop's demand is priced from the light run.
    """
    loop_ms, preempted_ms, without = pooled_light(lights)
    out, calibration = calibrate(graphs, ROUTES, loop_ms, {r: without.get(r, []) for r in ROUTES},
                                 preempted_ms=preempted_ms, host=pooled_host(lights),
                                 client_ms=client_side_ms(bases), levels=pooled_levels(lights),
                                 loop_levels=loop_levels)
    return out, calibration.describe()


def _predict_by_round(spec: str, bases: list[GroundTruth], lights: list[GroundTruth], store: ProfileStore,
                      samples: int, rng: np.random.Generator, status: Any, how: str) -> list[Any]:
    """Calibrated cases: each round predicted from its own baseline and light run; the rounds pooled.

    A round's baseline, light run and loaded run follow each other within a minute, while this machine's speed
    drifts by 40% between rounds (the app's CPU per request at light load, without the collector, went from
    6.3 to 9.0 ms between two runs of the benchmark). Each round's prediction is therefore made from that
    round's inputs, and the rounds' predictions are pooled in equal parts, as their measurements are.

    ``how`` the loop's demand under load is priced: ``"wake"`` from the one-user run, with what a wake-up costs
    fitted to the demand measured at every round's levels (:func:`analyzer.loadsim.fit_wake_cost`; without
    levels, as ``"one user"``), the host's cores simulated from the levels' readings; ``"one user"`` from it
    alone; ``"levels"`` interpolated between the levels, the host's cores too.
    """
    from analyzer.distribution import Distribution

    rounds: list[tuple[list[Any], str]] = []
    measured: list[MeasuredLevels] = []
    for k, (base, light) in enumerate(zip(bases, lights, strict=True)):
        problems: list[str] = []
        graphs = [g for g in build_graphs(_window_requests(base), problems=problems) if g.route in ROUTES]
        # the levels' loop demand for "levels"; for "wake" their host readings (the cores the loop shares with
        # the backends and the load client), the loop's demand from the light run and a wake-up's cost
        graphs, calibration = _calibrated(graphs, [light if how != "one user" else replace(light, levels=())],
                                          [base], loop_levels=how == "levels")
        rounds.append((graphs, f"round {k + 1}: {calibration}"
                       + (f" ({len(problems)} left out: {problems[0]})" if problems else "")))
        levels = pooled_levels([light])
        if how == "wake" and levels:
            measured.append(MeasuredLevels.of(graphs, ROUTES, pooled_light([light])[2], levels))
    if measured:
        # one cost for the app on this machine, fitted to every round's levels together
        cost = fit_wake_cost(measured, store, samples=WAKE_FIT_SAMPLES)
        rounds = [(with_wake_cost(graphs, cost), text) for graphs, text in rounds]
        status(f"a wake-up costs {cost:.3f} ms (fitted to the loop's demand at " + "; ".join(
            ", ".join(f"{n} users {ms:.2f} ms" for n, ms in m.levels) for m in measured) + ")")
    by_route: dict[str, list[Any]] = {}
    for graphs, text in rounds:
        status(text)
        for p in predict(graphs, spec, store, max(samples // len(bases), 1), rng):
            by_route.setdefault(p.route, []).append(p)
    return [replace(ps[0], predicted=Distribution.of(np.concatenate([p.predicted.samples_ms for p in ps])),
                    baseline=Distribution.of(np.concatenate([p.baseline.samples_ms for p in ps])),
                    requests=sum(p.requests for p in ps))
            for ps in by_route.values() if len(ps) == len(bases)]


def _loop_per_request(runs: list[GroundTruth]) -> tuple[float, float, float]:
    """(the app loop's CPU and the time it was preempted per request, as ``pooled_light`` pools them, and its
    sleeps per request) over ``runs``, weighted by their requests; 0 sleeps where a recording did not count
    them. The demand the prediction takes is the first two summed."""
    loop_ms, preempted_ms, latencies = pooled_light(runs)
    sleeps = sum(getattr(t, "loop_wakeups", 0.0) * sum(len(v) for v in t.client_ms.values()) for t in runs)
    return loop_ms, preempted_ms, sleeps / max(sum(len(v) for v in latencies.values()), 1)


def _host_per_request(runs: list[GroundTruth]) -> tuple[float, float]:
    """(the host's busy CPU beside the app's processes, its steal) per request over ``runs``, weighted by their
    requests; zeros for recordings made before the host was read."""
    n = [sum(len(v) for v in t.client_ms.values()) for t in runs]
    host = [getattr(t, "host_cpu_ms", (0.0, 0.0)) for t in runs]
    other = sum(k * (h[0] - sum(t.app_cpu_ms)) for k, h, t in zip(n, host, runs, strict=True))
    steal = sum(k * h[1] for k, h in zip(n, host, strict=True))
    return other / max(sum(n), 1), steal / max(sum(n), 1)


def _write(out: Path, config: str, ns: argparse.Namespace, rows: list[dict[str, Any]], elapsed: float) -> None:
    """The raw results so far (rewritten after every scenario, so that a crash keeps what was measured)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "format": "perfcast-whatif-accuracy/1", "configuration": config, "requests_per_run": ns.requests,
        "samples": ns.samples, "rounds": ns.rounds, "blocks": ns.blocks, "run": ns.run, "separate": ns.separate,
        "cache_ttl_ms": ns.cache_ttl_ms, "elapsed_s": elapsed,
        "python": sys.version.split()[0],
        "recordings": str(ns.recordings) if ns.recordings else None, "rows": rows,
    }, indent=1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=REQUESTS,
                   help=f"measured requests of each side (default {REQUESTS})")
    p.add_argument("--users", type=int, default=16, help="users of the load scenario (default 16)")
    p.add_argument("--size", type=int, default=262144, help="payload bytes of the size scenario (default 256 KiB)")
    p.add_argument("--rounds", type=int, default=3, help="alternations of baseline and scenario runs (default 3)")
    p.add_argument("--blocks", type=int, default=10,
                   help="location, size and interference: runs of the load client in one deployment, in each "
                        "today and the scenario taking turns in runs of --run requests (default 10)")
    p.add_argument("--run", type=int, default=6,
                   help="requests of one side in a row, the first not measured (default 6)")
    p.add_argument("--separate", action="store_true",
                   help="location, size and interference in separate deployments too (--rounds of baseline then "
                        "scenario), as load and failure are measured")
    p.add_argument("--cache-ttl-ms", type=int, default=0,
                   help="the app's page cache lifetime (default 0: every index page a miss, see the docs)")
    p.add_argument("--samples", type=int, default=10_000, help="Monte Carlo samples per route")
    p.add_argument("--embedded", action="store_true", help="no Redis/PostgreSQL even when reachable")
    p.add_argument("--only", default="", help="comma-separated scenario names to run")
    p.add_argument("--no-wake", action="store_true", help="location without a wake-up profile of the app")
    pinning = p.add_mutually_exclusive_group()
    pinning.add_argument("--pin", action="store_true",
                         help="size, load and failure too with the app alone on the first core, as the location "
                              "cases run (two replicas then share it)")
    pinning.add_argument("--no-pin", action="store_true",
                         help="the app on every core in every case but interference (its neighbour must share "
                              "the app's core): its dependencies and the rig's proxies may run on the app's core")
    p.add_argument("--recordings", type=Path, metavar="DIR",
                   help="predict again from a previous run's work directory (its runs and profiles) instead of "
                        "measuring: a change to the engine judged on the same recordings, without the machine's drift")
    p.add_argument("--out", type=Path, default=RESULTS / "whatif_accuracy.json")
    ns = p.parse_args(argv)
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 132))
    began = time.monotonic()
    use_real = not ns.embedded and reachable("127.0.0.1", 6379) and reachable("127.0.0.1", 5432)
    # The cache's hit ratio at TTL > 0 depends on the request rate, which every scenario changes: a feedback
    # neither WebPerf nor perfcast models, so by default the TTL is 0 and every index page is built.
    setup = ForumSetup(redis_url=REDIS_URL if use_real else None, postgres_url=POSTGRES_URL if use_real else None,
                       app_args=("--cache-ttl-ms", str(ns.cache_ttl_ms)))
    config = ("real Redis 7 + PostgreSQL at 127.0.0.1 (behind 0 ms proxies), blob service in its own process"
              if use_real else "embedded: SQLite + the blob service's key-value cache, blob service in its own process")
    config += ("; the app alone on the first core in every case (--pin)" if ns.pin
               else "; the app on every core but in interference (--no-pin)" if ns.no_pin
               else "; the app alone on the first core in location and interference")
    console.print(f"[bold]configuration:[/] {config}")
    work = ns.recordings or Path(tempfile.mkdtemp(prefix="perfcast-accuracy-"))
    again = ns.recordings is not None
    if again and not (work / "profiles.db").is_file():
        p.error(f"--recordings {work}: no profiles.db there (not a work directory of this benchmark)")

    def status(text: str) -> None:
        console.print(f"  [dim]{time.monotonic() - began:6.1f} s[/] {text}", highlight=False)

    store = ProfileStore(work / "profiles.db")
    cases = _cases(setup, ns.users, ns.size)
    if ns.pin or ns.no_pin:
        cases = [replace(c, pin=ns.pin or c.applied.cpu_pct > 0) for c in cases]
    if ns.only:
        wanted = set(ns.only.split(","))
        cases = [c for c in cases if c.name in wanted]
    if again:
        console.print(f"[bold]recordings[/]: {work} (nothing is measured)")
    elif any(c.name == "size" for c in cases):
        console.print(f"[bold]profiles[/]: http {BLOB_API} at {setup.payload_bytes} and {ns.size} bytes")
        size_pin = next(c.pin for c in cases if c.name == "size")
        _profile_sizes(replace(setup, pin=size_pin), store, [setup.payload_bytes, ns.size], budget_s=8.0)

    wake = False
    if again:
        wake = not ns.no_wake and (any(k.api == WAKE_API for k in store.keys()) or any(
            (work / f"{name}.pkl").is_file() for c in cases for name in _wake_names(c)))
    elif any(c.selector for c in cases) and not ns.no_wake:
        # the location cases measure their own right before them; the others share one per pinning
        for pin in sorted({c.pin for c in cases if not c.selector}):
            console.print("[bold]profiles[/]: wake-up of the app after pauses of "
                          f"{', '.join(f'{g:g}' for g in IDLE_MS)} ms{' (pinned)' if pin else ''}")
            _profile_wake(replace(setup, pin=pin), work, status, _shared_wake(pin))
        wake = True

    rows: list[dict[str, Any]] = []
    rng = np.random.default_rng(7)
    for case in cases:
        # Baseline and scenario runs alternate (B S B S ...): the machine's other load drifts from minute to
        # minute, and a prediction should be judged on the change it predicts, not on that drift.
        case_setup = replace(setup, pin=case.pin)
        paired = _pairable(case) and not ns.separate
        console.print(f"[bold]{case.name}[/]: {case.spec}, " + (
            f"{ns.blocks} blocks of today's and the scenario's requests taking turns {ns.run} at a time, one "
            "deployment" if paired
            else f"{ns.rounds} rounds of baseline then scenario"))
        case_store: Any = store
        if wake:
            # The machine's wake-up changes within a run (run 128: +0.06 ms at a 20 ms pause when the run began,
            # the location cases' pieces after a wait 0.2-0.25 ms slower a quarter of an hour later): each location
            # case is predicted from a wake-up profile measured right before it
            names = _wake_names(case)
            if case.selector and not again:
                status("the wake-up profile again, right before the case")
                _profile_wake(case_setup, work, status, names[0])
            own = next((n for n in names if (work / f"{n}.pkl").is_file()), None)
            if own is not None:
                case_store = _WithWakeAgain(store, work, status, own)
        if case.applied.cpu_pct > 0 and not again:
            status(f"probing CPU work with a neighbour taking {case.applied.cpu_pct:g} % of the core")
            _profile_cpu(store, case.applied.cpu_pct)
        per_round = max(ns.requests // ns.rounds, 1)
        # Under load the collector's own CPU (3.6x the app's when it records every request) would be most of
        # what is measured: load cases predict and measure the app without it, calibrated by a light run
        calibrate = case.users > 1
        runs = work / f"{case.name}.runs.pkl"
        if again:
            if not runs.is_file():
                status(f"[yellow]no recordings of {case.name} in {work}[/]")
                continue
            with runs.open("rb") as f:
                bases, lights, truths = pickle.load(f)
        elif paired:
            lights = []
            bases, truths = measure_paired(case_setup, case.applied, requests=ns.requests, blocks=ns.blocks,
                                           run=ns.run, spans=work / f"{case.name}.paired.jsonl", on_step=status)
            with runs.open("wb") as f:
                pickle.dump((bases, lights, truths), f)
        elif calibrate:
            bases = [measure(case_setup, requests=per_round, spans=work / f"{case.name}.base{k}.jsonl",
                             on_step=status) for k in range(ns.rounds)]
            # the light runs that calibrate the prediction and the loaded runs it predicts take turns in one
            # deployment without the collector, a few seconds apart. N users need a longer window than one to
            # reach their steady state: 100 requests at 16 users last under a second, 6 per user after a
            # warm-up of about one each
            per_loop = case.users // max(case.applied.app_replicas - case.applied.failed_replicas, 1)
            lights, truths = measure_loaded(case_setup, case.applied, users=case.users,
                                            requests=max(per_round, LOAD_REQUESTS_PER_USER * case.users),
                                            light_requests=per_round, blocks=ns.rounds,
                                            warmup_requests=max(20, 4 * case.users),
                                            levels=sorted({per_loop // k for k in LOAD_LEVELS} - {0, 1}),
                                            level_requests=LEVEL_REQUESTS, on_step=status)
            with runs.open("wb") as f:
                pickle.dump((bases, lights, truths), f)
        else:
            bases, lights, truths = [], [], []
            for k in range(ns.rounds):
                bases.append(measure(case_setup, requests=per_round, spans=work / f"{case.name}.base{k}.jsonl",
                                     on_step=status))
                truths.append(measure(case_setup, case.applied, users=case.users, requests=per_round,
                                      spans=work / f"{case.name}.truth{k}.jsonl", on_step=status))
            with runs.open("wb") as f:
                pickle.dump((bases, lights, truths), f)
        reqs = [req for b in bases for req in _window_requests(b)]
        problems: list[str] = []
        graphs = [g for g in build_graphs(reqs, problems=problems) if g.route in ROUTES]
        if calibrate:
            graphs, calibration = _calibrated(graphs, lights, bases)
            status(f"pooled: {calibration}")
        else:
            files = sorted({path for t in bases for path in t.spans})
            process = [c for path in files for c in process_cpu(_recorded(path).spans)]
            if set(files) & {path for t in truths for path in t.spans}:
                # paired blocks (one spans file for both sides): the process's CPU over the whole run, divided
                # among all its requests (both sides'), less what their spans record, is the demand per request
                every = [req for t in bases + truths for req in _window_requests(t)]
                # a request whose spans make no graph (rare: see build_graphs) is left out, as from the graphs
                _, demand = background_from_spans(build_graphs(every, problems=[]), every, process)
                graphs = with_background(graphs, demand) if demand is not None else graphs
            else:
                graphs, _ = background_from_spans(graphs, reqs, process)
        dump_graphs(graphs, work / f"{case.name}.graphs.json", source=str(work))
        status(f"baseline: {len(reqs)} requests -> {len(graphs)} graph variants"
               f"{f' ({len(problems)} left out: {problems[0]})' if problems else ''}; predicting")
        variants = [(case, case.spec)]
        applied = [t.applied_delay_ms[r] for t in truths for r, ms in case.applied.added_ms
                   if r in t.applied_delay_ms and ms > 0]
        if applied:
            # What the proxy really added per round trip in the scenario runs (its threads wake late on a busy
            # machine): the ground truth is for that delay, so the engine is also asked about it.
            added = float(np.mean(applied))
            variants.append((replace(case, name=f"{case.name} (applied)"),
                             f"{case.spec.split('=')[0]}=+{added:.2f}ms"))
            status(f"the proxy added {added:.2f} ms per round trip on average")
        if case.selector:
            if not again:
                status("measuring the RTT through the proxy at 0 ms and with the delay")
                _profile_rtt(case_setup, case, store)
            variants.append((replace(case, name=f"{case.name} (rtt)"), f"location:{case.selector}={case.name}"))
            if wake:
                variants.append((replace(case, name=f"{case.name} (no wake-up)"), case.spec))
        if calibrate and pooled_levels(lights):
            variants.append((replace(case, name=f"{case.name} (levels)"), case.spec))
            variants.append((replace(case, name=f"{case.name} (one user)"), case.spec))
        predicted = []
        for variant, spec in variants:
            # The RTT profiles, measured end to end by a client idle between calls, hold the cold start of the
            # call and what follows it; with the wake-up profile as well, the (rtt) rows would count it twice.
            plain = not wake or variant.name.endswith(("(rtt)", "(no wake-up)"))
            profiles = _WithoutWake(case_store) if plain else case_store
            try:
                # the nominal rows price the load from the one-user runs and a wake-up's cost fitted at the
                # levels, the (one user) rows from the one-user runs alone, the (levels) rows from the levels
                how = next((h for h in ("levels", "one user") if variant.name.endswith(f"({h})")), "wake")
                preds = (_predict_by_round(spec, bases, lights, profiles, ns.samples, rng, status, how) if calibrate
                         else predict(graphs, spec, profiles, ns.samples, rng))
                predicted.append((replace(variant, spec=spec), {p.route: p for p in preds}))
            except AnalyzerError as exc:
                status(f"[red]cannot predict {spec}[/]: {type(exc).__name__}: {exc}")
        if isinstance(case_store, _WithWakeAgain):
            case_store.drop()
        if not predicted:
            continue
        errors = sum(t.errors for t in truths)
        if errors:
            status(f"[yellow]{errors} failed requests[/]: {'; '.join(truths[0].error_examples[:2])}")
        measured = _pooled(truths)
        # how far the scenario's rounds are from each other: the floor under any prediction's score
        repeat = {route: repeatability([t.latencies(route) for t in truths], rng=np.random.default_rng(1))
                  for route in ROUTES if len(truths) > 1 and all(t.latencies(route) for t in truths)}
        for route, r in repeat.items():
            status(f"{route}: rounds apart {r.median:.1%} / {r.ks_d:.3f} (sampling alone: "
                   f"{r.sampling_median:.1%} / {r.sampling_ks_d:.3f})")
        throughput = float(np.mean([t.throughput_rps for t in truths]))
        for variant, preds in predicted:
            for route in ROUTES:
                if route in preds and measured.get(route):
                    rows.append(_row(variant, route, preds[route], measured[route], repeat.get(route)))
                    rows[-1]["throughput_rps"] = throughput
        _write(ns.out, config, ns, rows, time.monotonic() - began)
        row = next((r for r in reversed(rows) if r["scenario"] == case.name), None)
        if case.users > 1 and row is not None:
            # At saturation the loop is busy all the time: 1 / throughput is its time per request. The loop's
            # demand per request (CPU + preempted) and its sleeps in epoll_wait per request, light against loaded:
            # a loop that no longer idles needs less per request (the prediction takes the light runs' demand)
            loop_ms = 1000 / throughput
            (light_cpu, light_pre, light_sleeps), (loaded_cpu, loaded_pre, loaded_sleeps) = (
                _loop_per_request(lights), _loop_per_request(truths))
            by_round = [[_loop_per_request([t]) for t in runs] for runs in (lights, truths)]
            row.update(loop_ms_per_request=loop_ms, light_demand_ms=light_cpu + light_pre,
                       light_wakeups=light_sleeps, loaded_demand_ms=loaded_cpu + loaded_pre,
                       loaded_wakeups=loaded_sleeps, light_loop_cpu_ms=light_cpu,
                       light_preempted_ms=light_pre, loaded_loop_cpu_ms=loaded_cpu,
                       loaded_preempted_ms=loaded_pre,
                       round_throughput_rps=[[t.throughput_rps for t in lights],
                                             [t.throughput_rps for t in truths]],
                       round_loop_cpu_ms=[[cpu for cpu, _, _ in side] for side in by_round],
                       round_preempted_ms=[[pre for _, pre, _ in side] for side in by_round])
            # The demand's two parts can move apart under load: the CPU falls as the loop sleeps less, while the
            # time it is preempted doubled on one machine and stayed flat on another (docs/accuracy.md, runs 90-91)
            status(f"throughput {throughput:.1f} req/s = {loop_ms:.2f} ms of loop per request at saturation; the "
                   f"loop's demand per request {light_cpu + light_pre:.2f} ms at one user ({light_cpu:.2f} CPU + "
                   f"{light_pre:.2f} preempted, {light_sleeps:.1f} wake-ups), {loaded_cpu + loaded_pre:.2f} ms at "
                   f"{case.users} users ({loaded_cpu:.2f} + {loaded_pre:.2f}, {loaded_sleeps:.1f} wake-ups); "
                   f"throughput by round "
                   + ", ".join(f"{a.throughput_rps:.1f} -> {b.throughput_rps:.1f}"
                               for a, b in zip(lights, truths, strict=False))
                   + " req/s (light -> loaded)")
            (light_other, light_steal), (loaded_other, loaded_steal) = _host_per_request(lights), _host_per_request(truths)
            row.update(light_other_cpu_ms=light_other, light_steal_ms=light_steal,
                       loaded_other_cpu_ms=loaded_other, loaded_steal_ms=loaded_steal)
            levels = pooled_levels(lights)
            if levels:
                row.update(levels=[{"users": n, "loop_cpu_ms": cpu, "preempted_ms": pre, "host_cpu_ms": host}
                                   for n, cpu, pre, host in levels],
                           round_levels=[[x.to_json() for x in getattr(t, "levels", ())] for t in lights])
                status("the loop's demand per request at more users: " + ", ".join(
                    f"{cpu + pre:.2f} ms at {n} ({cpu:.2f} CPU + {pre:.2f} preempted"
                    + (f"; the host's other processes {host - cpu:.2f})" if host else ")")
                    for n, cpu, pre, host in levels))
            host = pooled_host(truths)
            if host is not None:
                row.update(host_busy_measured=throughput * host[0] / 1000 / host[1])
            status(f"the host's CPU beside the app per request: {light_other:.2f} ms at one user, {loaded_other:.2f} "
                   f"at {case.users} users (steal {light_steal:.2f} and {loaded_steal:.2f})"
                   + (f"; its cores {row['host_busy_measured']:.0%} busy under load" if host is not None else ""))
    store.close()

    table = Table(title=f"What-if accuracy, forum app ({'Redis + PostgreSQL' if use_real else 'embedded'}), "
                        f"{ns.requests} requests per run")
    for col in ("scenario", "route", "requests", "pred p50", "pred p90", "meas p50", "meas p90", "median dev",
                "KS D", "rounds apart"):
        table.add_column(col, justify="left" if col in ("scenario", "route") else "right")
    for r in rows:
        ok = r["median_deviation"] < 0.05 and r["ks_d"] < 0.15
        table.add_row(r["scenario"], r["route"], str(r["requests"]),
                      f"{r['predicted']['p50']:.1f}", f"{r['predicted']['p90']:.1f}",
                      f"{r['measured']['p50']:.1f}", f"{r['measured']['p90']:.1f}",
                      f"{r['median_deviation']:.1%}", f"[{'green' if ok else 'red'}]{r['ks_d']:.3f}[/]",
                      _apart(r.get("repeatability")))
    console.print(table)
    elapsed = time.monotonic() - began
    console.print(f"total {elapsed:.0f} s; work files in {work}")
    _write(ns.out, config, ns, rows, elapsed)
    console.print(f"raw results: {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
