"""``perfcast profile`` and ``perfcast plan``: thin click commands over analyzer.profiling and analyzer.planning."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click


def _list_of(kind: type, what: str, example: str) -> Callable[[click.Context, click.Parameter, str | None], list[Any]]:
    """A click callback parsing ``1,4,16`` into a list of ``kind``."""

    def parse(ctx: click.Context, param: click.Parameter, value: str | None) -> list[Any]:
        if not value:
            return []
        try:
            return [kind(v) for v in value.split(",")]
        except ValueError:
            raise click.BadParameter(f"expected {what} separated by commas ({example}), got {value!r}") from None

    return parse


_float_list = _list_of(float, "numbers", "25,50")
_int_list = _list_of(int, "integers", "1,4,16")


@click.command("profile")
@click.option("--redis", "redis_url", metavar="URL", help="Profile a Redis server (redis://host:port/db).")
@click.option("--postgres", "postgres_url", metavar="URL", help="Profile PostgreSQL (postgresql://user@host/db).")
@click.option("--http", "http_url", metavar="URL", help="Profile an HTTP endpoint; {size} in it takes --size.")
@click.option("--rtt", "rtt_address", metavar="HOST:PORT", help="Profile the network round trip (TCP connect).")
@click.option("--cpu", "cpu_levels", default=None, callback=_float_list, metavar="LIST",
              help="Profile CPU work while a neighbour takes these % of the core (25,50,75): interference:cpu=P.")
@click.option("--work", "work_ms", default=None, callback=_float_list, metavar="LIST",
              help="With --cpu: the CPU work sizes probed, in ms (default 0.05,0.2,1,5).")
@click.option("--op", default=None,
              help="Redis: GET (default), SET or any command; PostgreSQL: SELECT (default) or SQL text; "
                   "HTTP: the method (GET).")
@click.option("--api", default=None, help="Store under this api instead (e.g. 'http GET /blob/{id}').")
@click.option("--label", "labels", multiple=True, metavar="NAME=VALUE",
              help="Names the configuration measured (tier=C2, location=eu-west). Repeatable.")
@click.option("--size", "sizes", default=None, metavar="LIST", help="Payload sizes: 1k,64k,1m (parameterised).")
@click.option("--concurrency", "concurrencies", default=None, callback=_int_list, metavar="LIST",
              help="Concurrent callers: 1,4,16 (parameterised). With --size: every size at each.")
@click.option("--idle", "idle_ms", default=None, callback=_float_list, metavar="LIST",
              help="A wake-up profile: one caller pausing these ms before each call (5,10,20; 0 is added). "
                   "Point it at the app's own endpoint: what a longer idle spell costs the work after it.")
@click.option("--budget", default="60s", show_default=True, help="Time budget, shared by the points: 90s, 10m.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1),
              help="With several points: each is measured in this many spells, the points taking turns, so a "
                   "host whose speed drifts while profiling shifts every point alike.")
@click.option("--rse", default=0.02, show_default=True, type=click.FloatRange(0, min_open=True),
              help="Stop a point once sd/sqrt(n)/mean is below this.")
@click.option("--min", "min_count", default=30, show_default=True, type=click.IntRange(2),
              help="Minimum samples per point.")
@click.option("--store", "store_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The profile store (SQLite; created when missing).")
def profile(
    redis_url: str | None,
    postgres_url: str | None,
    http_url: str | None,
    rtt_address: str | None,
    cpu_levels: list[float],
    work_ms: list[float],
    op: str | None,
    api: str | None,
    labels: tuple[str, ...],
    sizes: str | None,
    concurrencies: list[int],
    idle_ms: list[float],
    budget: str,
    rounds: int,
    rse: float,
    min_count: int,
    store_path: Path,
) -> None:
    """Measure latency profiles of Redis / PostgreSQL / HTTP calls (or the network RTT, or CPU work under a
    noisy neighbour) into a store.

    Without --size/--concurrency the profile is workload-independent; with them, one profile per value
    (parameterised). Each point is measured until its mean is stable (--rse) or its share of --budget ends,
    in --rounds spells taking turns with the other points.
    --cpu runs CPU-work probes on one core, with a neighbour taking each given share of it and, in alternating
    blocks, paused (the reference); this host's interference profiles for interference:cpu=P.
    --idle measures the target after pauses (a wake-up profile): location, tier and size scenarios then charge
    the loop's longer idle spells what they cost the work after them.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from analyzer.profiles import ProfileKey, ProfileStore, parse_labels
    from analyzer.profiling import (
        HttpTarget,
        PostgresTarget,
        RedisTarget,
        RttTarget,
        StopRule,
        Target,
        parse_duration,
        parse_sizes,
        profile_target,
    )

    chosen = [(k, v) for k, v in (("redis", redis_url), ("postgres", postgres_url), ("http", http_url),
                                  ("rtt", rtt_address), ("cpu", cpu_levels)) if v]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --redis URL, --postgres URL, --http URL, --rtt HOST:PORT, "
                               "--cpu LIST")
    kind, where = chosen[0]
    if work_ms and kind != "cpu":
        raise click.UsageError("--work goes with --cpu")
    if idle_ms and kind != "http":
        raise click.UsageError("--idle goes with --http (an endpoint of the app: a wake-up profile)")
    if kind == "cpu":
        if op or api or sizes or concurrencies:
            raise click.UsageError("--cpu takes no --op, --api, --size or --concurrency")
        _profile_cpu(cpu_levels, work_ms, labels, budget, rse, min_count, store_path)
        return
    where = str(where)
    target: Target
    if kind == "redis":
        target = RedisTarget(where, op or "GET", api=api)
    elif kind == "postgres":
        target = PostgresTarget(where, op or "SELECT", api=api)
    elif kind == "http":
        target = HttpTarget(where, op or "GET", api=api)
    else:
        if op or api:
            raise click.UsageError("--rtt takes no --op or --api: its api is 'rtt'")
        target = RttTarget(where)
    size_list = parse_sizes(sizes) if sizes else []
    if idle_ms and (size_list or concurrencies):
        raise click.UsageError("--idle goes without --size and --concurrency")
    if idle_ms:
        points = len(set(idle_ms) | {0.0})
    elif size_list:  # the grid: every size with one caller and with each number of callers
        points = len(size_list) * len({1, *concurrencies})
    else:
        points = max(len(concurrencies), 1)
    rule = StopRule(rse=rse, min_count=min_count, budget_s=parse_duration(budget) / points)
    label_map = parse_labels(labels)
    console = Console(width=max(Console().width, 140))

    with ProfileStore(store_path) as store, Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
        console=console, transient=False,
    ) as bar:

        tasks: list[TaskID] = []

        def track(key: ProfileKey):  # type: ignore[no-untyped-def]
            task = bar.add_task(f"{key.api} {key.param_text}", total=rule.budget_s, status="")

            def update(n: int, rse_now: float, elapsed: float) -> None:
                shown = "-" if math.isinf(rse_now) else f"{rse_now:.2%}"
                bar.update(task, completed=min(elapsed, rule.budget_s), status=f"n={n} rse={shown}")

            tasks.append(task)
            return update

        results = asyncio.run(profile_target(
            target, labels=label_map, sizes=size_list, concurrencies=concurrencies, idle_ms=idle_ms, rule=rule,
            rounds=rounds, store=store, progress=track,
        ))
        for done in tasks:
            bar.update(done, completed=rule.budget_s)
    table = Table(title=f"profiles stored in {store_path}", title_justify="left")
    numbers = ("n", "p50", "p90", "p99", "mean", "rse", "cpu/call")
    for col in ("api", "resource", "labels", "parameter", *numbers, "stopped"):
        table.add_column(col, justify="right" if col in numbers else "left")
    import numpy as np

    for r in results:
        x = r.samples_ms
        table.add_row(
            r.key.api, r.key.resource, r.key.label_text, r.key.param_text if r.key.param else "-",
            str(x.size), *(f"{v:.3f}" for v in np.percentile(x, [50, 90, 99])), f"{x.mean():.3f}",
            f"{r.rse:.2%}", "-" if r.cpu_ms is None else f"{r.cpu_ms:.3f}", r.stopped,
        )
    console.print(table)
    console.print("[dim]latencies in ms; cpu/call: this client's CPU per call (ms), which a bigger payload adds to "
                  "the app's event loop too[/dim]")


