"""``perfcast whatif`` (and, below, ``compare`` and ``e2e``): thin click commands over the analyzer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

# ============================================================================================================
# perfcast whatif
# ============================================================================================================


@click.command("whatif")
@click.argument("graphs_file", metavar="GRAPHS", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--scenario", "-s", "specs", multiple=True, metavar="SPEC",
              help="A scenario, e.g. location:redis=+20ms; join changes with ';'. Repeat for several.")
@click.option("--scenarios", "scenarios_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A TOML file of [scenario.NAME] tables with changes = [...].")
@click.option("--profiles", "profiles_file", type=click.Path(dir_okay=False, path_type=Path),
              help="The profile store (SQLite) written by 'perfcast profile'.")
@click.option("--samples", default=10_000, show_default=True, type=click.IntRange(1),
              help="Monte Carlo samples (simulated requests under load) per route.")
@click.option("--seed", type=int, default=None, help="Seed, to reproduce a prediction.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON with the full distributions.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), help="Write baseline/predicted CDFs (PNG).")
@click.option("--explain", is_flag=True, help="Say where every node's durations came from.")
@click.option("--route", "routes", multiple=True, metavar="ROUTE",
              help="Only these routes (repeat); under load, the users issue only them. Default: all.")
def whatif(
    graphs_file: Path,
    specs: tuple[str, ...],
    scenarios_file: Path | None,
    profiles_file: Path | None,
    samples: int,
    seed: int | None,
    as_json: bool,
    plot: Path | None,
    explain: bool,
    routes: tuple[str, ...],
) -> None:
    """Predict each route's latency distribution under what-if scenarios.

    \b
    Scenario kinds:
      location:RESOURCE=+20ms | location:RESOURCE=LABEL   tier:RESOURCE=LABEL
      size:RESOURCE=6MB       load:N[?think=0ms&replicas=1&pool.RESOURCE=10&nested=shared]
      interference:cpu=PCT    failure:RESOURCE[?replicas=2]  (failure:app = a front end)
    RESOURCE: a system (redis), host:port, a resource URL, or a name given at collection.
    RESOURCE[API] (location, tier, size): only the calls whose api matches the glob API,
      e.g. size:blob[GET /blob/{id}]=256KiB.
    load:N?mix.ROUTE=W&...: the users request the routes in these shares (default: as
      recorded), e.g. load:60?mix.GET /=3&mix.GET /post/{id}=1.
    docs/whatif.md says how each change becomes node durations.
    """
    import numpy as np

    from analyzer.errors import ProfileError
    from analyzer.graph import load_graphs
    from analyzer.predict import predict, select_routes
    from analyzer.scenario import load_scenarios, parse_scenario

    scenarios = [parse_scenario(spec) for spec in specs]
    if scenarios_file is not None:
        scenarios += load_scenarios(scenarios_file)
    if not scenarios:
        raise click.UsageError("give at least one --scenario SPEC or a --scenarios FILE")
    graphs = select_routes(_checked(graphs_file, load_graphs(graphs_file)), routes)
    store = None
    if profiles_file is not None:
        if not profiles_file.is_file():
            raise ProfileError(f"profile store {profiles_file} does not exist (write one with 'perfcast profile')")
        from analyzer.profiles import ProfileStore

        store = ProfileStore(profiles_file)
    rng = np.random.default_rng(seed)
    try:
        results = [(sc, predict(graphs, sc, store, samples, rng)) for sc in scenarios]
    finally:
        if store is not None:
            store.close()
    if as_json:
        doc = {
            "format": "perfcast-whatif/1",
            "graphs": str(graphs_file),
            "samples": samples,
            "seed": seed,
            "scenarios": [{"name": sc.name, "predictions": [p.to_json() for p in preds]} for sc, preds in results],
        }
        click.echo(json.dumps(doc))
    else:
        _render(results, explain)
    if plot is not None:
        _plot(results, plot)
        if not as_json:
            click.echo(f"CDFs written to {plot}")


def _render(results: list[tuple[Any, list[Any]]], explain: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    for sc, preds in results:
        table = Table(title=f"scenario: {sc.name}", title_justify="left")
        table.add_column("route", no_wrap=True)
        table.add_column("n", justify="right")
        for side in ("baseline", "predicted"):
            for q in ("p50", "p90", "p99", "mean"):
                table.add_column(f"{side} {q}", justify="right", style="dim" if side == "baseline" else "bold")
        table.add_column("Δ p50", justify="right")
        for p in preds:
            b, d = p.baseline, p.predicted
            change = (d.p50 - b.p50) / b.p50 * 100 if b.p50 > 0 else float("nan")
            table.add_row(
                p.route, str(p.requests),
                *(f"{v:.2f}" for v in (b.p50, b.p90, b.p99, b.mean, d.p50, d.p90, d.p99, d.mean)),
                f"{change:+.0f}%",
            )
        console.print(table)
        notes = preds[0].notes if preds else ()
        for note in notes:
            console.print(f"  [dim]{escape(note)}[/dim]", highlight=False)
        if explain:
            for p in preds:
                for variant, sources in p.sources:
                    t = Table(title=f"{p.route} (variant {variant}): where each node's durations come from",
                              title_justify="left")
                    for col in ("node", "kind", "source", "how"):
                        t.add_column(col, overflow="fold")
                    for s in sources:
                        t.add_row(*(escape(str(x)) for x in (s.node, s.kind, s.source, s.how)))
                    console.print(t)
    console.print("[dim]latencies in ms; baseline = the model without the scenario on the same draws[/dim]")


def _plot(results: list[tuple[Any, list[Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    routes = list(dict.fromkeys(p.route for _, preds in results for p in preds))
    fig, axes = plt.subplots(len(routes), 1, figsize=(7, 3.2 * len(routes)), squeeze=False)
    for ax, route in zip(axes[:, 0], routes, strict=True):
        drawn_baseline = False
        for sc, preds in results:
            for p in preds:
                if p.route != route:
                    continue
                if not drawn_baseline:
                    x = p.baseline.samples_ms
                    ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", color="black", label="baseline")
                    drawn_baseline = True
                x = p.predicted.samples_ms
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=f"predicted: {sc.name}")
        ax.set_title(route)
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("CDF")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================================================
# perfcast compare / perfcast e2e: below this line (analyzer/accuracy.py and the end-to-end model).
# ============================================================================================================


@click.command("compare")
@click.argument("predicted", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("measured", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--route", default=None, help="The request, when a file is a whatif --json result or a graphs file.")
@click.option("--scenario", default=None, help="The scenario, when a whatif --json result holds several.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def compare(predicted: Path, measured: tuple[Path, ...], route: str | None, scenario: str | None,
            as_json: bool) -> None:
    """CDF deviation between predicted and measured samples: max (KS D), mean and median of |F1 - F2|.

    Each file holds one number per line, a JSON list, a 'perfcast whatif --json' result (with --route)
    or a graphs file (its recorded latencies, with --route). Several MEASURED files are rounds of one
    measurement: they are pooled, and how far apart they are is printed too (each round against the others,
    and what sampling alone gives), the floor under the prediction's score.
    """
    import numpy as np

    from analyzer.accuracy import cdf_deviation, read_samples, repeatability

    pred = read_samples(predicted, route, scenario)
    rounds = [read_samples(path, route, scenario) for path in measured]
    meas = np.concatenate(rounds)
    dev = cdf_deviation(pred, meas)
    apart = repeatability(rounds) if len(rounds) > 1 else None
    if as_json:
        doc: dict[str, object] = dict(dev.to_json())
        if apart is not None:
            doc["repeatability"] = apart.to_json()
        click.echo(json.dumps(doc))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="CDF deviation |F_predicted(x) - F_measured(x)|", title_justify="left")
    for col in ("", "n", "p50 ms", "p90 ms", "p99 ms", "mean ms"):
        table.add_column(col, justify="left" if not col else "right")
    named = [("predicted", pred), ("measured", meas)]
    if apart is not None:
        named += [(f"  round {k + 1}", r) for k, r in enumerate(rounds)]
    for name, x in named:
        table.add_row(name, str(x.size), *(f"{v:.3f}" for v in np.percentile(x, [50, 90, 99])), f"{x.mean():.3f}")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    console.print(f"max (KS D) {dev.max:.4f}   mean {dev.mean:.4f}   median {dev.median:.4f}")
    if apart is not None:
        console.print(f"rounds apart (each against the others): KS D {apart.ks_d:.4f}   median {apart.median:.4f}"
                      f"   sampling alone: KS D {apart.sampling_ks_d:.4f}   median {apart.sampling_median:.4f}")


def _checked(path: Path, graphs: list[Any]) -> list[Any]:
    """``graphs`` read from ``path``, their calibration's meta checked (:func:`analyzer.loadsim.check_meta`): a
    bad value is named with the file and the graph's place in it."""
    from analyzer.errors import GraphError, GraphFileError
    from analyzer.loadsim import check_meta

    for i, graph in enumerate(graphs):
        try:
            check_meta(graph)
        except GraphError as exc:
            raise GraphFileError(path, None, f"graphs[{i}].meta", str(exc)) from None
    return graphs


