"""``perfcast demo``: the whole story on the bundled forum app, predicted and then measured for real.

Thin over :mod:`replayer.groundtruth` (deploy, load, measure) and the analyzer (graphs, self-check, predict,
CDF deviation): :func:`run_demo` does the work and returns a :class:`DemoResult`; the click command renders.
Needs no Redis or PostgreSQL: the app runs on its SQLite file and the blob service's key-value cache.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console

    from analyzer.graph import CausalGraph

__all__ = ["DemoResult", "RouteComparison", "ScenarioOutcome", "demo", "run_demo"]

ROUTES = ("GET /", "GET /post/{id}")


@dataclass(frozen=True, slots=True)
class RouteComparison:
    """One route under one scenario: the predicted and the measured distribution, and how far apart."""

    route: str
    baseline: Mapping[str, float]
    """The baseline model's p50, p90, p99, mean (ms) and count."""
    predicted: Mapping[str, float]
    measured: Mapping[str, float]
    ks_d: float
    """max |F_pred(x) - F_meas(x)|: the Kolmogorov-Smirnov D."""
    median_deviation: float
    """The median of |F_pred(x) - F_meas(x)| (WebPerf's headline figure)."""


@dataclass(frozen=True, slots=True)
class ScenarioOutcome:
    """One scenario of the demo, predicted and measured, per route."""

    name: str
    spec: str
    rows: tuple[RouteComparison, ...]


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What :func:`run_demo` produced, and where it wrote it."""

    out: Path
    spans: Path
    graphs: Path
    predictions: Path
    measured: Path
    requests: int
    """Requests of the baseline's measured window that became graphs."""
    variants: int
    self_check_median: float
    """Median of |evaluated - observed| / observed over the baseline's requests."""
    outcomes: tuple[ScenarioOutcome, ...] = field(default=())
    profiles: Path | None = None
    """The profile store: the app's wake-up profile the location scenario was predicted with."""


def _status(console: Console, began: float) -> Any:
    def step(text: str) -> None:
        console.print(f"  [dim]{time.monotonic() - began:5.1f} s[/]  {text}", highlight=False)
    return step