def _profile_cpu(levels: list[float], work_ms: list[float], labels: tuple[str, ...], budget: str, rse: float,
                 min_count: int, store_path: Path) -> None:
    """``perfcast profile --cpu``: probes under a CpuHog on the probe's core (analyzer.cpuprobe)."""
    from rich.console import Console
    from rich.table import Table

    from analyzer.cpuprobe import DEFAULT_WORK_MS, GAP_CLASSES_MS, profile_cpu
    from analyzer.profiles import ProfileStore, parse_labels
    from analyzer.profiling import StopRule, parse_duration
    from replayer.hog import CpuHog

    works = work_ms or list(DEFAULT_WORK_MS)
    points = len(levels) * len(works) * len(GAP_CLASSES_MS)
    rule = StopRule(rse=rse, min_count=min_count, budget_s=parse_duration(budget) / points)
    console = Console(width=max(Console().width, 120))
    with ProfileStore(store_path) as store, console.status("probing CPU work") as status:

        def track(key):  # type: ignore[no-untyped-def]
            def update(n: int, rse_now: float, elapsed: float) -> None:
                status.update(f"{key.api} with a neighbour at {key.value:g} %: n={n} rse={rse_now:.2%} "
                              f"{elapsed:.0f}/{rule.budget_s:.0f} s")
            return update

        results = profile_cpu(levels, lambda pct, cores: CpuHog(pct, cpus=cores), work_ms=works,
                              labels=parse_labels(labels), rule=rule, store=store, progress=track)
    table = Table(title=f"CPU profiles stored in {store_path}", title_justify="left")
    for col in ("api", "neighbour %", "n", "p50", "p90", "p99", "mean", "stopped"):
        table.add_column(col, justify="left" if col in ("api", "stopped") else "right")
    import numpy as np

    for r in results:
        x = r.samples_ms
        table.add_row(r.key.api, f"{r.key.value:g}", str(x.size), *(f"{v:.3f}" for v in np.percentile(x, [50, 90, 99])),
                      f"{x.mean():.3f}", r.stopped)
    console.print(table)
    console.print("[dim]ms from the wake-up asked for to the end of the work; neighbour 0 %: paused, in the "
                  "same run[/dim]")