def _fraction(text: str) -> float:
    try:
        return float(text.rstrip("%")) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(f"expected a fraction (0.02) or a percentage (2%), got {text!r}") from None


@click.command("e2e")
@click.option("--har", "har_files", required=True, multiple=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="The page, recorded by a browser (HAR). Repeat with more recordings of the page: the objects "
                   "the frontend does not serve then draw their fetch times from all of them.")
@click.option("--graphs", "graphs_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Cloud side: the routes' recorded latencies in a graphs file.")
@click.option("--whatif", "whatif_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Cloud side: a 'perfcast whatif --json' result (its predicted samples).")
@click.option("--scenario", default=None, help="With --whatif: the scenario, when the result holds several.")
@click.option("--route", "routes", multiple=True, required=True,
              help="A route the frontend serves to the page ('GET /'); repeatable.")
@click.option("--rtt", "rtt", default=None, metavar="DURATION", help="A fixed browser-frontend RTT: 40ms.")
@click.option("--rtt-samples", type=click.Path(dir_okay=False, path_type=Path), help="A file of RTT samples (ms).")
@click.option("--profiles", "profiles_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Take the RTT from the 'rtt' profile in this store (with --label).")
@click.option("--label", "labels", multiple=True, metavar="NAME=VALUE", help="Labels of the rtt profile.")
@click.option("--frontend", default=None, metavar="HOST:PORT", help="The frontend's host (default: the page's).")
@click.option("--percentile", default=90.0, show_default=True, type=click.FloatRange(0, 100, min_open=True,
              max_open=True))