def run_demo(out: Path, requests: int = 300, *, quick: bool = False, console: Console | None = None,
             seed: int = 1) -> DemoResult:
    """Collect, build graphs, then predict and measure the location and load scenarios; print as it goes.

    Parameters
    ----------
    out
        Directory for the spans, graphs, predictions and measurements (created when missing).
    requests
        Requests measured per run (the baseline and each scenario).
    quick
        Fewer Monte Carlo samples and a smaller load (4 users instead of 16), for a smoke test.
    console
        Where to print (a rich Console); default stdout.
    """
    import numpy as np
    from rich.console import Console

    from analyzer.accuracy import cdf_deviation
    from analyzer.build import build_graphs
    from analyzer.graph import dump_graphs
    from analyzer.loadsim import (MeasuredLevels, background_from_spans, calibrate, fit_wake_cost, with_background,
                                  with_wake_cost)
    from analyzer.predict import predict
    from analyzer.selfcheck import summarize
    from analyzer.spans import process_cpu, read_spans
    from replayer.groundtruth import (BLOB_NAME, Applied, ForumSetup, client_mix, client_side_ms, measure_loaded,
                                      measure_paired, measured_requests, pooled_host, pooled_levels, pooled_light)

    console = console or Console()
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    step = _status(console, began)
    # Every index page built (no page cache): the cache's hit ratio depends on the request rate, which the load
    # scenario changes, a feedback the engine does not model (docs/demo.md)
    setup = ForumSetup(seed=seed, app_args=("--cache-ttl-ms", "0"))
    spans = out / "spans.jsonl"
    location = Applied(added_ms=(("blob", 20.0),))
    blocks = min(10, max(1, requests // 8))
    console.rule("[bold]1. collect[/]: the forum app under perfcast's collector, one user")
    step(f"one deployment, {blocks} blocks: today's configuration (the baseline) and step 3's location scenario "
         "(a proxy's 20 ms delay) switched between requests in random turns, so both see the same machine")
    warmup = 5 if quick else 20
    # a line per block would bury the story: the blocks are said once, above
    bases, located = measure_paired(setup, location, requests=requests, blocks=blocks, warmup_requests=warmup,
                                    spans=spans, log_dir=out / "logs",
                                    on_step=lambda text: None if text.startswith("block ") else step(text))
    throughput = sum(b.throughput_rps for b in bases) / len(bases)
    step(f"{sum(len(v) for b in bases for v in b.server_ms.values())} requests of today measured, "
         f"{throughput:.1f} req/s; spans of both sides in {spans}")

    console.rule("[bold]2. causal graphs[/]: today's requests")
    span_file = read_spans(spans)
    reqs = measured_requests(span_file.requests, bases)
    problems: list[str] = []
    graphs = [g for g in build_graphs(reqs, problems=problems) if g.route in ROUTES]
    # the process's CPU over the whole run (both sides' requests), less what their spans record, per request
    every = measured_requests(span_file.requests, bases + located)
    # a request whose spans make no graph is left out here as above (the problems are said once, below)
    _, background = background_from_spans(build_graphs(every, problems=[]), every,
                                           process_cpu(span_file.spans))
    if background is not None:
        graphs = with_background(graphs, background)
    for problem in problems[:3]:
        console.print(f"[yellow]left out:[/] {problem}", highlight=False)
    graphs_file = out / "graphs.json"
    dump_graphs(graphs, graphs_file, source=str(spans))
    per, overall = summarize(graphs)
    _print_graphs(console, graphs, per)
    console.print(f"self-check |evaluated - observed| / observed over {overall.count} requests: median "
                  f"{overall.median:.2%}, p90 {overall.p90:.2%}", highlight=False)
    if background is not None:
        console.print(f"process CPU per request {background.process_ms:.2f} ms, recorded on the graphs' nodes "
                      f"{background.traced_ms:.2f} ms: the rest, {background.background_ms:.2f} ms, contends "
                      "for the loop under load", highlight=False)

    users = 4 if quick else 16
    cases: list[tuple[str, str, int, str]] = [
        ("location", f"location:{BLOB_NAME}=+20ms", 1,
         "the blob service (blobs, cache, ads) moved 20 ms further away: measured in step 1's scenario requests"),
        ("load", f"load:{users}?{client_mix(routes=[g.route for g in graphs])}", users,
         f"{users} concurrent users instead of 1, asking for both pages half and half as the load client does, for "
         "the app without the collector (which would cost it 3.6x its CPU under load): calibrated by light runs "
         "without it, which take turns with the loaded ones in one deployment"),
    ]
    samples = 2000 if quick else 10_000
    rng = np.random.default_rng(seed)
    outcomes, whatif_doc, measured_doc = [], [], []
    wake = None  # the wake-up profile, measured for the location case and kept for the load case (its credit)
    with ExitStack() as held:  # the profile store is closed however the cases end
        for name, spec, n_users, what in cases:
            console.rule(f"[bold]3. what if[/] {spec}")
            console.print(f"  {what}", highlight=False)
            model, collected, loaded = graphs, True, []
            if n_users > 1:
                levels = sorted({n_users // 4, n_users // 2} - {0, 1})
                step(f"the app without the collector, one user and {n_users} users taking turns: the light runs for "
                     f"its CPU and latency (and its loop's CPU at {' and '.join(map(str, levels))} users), the "
                     "loaded ones to compare with")
                lights, loaded = measure_loaded(setup, Applied(), users=n_users,
                                                requests=max(requests // 2, 8 * n_users),
                                                light_requests=max(requests // 2, 1), blocks=2, warmup_requests=warmup,
                                                levels=levels,
                                                on_step=lambda text: None if text.startswith("block ") else step(text),
                                                log_dir=out / "logs")
                loop_ms, preempted_ms, without = pooled_light(lights)
                at_levels = pooled_levels(lights)
                # the levels' host readings simulate the cores the loop shares with the blob service and the load
                # client; the loop's demand comes from the light runs, with a wake-up's cost fitted to the levels
                model, calibration = calibrate(graphs, ROUTES, loop_ms, {r: without.get(r, []) for r in ROUTES},
                                               preempted_ms=preempted_ms, host=pooled_host(lights),
                                               client_ms=client_side_ms(bases), levels=at_levels, loop_levels=False)
                step(calibration.describe())
                if at_levels:
                    # what a wake-up of the loop costs, which a busier loop pays less often: fitted to the levels
                    measured = MeasuredLevels.of(model, ROUTES, without, at_levels)
                    cost = fit_wake_cost([measured], wake, samples=300 if quick else 600, seed=seed)
                    model = with_wake_cost(model, cost)
                    step(f"a wake-up of the loop costs {cost:.3f} ms (fitted to its CPU per request at "
                         + ", ".join(f"{n} users: {ms:.2f} ms" for n, ms in measured.levels) + ")")
                collected = False
            if name == "location":
                wake = held.enter_context(_wake_profile(setup, out, quick, step))
            # under load the same profile says what the loop's wake-ups at one user cost, which a busy loop does not
            # pay (analyzer.loadsim.simulate_scenario), as the accuracy benchmark predicts its load case
            step("predicting from the baseline's graphs" + (" and the wake-up profile" if wake else ""))
            preds = predict(model, spec, wake, samples, rng)
            truths = located if name == "location" else loaded
            rows = []
            for p in preds:
                got = [x for t in truths for x in t.latencies(p.route)]
                if not got:
                    continue
                m = np.asarray(got, dtype=np.float64)
                dev = cdf_deviation(p.predicted.samples_ms, m)
                rows.append(RouteComparison(
                    p.route, p.baseline.summary(), p.predicted.summary(),
                    {"p50": float(np.quantile(m, 0.5)), "p90": float(np.quantile(m, 0.9)),
                     "p99": float(np.quantile(m, 0.99)), "mean": float(m.mean()), "count": float(m.size)},
                    dev.max, dev.median))
                measured_doc.append({"scenario": spec, "route": p.route, "side": "server" if collected else "client",
                                     "samples_ms": m.round(4).tolist()})
            whatif_doc.append({"name": spec, "predictions": [p.to_json() for p in preds]})
            outcome = ScenarioOutcome(name, spec, tuple(rows))
            _print_outcome(console, outcome)
            # under load: where the requests waited (the loop, the pool) and how busy the host's cores would be
            for note in sorted({n for p in preds for n in p.notes if n.startswith(("queueing per request", "host:"))},
                               reverse=True):
                console.print(f"  {note}", highlight=False)
            outcomes.append(outcome)

    predictions = out / "predictions.json"
    predictions.write_text(json.dumps({"format": "perfcast-whatif/1", "graphs": str(graphs_file),
                                       "samples": samples, "seed": seed, "scenarios": whatif_doc}))
    measured = out / "measured.json"
    measured.write_text(json.dumps({"format": "perfcast-measured/1", "measured": measured_doc}))
    result = DemoResult(out, spans, graphs_file, predictions, measured, len(reqs), len(graphs), overall.median,
                        tuple(outcomes), out / "profiles.db")
    _print_files(console, result, time.monotonic() - began)
    return result


def _wake_profile(setup: Any, out: Path, quick: bool, step: Any) -> Any:
    """A wake-up profile of the app (:mod:`analyzer.wakeup`) in ``out/profiles.db``: a delay leaves the loop idle
    longer before the work after each wait, and the first work after an idle spell runs slow on a VM."""

    from analyzer.profiles import ProfileStore
    from analyzer.wakeup import add_wake_profiles
    from replayer.groundtruth import IDLE_MS, measure_idle

    path = out / "profiles.db"
    for old in (path, path.with_name(path.name + "-journal")):
        old.unlink(missing_ok=True)
    step(f"a wake-up profile of the app: its post page one request at a time, after pauses of "
         f"{', '.join(f'{g:g}' for g in IDLE_MS)} ms")
    got = measure_idle(setup, IDLE_MS, requests=20 if quick else 80, rounds=2, spans=out / "wake.jsonl",
                       on_step=step)
    store = ProfileStore(path)
    for line in add_wake_profiles(store, "forum GET /post/{id}", got.requests, got.every,
                                  note="perfcast demo: server-side latency after a pause"):
        step(f"wake-up profile: {line}")
    return store


def _print_graphs(console: Console, graphs: list[CausalGraph], per: dict[tuple[str, int], Any]) -> None:
    """A summary row per variant, then the nodes of each route's commonest variants, like nodes grouped."""
    import numpy as np
    from rich.table import Table

    from analyzer.graph import NodeKind

    summary = Table(title="graphs: one per route and causal shape (variant)", title_justify="left")
    for col in ("route", "variant", "requests", "nodes", "io calls", "p50 ms", "p90 ms", "self-check"):
        summary.add_column(col, justify="left" if col == "route" else "right")
    for g in graphs:
        lat = np.asarray(g.latency_ms)
        summary.add_row(g.route, str(g.variant), str(g.count), str(len(g.nodes)),
                        str(sum(n.kind is NodeKind.IO for n in g.nodes)), f"{np.median(lat):.2f}",
                        f"{np.quantile(lat, 0.9):.2f}", f"{per[(g.route, g.variant)].median:.2%}")
    console.print(summary)
    for route in dict.fromkeys(g.route for g in graphs):
        variants = [g for g in graphs if g.route == route]
        total = sum(g.count for g in variants)
        shown: set[tuple[tuple[str, str, str, int], ...]] = set()
        for g in variants:
            if g.variant > 0 and g.count < 0.25 * total:
                continue
            table = Table(title=f"{route} variant {g.variant} ({g.count} of {total} requests): its nodes, "
                                "alike ones grouped", title_justify="left")
            for col in ("nodes", "kind", "wait", "api / label", "median ms (each)"):
                table.add_column(col, justify="right" if col in ("nodes", "median ms (each)") else "left")
            groups: dict[tuple[str, str, str], list[float]] = {}
            for node_id in g.topological_order():
                node = g.node(node_id)
                if node.kind.value in ("start", "end"):
                    continue
                what = node.api or node.label or node_id
                key = (node.kind.value, node.wait.value, what)
                groups.setdefault(key, []).append(float(np.median(node.samples_ms)) if node.samples_ms else 0.0)
            signature = tuple((*key, len(meds)) for key, meds in groups.items())
            if signature in shown:  # the same nodes in another order: said in one line
                console.print(f"{route} variant {g.variant} ({g.count} requests): the same nodes, joined "
                              "differently", highlight=False)
                continue
            shown.add(signature)
            for (kind, wait, what), meds in groups.items():
                table.add_row(str(len(meds)), kind, wait, what, f"{np.median(meds):.2f}")
            console.print(table)


def _print_outcome(console: Console, outcome: ScenarioOutcome) -> None:
    from rich.table import Table

    table = Table(title=f"{outcome.spec}: predicted (from the baseline) vs measured (applied for real), ms",
                  title_justify="left")
    table.add_column("route", no_wrap=True)
    for side in ("predicted", "measured"):
        for q in ("p50", "p90", "p99", "mean"):
            table.add_column(f"{side[:4]}. {q}", justify="right", style="bold" if side == "predicted" else "")
    table.add_column("KS D", justify="right")
    table.add_column("median dev", justify="right")
    for r in outcome.rows:
        table.add_row(r.route, *(f"{side[q]:.1f}" for side in (r.predicted, r.measured)
                                 for q in ("p50", "p90", "p99", "mean")),
                      f"{r.ks_d:.3f}", f"{r.median_deviation:.1%}")
    console.print(table)
    base = ", ".join(f"{r.route} p50 {r.baseline['p50']:.1f}" for r in outcome.rows)
    console.print(f"  [dim]today (baseline model): {base} ms[/]", highlight=False)


def _print_files(console: Console, result: DemoResult, elapsed_s: float) -> None:
    console.rule(f"[bold]4. done[/] in {elapsed_s:.0f} s")
    console.print(f"files in {result.out}:", highlight=False)
    for what, path in (("spans", result.spans), ("graphs", result.graphs), ("predictions", result.predictions),
                       ("measured", result.measured), ("profiles", result.profiles)):
        if path is None:
            continue
        console.print(f"  {what:12s} {path}", highlight=False)
    g, p, m = result.graphs, result.predictions, result.measured
    console.print("carry on with, for example:", highlight=False)
    for line in (f"perfcast graph {result.spans} -o {g}",
                 f"perfcast whatif {g} -s 'location:blob=+50ms' -s 'interference:cpu=50' --explain",
                 f"perfcast compare {p} {m} --route 'GET /' --scenario 'location:blob=+20ms'"):
        console.print(f"  {line}", highlight=False, soft_wrap=True)


@click.command("demo")
@click.option("--requests", "-n", default=300, show_default=True, type=click.IntRange(10),
              help="Requests measured per run (the baseline, and each scenario applied for real).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the files (default: a fresh temporary directory, printed).")
@click.option("--quick", is_flag=True, help="A smaller load and fewer Monte Carlo samples (a smoke run).")
def demo(requests: int, out: Path | None, quick: bool) -> None:
    """Run the whole story on the bundled forum app: collect, graph, predict, then measure for real.

    Starts the app under the collector, sends it REQUESTS requests, builds and prints its causal graphs,
    predicts two what-ifs (the blob service 20 ms further away; 16 concurrent users), applies each for real
    and prints the predicted and the measured distributions side by side. Needs no Redis or PostgreSQL.
    """
    from rich.console import Console

    from replayer.groundtruth import GroundTruthError

    console = Console(width=max(Console().width, 120))
    if out is None:
        out = Path(tempfile.mkdtemp(prefix="perfcast-demo-"))
    console.print(f"perfcast demo: files go to {out}", highlight=False)
    try:
        run_demo(out, requests, quick=quick, console=console)
    except GroundTruthError as exc:
        click.echo(f"GroundTruthError: {exc}", err=True)
        raise SystemExit(1) from None