@click.command("plan")
@click.argument("graphs_file", metavar="GRAPHS", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--budget", required=True, help="Total profiling time: 90s, 10m, 1h.")
@click.option("--min", "min_count", default=10, show_default=True, type=click.IntRange(1),
              help="Measure every API call at least this many times (k).")
def plan(graphs_file: Path, budget: str, min_count: int) -> None:
    """Optimal profiling: how many measurements of each API call a time budget buys (WebPerf 5.2).

    Mean and spread of each call come from the baseline samples in the graphs; calls that appear more often
    in the requests weigh more.
    """
    import numpy as np
    from rich.console import Console
    from rich.table import Table

    from analyzer.graph import load_graphs
    from analyzer.planning import plan_profiling, summed_standard_error
    from analyzer.profiling import parse_duration

    budget_s = parse_duration(budget)
    result = plan_profiling(load_graphs(graphs_file), budget_s, min_count)
    table = Table(title=f"profiling plan for {graphs_file}: budget {budget_s:g} s, at least {min_count} each",
                  title_justify="left")
    for col in ("api", "calls/request", "mean ms", "sd ms", "measurements", "time s", ""):
        table.add_column(col, justify="left" if col in ("api", "") else "right")
    for a in result.allocations:
        table.add_row(a.api, f"{a.weight:.2f}", f"{a.mean_ms:.3f}", f"{a.std_ms:.3f}", str(a.count),
                      f"{a.time_s:.1f}", "at minimum" if a.at_minimum else "")
    console = Console(width=max(Console().width, 120))
    console.print(table)
    t = np.array([a.mean_ms for a in result.allocations])
    s = np.array([a.std_ms for a in result.allocations])
    w = np.array([a.weight for a in result.allocations])
    even = np.maximum(np.floor(budget_s * 1000.0 / t.size / t), 1)
    console.print(
        f"uses {result.used_s:.1f} s of {budget_s:g} s; summed standard error "
        f"{result.summed_standard_error_ms:.4f} ms (an even split of the time: "
        f"{summed_standard_error(even, s, w):.4f} ms)"
    )