@click.option("--ci", "ci_text", default="2%", show_default=True,
              help="Stop when the 95% CI half-width of the percentile is within this (relative).")
@click.option("--seed", type=int, default=None, help="Seed, to reproduce a prediction.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON with the predicted samples.")
def e2e(
    har_files: tuple[Path, ...],
    graphs_file: Path | None,
    whatif_file: Path | None,
    scenario: str | None,
    routes: tuple[str, ...],
    rtt: str | None,
    rtt_samples: Path | None,
    profiles_file: Path | None,
    labels: tuple[str, ...],
    frontend: str | None,
    percentile: float,
    ci_text: str,
    seed: int | None,
    as_json: bool,
) -> None:
    """End-to-end page load time: cloud side + network RTT + browser (WebPerf's Algorithm 2).

    Without --rtt/--rtt-samples/--profiles, the RTT is the HAR's TCP connect times to the frontend.
    """
    import numpy as np

    from analyzer.accuracy import read_samples
    from analyzer.e2e import (
        cloud_samples_from_graphs,
        fetch_times,
        predict_e2e,
        read_har,
    )
    from analyzer.errors import ProfileError

    if (graphs_file is None) == (whatif_file is None):
        raise click.UsageError("give the cloud side as exactly one of --graphs FILE or --whatif FILE")
    if sum(x is not None for x in (rtt, rtt_samples, profiles_file)) > 1:
        raise click.UsageError("give at most one of --rtt, --rtt-samples, --profiles")
    ci = _fraction(ci_text)
    har_file = har_files[0]
    page = read_har(har_file)
    fetch = fetch_times([page, *(read_har(h) for h in har_files[1:])]) if len(har_files) > 1 else None
    if graphs_file is not None:
        from analyzer.graph import load_graphs

        cloud = cloud_samples_from_graphs(load_graphs(graphs_file), routes)
    else:
        assert whatif_file is not None
        cloud = {route: read_samples(whatif_file, route, scenario) for route in routes}
    host = frontend or page.objects[0].host
    rtt_ms = None
    rtt_how = "the HAR's TCP connect times"
    if rtt is not None:
        from analyzer.profiling import parse_duration

        rtt_ms, rtt_how = np.array([parse_duration(rtt) * 1000.0]), f"fixed {rtt}"
    elif rtt_samples is not None:
        rtt_ms, rtt_how = read_samples(rtt_samples), f"samples in {rtt_samples}"
    elif profiles_file is not None:
        from analyzer.profiles import RTT_API, ProfileStore, parse_labels

        if not profiles_file.is_file():
            raise ProfileError(f"profile store {profiles_file} does not exist (write one with 'perfcast profile')")
        with ProfileStore(profiles_file) as store:
            sel = store.select(RTT_API, f"tcp://{host}", parse_labels(labels))
        rtt_ms, rtt_how = sel.samples_ms, f"profile {sel.keys[0].describe()}"
    result = predict_e2e(page, cloud, rtt_ms, frontend_host=host, fetch_ms=fetch, percentile=percentile, ci=ci,
                         rng=np.random.default_rng(seed))
    x = result.samples_ms
    if as_json:
        click.echo(json.dumps({
            "format": "perfcast-e2e/1", "har": str(har_file), "percentile": percentile,
            "value_ms": result.value_ms, "ci_ms": list(result.ci_ms), "converged": result.converged,
            "observed_ms": result.observed_ms, "rtt": rtt_how,
            "frontend": [{"object": page.objects[i].url, "route": r} for i, r in result.frontend],
            "samples_ms": [round(float(v), 6) for v in x],
        }))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(Console().width, 120))
    table = Table(title=f"page objects of {har_file}", title_justify="left")
    for col in ("#", "object", "HAR ms", "waits for", "served as"):
        table.add_column(col, justify="right" if col in ("#", "HAR ms") else "left", overflow="fold")
    cloud_of = dict(result.frontend)
    for i, o in enumerate(page.objects):
        after = "-" if o.parent is None else f"#{o.parent} {o.anchor} +{o.gap_ms:.1f} ms ({o.how})"
        served = (f"cloud {cloud_of[i]} + rtt" if i in cloud_of
                  else f"fetch times of {len(fetch[o.url])} recordings" if fetch else "HAR fetch time")
        table.add_row(str(i), f"{o.method} {o.url}", f"{o.fetch_ms:.1f}", after, served)
    console.print(table)
    lo, hi = result.ci_ms
    console.print(f"RTT: {rtt_how}; {x.size} Monte Carlo samples"
                  f"{'' if result.converged else ' (the CI target was NOT reached)'}")
    console.print(f"page load time: p50 {np.percentile(x, 50):.1f} ms, p{percentile:g} {result.value_ms:.1f} ms "
                  f"(95% CI {lo:.1f}..{hi:.1f}), p99 {np.percentile(x, 99):.1f} ms, mean {x.mean():.1f} ms; "
                  f"as recorded in the HAR: {result.observed_ms:.1f} ms")
